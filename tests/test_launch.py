"""The torchrun command line, program arguments, env contract, metrics parsing, root causes."""

import io
import json

import pytest

from gpucluster.watch.launch import JobSpec, node_env, program_args, torchrun_argv
from gpucluster.ledger.node_output import root_cause, worker_lines
from gpucluster.watch.metrics import MetricsState, parse_line
from gpucluster.workloads.protocol import PREFIX, emit

pytestmark = pytest.mark.unit  # the test tier (tests/conftest.py, docs/testing.md)


def test_program_args_variants():
    assert program_args(JobSpec("r", workload="digits", workload_args=("--epochs", "2"))) == [
        "-m", "gpucluster.workloads.digits", "--epochs", "2"]
    assert program_args(JobSpec("r", workload="mnist"), workload_dir="/tmp/w/") == ["/tmp/w/mnist.py"]
    assert program_args(JobSpec("r", command=("python", "train.py", "--lr", "1"))) == ["train.py", "--lr", "1"]
    assert program_args(JobSpec("r", command=("python3.11", "-m", "pkg.train", "-x"))) == ["-m", "pkg.train", "-x"]
    assert program_args(JobSpec("r", command=("python", "-u", "t.py"))) == ["--no-python", "python", "-u", "t.py"]
    assert program_args(JobSpec("r", command=("./run.sh", "a"))) == ["--no-python", "./run.sh", "a"]


def test_torchrun_argv_is_a_c10d_rendezvous_on_the_head():
    job = JobSpec("r123", workload="digits", nproc_per_node=4, rdzv_port=29500)
    head = torchrun_argv(job, python="py", nnodes=3, node_rank=0, rdzv_host="10.0.0.5", local_addr="10.0.0.5",
                         program=["-m", "x"])
    other = torchrun_argv(job, python="py", nnodes=3, node_rank=2, rdzv_host="10.0.0.5", local_addr="10.0.0.7",
                          program=["-m", "x"])
    assert head[:3] == ["py", "-m", "torch.distributed.run"]
    for argv in (head, other):
        assert "--nnodes=3" in argv and "--nproc-per-node=4" in argv and "--rdzv-backend=c10d" in argv
        assert "--rdzv-endpoint=10.0.0.5:29500" in argv and "--rdzv-id=r123" in argv
        assert "--max-restarts=0" in argv
        assert argv[-2:] == ["-m", "x"]
    assert any(a.startswith("--rdzv-conf=is_host=true") for a in head)
    assert any(a.startswith("--rdzv-conf=is_host=false") for a in other)
    assert "--local-addr=10.0.0.7" in other


def test_node_env_contract():
    env = node_env(JobSpec("r9", threads_per_proc=2, env=(("X", "1"),)), node_rank=1,
                   node_ips=["10.0.0.1", "10.0.0.2"], gpus_per_node=4)
    assert env["GPUCLUSTER_RUN_ID"] == "r9"
    assert env["GPUCLUSTER_NODE_RANK"] == "1"
    assert env["GPUCLUSTER_NUM_NODES"] == "2"
    assert env["GPUCLUSTER_NODE_IPS"] == "10.0.0.1,10.0.0.2"
    assert env["GPUCLUSTER_GPUS_PER_NODE"] == "4"
    assert env["OMP_NUM_THREADS"] == "2" and env["X"] == "1"


def test_metrics_roundtrip_and_state():
    buf = io.StringIO()
    emit("epoch", stream=buf, rank=0, epoch=1, step=10, loss=0.5, accuracy=0.9, samples_per_s=100.0)
    emit("final", stream=buf, rank=1, loss=0.4)
    lines = buf.getvalue().splitlines()
    assert all(ln.startswith(PREFIX) for ln in lines)
    state = MetricsState()
    for ln in lines:
        state.update(parse_line("[default0]:" + ln))  # torchrun may prefix lines
    assert state.epoch == 1 and state.loss == 0.5 and state.accuracy == 0.9
    assert set(state.finals) == {1}
    assert parse_line("plain log line") is None
    assert parse_line(PREFIX + "{not json") is None
    assert parse_line(PREFIX + json.dumps([1, 2])) is None


def test_worker_lines_and_root_cause():
    lines = [
        "rank 1 crashing",
        "E1122 03:19:10.237000 17925 torch/distributed/elastic/multiprocessing/api.py:1002] failed (exitcode: 3) local_rank: 0",
        "Traceback (most recent call last):",
        "  rank      : 1 (local_rank: 0)",
        "  exitcode  : 3 (pid: 18702) ",
    ]
    assert worker_lines(lines) == ["rank 1 crashing"]
    assert root_cause(lines) == "worker rank 1 exit code 3"
    assert root_cause(["nothing"]) is None


def test_the_workers_own_last_exception_is_named_not_torchruns():
    """Issue 45 item 13: a rank failing on a full --output folder was said as "exited with code 1"
    only; ENOSPC was in the node log. Torchrun's own ChildFailedError report after it is not the cause."""
    from gpucluster.ledger.node_output import last_error

    lines = [
        "epoch 1 done",
        "Traceback (most recent call last):",
        '  File "train.py", line 9, in <module>',
        "OSError: [Errno 28] No space left on device: '/out/model.pt'",
        "E1122 03:19:10.237000 17925 torch/distributed/elastic/multiprocessing/api.py:1002] failed (exitcode: 1) local_rank: 0",
        "Traceback (most recent call last):",
        "torch.distributed.elastic.multiprocessing.errors.ChildFailedError: ",
    ]
    assert last_error(lines) == "OSError: [Errno 28] No space left on device: '/out/model.pt'"
    assert last_error(["[rank0]: RuntimeError: CUDA error: out of memory"]) == "RuntimeError: CUDA error: out of memory"
    assert last_error(["epoch 1", "Errors: 0 of 10 samples bad"]) is None  # a line that merely mentions errors


def test_a_signal_death_says_what_the_signal_means_and_never_complete_for_a_kill():
    """Issue 46 item 1: a SIGKILL mid-training (the out-of-memory killer's signal) was reported as
    "its work may be complete". Only SIGABRT after a last line that says the script finished is."""
    from gpucluster.watch.supervisor import signal_note

    agent = ("E1122 03:19:10.237000 17925 torch/distributed/elastic/multiprocessing/api.py:1002] failed "
             "(exitcode: -9) local_rank: 0")

    def died(last: str, sig: int) -> str:
        return signal_note([last, agent, "Root Cause (first observed failure):", f"  exitcode  : -{sig} (pid: 7)"])

    killed = died("epoch 110 loss 0.31", 9)
    assert killed == ("; worker ended with SIGKILL: killed, e.g. by the out-of-memory killer (`dmesg` on the node says "
                      "which process and why)")
    assert "may be complete" not in died("rank 1 all work done", 9)  # a kill is never "complete"
    assert died("rank 1 all work done", 6) == "; worker ended with SIGABRT after its last line; its work may be complete"
    assert died("epoch 3 loss 0.2", 6) == "; worker ended with SIGABRT"  # mid-training: nothing says it finished
    assert died("saving", 11).startswith("; worker ended with SIGSEGV: a crash in native code")
