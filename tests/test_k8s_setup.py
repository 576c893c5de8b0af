"""`--setup` on gcp: the real entry script runs the setup wrapper (`gpucluster.watch.staging.setup_wrapped`)
locally with a stand-in torchrun; the launcher's setup barrier (go file through exec, only once every
pod's setup_end record says rc 0) against FakeKubeApi, the FAKE API server whose pods run the real entry
script, setup wrapper and wait.py (tests/k8s_fake.py says where each behaviour comes from)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest

pytestmark = pytest.mark.integration  # the test tier (tests/conftest.py, docs/testing.md)

pytest.importorskip("kubernetes")

from k8s_fake import FakeKubeApi  # noqa: E402
from test_k8s_launcher import NAME, Events, assert_everything_deleted, cluster, healthy, job, launch  # noqa: E402

from gpucluster.infra.kubernetes import launcher as k8s, plan as k8s_plan  # noqa: E402
from gpucluster.watch.staging import GO_FILE, setup_wrapped  # noqa: E402

SETUP = ("echo preparing; echo ready > prepared.txt",)
# torchrun's stand-in: fails unless the setup ran before it, in the same working directory
TORCHRUN = [sys.executable, "-c", "import pathlib; pathlib.Path('torchrun.txt').write_text("
            "pathlib.Path('prepared.txt').read_text())"]


def entry(tmp_path, setup):
    control = tmp_path / "control"
    (tmp_path / "argv.json").write_text(json.dumps([setup_wrapped(TORCHRUN, setup, str(control / GO_FILE))]))
    (tmp_path / "entry.py").write_text(k8s_plan.ENTRYPOINT)
    env = {**os.environ, "JOB_COMPLETION_INDEX": "0", "GPUCLUSTER_CONTROL_DIR": str(control),
           "GPUCLUSTER_OUTPUT_DIR": str(tmp_path / "outputs")}
    proc = subprocess.Popen([sys.executable, str(tmp_path / "entry.py")], env=env, cwd=tmp_path,
                            stdout=subprocess.PIPE, text=True)
    return proc, control


def record(line):
    assert line.startswith("@gpucluster-metric "), line
    return json.loads(line.split(" ", 1)[1])


def test_entry_script_runs_setup_then_waits_for_go_then_torchrun(tmp_path):
    proc, control = entry(tmp_path, SETUP)
    try:
        assert record(proc.stdout.readline())["kind"] == "setup_start"
        assert "[gpucluster setup 1/1] $ echo preparing" in proc.stdout.readline()
        assert proc.stdout.readline() == "preparing\n"
        assert proc.stdout.readline().startswith("[gpucluster setup] done in")
        assert record(proc.stdout.readline())["rc"] == 0
        time.sleep(1.0)
        assert not (tmp_path / "torchrun.txt").exists()  # waits for the go file
        (control / GO_FILE).touch()
        assert record(proc.stdout.readline()) == {"kind": "job_end", "exit_code": 0, "stopped": False}
        assert (tmp_path / "torchrun.txt").read_text() == "ready\n"  # after the setup, in its folder
        assert proc.wait(timeout=10) == 0
    finally:
        if proc.poll() is None:
            proc.kill()


def test_entry_script_failed_setup_ends_with_its_code_and_never_starts_torchrun(tmp_path):
    proc, control = entry(tmp_path, ("echo first ok", "echo broken >&2; exit 5", "echo never"))
    try:
        lines = [proc.stdout.readline() for _ in range(8)]
        assert "never\n" not in lines
        assert "[gpucluster setup 2/3] failed: exit code 5\n" in lines and "broken\n" in lines
        end = [record(ln) for ln in lines if ln.startswith("@") and "setup_end" in ln]
        assert end and end[0]["rc"] == 5 and end[0]["command"] == 2
        assert record(lines[-1]) == {"kind": "job_end", "exit_code": 5, "stopped": False}
        assert proc.wait(timeout=10) == 5
        assert not (tmp_path / "torchrun.txt").exists()
    finally:
        if proc.poll() is None:
            proc.kill()


def test_entry_script_stop_while_waiting_for_go_ends_it(tmp_path):
    proc, control = entry(tmp_path, ("true",))
    try:
        while "setup_end" not in proc.stdout.readline():
            pass
        (control / "stop").touch()
        assert record(proc.stdout.readline()) == {"kind": "job_end", "exit_code": 143, "stopped": True}
        assert proc.wait(timeout=10) == 143
        assert not (tmp_path / "torchrun.txt").exists()
    finally:
        if proc.poll() is None:
            proc.kill()


def test_plan_wraps_every_rank_and_mounts_the_run_folder():
    plan = k8s_plan.plan_job(cluster(2), job(setup=SETUP))
    assert plan.setup and not plan.collects
    bare = k8s_plan.plan_job(cluster(2), job())
    for rank, argv in enumerate(plan.argv_by_rank):
        assert argv[:2] == ("sh", "-c") and argv[3] == "gpucluster-setup" and k8s_plan.SETUP_GO_FILE in argv[2]
        assert argv[4:] == bare.argv_by_rank[rank]  # then this rank's torchrun, unchanged
    from gpucluster.infra.kubernetes.manifests import job_manifest

    volumes = lambda p: {v.name for v in job_manifest(p).spec.template.spec.volumes}  # noqa: E731
    assert "run" in volumes(plan) and "run" not in volumes(bare)  # the go file's emptyDir


def watch_go(fake):
    """Record, at every go-file exec, which pods had ended their setup (their log's setup_end record)."""
    seen, real = [], fake.connect_get_namespaced_pod_exec

    def connect(name, namespace, command=None, **kw):
        if command and k8s_plan.SETUP_GO_FILE in command:
            seen.append((name, {p.index: "setup_end" in p.log_text() for p in fake.pods.values()}))
        return real(name, namespace, command=command, **kw)

    fake.connect_get_namespaced_pod_exec = connect
    return seen


# the setup runs with the job's environment, so what a node does can depend on its rank
SLOW_ON_1 = ('if [ "$GPUCLUSTER_NODE_RANK" = 1 ]; then echo installing; sleep 1.5; fi; echo ready > prepared.txt',)
FAILS_ON_1 = ('if [ "$GPUCLUSTER_NODE_RANK" = 1 ]; then sleep 2; echo "ERROR: No matching distribution found for '
              'nosuchpkg" >&2; exit 4; fi',)
FAILS_ON_0 = ('if [ "$GPUCLUSTER_NODE_RANK" = 0 ]; then exit 2; fi',)


@pytest.mark.parametrize("outputs", [True, False], ids=["collecting", "no-outputs"])
def test_go_is_sent_only_after_every_pods_setup_succeeded(tmp_path, outputs):
    fake = FakeKubeApi({r: healthy(r) for r in range(2)})
    seen = watch_go(fake)
    launcher = k8s.KubernetesLauncher(api=k8s.KubeApi(fake, fake, fake, stream=fake.stream), poll_interval=0)
    spec = job(setup=SLOW_ON_1, output_dir=str(tmp_path / "out") if outputs else None, max_seconds=120)  # no hang
    events = Events()
    result = launcher.launch(cluster(2), spec, events, tmp_path / "logs")
    assert result.ok, result.failure
    assert sorted(n for n, _ in seen) == [f"{NAME}-0-fake0", f"{NAME}-1-fake1"]
    assert all(state == {0: True, 1: True} for _, state in seen)
    assert events.phases[:3] == ["setup", "rendezvous", "train"]
    lines = [line for rank, line in events.lines if rank == 1]
    assert lines.index("installing") < lines.index("node 1 says hello")  # setup output before training
    launcher.collect_outputs(spec, Events())
    assert_everything_deleted(fake)


def test_a_failed_setup_fails_the_run_naming_the_node_and_stops_the_others(tmp_path):
    scripts = {0: healthy(0), 1: healthy(1)}
    scripts[0].exit_code = None  # would train forever
    fake = FakeKubeApi(scripts)
    launcher = k8s.KubernetesLauncher(api=k8s.KubeApi(fake, fake, fake, stream=fake.stream), poll_interval=0.05)
    spec = job(setup=FAILS_ON_1, output_dir=str(tmp_path / "out"))
    result = launcher.launch(cluster(2), spec, Events(), tmp_path / "logs")
    assert not result.ok and result.failed_node == 1
    assert "setup failed on node 1" in result.failure and "exit code 4" in result.failure
    assert "nosuchpkg" in result.failure
    execs = fake.of("exec")
    assert not any(k8s_plan.SETUP_GO_FILE in c[4] for c in execs)  # torchrun started nowhere
    assert [c[3] for c in execs if k8s_plan.STOP_FILE in c[4]] == [f"{NAME}-0-fake0"]
    assert fake.of("delete") == []
    launcher.collect_outputs(spec, Events())
    assert_everything_deleted(fake)


def test_a_failed_setup_without_outputs_fails_and_deletes_everything(tmp_path):
    fake = FakeKubeApi({0: healthy(0), 1: healthy(1)})
    result, _, _ = launch(fake, tmp_path, setup=FAILS_ON_0)
    assert not result.ok and result.failed_node == 0
    assert "setup failed on node 0" in result.failure and "exit code 2" in result.failure
    assert not any(k8s_plan.SETUP_GO_FILE in c[4] for c in fake.of("exec"))
    assert_everything_deleted(fake)
