"""Real local runs (issue 10 items 11, 15, 16): the rendezvous store kept by node 0's agent until
the launcher lets go (after every other agent, on every path; issue 31: no process of its own), a
clean console for a clean run, the train phase of a user script, and the ledger/`show --json` size
with a huge log line."""

import json
import os
import re
import socket
import subprocess
import sys
import threading
import time

import psutil
import pytest

from conftest import FIXTURES, ROOT, gpucluster_argv, needs_torch, run_cli
from gpucluster.watch.launch import JobSpec, agent_boot, torchrun_argv, announced_program
from gpucluster.ledger.node_output import TAIL_BYTES
from gpucluster.ledger.store import Ledger
from gpucluster.watch.procs import kill_run_processes, run_processes

pytestmark = pytest.mark.integration  # the test tier (tests/conftest.py, docs/testing.md)

NOISE = re.compile(r"recvVector|RendezvousConnectionError|frame #\d+|Exception raised from|Traceback \(most recent")


def only_run(home):
    ledger = Ledger(home / "ledger.sqlite3")
    runs = ledger.list_runs()
    assert len(runs) == 1
    return ledger.get_run(runs[0].id, with_metrics=True).to_dict()


def is_agent(cmd):
    """An agent's argv: `python -m torch.distributed.run` or the local launcher's `python -c BOOT`."""
    return (cmd[1:3] == ["-m", "torch.distributed.run"]
            or (cmd[1:2] == ["-c"] and len(cmd) > 2 and "torch.distributed.run" in cmd[2]))


def hosts_store(cmd):
    return cmd[1:2] == ["-c"] and "TCPStore(" in cmd[2]


class StoreWatch(threading.Thread):
    """Notes every agent of the watched runs while they go on: its argv, and the last sweep of the
    process table that found it alive (a sweep number, not a clock: within one sweep the processes
    are met one after another, so a clock would rank two agents alive together by their pids)."""

    def __init__(self):
        super().__init__(daemon=True)
        self.agents: dict[int, tuple[str, list[str]]] = {}
        self.last_seen: dict[int, int] = {}
        self.done = threading.Event()

    def run(self):
        sweep = 0
        while not self.done.is_set():
            sweep += 1
            for p in psutil.process_iter(["pid", "cmdline"]):
                cmd = p.info["cmdline"] or []
                try:
                    if is_agent(cmd) and p.status() != psutil.STATUS_ZOMBIE:
                        rid = p.environ().get("GPUCLUSTER_RUN_ID")
                        if rid:
                            self.agents[p.pid] = (rid, cmd)
                            self.last_seen[p.pid] = sweep
                except psutil.Error:
                    pass
            time.sleep(0.05)


def test_torchrun_argv_without_a_store_on_the_head_and_announcer_for_commands():
    job = JobSpec("r1", command=("python", "t.py"), rdzv_port=29501)
    argvs = [torchrun_argv(job, python="py", nnodes=2, node_rank=r, rdzv_host="127.0.0.1", local_addr=None,
                           program=["t.py", "--x"], store_on_head=False) for r in (0, 1)]
    for argv in argvs:
        assert any(a.startswith("--rdzv-conf=is_host=false") for a in argv)
        i = argv.index("--no-python")
        # the program's words as one JSON argument, after the name torchrun's failure summary shows
        assert argv[i + 1:i + 3] == ["py", "-c"] and argv[i + 4:] == ["t.py", '["t.py", "--x"]']
    # built-in workloads are not wrapped (they report "start" themselves), and the head still
    # hosts the store by default (ssh/k8s launchers)
    wl = torchrun_argv(JobSpec("r1", workload="digits"), python="py", nnodes=2, node_rank=0, rdzv_host="h",
                       local_addr=None, program=["-m", "x"])
    assert wl[-2:] == ["-m", "x"] and any(a.startswith("--rdzv-conf=is_host=true") for a in wl)
    assert wl[:3] == ["py", "-m", "torch.distributed.run"]
    # the local launcher's boot: the same torchrun options after `python -c BOOT`
    booted = torchrun_argv(JobSpec("r1", workload="digits"), python="py", nnodes=2, node_rank=0,
                           rdzv_host="h", local_addr=None, program=["-m", "x"], store_on_head=False,
                           boot=agent_boot(("127.0.0.1", 29501, 7)))
    assert booted[:2] == ["py", "-c"] and hosts_store(booted) and "os.read(7, 1)" in booted[2]

    def options(argv):
        return [a for a in argv[3:] if not a.startswith("--rdzv-conf")]

    assert options(booted) == options(wl)
    assert any(a.startswith("--rdzv-conf=is_host=false") for a in booted)
    assert not hosts_store(["py", "-c", agent_boot()])


