"""`--data` and `--resume` on gcp: folders staged into each pod through the exec API while it runs
(`infra.kubernetes.stage`), against FakeKubeApi, the in-memory FAKE API server. Its exec really runs
the staging program over a folder per pod and a folder per GPU node (the hostPath cache), never
closes an exec's stdin (the v4 websocket protocol cannot: kubernetes/kubernetes#89899), starts
pods with skew and refuses exec into a pod that is not running (tests/k8s_fake.py gives the source
of each behaviour)."""

from __future__ import annotations

import hashlib
import os

import pytest

pytestmark = pytest.mark.integration  # the test tier (tests/conftest.py, docs/testing.md)

pytest.importorskip("kubernetes")

from k8s_fake import FakeKubeApi, PodScript  # noqa: E402
from k8s_fake_http import serve  # noqa: E402
from test_k8s_launcher import NAME, Events, assert_everything_deleted, cluster, healthy, job  # noqa: E402

from gpucluster.infra.kubernetes import launcher as k8s, plan as k8s_plan  # noqa: E402
from gpucluster.watch.staging import RESUME_ENV, STAGE_KIND, DataMount, parse_data  # noqa: E402


def staged(events):
    """{node rank: its stage record}."""
    return {r: rec for r, rec in events.metrics if rec.get("kind") == STAGE_KIND}


def dataset(tmp_path, n=12, size=100_000):
    folder = tmp_path / "imagenet-mini"
    (folder / "train").mkdir(parents=True)
    for i in range(n):
        (folder / "train" / f"{i:03d}.bin").write_bytes(os.urandom(size))
    (folder / "labels.txt").write_text("cat\ndog\n")
    return folder


def sha(path):
    return hashlib.sha256(path.read_bytes()).hexdigest()


def same_tree(a, b):
    files = sorted(p.relative_to(a) for p in a.rglob("*") if p.is_file())
    assert files, a
    assert files == sorted(p.relative_to(b) for p in b.rglob("*") if p.is_file())
    for rel in files:
        assert sha(a / rel) == sha(b / rel), rel


def run(fake, tmp_path, mounts=(), nodes=2, setup=(), resume=None, output=True, http=False, **kw):
    """`http`: through the real kubernetes client (its websocket exec patches an ApiClient while each of
    the staging threads' execs opens) against the fake served over HTTP (tests/k8s_fake_http.py)."""
    events = Events()
    api, stop = serve(fake) if http else (k8s.KubeApi(fake, fake, fake, stream=fake.stream), lambda: None)
    launcher = k8s.KubernetesLauncher(api=api, poll_interval=0, api_retry_s=10)
    spec = job(data=tuple(mounts), setup=tuple(setup), resume=resume,
               output_dir=str(tmp_path / "out") if output else None, **kw)
    result = err = None
    try:
        try:
            result = launcher.launch(cluster(nodes), spec, events, tmp_path / "logs")
        except KeyboardInterrupt as exc:
            err = exc
        if output:
            launcher.collect_outputs(spec, Events())
    finally:
        stop()
    assert fake.rest_upgrades == []
    return result, err, events


def pod_dir(fake, rank):
    """The pod's emptyDir (/gpucluster-run) as the fake keeps it."""
    return fake.root / f"{NAME}-{rank}-fake{rank}" / "run"


def assert_no_exec_left(fake):
    assert fake.exec_clients, "no exec with stdin was made"
    assert all(c.proc.poll() is not None for c in fake.exec_clients)


def test_a_folder_reaches_every_pod_before_training_and_a_rerun_sends_under_one_percent(tmp_path):
    data = dataset(tmp_path)
    mounts = parse_data([str(data)])
    hosts = tmp_path / "gpu-nodes"  # the nodes' disks outlive the fake (a kept cluster)
    fake = FakeKubeApi({r: healthy(r) for r in range(2)}, host_root=hosts)
    result, _, events = run(fake, tmp_path, mounts, http=True)
    assert result.ok, result.failure
    assert events.phases[:2] == ["stage", "rendezvous"] and "train" in events.phases
    for rank in range(2):
        same_tree(data, pod_dir(fake, rank) / "data" / "imagenet-mini")
    total = sum(p.stat().st_size for p in data.rglob("*") if p.is_file())
    cold = staged(events)
    assert set(cold) == {0, 1}
    for rec in cold.values():
        assert rec["files"] == 13 and rec["bytes"] == total and rec["sent_files"] == 13
        assert total < rec["sent_bytes"] < total * 1.1
        # a hard link cannot cross from the hostPath mount into the emptyDir: copies, said so
        assert rec["received"] == 13 and rec["linked"] + rec["copied"] == 13
    # every pod's environment points at the staged folder
    plan = k8s_plan.plan_job(cluster(2), job(data=mounts, output_dir="x"))
    env = dict(plan.env)
    assert env["GPUCLUSTER_DATA"] == f"{k8s_plan.RUN_DIR}/data/imagenet-mini"
    assert_everything_deleted(fake)
    assert_no_exec_left(fake)

    # the same nodes again (a kept cluster): only the list of hashes goes
    fake2 = FakeKubeApi({r: healthy(r) for r in range(2)}, host_root=hosts)
    result, _, events = run(fake2, tmp_path / "again", mounts)
    assert result.ok, result.failure
    for rank, rec in staged(events).items():
        assert rec["sent_files"] == 0 and rec["sent_bytes"] < total * 0.01, rec
        same_tree(data, pod_dir(fake2, rank) / "data" / "imagenet-mini")

    # one file changed: that file alone is sent to each node
    (data / "train" / "005.bin").write_bytes(os.urandom(100_000))
    fake3 = FakeKubeApi({r: healthy(r) for r in range(2)}, host_root=hosts)
    result, _, events = run(fake3, tmp_path / "third", parse_data([str(data)]))
    assert result.ok, result.failure
    assert {rec["sent_files"] for rec in staged(events).values()} == {1}
    same_tree(data, pod_dir(fake3, 1) / "data" / "imagenet-mini")


