"""The console on a real terminal (tmux, 80 columns): the status line's clock ticks between events,
provisioning shows its progress, Ctrl-C prints one line and no traceback, and tables keep run ids and
cluster names whole. Real CLI processes throughout (the local backend runs real torchrun agents)."""

from __future__ import annotations

import json
import os
import re
import sys
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from terminal import Terminal, need_tmux  # noqa: E402

HERE = Path(__file__).parent
ROOT = HERE.parent
pytestmark = pytest.mark.slow
CLOCK = r"  \S+(?: \(total \S+\))?  "  # the status line's clocks: the phase's, then the total once there is one
STATUS = re.compile(r"^ (\w+)  (?:(\d+)s|(\d+):(\d\d))\b", re.M)


@pytest.fixture
def term(tmp_path):
    need_tmux()
    opened: list[Terminal] = []

    def open_(argv: list[str], *, env: dict[str, str] | None = None, width: int = 80, height: int = 40,
              cwd: Path | None = None) -> Terminal:
        bin_dir = os.path.dirname(sys.executable)  # `python` on the nodes: this venv's, with torch
        base = {"GPUCLUSTER_HOME": str(tmp_path / "home"), "PATH": f"{bin_dir}:{os.environ.get('PATH', '')}",
                "TERM": "xterm-256color", "PYTHONPATH": str(ROOT)}
        t = Terminal(argv, env={**base, **(env or {})}, cwd=str(cwd or tmp_path), width=width, height=height)
        opened.append(t)
        return t

    yield open_
    for t in opened:
        t.close()


def _gpucluster(*args: str) -> list[str]:
    return [sys.executable, "-m", "gpucluster.cli.main", *args]


def _clock(screen: str) -> tuple[str, int] | None:
    """(phase, seconds) of the status line at the bottom of the screen."""
    found = list(STATUS.finditer(screen))
    if not found:
        return None
    m = found[-1]
    secs = int(m.group(2)) if m.group(2) is not None else int(m.group(3)) * 60 + int(m.group(4))
    return m.group(1), secs


def test_the_status_clock_ticks_while_the_job_prints_nothing(term, tmp_path):
    (tmp_path / "quiet.py").write_text("import time\nprint('started', flush=True)\ntime.sleep(12)\n")
    t = term(_gpucluster("run", "--cloud", "local", "--nodes", "1", "--", "python", "quiet.py"))
    t.wait_for(r"\[node 0\] started", timeout=120)
    first = _clock(t.screen())
    lines_before = [ln for ln in t.lines() if ln.startswith("[node")]
    time.sleep(2.5)
    second = _clock(t.screen())
    assert first and second, t.screen()
    assert first[0] == second[0] == "train"
    assert second[1] - first[1] >= 2, (first, second)  # it moved with no event in between
    assert [ln for ln in t.lines() if ln.startswith("[node")] == lines_before  # nothing was printed meanwhile
    assert t.exit_code(timeout=120) == 0


def test_ctrl_c_prints_one_stopping_line_and_keeps_the_tracebacks_in_the_node_logs(term, tmp_path):
    (tmp_path / "long.py").write_text("import time\nprint('started', flush=True)\ntime.sleep(120)\n")
    t = term(_gpucluster("run", "--cloud", "local", "--nodes", "2", "--", "python", "long.py"), height=60)
    t.wait_for(r"\[node 1\] started", timeout=120)
    t.wait_for(r"\[node 0\] started", timeout=30)
    t.send("C-c")
    assert t.exit_code(timeout=120) == 130
    screen = t.screen(history=True)
    lines = [ln for ln in screen.splitlines() if ln.strip()]
    stopping = [ln for ln in lines if ln.startswith("stopping:")]
    assert len(stopping) == 1, screen
    assert stopping[0].startswith("stopping: Ctrl-C: stopping the job and tearing down; press Ctrl-C again")
    assert "Traceback" not in screen and "SignalException" not in screen, screen
    assert "INTERRUPTED" in screen and "teardown: verified" in screen
    run_id = re.search(r"run (r\d{8}-\d{6}-[0-9a-f]{6}) INTERRUPTED", screen).group(1)
    logs = (tmp_path / "home" / "runs" / run_id)
    both = (logs / "node-0.log").read_text() + (logs / "node-1.log").read_text()
    assert "Traceback" in both  # what the stopped torchrun printed is kept, in the node logs
    # fewer lines than the ~180 the tracebacks made (the plan, the report and its tables)
    assert len(lines) < 60, len(lines)


def test_a_second_ctrl_c_says_what_the_stopping_waits_for_and_changes_nothing(term, tmp_path):
    (tmp_path / "stubborn.py").write_text(
        "import signal, time\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\nprint('started', flush=True)\n"
        "time.sleep(120)\n")
    t = term(_gpucluster("run", "--cloud", "local", "--nodes", "1", "--", "python", "stubborn.py"), height=60)
    t.wait_for(r"\[node 0\] started", timeout=120)
    t.send("C-c")
    t.wait_for(r"^stopping: Ctrl-C", timeout=30)
    time.sleep(0.5)
    t.send("C-c")
    assert t.exit_code(timeout=120) == 130
    screen = t.screen(history=True)
    assert len(re.findall(r"^stopping:", screen, re.M)) == 1
    assert re.search(r"^Ctrl-C: still stopping \(bounded; it cannot be cut short\): \w+ ", screen, re.M), screen
    assert "teardown: verified" in screen