def test_a_scripts_own_options_never_reach_torchruns_parser(tmp_path):
    """torchrun's argparse refuses an ambiguous abbreviation of its options anywhere on its command
    line, the script's arguments included (Python's argparse classifies every word before it assigns
    them: `torchrun t.py --log x` fails with "ambiguous option: --log could match --log-dir, ...")."""
    torch = pytest.importorskip("torch")  # noqa: F841 - torchrun itself parses the command line
    import subprocess

    script = tmp_path / "t.py"
    script.write_text("import sys; print('args', sys.argv[1:])\n")
    job = JobSpec("r1", command=("python", str(script)), rdzv_port=29501)
    words = [str(script), "--log", "x", "--node", "--local", "--s"]
    argv = torchrun_argv(job, python=sys.executable, nnodes=1, node_rank=0, rdzv_host="127.0.0.1",
                         local_addr=None, program=words)
    argv = [a for a in argv if not a.startswith(("--rdzv", "--nnodes"))]  # one node, its own store
    argv.insert(3, "--standalone")
    out = subprocess.run(argv, capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "args ['--log', 'x', '--node', '--local', '--s']" in out.stdout


@pytest.mark.parametrize("program,expect", [
    (["-c", "import os; print('argv', os.getpid())"], 0),
    (["--no-python", "sh", "-c", "echo argv $$; exit 7"], 7),
    (["--no-python", "/nonexistent/tool"], 127),
])
def test_announcer_reports_the_worker_then_execs_it_in_the_same_process(program, expect):
    argv = announced_program(sys.executable, program)[1:]  # what torchrun runs with --no-python
    p = subprocess.run(argv, capture_output=True, text=True, env=dict(os.environ, RANK="3", LOCAL_RANK="1"))
    assert p.returncode == expect, p.stderr
    first = p.stdout.splitlines()[0]
    record = json.loads(first.split("@gpucluster-metric ", 1)[1])
    assert record["kind"] == "worker_start" and record["rank"] == 3 and record["local_rank"] == 1
    if expect == 127:
        assert "cannot start '/nonexistent/tool'" in p.stderr
    else:  # exec: the user's program is the very process that announced itself
        assert p.stdout.splitlines()[1] == f"argv {record['pid']}"


def boot_agent(tmp_path, script_text, port):
    """`python -c agent_boot(store) ...`: a 1-node torchrun whose agent hosts the store; (Popen,
    write end of its hold)."""
    script = tmp_path / "job.py"
    script.write_text(script_text)
    r, w = os.pipe()
    job = JobSpec("boot1", command=None, workload="x", rdzv_port=port)
    argv = torchrun_argv(job, python=sys.executable, nnodes=1, node_rank=0, rdzv_host="127.0.0.1",
                         local_addr="127.0.0.1", program=[str(script)], store_on_head=False,
                         boot=agent_boot(("127.0.0.1", port, r)))
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=tmp_path,
                            pass_fds=(r,), env=dict(os.environ, OMP_NUM_THREADS="1"))
    os.close(r)
    return proc, w


@needs_torch
def test_the_store_agent_keeps_serving_after_its_job_until_released(tmp_path):
    """The agent that hosts the store outlives its own (successful) torchrun until the launcher
    lets go, and keeps serving the store meanwhile (what the other agents need while they shut
    down); then it exits 0. A plain agent (`python -m torch.distributed.run`, or the boot without
    the wait) exits as soon as its job has: this test fails on it."""
    from datetime import timedelta

    from torch.distributed import TCPStore

    from gpucluster.infra.local.launch import free_port

    port = free_port()
    marker = tmp_path / "job-done"
    proc, w = boot_agent(tmp_path, f"import os, pathlib\npathlib.Path({str(marker)!r}).touch()\nos._exit(0)\n", port)
    try:
        end = time.monotonic() + 120
        while not marker.exists() and proc.poll() is None and time.monotonic() < end:
            time.sleep(0.1)
        assert marker.exists(), proc.stdout.read() if proc.poll() is not None else "job did not run"
        # torchrun notices its worker's end within its monitor interval (0.5 s) and returns; the
        # agent must still be there, serving
        time.sleep(3)
        assert proc.poll() is None
        assert not [c for c in psutil.Process(proc.pid).children(recursive=True) if c.status() != psutil.STATUS_ZOMBIE]
        client = TCPStore("127.0.0.1", port, is_master=False, timeout=timedelta(seconds=10))
        client.set("late", "still here")
        assert client.get("late") == b"still here"
        del client
    finally:
        os.close(w)  # the launcher lets go (or dies: the kernel closes the write end the same way)
    assert proc.wait(30) == 0, proc.stdout.read()[-2000:]