def test_setup_runs_after_staging_then_the_barrier(tmp_path):
    data = dataset(tmp_path, n=2)
    fake = FakeKubeApi({r: healthy(r) for r in range(2)})
    setup = ('echo "node $GPUCLUSTER_NODE_RANK installing"; test -f "$GPUCLUSTER_DATA/train/000.bin"',)  # data first
    result, _, events = run(fake, tmp_path, parse_data([f"{data}:inputs/mini"]), setup=setup)
    assert result.ok, result.failure  # each pod's setup found its data in place (the `test -f` above)
    assert events.phases[:3] == ["stage", "setup", "rendezvous"]
    ends = {r: rec for r, rec in events.metrics if rec.get("kind") == "setup_end"}
    assert {r: rec["rc"] for r, rec in ends.items()} == {0: 0, 1: 0}
    assert any("node 1 installing" in line for _, line in events.lines)
    same_tree(data, pod_dir(fake, 0) / "inputs" / "mini")


def test_resume_stages_the_earlier_runs_outputs_as_the_resume_folder(tmp_path):
    earlier = tmp_path / "runs" / "r1" / "outputs"
    (earlier / "node-0").mkdir(parents=True)
    (earlier / "node-0" / "checkpoint.pt").write_bytes(os.urandom(5000))
    fake = FakeKubeApi({r: healthy(r) for r in range(2)})
    result, _, events = run(fake, tmp_path, resume=DataMount(str(earlier), "resume"))
    assert result.ok, result.failure
    for rank in range(2):
        same_tree(earlier, pod_dir(fake, rank) / "resume")
    plan = k8s_plan.plan_job(cluster(2), job(resume=DataMount(str(earlier), "resume")))
    assert dict(plan.env)[RESUME_ENV] == f"{k8s_plan.RUN_DIR}/resume" and "GPUCLUSTER_DATA" not in dict(plan.env)
    assert staged(events)[1]["files"] == 1


def test_a_node_that_cannot_take_the_data_fails_the_run_naming_it_and_nothing_is_left(tmp_path):
    data = dataset(tmp_path, n=3)
    hosts = tmp_path / "gpu-nodes"
    (hosts / "node-1").mkdir(parents=True)
    (hosts / "node-1" / "cache-full").write_text("")
    os.chmod(hosts / "node-1", 0o500)  # the node's disk refuses writes (root ignores modes: see below)
    if os.geteuid() == 0:  # as root a mode does not stop writes: make the cache path a file instead
        os.chmod(hosts / "node-1", 0o700)
        (hosts / "node-1").rename(hosts / "node-1-gone")
        (hosts / "node-1").write_text("not a folder")
    fake = FakeKubeApi({0: healthy(0), 1: healthy(1)}, host_root=hosts)
    result, _, events = run(fake, tmp_path, parse_data([str(data)]))
    assert not result.ok
    assert f"node 1 (pod {NAME}-1-fake1): staging the data failed" in result.failure
    assert "rendezvous" not in events.phases and "train" not in events.phases  # the stage phase never ended
    assert_everything_deleted(fake)
    assert_no_exec_left(fake)


def test_ctrl_c_while_staging_closes_the_streams_and_deletes_everything(tmp_path):
    data = dataset(tmp_path, n=16, size=1_000_000)  # 16 MB a node
    fake = FakeKubeApi({r: PodScript(lines=["training"], exit_code=None) for r in range(2)})
    fake.stdin_delay = 0.2  # 1 MiB frames over a slow link: about 3 s a node
    fake.interrupt_when = lambda f: any(c.sent for c in f.exec_clients)  # once data is being sent
    result, err, events = run(fake, tmp_path, parse_data([str(data)]))
    assert isinstance(err, KeyboardInterrupt) and result is None
    assert events.phases == ["stage"]
    assert_everything_deleted(fake)
    assert_no_exec_left(fake)
    stops = {c[3] for c in fake.of("exec") if k8s_plan.STOP_FILE in c[4]}
    assert stops  # the pods that ran were told to stop (their wrapper still waited for the data)


def test_the_staging_program_never_needs_its_stdin_closed(tmp_path):
    """The fake never closes stdin; a program that read to end-of-input would hang here (the
    staging thread would wait for it until the exec stream's idle limit)."""
    data = dataset(tmp_path, n=1, size=10)
    fake = FakeKubeApi({0: healthy(0, 1)})
    result, _, _ = run(fake, tmp_path, parse_data([str(data)]), nodes=1)
    assert result.ok, result.failure
    assert all(c.proc.returncode == 0 for c in fake.exec_clients)
