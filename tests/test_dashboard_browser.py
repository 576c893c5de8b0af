"""`gpucluster dashboard` in a real headless Chromium (Debian's `chromium` and `chromium-driver`,
installed by .ci/system-deps), driven by Selenium through the system chromedriver (Selenium
Manager never downloads anything: the driver's and the browser's paths are given). One browser and
two real servers (`gpucluster dashboard --no-browser`, read-only and `--allow-actions`) over one
ledger written with the ledger's API (tests/dashboard_ledger.py) serve the module:

- the runs list shows a finished run; its page renders the phase timeline and a loss chart with data;
- a live run's logs appear in the page while it runs (lines appended to its node log while a
  process holds the run's owner lock, as a live `gpucluster run` does), and the page says when it ends;
- the `down` button is there only with --allow-actions, asks first, and takes the cluster down;
- `--port 80` as a user without the privilege: one line, exit 2.

The screenshots in docs/dashboard.md are taken here: GPUCLUSTER_DASHBOARD_SHOTS=docs/img."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

pytest.importorskip("starlette", reason="the dashboard extra (starlette) is not installed")
webdriver = pytest.importorskip("selenium.webdriver", reason="selenium (the test extra) is not installed")

from selenium.webdriver.chrome.service import Service  # noqa: E402
from selenium.common.exceptions import NoSuchElementException, StaleElementReferenceException  # noqa: E402
from selenium.webdriver.common.by import By  # noqa: E402
from selenium.webdriver.support.ui import WebDriverWait  # noqa: E402

from conftest import ROOT, gpucluster_argv  # noqa: E402
from dashboard_ledger import DONE, ORPHAN_CLUSTER, seed  # noqa: E402

pytestmark = pytest.mark.integration  # the test tier (tests/conftest.py, docs/testing.md)

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
CHROMEDRIVER = shutil.which("chromedriver") or "/usr/bin/chromedriver"
needs_browser = pytest.mark.skipif(not CHROMIUM or not os.path.exists(CHROMEDRIVER),
                                   reason="needs Debian's chromium and chromium-driver (.ci/system-deps installs them)")
LIVE = "r20261128-120000-11fe11"
LIVE_CLUSTER = "gpucluster-local-11fe"


class Server:
    """`gpucluster dashboard --no-browser` in a subprocess; its URL is its first line."""

    def __init__(self, home: Path, *flags: str):
        env = dict(os.environ, GPUCLUSTER_HOME=str(home))
        self.proc = subprocess.Popen([*gpucluster_argv("dashboard", "--no-browser", *flags)], cwd=ROOT, env=env,
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    def started(self) -> "Server":
        self.url = self.proc.stdout.readline().strip() if self.proc.stdout else ""
        if not self.url.startswith("http://127.0.0.1:"):
            self.stop()
            raise AssertionError(f"no URL on the first line: {self.url!r} {self.proc.stderr.read() if self.proc.stderr else ''}")
        self.base = self.url.split("/?")[0]
        return self

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    home = tmp_path_factory.mktemp("dash") / "home"
    home.mkdir()
    old = os.environ.get("GPUCLUSTER_HOME")
    os.environ["GPUCLUSTER_HOME"] = str(home)  # the live run's owner lock is taken in this process
    ledger = seed(home)
    servers = [Server(home), Server(home, "--allow-actions")]  # both start at once
    try:
        for s in servers:
            s.started()
        yield {"home": home, "ledger": ledger, "ro": servers[0], "rw": servers[1]}
    finally:
        for s in servers:
            s.stop()
        ledger.close()
        if old is None:
            os.environ.pop("GPUCLUSTER_HOME", None)
        else:
            os.environ["GPUCLUSTER_HOME"] = old


@pytest.fixture(scope="module")
def browser():
    if not CHROMIUM or not os.path.exists(CHROMEDRIVER):
        pytest.skip("needs Debian's chromium and chromium-driver (.ci/system-deps installs them)")
    opts = webdriver.ChromeOptions()
    opts.binary_location = CHROMIUM
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--window-size=1280,900",
                "--hide-scrollbars"):
        opts.add_argument(arg)
    driver = webdriver.Chrome(service=Service(executable_path=CHROMEDRIVER), options=opts)
    driver.set_page_load_timeout(30)
    yield driver
    driver.quit()


def shot(driver, name: str) -> None:
    """A screenshot of the whole page: into GPUCLUSTER_DASHBOARD_SHOTS (docs/img) when set."""
    where = os.environ.get("GPUCLUSTER_DASHBOARD_SHOTS")
    if not where:
        return
    height = driver.execute_script("return document.body.scrollHeight")
    driver.set_window_size(1280, min(max(height + 20, 600), 2400))
    driver.save_screenshot(str(Path(where) / f"dashboard-{name}.png"))
    driver.set_window_size(1280, 900)


def wait(driver, what, timeout: float = 20):
    """Until `what(driver)` is true (a part refreshed under it meanwhile is looked up again)."""
    return WebDriverWait(driver, timeout, poll_frequency=0.1,
                         ignored_exceptions=(NoSuchElementException, StaleElementReferenceException)).until(what)


@needs_browser
def test_the_runs_list_shows_a_finished_run_and_its_page_the_timeline_and_loss_chart(site, browser):
    browser.get(site["ro"].url)
    row = wait(browser, lambda d: d.find_element(By.CSS_SELECTOR, f'tr.run[data-run="{DONE}"]'))
    assert row.find_element(By.CSS_SELECTOR, ".status").text == "succeeded"
    assert row.find_element(By.CSS_SELECTOR, ".verdict").text == "verified"
    shot(browser, "runs")
    row.find_element(By.LINK_TEXT, DONE).click()
    wait(browser, lambda d: d.find_element(By.ID, "timeline"))
    phases = browser.find_elements(By.CSS_SELECTOR, "#timeline rect.phase")
    assert [p.get_attribute("data-phase") for p in phases] == ["prepare", "provision", "rendezvous", "train",
                                                                "outputs", "teardown"]
    assert all(p.size["width"] >= 2 for p in phases) and phases[3].size["width"] > phases[0].size["width"]
    line = browser.find_element(By.CSS_SELECTOR, "svg#loss polyline.series")
    assert line.get_attribute("data-points") == "4" and line.size["width"] > 100 and line.size["height"] > 50
    # the finished run's logs, sent once, and the stream closed
    wait(browser, lambda d: "node 0 starting" in d.find_element(By.ID, "log-0").text)
    wait(browser, lambda d: d.find_element(By.ID, "logs-state").text == "(the run is over)")
    shot(browser, "run")
    browser.find_element(By.LINK_TEXT, "costs").click()  # the costs page: its three bar charts drawn
    for chart in ("by-day", "by-cloud", "by-cluster"):
        wait(browser, lambda d, chart=chart: d.find_element(By.CSS_SELECTOR, f"svg#{chart}"))
    assert browser.find_elements(By.CSS_SELECTOR, "svg#by-cluster rect.bar")
    shot(browser, "costs")


@needs_browser
def test_a_live_run_s_logs_appear_in_the_page_while_it_runs(site, browser):
    from gpucluster.lifecycle.owner import owner_lock

    home, ledger = site["home"], site["ledger"]
    logs = home / "runs" / LIVE
    logs.mkdir(parents=True)
    ledger.create_run(LIVE, cloud="local", cluster=LIVE_CLUSTER, nodes=1, gpus_per_node=0, command=["python", "t.py"],
                      spec={"cloud": "local", "nodes": 1}, log_dir=str(logs))
    ledger.phase_start(LIVE, "train")
    log = logs / "node-0.log"
    log.write_text("epoch 1 starting\n")
    with owner_lock(LIVE_CLUSTER, "run", run_id=LIVE):  # as the live `gpucluster run` holds it
        browser.get(f"{site['ro'].base}/runs/{LIVE}")
        wait(browser, lambda d: "epoch 1 starting" in d.find_element(By.ID, "log-0").text)
        assert browser.find_element(By.ID, "logs-state").text == "following"
        browser.execute_script("window.samePage = true")
        with open(log, "a") as fh:
            fh.write("epoch 2 loss 0.4210\n")
        wait(browser, lambda d: "epoch 2 loss 0.4210" in d.find_element(By.ID, "log-0").text)
        assert browser.execute_script("return window.samePage") is True  # streamed, not reloaded
        ledger.phase_end(LIVE, "train")
        ledger.finish_run(LIVE, status="succeeded", exit_code=0, teardown="verified")
    wait(browser, lambda d: d.find_element(By.ID, "logs-state").text == "(the run is over)")
    assert browser.find_element(By.ID, "log-0").text.splitlines() == ["epoch 1 starting", "epoch 2 loss 0.4210"]
    wait(browser, lambda d: d.find_element(By.ID, "run-status").text == "succeeded", timeout=10)  # the live part


@needs_browser
def test_the_down_button_is_there_only_with_allow_actions_and_asks_first(site, browser):
    browser.get(site["ro"].base + "/clusters")
    row = wait(browser, lambda d: d.find_element(By.CSS_SELECTOR, f'tr.cluster[data-cluster="{ORPHAN_CLUSTER}"]'))
    assert "orphaned" in row.text and not browser.find_elements(By.CSS_SELECTOR, "form.down button")
    browser.get(site["rw"].url.replace("/?", "/clusters?"))
    button = wait(browser, lambda d: d.find_element(
        By.CSS_SELECTOR, f'tr.cluster[data-cluster="{ORPHAN_CLUSTER}"] form.down button'))
    shot(browser, "clusters")
    button.click()
    alert = wait(browser, lambda d: d.switch_to.alert)
    assert f"gpucluster down {ORPHAN_CLUSTER}" in alert.text
    alert.dismiss()  # "cancel": nothing is done
    assert site["ledger"].open_resources(ORPHAN_CLUSTER)
    browser.find_element(By.CSS_SELECTOR, f'tr.cluster[data-cluster="{ORPHAN_CLUSTER}"] form.down button').click()
    wait(browser, lambda d: d.switch_to.alert).accept()
    done = wait(browser, lambda d: d.find_element(By.CSS_SELECTOR, f'[data-down="{ORPHAN_CLUSTER}"][data-state="done"]'))
    assert "teardown verified" in done.text
    assert not site["ledger"].open_resources(ORPHAN_CLUSTER)  # gpucluster down's own path closed it


def test_a_port_this_user_may_not_have_is_one_line_and_exit_2():
    """--port 80 as uid 65534 (root may listen anywhere)."""
    if os.geteuid() != 0 or shutil.which("setpriv") is None:
        pytest.skip("needs root and setpriv to run the CLI as a user without the privilege")
    top = tempfile.mkdtemp(prefix="gpucluster-dash-")
    try:
        os.chmod(top, 0o777)
        env = dict(os.environ, GPUCLUSTER_HOME=str(Path(top) / "home"), HOME=top)
        done = subprocess.run(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "--",
                               *gpucluster_argv("dashboard", "--port", "80", "--no-browser")],
                              capture_output=True, text=True, env=env, cwd=ROOT, timeout=120)
    finally:
        shutil.rmtree(top, ignore_errors=True)
    if "No module named" in done.stderr or done.returncode == 127:
        pytest.skip(f"this Python cannot start as uid 65534: {done.stderr.strip()[:200]}")
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.startswith("gpucluster: error: --port 80 is not allowed: this user may not listen on it")
    assert len(done.stderr.splitlines()) == 1 and "Traceback" not in done.stderr

