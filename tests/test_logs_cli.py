"""`gpucluster logs`: --tail, --follow waiting for node logs that appear later (a cloud run still
provisioning) and ending with the run, metric lines summarised (--raw keeps them)."""

from __future__ import annotations

import json
import threading
import time

import pytest

from gpucluster.cli import logs
from gpucluster.ledger.store import Ledger
from gpucluster.lifecycle.owner import owner_lock

pytestmark = pytest.mark.unit  # the test tier (tests/conftest.py, docs/testing.md)

RID = "r20261126-000000-aaaaaa"


def invoke(*args):
    return logs.logs.main(list(args), prog_name="gpucluster logs", standalone_mode=False)


def metric(**fields) -> str:
    return "@gpucluster-metric " + json.dumps({"time": 1795650000.0, **fields})


def _run(tmp_path, nodes=2, running=False):
    led = Ledger.open_default()
    log_dir = tmp_path / "runs" / RID
    led.create_run(RID, cloud="aws", cluster="c1", nodes=nodes, gpus_per_node=1, command=["x"],
                   spec={"cloud": "aws", "nodes": nodes}, log_dir=str(log_dir))
    if not running:
        led.finish_run(RID, status="succeeded", exit_code=0)
    return led, log_dir


def test_tail_and_metric_summaries(home, tmp_path, capsys):
    led, log_dir = _run(tmp_path)
    log_dir.mkdir(parents=True)
    lines = [f"line {i}" for i in range(10)] + [
        metric(kind="epoch", epoch=1, step=40, loss=0.31204, accuracy=0.912),
        metric(kind="util", node_rank=0, gpu=[], cpu_percent=40.0),
        "done",
        # the node supervisor's own record (internal, with its control key): hidden (issue 46 item 9)
        metric(kind="reaper_done", stopped=0, survived=0, key="1425356c4b2ffcb2a667dee2dfcfaa6c")]
    (log_dir / "node-0.log").write_text("\n".join(lines) + "\n")
    (log_dir / "node-1.log").write_text("only line\n")
    assert invoke(RID, "--tail", "3") == 0
    out = capsys.readouterr().out.splitlines()
    # the sampler's record is hidden (it does not count towards the tail), the epoch record summarised
    assert out == ["[node 0] line 9", "[node 0] epoch  epoch 1  step 40  loss 0.3120  acc 91.20%", "[node 0] done",
                   "[node 1] only line"]
    assert invoke(RID, "--node", "0", "--tail", "3", "--metrics") == 0
    assert capsys.readouterr().out.splitlines() == ["util  cpu 40%", "done", "reaper_done  stopped 0  survived 0"]
    assert invoke(RID, "--node", "0", "--tail", "4", "--raw") == 0
    raw = capsys.readouterr().out.splitlines()
    assert raw[0].startswith("@gpucluster-metric {") and json.loads(raw[0].split(" ", 1)[1])["kind"] == "epoch"
    assert invoke(RID, "--tail", "0") == 0 and capsys.readouterr().out == ""


def test_follow_waits_for_logs_that_appear_later_and_ends_with_the_run(home, tmp_path, capsys):
    led, log_dir = _run(tmp_path, running=True)

    def later():
        time.sleep(1.0)  # the nodes are still being provisioned: no log folder yet
        log_dir.mkdir(parents=True)
        (log_dir / "node-1.log").write_text("worker up\n")
        time.sleep(0.8)
        (log_dir / "node-0.log").write_text("head up\n" + metric(kind="final", rank=0, accuracy=0.95) + "\n")
        time.sleep(0.8)
        with open(log_dir / "node-1.log", "a") as fh:
            fh.write("worker done\n")
        Ledger.open_default().finish_run(RID, status="succeeded", exit_code=0)

    t = threading.Thread(target=later)
    start = time.monotonic()
    with owner_lock("c1", "run", run_id=RID):  # the run's live owner
        t.start()
        assert invoke(RID, "--follow") == 0
    t.join()
    took = time.monotonic() - start
    captured = capsys.readouterr()
    assert "no node log yet" in captured.err
    out = captured.out.splitlines()
    assert "[node 1] worker up" in out and "[node 1] worker done" in out and "[node 0] head up" in out
    assert "[node 0] final  acc 95.00%  rank 0" in out
    assert 2.4 < took < 15


def test_without_follow_a_run_with_no_logs_yet_says_so(home, tmp_path, capsys):
    _run(tmp_path, running=True)
    assert invoke(RID) == 0
    assert "has no node logs" in capsys.readouterr().err


def test_follow_keeps_every_line_after_bytes_that_are_not_utf8(home, tmp_path, capsys):
    """Issue 45 item 8: the offset counted the re-encoded text (each bad byte became a 3-byte U+FFFD),
    so after a line with bytes that are not UTF-8 the next read began past the next lines: 28 of 60
    lines shown, exit 0."""
    led, log_dir = _run(tmp_path, nodes=1, running=True)
    log_dir.mkdir(parents=True)
    log = log_dir / "node-0.log"
    log.write_bytes(b"".join(b"line %d \xff\xfe\x80 latin-1 caf\xe9\n" % i for i in range(30)))

    def later():
        time.sleep(0.8)
        with open(log, "ab") as fh:
            fh.write(b"".join(b"more %d \xe9\n" % i for i in range(30)))
        time.sleep(0.8)
        Ledger.open_default().finish_run(RID, status="succeeded", exit_code=0)

    t = threading.Thread(target=later)
    with owner_lock("c1", "run", run_id=RID):
        t.start()
        assert invoke(RID, "--follow") == 0
    t.join()
    out = capsys.readouterr().out.splitlines()
    assert [ln.split()[1] for ln in out] == [str(i) for i in range(30)] * 2
    assert out[0] == "line 0 \ufffd\ufffd\ufffd latin-1 caf\ufffd" and out[-1] == "more 29 \ufffd"
