"""Loss and accuracy read from an unmodified script's printed lines (issue 28 item 8): the common
`key=value` / `key: value` forms become `text_metric` records (checked, marked `source: text`),
bounded (one line a second per node reaches the supervisor, at most the last 4 KiB of a line is
read), never an internal error, and `result:` shows them when the job reported no metric records.

Line forms, as the tools print them:
- PyTorch Lightning's progress bar (TQDMProgressBar: the bar, then `v_num` and the logged metrics
  as `name=value` after the rate, e.g. "Epoch 1: 100%|...| 938/938 [00:10<00:00, 90.1it/s, v_num=0,
  train_loss=0.310, val_acc=0.910]"; Lightning docs, "Customize the progress bar").
- Keras' fit() epoch line: "938/938 - 3s - loss: 0.3120 - accuracy: 0.9120 - val_loss: ..." (Keras
  docs, Model.fit verbose=2).
- Hand-written: "Epoch 3 | loss 0.21 | acc 91.2%", "loss=0.31", "loss: 0.3120"."""

from __future__ import annotations

import math
import os
import random
import subprocess
import sys
import textwrap

import pytest
from rich.console import Console

from gpucluster.cli.render import run_report
from gpucluster.events import NullEvents
from gpucluster.watch.launch import JobSpec
from gpucluster.ledger.store import Ledger
from gpucluster.watch.metrics import MetricsState, check_record
from gpucluster.watch.supervisor import NodeSupervisor
from gpucluster.watch.text_metrics import TEXT_KIND, TextScan, text_record

pytestmark = pytest.mark.unit  # the test tier (tests/conftest.py, docs/testing.md)

FORMS = [
    ("loss=0.31", {"loss": 0.31}),
    ("loss: 0.3120", {"loss": 0.312}),
    ("Epoch 3 | loss 0.21 | acc 91.2%", {"loss": 0.21, "accuracy": 0.912, "epoch": 3}),
    ("Epoch 1: 100%|##########| 938/938 [00:10<00:00, 90.12it/s, v_num=0, train_loss=0.310, val_acc=0.910]",
     {"loss": 0.31, "accuracy": 0.91, "loss_name": "train_loss", "accuracy_name": "val_acc", "epoch": 1}),
    ("Epoch 0:  40%|####      | 4/10 [00:01<00:02, 2.9it/s, loss=0.31, v_num=0]", {"loss": 0.31}),
    ("val_acc=0.91", {"accuracy": 0.91}),
    ("938/938 - 3s - loss: 0.3120 - accuracy: 0.9120 - val_loss: 0.2 - val_accuracy: 0.9500",
     {"loss": 0.312, "accuracy": 0.95, "accuracy_name": "val_accuracy"}),
    ("[CPU0] Epoch 4 | loss 0.2312", {"loss": 0.2312, "epoch": 4}),
    ("Train Epoch: 2 [0/60000 (0%)]\tLoss: 2.300000", {"loss": 2.3, "epoch": 2}),  # the PyTorch MNIST example
    ("Test set: Average loss: 0.0335, Accuracy: 9889/10000 (99%)", {"loss": 0.0335}),
    ("step 10 loss nan", {"loss": math.nan}),
    ("\rEpoch 2: 50% loss=0.5\rEpoch 2: 60% loss=0.4\r", {"loss": 0.4, "epoch": 2}),  # a bar redrawn in place
]

NOT_METRICS = [
    "[GPU0] Epoch 0 | Batchsize: 32 | Steps: 64",  # the DDP tutorial prints no loss
    "Loss function: CrossEntropyLoss",
    "loss_scale=1024",
    "acc@1 76.1",
    "accuracy 250",  # neither a fraction nor a percentage
    "accuracy=-0.2",
    "xloss=1.0",
    "@gpucluster-metric " + '{"kind": "epoch", "loss": 0.5}',  # the protocol's own lines are not text
    "",
]


@pytest.mark.parametrize("line,want", FORMS)
def test_common_forms_become_checked_text_records(line, want):
    rec = text_record(line)
    assert rec is not None and rec["kind"] == TEXT_KIND and rec["source"] == "text"
    assert check_record(rec) is None
    for key, value in want.items():
        if isinstance(value, float) and math.isnan(value):
            assert math.isnan(rec[key])
        elif isinstance(value, float):
            assert rec[key] == pytest.approx(value)
        else:
            assert rec[key] == value


@pytest.mark.parametrize("line", NOT_METRICS)
def test_lines_without_a_named_value_are_not_metrics(line):
    if line.startswith("@gpucluster-metric"):
        assert TextScan(every=0).lines(line.encode() + b"\n") == []
    else:
        assert text_record(line) is None


def test_junk_never_raises_and_whatever_is_read_passes_the_checks():
    rnd = random.Random(28)
    alphabet = "loss acc accuracy val_ train_ = : % . - + e E 0 1 9 nan inf \r \t | , [ ] \x00 \xff é 1e999 ".split(" ")
    for _ in range(3000):
        line = "".join(rnd.choice(alphabet) for _ in range(rnd.randint(0, 60)))
        rec = text_record(line)
        assert rec is None or check_record(rec) is None
    # a huge line without a newline: only its end is read
    assert text_record("x" * 10_000_000 + " loss=0.5")["loss"] == 0.5
    assert text_record("loss=0.5 " + "x" * 10_000) is None