def test_provisioning_shows_resources_done_planned_and_in_flight(term, tmp_path):
    """`up` on aws with the FAKE Pulumi CLI whose resource steps take 1.5 s each (tests/kept_cli.py):
    the status line says what is created, of the planned fleet (all nodes in one), and what is in flight."""
    pytest.importorskip("pulumi.automation")
    outputs = tmp_path / "outputs.json"
    outputs.write_text(json.dumps({
        "cluster_name": "slowup", "instance_ids": ["i-0a", "i-0b"], "private_ips": ["10.0.0.1", "10.0.0.2"],
        "public_ips": ["203.0.113.1", "203.0.113.2"], "host_public_keys": ["ssh-ed25519 AAAA1", "ssh-ed25519 AAAA2"],
        "ssh_user": "ubuntu", "ssh_private_key": "KEY", "region": "us-east-1", "availability_zone": "us-east-1a",
        "instance_type": "g5.xlarge", "gpus_per_node": 1}))
    env = {"FAKE_PULUMI_STATE": str(tmp_path / "state.json"), "FAKE_PULUMI_OUTPUTS": str(outputs),
           "FAKE_PULUMI_STEP_S": "1.5"}
    t = term([sys.executable, str(HERE / "kept_cli.py"), "up", "--cloud", "aws", "--name", "slowup", "--nodes", "2",
              "--instance-type", "g5.xlarge", "--region", "us-east-1", "--ssh-cidr", "203.0.113.7/32", "--yes"],
             env=env, width=120)
    m = t.wait_for(rf"^ provision{CLOCK}(\d+) created, (\d+) in flight, fleet (\d) of 1; slowest: \S+ \S+ "
                   r"\((\d+)s\)", timeout=120, history=False)
    seen = {m.group(0)}
    while not re.search(r"fleet 1 of 1", "\n".join(seen)) and "hourly cost" not in t.screen(True):
        time.sleep(0.2)
        found = re.search(r"^ provision\s.*$", t.screen(), re.M)
        if found:
            seen.add(found.group(0))
    assert t.exit_code(timeout=120) == 0, t.screen(True)
    counts = sorted({int(re.search(r"(\d+) created", s).group(1)) for s in seen if "created" in s})
    assert len(counts) >= 3, seen  # the count went up while it ran, not all at once at the end
    # down: the teardown's status line says what is deleted of what was open
    d = term([sys.executable, str(HERE / "kept_cli.py"), "down", "slowup", "--yes"], env=env, width=120)
    m = d.wait_for(rf"^ teardown{CLOCK}(\d+) of (\d+) deleted; waiting on: ", timeout=120, history=False)
    assert int(m.group(2)) >= 2
    assert d.exit_code(timeout=120) == 0, d.screen(True)


def _seed(home: Path) -> tuple[list[str], list[str]]:
    """Runs with long cluster names, a kept cluster (open rows), and costs, as the ledger holds them."""
    from gpucluster.ledger.store import Ledger

    led = Ledger(home / "ledger.sqlite3")
    ids, clusters = [], []
    for i, name in enumerate(["team-vision-resnet50-ablation", "nlp-finetune-llama-lora-sweep", "k"]):
        rid = f"r20261126-00{i}000-abcde{i}"
        led.create_run(rid, cloud="local", cluster=name, nodes=4, gpus_per_node=0,
                       command=["python", "a_rather_long_training_script_name.py"],
                       spec={"cloud": "local", "nodes": 4, "name": name}, workload="a_rather_long_training_script_name.py",
                       now=1795650000.0 + i * 100)
        led.resource_requested(rid, "process", "node-0", now=1795650000.0 + i * 100)
        if i < 2:
            led.finish_run(rid, status="succeeded", exit_code=0, teardown="kept" if i == 0 else "verified",
                           now=1795650060.0 + i * 100)
        if i == 1:  # torn down: nothing of it is open
            led.resource_deleted(rid, "process", "node-0", now=1795650070.0 + i * 100)
        ids.append(rid)
        clusters.append(name)
    return ids, clusters


@pytest.mark.parametrize("command", [("runs",), ("cost", "report"), ("status",)])
def test_ids_and_cluster_names_are_whole_at_80_columns(term, tmp_path, command):
    home = tmp_path / "home"
    home.mkdir()
    ids, clusters = _seed(home)
    t = term(_gpucluster(*command), width=80, height=60)
    assert t.exit_code(timeout=60) == 0, t.screen(True)
    screen = t.screen(history=True)
    lines = screen.splitlines()
    assert all(len(ln) <= 80 for ln in lines)
    # every value the user types next is on one line, whole
    if command == ("status",):
        want = [clusters[0], clusters[2]]  # the clusters that may still exist
    else:
        want = ids + clusters
    for value in want:
        assert any(value in ln for ln in lines), (value, screen)
    assert "r202…" not in screen and "…" not in "".join(ln for ln in lines if "r2026" in ln)
