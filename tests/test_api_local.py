"""Issue 47, items 1, 3 and 4: the Python API end to end on the local backend (real torchrun agents):
a run and its typed record, `on_event=` and `notify=` against a webhook on loopback, `logs(follow=True)`
while a run is live, Ctrl-C in the caller (teardown runs, then KeyboardInterrupt), and the CLI's
`--notify`. Small jobs (a print, a short sleep): each test takes seconds."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time

import pytest

from conftest import ROOT, needs_torch, run_cli
from test_notify import hook  # noqa: F401 - the fixture: a webhook on loopback

pytestmark = [needs_torch, pytest.mark.slow]

SAY = [sys.executable, "-c", "print('hello from', __import__('os').environ['RANK'])"]


def test_a_run_returns_its_typed_record_and_tells_on_event_and_the_webhook(home, hook):  # noqa: F811
    import gpucluster

    seen, said = [], []
    record = gpucluster.run(SAY, nodes=2, on_event=seen.append, notify=[hook.url], progress=said.append,
                            env={"GREETING": "hi"})
    assert record.status == "succeeded" and record.teardown == "verified" and record.exit_code == 0
    assert record.cost["total"] is not None and len(record.nodes) == 2
    assert [o.verdict for o in record.outputs] == ["complete", "complete"]
    assert "phase: train" in said and "phase: teardown" in said
    assert [e.kind for e in seen] == ["succeeded"] and seen[0].run_id == record.id
    [body] = hook.bodies
    assert body["run_id"] == record.id and body["kind"] == "succeeded" and body["verdict"] == "verified"
    assert body["text"] == seen[0].text
    assert sorted(gpucluster.logs(record.id)) == ["hello from 0", "hello from 1"]
    assert gpucluster.runs(limit=1)[0].id == record.id and gpucluster.show(record.id).teardown == "verified"


def test_a_failed_run_is_returned_and_its_event_says_so(home):
    import gpucluster

    seen = []
    record = gpucluster.run([sys.executable, "-c", "raise SystemExit(4)"], nodes=1, on_event=seen.append)
    assert record.status == "failed" and record.teardown == "verified" and record.exit_code == 1
    assert [e.kind for e in seen] == ["failed"] and "FAILED" in seen[0].text


def test_logs_follow_yields_the_lines_of_a_live_run_as_they_come(home):
    import gpucluster

    job = [sys.executable, "-u", "-c", "import time\nfor i in range(3):\n    print('tick', i, flush=True)\n"
           "    time.sleep(0.7)\n"]
    done: dict = {}
    runner = threading.Thread(target=lambda: done.setdefault("record", gpucluster.run(job, nodes=1)))
    runner.start()  # (outside the main thread the run takes no signal handlers: the test's Ctrl-C is its own)
    deadline = time.monotonic() + 30
    while not gpucluster.runs() and time.monotonic() < deadline:
        time.sleep(0.1)
    run_id = gpucluster.runs()[0].id
    got, when = [], []
    for line in gpucluster.logs(run_id, follow=True):
        got.append(line)
        when.append(done.get("record") is None)  # read while the run was still going
    runner.join(30)
    assert got == ["tick 0", "tick 1", "tick 2"]
    assert when[0], "the first line came only after the run had ended"
    assert done["record"].status == "succeeded"


def test_ctrl_c_in_the_caller_tears_down_then_raises(home):
    code = ("import gpucluster, sys\n"
            "try:\n"
            "    gpucluster.run([sys.executable, '-c', 'import time; print(\"up\", flush=True); time.sleep(60)'],"
            " nodes=2)\n"
            "except KeyboardInterrupt as exc:\n"
            "    print('INTERRUPTED', exc, flush=True)\n")
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            cwd=ROOT, env=dict(os.environ))
    from gpucluster.ledger.store import Ledger

    deadline = time.monotonic() + 40
    while time.monotonic() < deadline:
        runs = Ledger(home / "ledger.sqlite3").list_runs() if (home / "ledger.sqlite3").exists() else []
        logs = [p for r in runs for p in (home / "runs" / str(r.id)).rglob("node-*.log")] if runs else []
        if any("up" in p.read_text() for p in logs):
            break
        time.sleep(0.2)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=60)
    assert "INTERRUPTED" in out, err[-2000:]
    [run] = Ledger(home / "ledger.sqlite3").list_runs()
    assert run.status == "interrupted" and run.teardown == "verified"
    assert "teardown: verified" in out


def test_the_cli_notify_flag_posts_the_same_event(home, hook):  # noqa: F811
    r = run_cli("run", "--cloud", "local", "--nodes", "1", "--notify", hook.url, "--json", "--", *SAY)
    assert r.returncode == 0, r.stderr[-2000:]
    record = json.loads(r.stdout)
    [body] = hook.bodies
    assert body["run_id"] == record["id"] and body["status"] == "succeeded" and body["cost"] is not None
    bad = run_cli("run", "--cloud", "local", "--notify", "nope", "--", *SAY)
    assert bad.returncode == 2 and "--notify 'nope' is not allowed" in bad.stderr