def test_a_node_hands_over_at_most_one_line_a_second_and_its_last_at_the_end():
    now = [0.0]
    scan = TextScan(every=1.0, clock=lambda: now[0])
    handed = []
    for i in range(5000):  # a script printing its loss every step, 5000 steps in 2.5 s
        now[0] = i * 0.0005
        handed += scan.lines(f"step {i} loss={1 / (i + 1):.6f}\n".encode())
    handed += scan.close()
    assert 3 <= len(handed) <= 5
    assert handed[-1] == "step 4999 loss=0.000200"
    # framework start lines pass (bounded), a read without "loss"/"acc" is never split
    assert scan.lines(b"[rank: 1] Initializing distributed: GLOBAL_RANK: 1, MEMBER: 2/2\n") == \
        ["[rank: 1] Initializing distributed: GLOBAL_RANK: 1, MEMBER: 2/2"]
    assert scan.lines(b"epoch 3 done\n" * 1000) == []


class Events(NullEvents):
    def __init__(self):
        self.metrics: list[tuple[int, dict]] = []

    def on_metric(self, node_rank, record):
        self.metrics.append((node_rank, record))


SCRIPT = textwrap.dedent("""
    import os, sys
    r = int(os.environ["RANK"])
    print(f"[rank: {r}] Initializing distributed: GLOBAL_RANK: {r}, MEMBER: {r + 1}/2", flush=True)
    for step in range(20000):
        print(f"rank {r} step {step} loss={1 / (step + 1):.6f}")
    print(f"Epoch 4 | loss {0.1 + r:.4f} | acc {90 + r}.5%", flush=True)
    print("done", flush=True)
""")


def test_an_unmodified_scripts_printed_figures_reach_the_summary_and_result(tmp_path):
    """Real child processes through the real NodeSupervisor: 20,000 loss lines per node reach the
    supervisor as a handful of records; the summary takes node 0's last printed figures; the
    Lightning start line gives the world size; nothing asks a final record of the script."""
    events = Events()
    sup = NodeSupervisor(JobSpec("t", command=("x",)), events, tmp_path, ["n0", "n1"])
    procs = {}
    for rank in (0, 1):
        procs[rank] = subprocess.Popen([sys.executable, "-c", SCRIPT], stdout=subprocess.PIPE,
                                       stderr=subprocess.STDOUT, env=dict(os.environ, RANK=str(rank)))
        sup.attach(rank, procs[rank].stdout)
    result = sup.run(procs, stop=lambda: None)
    assert result.ok, result.failure
    texts = [(n, r) for n, r in events.metrics if r["kind"] == TEXT_KIND]
    assert 2 <= len(texts) <= 2 * 12, len(texts)
    summary = result.metrics.summary()
    assert summary["metrics_source"] == "text" and summary["text_node"] == 0
    assert summary["loss"] == pytest.approx(0.1) and summary["accuracy"] == pytest.approx(0.905)
    assert summary["world_size"] == 2

    ledger = Ledger(tmp_path / "l.db")
    ledger.create_run("r1", cloud="local", cluster="c", nodes=2, gpus_per_node=0, command=["python", "t.py"],
                      spec={}, workload=None)
    ledger.finish_run("r1", status="succeeded", exit_code=0, metrics=summary)
    con = Console(record=True, width=200)
    run_report(con, ledger.get_run("r1"))
    text = con.export_text()
    assert "result: loss 0.1000, acc 90.50%, world size 2, as node 0 last printed 'loss' and 'acc'" in text


def test_a_script_that_reports_metric_records_keeps_them():
    state = MetricsState(launched_world=2)
    state.update(text_record("loss=0.9 acc=0.1"), 0)
    state.update({"kind": "epoch", "epoch": 1, "loss": 0.2, "accuracy": 0.8}, 0)
    summary = state.summary()
    assert summary["loss"] == 0.2 and summary["accuracy"] == 0.8 and "metrics_source" not in summary


def test_the_status_line_shows_a_scripts_printed_loss():
    """README: on a terminal the status line shows the phase, epoch/step, loss and accuracy; for a
    user's script whose loss is read from its printed lines it showed the phase only (issue 46 item 9)."""
    from rich.console import Console

    from gpucluster.cli.render import RichRunUI
    from gpucluster.watch.text_metrics import text_record

    ui = RichRunUI(Console(record=True, width=200))
    ui.phase("train")
    ui.metric(0, text_record("Epoch 3 | loss 0.2100 | acc 91.2%"))
    ui.metric(1, text_record("Epoch 3 | loss 9.9 | acc 1%"))  # node 0's, as the result: line
    status = ui._status().plain
    assert "epoch 3" in status and "loss 0.2100" in status and "acc 91.20%" in status, status