@needs_torch
def test_the_store_agent_of_a_failed_job_leaves_at_once(tmp_path):
    """A failed torchrun is not held: its node must be seen failing while the launcher still
    holds the store (the run stops anyway), with torchrun's own exit code and failure report."""
    from gpucluster.infra.local.launch import free_port

    proc, w = boot_agent(tmp_path, "import os\nos._exit(3)\n", free_port())
    try:
        code = proc.wait(120)  # the write end is still open here
    finally:
        os.close(w)
    out = proc.stdout.read()
    assert code == 1, out[-2000:]  # torchrun's own code for a failed worker
    assert "ChildFailedError" in out and "exitcode  : 3" in out


@needs_torch
def test_a_store_port_taken_is_one_line_and_exit_1(tmp_path):
    from gpucluster.infra.local.launch import free_port

    port = free_port()
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", port))
        taken.listen()
        proc, w = boot_agent(tmp_path, "print('never runs')\n", port)
        try:
            out, _ = proc.communicate(timeout=120)
        finally:
            os.close(w)
    assert proc.returncode == 1
    assert f"rendezvous store: cannot listen on 127.0.0.1:{port}:" in out and "never runs" not in out
    assert "Traceback" not in out


@needs_torch
@pytest.mark.slow
@pytest.mark.parametrize("nodes", [2, 4])
def test_digits_multi_node_clean_console_and_no_store_left(home, nodes):
    """A real digits run on N local nodes: it learns, every rank trained its own shard, every
    phase and process is accounted for, the console carries no gloo/c10d noise, and the run's one
    rendezvous store, in node 0's agent, was the last agent to go."""
    watch = StoreWatch()
    watch.start()
    try:
        r = run_cli("run", "--cloud", "local", "--nodes", str(nodes), "--workload", "digits",
                    "--threads-per-proc", "1", "--json")
    finally:
        watch.done.set()
        watch.join()
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    record = json.loads(r.stdout)
    run = only_run(home)
    assert record["id"] == run["id"]
    noise = [ln for ln in (r.stdout + r.stderr).splitlines() if NOISE.search(ln)]
    assert noise == []
    # one agent hosted the store, and it was seen after every other agent had gone; every agent
    # only connected to it (other runs on this machine are ignored: matched by run id)
    agents = {pid: argv for pid, (rid, argv) in watch.agents.items() if rid == run["id"]}
    assert len(agents) == nodes
    assert all("--rdzv-conf=is_host=false,join_timeout=300" in argv for argv in agents.values())
    hosts = [pid for pid, argv in agents.items() if hosts_store(argv)]
    assert len(hosts) == 1
    assert all(watch.last_seen[hosts[0]] >= watch.last_seen[pid] for pid in agents)
    assert run_processes(run["id"]) == []  # this run only: other runs may share the machine
    assert run["status"] == "succeeded" and run["exit_code"] == 0 and run["teardown"] == "verified"
    assert run["leftovers"] == []
    assert run["metrics"]["accuracy"] >= 0.95
    assert run["metrics"]["world_size"] == nodes
    assert run["metrics"]["final_records"] == nodes
    assert [p["name"] for p in run["phases"]] == ["prepare", "provision", "ready", "rendezvous", "train", "outputs",
                                                 "teardown"]
    assert all(p["ended_at"] and p["status"] == "ok" for p in run["phases"])
    assert [n["exit_code"] for n in run["node_results"]] == [0] * nodes
    procs = [x for x in run["resources"] if x["kind"] == "process"]
    assert len(procs) == nodes and all(x["confirmed_gone"] for x in procs)
    finals = [m for m in run["metric_records"] if m["kind"] == "final"]
    assert sorted(m["rank"] for m in finals) == list(range(nodes))
    # Every rank trained its own shard: the samples seen add up to one epoch's worth per epoch.
    epochs = [m for m in run["metric_records"] if m["kind"] == "epoch"]
    assert len(epochs) == finals[0]["epochs"]
    per_rank = {m["samples_seen"] for m in finals}
    assert len(per_rank) == 1
    train_size = 1797 - 1797 // 5
    assert per_rank.pop() * nodes <= train_size * finals[0]["epochs"]
    # the run as `runs` and `show` give it (id prefix accepted)
    listed = json.loads(run_cli("runs", "--json").stdout)
    assert [x["id"] for x in listed] == [run["id"]]
    shown = json.loads(run_cli("show", run["id"][:12], "--json").stdout)
    assert shown["id"] == run["id"] and shown["metric_records"]
    text = run_cli("show", run["id"]).stdout
    assert "SUCCEEDED" in text and "teardown: verified" in text and "node-0" in text
    table = run_cli("runs").stdout
    assert run["id"] in table and "succeeded" in table


