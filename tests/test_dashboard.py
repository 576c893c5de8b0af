"""`gpucluster dashboard` (issue 47 item 2), in-process: the routes through Starlette's test client
over a ledger written with the ledger's API (tests/dashboard_ledger.py): the token (401 without,
403 wrong, then a cookie), the JSON shapes (`runs --json` / `show --json` and what the page adds),
SVG charts with data, read-only unless --allow-actions, the `down` path; the socket bound to
127.0.0.1 and the one-line errors for a port that cannot be had; the notification's link.
The pages in a real browser: tests/test_dashboard_browser.py."""

from __future__ import annotations

import errno
import json
import os
import re
import socket
import subprocess
import sys
import time

import pytest

pytest.importorskip("starlette", reason="the dashboard extra (starlette) is not installed")
pytest.importorskip("httpx", reason="Starlette's test client needs httpx (the test extra)")

from starlette.testclient import TestClient  # noqa: E402

from dashboard_ledger import AWS, DONE, GCP, ORPHAN, ORPHAN_CLUSTER, seed  # noqa: E402
from gpucluster.cli.dashboard import serve  # noqa: E402
from gpucluster.cli.dashboard.app import build, cookie_name  # noqa: E402
from gpucluster.cli.main import main  # noqa: E402
from gpucluster.errors import UsageError  # noqa: E402

pytestmark = pytest.mark.unit  # the test tier (tests/conftest.py, docs/testing.md)

TOKEN = "t0ken-for-tests"


@pytest.fixture
def ledger(home):
    led = seed(home)
    yield led
    led.close()


def client(allow_actions: bool = False) -> TestClient:
    return TestClient(build(TOKEN, allow_actions=allow_actions), follow_redirects=False)


def test_every_route_needs_the_token_then_keeps_it_in_a_cookie(ledger):
    routes = ["/", f"/runs/{DONE}", "/clusters", "/costs", "/api/runs", f"/api/runs/{DONE}",
              f"/api/runs/{DONE}/logs", "/static/dashboard.js"]
    c = client()
    for path in routes:
        refused = c.get(path)
        assert refused.status_code == 401 and len(refused.text.strip().splitlines()) == 1, path
        assert c.get(path, params={"token": "wrong"}).status_code == 403, path
    assert c.post(f"/clusters/{ORPHAN_CLUSTER}/down").status_code == 401
    first = c.get("/", params={"token": TOKEN})
    assert first.status_code == 200
    cookie = first.headers["set-cookie"]
    assert cookie.startswith(f"{cookie_name(TOKEN)}={TOKEN};") and "HttpOnly" in cookie and "SameSite=Strict" in cookie
    for path in routes:  # the cookie alone from now on
        assert c.get(path).status_code == 200, path
    stranger = client()
    stranger.cookies.set(cookie_name(TOKEN), "wrong")
    assert stranger.get("/api/runs").status_code == 403


