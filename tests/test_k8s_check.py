"""The health check on gcp (issue 30 item 1): the Kubernetes launcher runs gpucluster/node/node_check.py
in every pod, through the exec API, before anything of the job starts; against the fake API server
(tests/k8s_fake.py), whose pods run the launcher's real entry programs and whose exec really runs
the command (here: the real check program, gloo over the pods' addresses, which the fake gives as
`status.podIP` once a pod is placed)."""

from __future__ import annotations

import os
import socket
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit  # the test tier (tests/conftest.py, docs/testing.md)

pytest.importorskip("kubernetes")
pytest.importorskip("torch")

from k8s_fake import FakeKubeApi  # noqa: E402
from test_k8s_data import dataset, run, staged  # noqa: E402
from test_k8s_launcher import NAME, assert_everything_deleted, healthy  # noqa: E402

from gpucluster.watch.health import HealthSpec  # noqa: E402


def free_port() -> int:
    with socket.socket() as s:  # the check's store takes the next port too: both free here
        for _ in range(50):
            s2 = socket.socket()
            try:
                s2.bind(("127.0.0.1", 0))
                port = s2.getsockname()[1]
                s.close()
                with socket.socket() as s3:
                    s3.bind(("127.0.0.1", port + 1))
                return port
            except OSError:
                continue
            finally:
                s2.close()
    raise RuntimeError("no two free ports in a row")


def kinds(events, kind):
    return [(r, m) for r, m in events.metrics if m.get("kind") == kind]


def test_the_kubernetes_launcher_checks_by_default_and_check_is_no_longer_refused():
    from gpucluster.watch.health import spec_for
    from gpucluster.infra.kubernetes.launcher import KubernetesLauncher
    from gpucluster.infra.registry import plugin
    from gpucluster.spec import ClusterSpec

    g = ClusterSpec(cloud="gcp", nodes=2, instance_type="n1-standard-8", gpus_per_node=1)
    launcher = KubernetesLauncher()
    got = spec_for(g, plugin("gcp"), None, launcher)
    assert got is not None and got.gpus == 1 and got.link_gbps
    assert spec_for(g, plugin("gcp"), True, launcher) is not None
    assert spec_for(g, plugin("gcp"), False, launcher) is None


@pytest.mark.slow
@pytest.mark.parametrize("how", ["in-memory", "http", "with-data"])
def test_every_pod_passes_the_check_before_the_job_starts(tmp_path, how):
    """`http`: through the real kubernetes client's websocket exec (tests/k8s_fake_http.py);
    `with-data`: the check, then the staging of a --data folder, then the job."""
    from gpucluster.watch.staging import parse_data

    fake = FakeKubeApi({0: healthy(0), 1: healthy(1)})
    mounts = parse_data((str(dataset(tmp_path, n=3)),), None) if how == "with-data" else ()
    result, err, events = run(fake, tmp_path, mounts, output=False, http=how == "http",
                              check=HealthSpec(gpus=0, timeout_s=30), rdzv_port=free_port())
    assert err is None and result.ok, result.failure
    want = ["check", "stage", "rendezvous"] if mounts else ["check", "rendezvous"]
    assert events.phases[:len(want)] == want, events.phases
    if mounts:
        assert sorted(staged(events)) == [0, 1]
    checks = kinds(events, "node_check")
    assert sorted(r for r, _ in checks) == [0, 1] and all(m["ok"] for _, m in checks)
    (_, summary), = kinds(events, "check")
    assert summary["ok"] and summary["nodes"] == 2
    assert kinds(events, "link") and kinds(events, "allreduce")  # the collective ran, over the pods' addresses
    # the check ran in each pod's training container, before its torchrun: the job's first record after it
    execs = [c for c in fake.calls if c[0] == "exec" and any(a.endswith("node_check.py") for a in c[4])]
    assert sorted(c[3] for c in execs) == [f"{NAME}-0-fake0", f"{NAME}-1-fake1"], execs
    order = [m.get("kind") for _, m in events.metrics]
    assert order.index("check") < order.index("start")
    assert_everything_deleted(fake)