@needs_torch
@pytest.mark.slow
def test_user_script_failing_after_start_fails_in_train_not_rendezvous(home):
    r = run_cli("run", "--nodes", "2", "--", "python", str(FIXTURES / "fail_after_start.py"))
    assert r.returncode == 1, r.stdout[-3000:]
    run = only_run(home)
    phases = {p["name"]: p for p in run["phases"]}
    assert phases["rendezvous"]["status"] == "ok"
    assert phases["train"]["status"] == "failed" and "node 1" in phases["train"]["detail"]
    assert "node 1" in run["failure"]
    starts = Ledger(home / "ledger.sqlite3").metrics(run["id"], kind="worker_start")
    assert sorted(m["rank"] for m in starts) == [0, 1]
    assert "worker_start" not in r.stdout  # bookkeeping, not shown
    assert "failing after start on purpose" in r.stdout
    assert run_processes(run["id"]) == []  # this run only: other runs may share the machine


@needs_torch
@pytest.mark.slow
def test_store_hold_goes_when_gpucluster_is_killed(home):
    """gpucluster SIGKILLed mid-run: no teardown runs, the agents go on to the job's end, and the
    agent that hosts the store must not wait for a release that will never come: every process
    of the run ends by itself."""
    env = dict(os.environ, COLUMNS="200", STEPS="120")  # about 6 s of steps, then the job ends
    proc = subprocess.Popen(gpucluster_argv("run", "--nodes", "2", "--", "python", str(FIXTURES / "crashy_train.py")),
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, cwd=ROOT,
                            start_new_session=True)
    run_id = None
    try:
        for line in proc.stdout:  # global rank 0 prints the epochs, and c10d may place it on either node
            if line.startswith("[node ") and "epoch" in line:
                break
        run_id = Ledger(home / "ledger.sqlite3").list_runs()[0].id
        hosts = [p for p in psutil.process_iter(["cmdline"]) if hosts_store(p.info["cmdline"] or [])
                 and p.environ().get("GPUCLUSTER_RUN_ID") == run_id]
        assert len(hosts) == 1
        proc.kill()  # SIGKILL: no teardown runs; the hold ends with this process
        proc.wait(10)
        end = time.monotonic() + 90
        while run_processes(run_id) and time.monotonic() < end:
            time.sleep(0.2)
        assert run_processes(run_id) == []
    finally:
        if proc.poll() is None:
            proc.kill()
        if run_id:  # whatever is left is not this test's to leave behind
            kill_run_processes(run_id, grace=1.0)


@needs_torch
@pytest.mark.slow
def test_fast_printer_through_the_cli_ledger_and_show_stay_small(home):
    r = run_cli("run", "--nodes", "2", "--threads-per-proc", "1", "--", "python", str(FIXTURES / "spew.py"),
                env={"SPEW_MB": "10", "SPEW_HUGE_LINE_MB": "5"})
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    run = only_run(home)
    summaries = re.findall(r"\[node (\d)\] \.\.\. (\d+) lines not shown; full log: (\S+)", r.stdout)
    assert {s[0] for s in summaries} == {"0", "1"}
    for rank in (0, 1):
        log = os.path.join(run["log_dir"], f"node-{rank}.log")
        assert all(path == log for n, _, path in summaries if n == str(rank))
        data = open(log, "rb").read()
        assert b"HUGE" + b"y" * 5_000_000 + b"\n" in data and data.count(b"x" * 50 + b"\n") >= 10e6 / 71
    for node in run["node_results"]:
        assert sum(len(ln.encode()) + 1 for ln in node["last_lines"]) <= TAIL_BYTES
        assert any("line cut: 5000004 bytes" in ln for ln in node["last_lines"])
    shown = run_cli("show", run["id"], "--json")
    assert shown.returncode == 0 and len(shown.stdout) < 4 * TAIL_BYTES
    assert run_processes(run["id"]) == []  # this run only: other runs may share the machine