def test_the_json_is_what_runs_and_show_print(ledger, capsys):
    c = client()
    rows = c.get("/api/runs", params={"token": TOKEN}).json()
    assert [r["id"] for r in rows] == [ORPHAN, DONE, GCP, AWS]  # newest first
    assert main(["runs", "--json", "--limit", "100"]) == 0
    cli_rows = json.loads(capsys.readouterr().out)
    assert [{k: v for k, v in r.items() if k != "orphaned"} for r in rows] == cli_rows  # key for key, in order
    assert {r["id"]: r["orphaned"] for r in rows}[ORPHAN] is True
    assert [r["id"] for r in c.get("/api/runs", params={"status": "succeeded", "cloud": "aws"}).json()] == [AWS]
    assert [r["id"] for r in c.get("/api/runs", params={"q": "d1g175"}).json()] == [DONE]
    bad = c.get("/api/runs", params={"status": "done"})
    assert bad.status_code == 400 and "status 'done' is not allowed" in bad.text and len(bad.text.splitlines()) == 1
    one = c.get(f"/api/runs/{DONE[:12]}").json()  # a unique prefix, as `show` takes
    assert main(["show", DONE, "--json"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert {k: v for k, v in one.items() if k not in ("live", "cost_now")} == shown
    assert one["live"] is False and one["cost_now"]["total"] == "0"
    assert [p["name"] for p in one["phases"]][:2] == ["prepare", "provision"]
    missing = c.get("/api/runs/r19990101-000000-000000")
    assert missing.status_code == 404 and "not in the ledger" in missing.text


def test_the_run_page_draws_its_timeline_and_curves_from_the_ledger(ledger):
    page = client().get(f"/runs/{DONE}", params={"token": TOKEN}).text
    timeline = re.search(r'<svg[^>]*id="timeline".*?</svg>', page, re.S).group(0)
    assert re.findall(r'data-phase="([a-z]+)"', timeline) == ["prepare", "provision", "rendezvous", "train", "outputs",
                                                               "teardown"]
    loss = re.search(r'<svg[^>]*id="loss".*?</svg>', page, re.S).group(0)
    assert 'data-label="per epoch" data-points="4"' in loss
    points = [tuple(map(float, p.split(","))) for p in re.search(r' points="([^"]+)"', loss).group(1).split()]
    assert [y for _, y in points] == sorted(y for _, y in points)  # the loss falls: y grows down the SVG
    for chart in ("accuracy", "samples", "gpu", "cpu"):
        assert re.search(rf'<svg class="chart" id="{chart}".*?<polyline', page, re.S), chart
    assert page.count('class="num exit">0<') == 2 and page.count(">complete<") == 2  # nodes, exit codes, verdicts
    assert "no data recorded" not in page
    orphan = client().get(f"/runs/{ORPHAN}", params={"token": TOKEN}).text
    assert "orphaned" in orphan and f"gpucluster down {ORPHAN_CLUSTER}" in orphan and "no data recorded" in orphan


def test_costs_are_bars_by_day_and_cloud_and_the_runs_list_filters(ledger):
    c = client()
    costs = c.get("/costs", params={"token": TOKEN}).text
    by_day = re.search(r'<svg[^>]*id="by-day".*?</svg>', costs, re.S).group(0)
    assert {k for k in re.findall(r'data-key="(\w+)"', by_day)} == {"aws", "gcp"}  # $0 local bars are not drawn
    assert "$9.52" in costs  # 6.12 + 3.40: cost report's total
    by_cluster = re.search(r'<svg[^>]*id="by-cluster".*?</svg>', costs, re.S).group(0)
    assert len(re.findall(r'<rect class="bar" data-group="', by_cluster)) == 2  # the priced clusters, largest first
    runs = c.get("/", params={"cloud": "aws"}).text
    assert f'data-run="{AWS}"' in runs and f'data-run="{DONE}"' not in runs
    fragment = c.get("/", params={"fragment": "1", "q": "0dead"}).text
    assert "<html" not in fragment and 'data-status="orphaned"' in fragment


def test_logs_stream_as_server_sent_events_and_end_with_the_run(ledger):
    with client().stream("GET", f"/api/runs/{DONE}/logs", params={"token": TOKEN}) as resp:
        assert resp.headers["content-type"].startswith("text/event-stream")
        body = "".join(resp.iter_text())
    lines = [json.loads(m) for m in re.findall(r"event: line\ndata: (.*)\n", body)]
    assert {(x["node"], x["text"]) for x in lines} >= {(0, "node 0 starting"), (1, "done")}
    assert body.rstrip().endswith("event: end\ndata: {}")


def test_clusters_are_read_only_unless_actions_are_allowed(ledger):
    ro = client()
    page = ro.get("/clusters", params={"token": TOKEN}).text
    assert f'data-cluster="{ORPHAN_CLUSTER}"' in page and "orphaned" in page and 'class="down"' not in page
    refused = ro.post(f"/clusters/{ORPHAN_CLUSTER}/down", data={"token": TOKEN})
    assert refused.status_code == 403 and "--allow-actions" in refused.text
    assert ledger.open_resources(ORPHAN_CLUSTER)  # nothing was done
    rw = client(allow_actions=True)
    page = rw.get("/clusters", params={"token": TOKEN}).text
    assert 'class="down"' in page and "data-confirm=" in page
    assert rw.post(f"/clusters/{ORPHAN_CLUSTER}/down", data={"token": "wrong"}).status_code == 403
    assert rw.post(f"/clusters/{ORPHAN_CLUSTER}/down", data={"token": TOKEN}).status_code == 303
    deadline = time.time() + 30
    while 'data-state="running"' in (page := rw.get("/clusters?fragment=1").text) and time.time() < deadline:
        time.sleep(0.1)
    assert f'data-down="{ORPHAN_CLUSTER}" data-state="done"' in page and ">verified<" in page
    assert not ledger.open_resources(ORPHAN_CLUSTER)  # the same path as `gpucluster down`: the run is closed
    assert ledger.get_run(ORPHAN).run.status != "running"


def test_it_binds_to_loopback_and_a_port_it_cannot_have_is_one_line(home, capsys, monkeypatch):
    sock = serve.bind(None)
    try:
        host, port = sock.getsockname()
        assert host == "127.0.0.1" and port > 0
        with pytest.raises(UsageError, match=rf"--port {port} is in use on 127.0.0.1"):
            serve.bind(port)
        assert main(["dashboard", "--port", str(port), "--no-browser"]) == 2
        err = capsys.readouterr().err
        assert err.startswith(f"gpucluster: error: --port {port} is in use") and len(err.splitlines()) == 1
    finally:
        sock.close()
    for bad in ("0", "70000", "http"):
        assert main(["dashboard", "--port", bad, "--no-browser"]) == 2
        err = capsys.readouterr().err
        assert f"--port {bad!r} is not allowed: an integer from 1 to 65535" in err and len(err.splitlines()) == 1

    class NoPrivilege(socket.socket):  # what a user without the privilege gets for a port below 1024
        def bind(self, address):
            raise PermissionError(errno.EACCES, "Permission denied")

    monkeypatch.setattr(serve.socket, "socket", NoPrivilege)
    with pytest.raises(UsageError, match=r"--port 80 is not allowed: this user may not listen on it"):
        serve.bind(80)


def test_the_notification_links_to_the_page_while_a_dashboard_runs(ledger, home):
    from gpucluster.lifecycle.notify import events_of

    assert events_of(ledger.get_run(DONE))[0].link is None
    serve.write_note("http://127.0.0.1:4321")
    try:
        event = events_of(ledger.get_run(DONE))[0]
        assert event.link == f"http://127.0.0.1:4321/runs/{DONE}" and event.link in event.text
    finally:
        serve.remove_note()
    assert not (home / "dashboard.json").exists()
    (home / "dashboard.json").write_text(json.dumps({"url": "http://127.0.0.1:4321", "pid": 2 ** 22 + 12345}))
    assert events_of(ledger.get_run(DONE))[0].link is None  # its process is gone
    os.unlink(home / "dashboard.json")


def test_its_help_imports_no_server_library():
    code = ("import sys\nfrom gpucluster.cli.main import main\nmain(['dashboard', '--help'])\n"
            "print([m for m in ('starlette', 'uvicorn', 'jinja2', 'rich') if m in sys.modules])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert "--allow-actions" in out and out.strip().splitlines()[-1] == "[]"


def test_an_old_ledger_is_migrated_and_a_newer_one_refused_before_it_serves(home, capsys):
    import sqlite3

    from conftest import write_old_ledger
    from gpucluster.ledger.schema import MIGRATIONS

    home.mkdir(parents=True)
    path = home / "ledger.sqlite3"
    write_old_ledger(path, 3)
    assert [r["id"] for r in client().get("/api/runs", params={"token": TOKEN}).json()] == ["old"]
    db = sqlite3.connect(path)
    assert db.execute("PRAGMA user_version").fetchone()[0] == MIGRATIONS[-1][0]  # moved forward
    db.execute(f"PRAGMA user_version = {MIGRATIONS[-1][0] + 5}")
    db.commit()
    db.close()
    assert main(["dashboard", "--no-browser"]) == 2  # as `runs` refuses it: one line, before any URL
    out = capsys.readouterr()
    assert out.out == "" and "newer" in out.err and len(out.err.splitlines()) == 1