@pytest.mark.slow
def test_a_pod_that_fails_the_check_is_named_and_nothing_of_the_job_starts(tmp_path, monkeypatch):
    """nvidia-smi (a stub on the exec's PATH) shows node 1 no GPU; the shape promises one. torch
    sees no CUDA device on this CPU machine: that is said for both nodes, as a real check must."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    stub = bin_dir / "nvidia-smi"
    # node 1's check is the program whose command line holds `--rank 1` (the stub's parent)
    stub.write_text("#!/bin/sh\n"
                    "if tr '\\0' ' ' < /proc/$PPID/cmdline | grep -q -- '--rank 1 '; then exit 0; fi\n"
                    "echo '0, GPU-00000000-aaaa, Tesla V100-SXM2-16GB'\n")
    stub.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    fake = FakeKubeApi({0: healthy(0), 1: healthy(1)})
    result, err, events = run(fake, tmp_path, output=False, check=HealthSpec(gpus=1, timeout_s=30),
                              rdzv_port=free_port())
    assert err is None and not result.ok
    assert result.failure.startswith(f"health check failed: node 0 (pod {NAME}-0"), result.failure
    node1 = result.failure.split(f"node 1 (pod {NAME}-1", 1)[1]
    assert "0 of 1 promised GPU(s) visible to nvidia-smi" in node1
    assert "visible to nvidia-smi" not in result.failure.split(f"node 1 (pod {NAME}-1")[0]  # node 0 has its one
    assert "0 of 1 promised GPU(s) usable by CUDA" in node1
    lost = [m for _, m in kinds(events, "node_lost")]
    assert sorted(m["node_rank"] for m in lost) == [0, 1] and {m["cause"] for m in lost} == {"health"}
    assert {m["phase"] for m in lost} == {"check"}
    assert not kinds(events, "start")  # torchrun never started: every pod waited for the check
    assert not any("says hello" in line for _, line in events.lines)
    assert_everything_deleted(fake)


@pytest.mark.slow
def test_a_pod_deleted_during_the_check_is_named_lost_and_the_check_stops(tmp_path):
    """Node 1's pod is deleted while its check program runs (its exec'd process dies with the pod,
    tests/k8s_fake.py): the run ends at once naming node 1 as lost in the check phase (cause
    interruption, for the recovery loop), not node 0 (whose collective waited on node 1); every
    check program is stopped and nothing of the job starts. The deleted pod stays listed with a
    deletionTimestamp while it terminates (Kubernetes docs, "Termination of Pods"; the fake's
    `delete_ticks`). Checked once by hand (2026-11-26): with `delete_ticks` forced to 0 (the old,
    kinder fake that drops a deleted pod at once) this test fails, the run saying the pod
    "disappeared" instead of "is being deleted"."""
    import threading
    import time

    fake = FakeKubeApi({0: healthy(0), 1: healthy(1)}, delete_ticks=3)
    hit: list[float] = []

    def strike():
        end = time.monotonic() + 60
        while time.monotonic() < end:
            if any(c[0] == "exec" and c[3].endswith("-1-fake1") and any(a.endswith("node_check.py") for a in c[4])
                   for c in list(fake.calls)):
                time.sleep(1.0)  # its program runs (imports torch, waits on the others)
                hit.append(time.time())
                fake.delete_pod(1)
                return
            time.sleep(0.02)

    threading.Thread(target=strike, daemon=True).start()
    t0 = time.monotonic()
    result, err, events = run(fake, tmp_path, output=False, check=HealthSpec(gpus=0, timeout_s=30),
                              rdzv_port=free_port())
    took = time.monotonic() - t0
    assert hit and err is None and not result.ok
    # the pod watch sees it first (the check's own reading would say "lost during the check")
    assert result.failure.startswith(f"node 1 ({NAME}-1.{NAME}) lost: pod {NAME}-1-fake1 is being deleted"), \
        result.failure
    assert "node 0" not in result.failure
    lost = [m for _, m in kinds(events, "node_lost")]
    assert [(m["node_rank"], m["cause"], m["phase"]) for m in lost] == [(1, "interruption", "check")]
    assert not kinds(events, "start") and took < 60, took  # not the check's own 2 x 30 s + 60 s deadline
    assert all(c.proc.poll() is not None for c in fake.exec_clients)  # no check program left running
    assert_everything_deleted(fake)


def test_the_check_program_stops_the_other_checks_in_its_container(tmp_path):
    """`node_check.py --stop` (run by the launcher in each pod whose check must end: closing an exec
    stream need not end its command in a real container) kills every process whose command line
    holds the program's path, and nothing else."""
    import shutil
    import subprocess
    import sys
    import time

    from gpucluster.node import node_check

    program = tmp_path / "node_check.py"
    shutil.copy(node_check.__file__, program)
    hold = "import time; time.sleep(120)"
    check = subprocess.Popen([sys.executable, "-c", hold, str(program), "--rank", "0"])
    other = subprocess.Popen([sys.executable, "-c", hold, str(tmp_path / "other.py")])
    try:
        assert subprocess.run([sys.executable, str(program), "--stop"], timeout=60).returncode == 0
        deadline = time.monotonic() + 10
        while check.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert check.poll() == -9
        assert other.poll() is None
    finally:
        for p in (check, other):
            p.kill()
            p.wait()
