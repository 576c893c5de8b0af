"""The `check` phase (issue 30 item 1): gpucluster/node/node_check.py on every node, judged by
gpucluster/watch/health.py. The judgement as a pure function (units), then real checks on the local
backend: real processes, gloo over 127.0.0.1, torch imported by each node. The bad-node paths name
the node: fewer GPUs than promised (a stub nvidia-smi on PATH, listing what a real one lists:
`nvidia-smi --query-gpu=index,uuid,name --format=csv,noheader`), DCGM's quick diagnostic failing
(a stub dcgmi exiting 226 with "Fail" lines), a disk without room (a real 8 MiB tmpfs), a node
killed during the check. The slow link (tc on a network namespace) and the ssh path:
tests/test_health_ssh.py."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit  # the test tier (tests/conftest.py, docs/testing.md)

sys.path.insert(0, str(Path(__file__).parent))
from conftest import FIXTURES, needs_torch  # noqa: E402
from gpucluster.infra.registry import plugin as backend_of  # noqa: E402
from gpucluster.watch.health import HealthCheckFailed, HealthSpec, NodeRun, judge  # noqa: E402
from gpucluster.node.node_check import schedule  # noqa: E402


# -- units -------------------------------------------------------------------------------------
@pytest.mark.parametrize("world", [2, 3, 4, 5, 8])
def test_every_pair_meets_exactly_once_and_nobody_twice_in_a_round(world):
    seen = []
    for meet in schedule(world):
        assert all(meet[meet[a]] == a for a in meet)  # symmetric: one partner each
        seen += [(a, b) for a, b in meet.items() if a < b]
    assert sorted(seen) == [(a, b) for a in range(world) for b in range(a + 1, world)]


def _node(rank, *, problems=(), pairs=None, rc=0, hello_skew=0.0, done=True, links_extra=None, stack=None):
    now = time.time()
    n = NodeRun(rank, f"h{rank}", rc=rc)
    n.records["hello"] = {"kind": "hello", "time": now + hello_skew, "stack": stack}
    n.hello_arrived = now
    n.records["node"] = {"kind": "node", "problems": list(problems)}
    if pairs is not None or links_extra:
        n.records["links"] = {"kind": "links", "problems": [], "pairs": [{"peer": p, "gbps": g} for p, g in (pairs or {}).items()],
                              **(links_extra or {})}
    if done:
        n.records["done"] = {"kind": "done"}
    return n


def _mesh(gbps, stacks=None):
    """gbps[(a, b)] -> nodes whose pair records say so (both ends, as the program reports); stacks[rank]:
    the network stack its hello names (None: not said)."""
    ranks = sorted({r for k in gbps for r in k})
    return {r: _node(r, pairs={(b if a == r else a): g for (a, b), g in gbps.items() if r in (a, b)},
                     stack=(stacks or {}).get(r)) for r in ranks}


def test_pairs_on_one_network_stack_are_loopback_and_never_judged():
    """Nodes on one machine (local; ssh hosts that are this machine): what their "links" give is the shared
    CPUs' load (1.5 against 44 Gbit/s between four local nodes under `make test`), so neither floor judges
    them; they are recorded as loopback."""
    gbps = {(0, 1): 44.0, (0, 2): 1.5, (0, 3): 30.0, (1, 2): 40.0, (1, 3): 0.2, (2, 3): 38.0}
    problems, _, links = judge(_mesh(gbps, stacks=dict.fromkeys(range(4), "boot-1 net:[1]")), HealthSpec(link_gbps=5.0))
    assert problems == {} and all(r["loopback"] is True and r["slow"] is False for r in links)
    # the same numbers between four machines: node 1 to 3 and node 0 to 2 are slow links
    problems, _, links = judge(_mesh(gbps), HealthSpec(link_gbps=5.0))
    assert sorted((r["a"], r["b"]) for r in links if r["slow"]) == [(0, 2), (1, 3)]
    assert not any("loopback" in r for r in links)


def test_the_network_stack_is_one_per_kernel_and_network_namespace():
    """node_check.py's `network_stack`, read for real: another process of this machine names the same
    stack; a process in a network namespace of its own (unshare -n, as tests/slowlink.py's hosts) another."""
    from gpucluster.node.node_check import network_stack

    mine = network_stack()
    if mine is None:
        pytest.skip("/proc does not say the boot id or the network namespace here")
    code = "from gpucluster.node.node_check import network_stack; print(network_stack())"
    other = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    assert other == mine
    if os.geteuid() != 0 or not shutil.which("unshare"):
        pytest.skip("needs root and unshare for a network namespace of its own")
    apart = subprocess.run(["unshare", "-n", sys.executable, "-c", code], capture_output=True, text=True, check=True)
    boot = mine.partition(" ")[0]
    assert apart.stdout.strip().startswith(boot + " net:[") and apart.stdout.strip() != mine


def test_a_loopback_pair_is_not_the_fastest_pair_the_others_are_held_to():
    """Two nodes of one machine (one stack) and two machines: the loopback pair's 40 Gbit/s does not make
    the 4 Gbit/s network pairs "under an eighth of the fastest"; one namespace per container or host (other
    stacks on the same kernel) is a link and is judged."""
    gbps = {(0, 1): 40.0, (0, 2): 4.0, (0, 3): 4.0, (1, 2): 4.0, (1, 3): 4.0, (2, 3): 4.2}
    stacks = {0: "boot-1 net:[1]", 1: "boot-1 net:[1]", 2: "boot-1 net:[2]", 3: "boot-2 net:[1]"}
    problems, _, links = judge(_mesh(gbps, stacks), HealthSpec())
    assert problems == {}
    assert [(r["a"], r["b"]) for r in links if r.get("loopback")] == [(0, 1)]
    # without the stacks, the 40 Gbit/s pair sets the floor at 5 and every other pair is slow
    problems, _, _ = judge(_mesh(gbps), HealthSpec())
    assert problems


def test_a_node_in_every_slow_pair_is_named_as_the_slow_node():
    fast, slow = 8.0, 0.2
    nodes = _mesh({(0, 1): fast, (0, 2): slow, (0, 3): fast, (1, 2): slow, (1, 3): fast, (2, 3): slow})
    problems, causes, links = judge(nodes, HealthSpec())
    assert list(problems) == [2] and "slow link: every pair with this node is slow" in problems[2][0]
    assert sorted((r["a"], r["b"]) for r in links if r["slow"]) == [(0, 2), (1, 2), (2, 3)]
    # three nodes: the fastest pair is the reference (a median would be the slow node's)
    problems, _, _ = judge(_mesh({(0, 1): fast, (0, 2): slow, (1, 2): slow}), HealthSpec())
    assert list(problems) == [2]


def test_noise_within_the_relative_floor_is_not_a_slow_link():
    nodes = _mesh({(0, 1): 21.0, (0, 2): 6.0, (0, 3): 14.0, (1, 2): 5.8, (1, 3): 13.0, (2, 3): 7.0})
    assert judge(nodes, HealthSpec())[0] == {}


def test_two_nodes_are_judged_only_against_the_shapes_expectation():
    nodes = _mesh({(0, 1): 0.3})
    assert judge(nodes, HealthSpec())[0] == {}  # nothing to compare with
    problems, _, links = judge(nodes, HealthSpec(link_gbps=5.0))
    assert "slow link to node 1: 0.3 Gbit/s, under 10% of the 5 Gbit/s" in problems[0][0]
    assert links[0]["expected_gbps"] == 5.0 and links[0]["slow"] is True


def test_slow_pairs_without_a_common_node_are_each_named():
    nodes = _mesh({(0, 1): 0.1, (0, 2): 9.0, (0, 3): 9.0, (1, 2): 9.0, (1, 3): 9.0, (2, 3): 0.1})
    problems, _, _ = judge(nodes, HealthSpec())
    assert problems == {0: [problems[0][0]], 2: [problems[2][0]]}
    assert "slow link to node 1" in problems[0][0] and "slow link to node 3" in problems[2][0]


def test_own_problems_clock_and_lost_nodes_outrank_the_links():
    nodes = _mesh({(0, 1): 9.0, (0, 2): 9.0, (1, 2): 0.01})
    nodes[1].records["node"]["problems"] = ["1 of 2 promised GPU(s) visible to nvidia-smi"]
    nodes[2].records["hello"]["time"] += 120
    problems, _, links = judge(nodes, HealthSpec())
    assert problems[1] == ["1 of 2 promised GPU(s) visible to nvidia-smi"]
    assert "clock is +120 s off" in problems[2][0]
    assert links == []  # the links of a failed check are consequences, not findings
    # a node whose program was killed: the launcher says why; the others' collective errors are not findings
    nodes = {0: _node(0, pairs={}), 1: _node(1, done=False, rc=-9)}
    del nodes[1].records["node"]
    problems, causes, _ = judge(nodes, HealthSpec(), lambda r, c: "its process was killed by SIGKILL" if c == -9 else None)
    assert list(problems) == [1] and causes == {1: "killed"} and "killed by SIGKILL" in problems[1][0]


def test_a_gpu_far_under_its_models_fp32_peak_is_slow_and_unknown_models_are_not_judged():
    """The matmul floor (health.MATMUL_FLOOR of FP32_PEAK_TFLOPS): a healthy H100 gave ~50 TFLOP/s in
    the check's 4096^3 fp32 matmul; one held at idle clocks gives a few."""
    from gpucluster.watch.health import MATMUL_FLOOR, fp32_peak

    assert fp32_peak("NVIDIA H100 80GB HBM3") == 67.0 and fp32_peak("NVIDIA H100 PCIe") == 51.0
    assert fp32_peak("NVIDIA L40S") == 91.6 and fp32_peak("NVIDIA L4") == 30.3  # L4 is not L40S's prefix
    assert fp32_peak("NVIDIA A10G") == 31.2 and fp32_peak("NVIDIA H200") == 67.0 and fp32_peak("Quadro X") is None
    nodes = _mesh({(0, 1): 9.0})
    nodes[0].records["node"].update(gpu_names=["NVIDIA H100 80GB HBM3"] * 2,
                                    matmul=[{"gpu": 0, "tflops": 48.7, "ok": True}, {"gpu": 1, "tflops": 3.1, "ok": True}])
    nodes[1].records["node"].update(gpu_names=["Quadro X"], matmul=[{"gpu": 0, "tflops": 0.5, "ok": True}])
    problems, _, links = judge(nodes, HealthSpec())
    assert list(problems) == [0] and len(problems[0]) == 1 and links == []
    assert problems[0][0].startswith("GPU 1 (NVIDIA H100 80GB HBM3) is slow: its fp32 test matmul ran at 3.1 TFLOP/s")
    assert f"under {MATMUL_FLOOR:.0%} of the model's 67" in problems[0][0]
    nodes[0].records["node"]["matmul"][1]["tflops"] = 0.3 * 67  # over the floor: not judged slow
    assert judge(nodes, HealthSpec())[0] == {}
    # the CUDA device's own name wins over nvidia-smi's list; a MIG slice is a share of a GPU: not judged
    nodes[0].records["node"]["matmul"] = [{"gpu": 0, "name": "NVIDIA H100 80GB HBM3 MIG 1g.10gb", "tflops": 4.0, "ok": True},
                                          {"gpu": 1, "name": "NVIDIA L4", "tflops": 3.0, "ok": True}]
    problems, _, _ = judge(nodes, HealthSpec())
    assert list(problems) == [0] and len(problems[0]) == 1 and problems[0][0].startswith("GPU 1 (NVIDIA L4) is slow")


def test_nobody_reaching_the_store_names_node_0_and_one_node_names_itself():
    unreached = {"unreached": "store", "problems": ["could not reach node 0's check store"]}
    nodes = {0: _node(0, pairs={}), 1: _node(1, links_extra=unreached), 2: _node(2, links_extra=unreached)}
    assert list(judge(nodes, HealthSpec())[0]) == [0]
    nodes = {0: _node(0, pairs={}), 1: _node(1, pairs={}), 2: _node(2, links_extra=unreached)}
    assert list(judge(nodes, HealthSpec())[0]) == [2]


# -- real checks on the local backend ----------------------------------------------------------
def _execute(home, spec, check, env=None, output=None):
    from gpucluster.infra.local.launch import LocalLauncher
    from gpucluster.infra.local.provider import LocalProvider
    from gpucluster.watch.launch import JobSpec
    from gpucluster.ledger.store import Ledger
    from gpucluster.lifecycle.steps import execute

    ledger = Ledger(home / "ledger.sqlite3")
    job = JobSpec(run_id=spec.run_id, command=(sys.executable, str(FIXTURES / "plain_job.py")), threads_per_proc=1,
                  check=check, max_seconds=180, output_dir=output)
    outcome = execute(spec, job, backend=backend_of(spec.cloud),
                      ledger=ledger, provider=LocalProvider(), launcher=LocalLauncher(grace=2.0))
    return outcome, ledger.get_run(spec.run_id, with_metrics=True), ledger


@needs_torch
@pytest.mark.slow
def test_four_local_nodes_pass_the_check_and_it_is_recorded_and_timed(home):
    from gpucluster.watch.procs import run_processes
    from gpucluster.spec import ClusterSpec, new_run_id

    spec = ClusterSpec(cloud="local", nodes=4, name="hc", gpus_per_node=0, run_id=new_run_id())
    outcome, record, ledger = _execute(home, spec, HealthSpec())
    assert outcome.status == "succeeded", outcome.failure
    phases = [p.name for p in record.phases]
    assert phases.index("ready") < phases.index("check") < phases.index("rendezvous")
    check = record.phase("check")
    assert check.status == "ok" and check.ended_at - check.started_at < 120
    (summary,) = ledger.metrics(spec.run_id, kind="check")
    assert summary["ok"] is True and summary["nodes"] == 4 and summary["failed"] == {}
    nodes = ledger.metrics(spec.run_id, kind="node_check")
    assert sorted(r["node_rank"] for r in nodes) == [0, 1, 2, 3] and all(r["ok"] for r in nodes)
    assert all(abs(r["clock_skew_s"]) < 30 and r["disk_free_gb"] > 0 for r in nodes)
    links = ledger.metrics(spec.run_id, kind="link")
    assert sorted((r["a"], r["b"]) for r in links) == [(0, 1), (0, 2), (0, 3), (1, 2), (1, 3), (2, 3)]
    # four processes of this machine: every pair is loopback (one kernel, one network namespace), measured
    # and never judged (its speed is the load of the machine's CPUs, which other tests share)
    assert all(r["gbps"] > 0 and r["slow"] is False and r["loopback"] is True for r in links)
    (ar,) = ledger.metrics(spec.run_id, kind="allreduce")
    assert ar["backend"] == "gloo" and ar["world"] == 4 and ar["busbw_gbps"] > 0
    assert run_processes(spec.run_id) == [] and record.run.teardown == "verified"
    log = (Path(record.run.log_dir) / "node-2.log").read_text()
    assert '@gpucluster-check {"kind": "links", "rank": 2' in log  # the check's own lines are in the node's log


def _stub(bin_dir: Path, name: str, body: str) -> None:
    bin_dir.mkdir(exist_ok=True)
    (bin_dir / name).write_text("#!/bin/sh\n" + body)
    (bin_dir / name).chmod(0o755)


@needs_torch
@pytest.mark.slow
def test_fewer_gpus_than_promised_and_a_failing_dcgm_name_the_node(home, tmp_path, monkeypatch):
    """This machine shows three GPUs to nvidia-smi (stub); two local nodes of two GPUs each: node 1's
    slice (2,3) holds one of them. dcgmi's quick diagnostic fails. torch sees no CUDA device here
    (a CPU machine): that is said for both nodes, as a real check must."""
    from gpucluster.watch.procs import run_processes
    from gpucluster.spec import ClusterSpec, new_run_id

    bin_dir = tmp_path / "bin"
    _stub(bin_dir, "nvidia-smi", 'for i in 0 1 2; do echo "$i, GPU-0000000$i-aaaa, NVIDIA A10G"; done\n')
    _stub(bin_dir, "dcgmi", 'echo "| Deployment | Fail - Xid errors in the log |"; exit 226\n')
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    spec = ClusterSpec(cloud="local", nodes=2, name="hc", gpus_per_node=2, run_id=new_run_id())
    outcome, record, ledger = _execute(home, spec, HealthSpec(gpus=2))
    assert outcome.status == "failed" and record.phase("check").status == "failed"
    assert outcome.failure.startswith("health check failed: node 0 (local:0): ")
    node1 = outcome.failure.split("node 1 (local:1): ", 1)[1]
    assert "1 of 2 promised GPU(s) visible to nvidia-smi" in node1
    assert "1 of 2 promised" not in outcome.failure.split("node 1 (local:1)")[0]  # node 0 has its two
    assert "0 of 2 promised GPU(s) usable by CUDA" in node1
    assert "DCGM's quick diagnostic (dcgmi diag -r 1) failed (exit 226): | Deployment | Fail - Xid errors" in node1
    assert [p.name for p in record.phases][-3:] == ["check", "outputs", "teardown"]  # nothing started
    lost = ledger.metrics(spec.run_id, kind="node_lost")
    assert sorted(r["node_rank"] for r in lost) == [0, 1] and {r["cause"] for r in lost} == {"health"}
    assert run_processes(spec.run_id) == [] and record.run.teardown == "verified"


@needs_torch
@pytest.mark.slow
def test_a_node_without_disk_room_is_named(home, tmp_path):
    from gpucluster.spec import ClusterSpec, new_run_id

    if os.geteuid() != 0:
        pytest.skip("needs root to mount a small tmpfs")
    out = tmp_path / "out"
    small = out / "node-1"
    small.mkdir(parents=True)
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=8m", "tmpfs", str(small)]).returncode != 0:
        pytest.skip("cannot mount a tmpfs")
    try:
        spec = ClusterSpec(cloud="local", nodes=2, name="hc", gpus_per_node=0, run_id=new_run_id())
        outcome, record, _ = _execute(home, spec, HealthSpec(min_free_gb=0.5), output=str(out))
    finally:
        subprocess.run(["umount", "-l", str(small)])
    assert outcome.status == "failed"
    assert outcome.failure.startswith("health check failed: node 1 (local:1): 0.01 GB free at ")
    assert "at least 0.5 GB needed" in outcome.failure and "node 0" not in outcome.failure


@needs_torch
@pytest.mark.slow
def test_a_node_killed_during_the_check_is_a_lost_node(home):
    """Node 1's check program is killed (SIGKILL) as soon as it has said hello: the check names node
    1 as lost (killed), not node 0, whose collective broke because of it."""
    import threading

    import psutil

    from gpucluster.watch.procs import run_processes
    from gpucluster.spec import ClusterSpec, new_run_id

    spec = ClusterSpec(cloud="local", nodes=2, name="hc", gpus_per_node=0, run_id=new_run_id())
    killed = []

    def killer():
        end = time.monotonic() + 60
        while time.monotonic() < end and not killed:
            for p in run_processes(spec.run_id):
                try:
                    env = p.environ()
                    if env.get("GPUCLUSTER_NODE_RANK") == "1" and "node_check.py" in " ".join(p.cmdline()):
                        p.kill()
                        killed.append(time.time())
                except psutil.Error:
                    continue
            time.sleep(0.05)

    t = threading.Thread(target=killer, daemon=True)
    t.start()
    outcome, record, ledger = _execute(home, spec, HealthSpec(timeout_s=20))
    t.join()
    assert killed
    assert outcome.status == "failed" and outcome.failure.startswith(
        "health check failed: node 1 (local:1): lost during the check: its process was killed by SIGKILL"), outcome.failure
    (lost,) = ledger.metrics(spec.run_id, kind="node_lost")
    assert lost["node_rank"] == 1 and lost["cause"] == "killed" and lost["phase"] == "check"
    assert lost["detected_at"] - killed[0] < 30
    assert run_processes(spec.run_id) == [] and record.run.teardown == "verified"


def test_nvidia_smi_is_found_where_gke_mounts_it_when_it_is_not_on_path(tmp_path, monkeypatch):
    """GKE's driver installer mounts nvidia-smi at /usr/local/nvidia/bin in GPU containers, not on a
    public image's PATH (GKE docs, "Run GPUs in GKE Standard node pools")."""
    from gpucluster.node import node_check

    bin_dir = tmp_path / "nvidia-bin"
    bin_dir.mkdir()
    _stub(bin_dir, "nvidia-smi", 'echo "0, GPU-00000000-aaaa, Tesla V100-SXM2-16GB"\n')
    monkeypatch.setenv("PATH", "/usr/bin:/bin")
    monkeypatch.setattr(node_check, "NVIDIA_BIN", str(bin_dir))
    rows, why = node_check.nvidia_smi_gpus()
    assert why is None and [r["name"] for r in rows] == ["Tesla V100-SXM2-16GB"]
    monkeypatch.setattr(node_check, "NVIDIA_BIN", str(tmp_path / "none"))
    rows, why = node_check.nvidia_smi_gpus()
    assert rows is None and "not found on PATH or in" in why


def test_no_kernel_image_is_explained_with_the_builds_architectures_and_the_gpus_capability():
    """A current torch build (cu128/cu130) on a V100 fails every kernel with "no kernel image is
    available for execution on the device" (pytorch/pytorch#172352: sm_70 dropped)."""
    from types import SimpleNamespace as NS

    from gpucluster.node.node_check import no_kernel_hint

    torch = NS(version=NS(cuda="13.0"), cuda=NS(get_device_capability=lambda i: (7, 0),
                                                get_arch_list=lambda: ["sm_75", "sm_80", "sm_90", "sm_100"]))
    hint = no_kernel_hint("RuntimeError: CUDA error: no kernel image is available for execution on the device", torch, 0)
    assert "CUDA 13.0" in hint and "sm_75 sm_80" in hint and "compute capability 7.0" in hint and "cu126" in hint
    assert no_kernel_hint("RuntimeError: CUDA error: out of memory", torch, 0) == ""
