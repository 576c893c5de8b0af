"""Files a job writes in its working folder come back on gcp too (issue 28 items 1 and 7): the same
fixture script as on local and ssh (tests/fixtures/workdir_job/train.py: it saves relative to its working
folder, with torch.distributed over gloo), shipped in the ConfigMap and run by each fake pod from its
writable copy in the pod's run folder (the real entry script lays it down; the fake torchrun starts the
script's workers after its rendezvous), against FakeKubeApi served over HTTP to the real kubernetes
client (tests/k8s_fake_http.py). Every file is back per node, with its checksum, before the pods go."""

from __future__ import annotations

import itertools
import os
import shutil

import pytest

pytest.importorskip("kubernetes")
pytest.importorskip("torch")

from gcs_emulator import gcs_server  # noqa: E402,F401
from k8s_fake import FakeKubeApi, PodScript  # noqa: E402
from k8s_fake_http import serve  # noqa: E402
from test_k8s_launcher import Events, cluster  # noqa: E402
from test_workdir import JOB, check_every_file_came_back  # noqa: E402

from gpucluster.infra.kubernetes import launcher as k8s  # noqa: E402
from gpucluster.watch.launch import JobSpec  # noqa: E402
from gpucluster.watch.outputs import COMPLETE, PARTIAL  # noqa: E402

pytestmark = pytest.mark.slow
_COUNT = itertools.count()


def assert_everything_deleted(fake):
    assert [d[1] for d in fake.of("delete")] == ["job", "service", "configmap"]
    fake.settle()
    assert fake.objects == {} and fake.pods == {}


def _gcp_run(tmp_path, monkeypatch, output=None, **job_fields):
    """`output`: a gs:// URL (the pods upload, as the cluster's Google service account), else a folder here."""
    project = tmp_path / "project"
    shutil.copytree(JOB, project)
    monkeypatch.chdir(project)  # the script folder is the working folder, as the user runs it
    fake = FakeKubeApi({r: PodScript(program=True) for r in range(2)})
    api, stop = serve(fake)
    objects, platform = None, k8s.GENERIC
    if output:
        from gpucluster.infra.gcp import gcs
        from gpucluster.infra.gcp.gke import GKE

        objects, platform = gcs.GcsTransfer(), GKE  # gs:// as the cluster's Google service account
    launcher = k8s.KubernetesLauncher(api=api, poll_interval=0.05, api_retry_s=10, objects=objects, platform=platform)
    job = JobSpec(f"r20261125-0{next(_COUNT)}0000-abcdef", command=("python", "train.py"), nproc_per_node=1,
                  threads_per_proc=1, max_seconds=180, output_dir=output or str(tmp_path / "results"), **job_fields)
    events = Events()
    if output:
        from test_k8s_gcs import cluster as gcs_cluster

        spec = gcs_cluster(2)
    else:
        spec = cluster(2)
    try:
        result = launcher.launch(spec, job, events, tmp_path / "logs")
        got = {o.node_rank: o for o in launcher.collect_outputs(job, Events())}
    finally:
        stop()
    assert fake.rest_upgrades == []  # no REST call went out on an ApiClient an exec had patched
    return fake, result, got, job


def test_gcp_files_written_in_the_working_folder_come_back_before_teardown(tmp_path, monkeypatch):
    """Also issue 28 item 6 on gcp: every rank and --setup command gets GPUCLUSTER_PYTHON, the image's
    `python` (here the fake pod's) as an absolute path, with its folder first on PATH."""
    import json

    fake, result, got, _ = _gcp_run(tmp_path, monkeypatch, setup=("echo SETUP-PY $GPUCLUSTER_PYTHON ${PATH%%:*}",))
    assert result.ok, result.failure
    logs = "".join((tmp_path / "logs" / f"node-{r}.log").read_text() for r in range(2))
    seen = [json.loads(ln.split("PY ", 1)[1]) for ln in logs.splitlines() if ln.startswith("PY ")]
    assert len(seen) == 2 and all(os.path.isabs(s["gp"] or "") and os.path.basename(s["gp"]) == "python"
                                  and s["path0"] == os.path.dirname(s["gp"]) for s in seen), seen
    for s in seen:
        assert f"SETUP-PY {s['gp']} {s['path0']}" in logs, logs[-2000:]
    assert check_every_file_came_back(tmp_path / "results", 2) == 9
    assert [got[r].verdict for r in range(2)] == [COMPLETE, COMPLETE], [got[r].detail for r in range(2)]
    assert all(got[r].workdir_files > 0 for r in range(2))
    assert_everything_deleted(fake)


def test_gcp_limit_is_partial_and_named(tmp_path, monkeypatch):
    fake, result, got, _ = _gcp_run(tmp_path, monkeypatch, env=(("BIG", "30000"),), collect_limit=20000)
    assert [got[r].verdict for r in range(2)] == [PARTIAL, PARTIAL]
    assert all("big.bin (30000 B)" in got[r].detail and "limit" in got[r].detail for r in range(2))
    assert not list((tmp_path / "results" / "workdir").rglob("big.bin"))
    assert_everything_deleted(fake)


def test_gcp_data_beside_the_script_folder(tmp_path, monkeypatch):
    """`--data SRC:../data`: staged beside the job's working folder in each pod's run folder."""
    from gpucluster.watch.staging import parse_data

    data = tmp_path / "dataset"
    data.mkdir()
    (data / "input.txt").write_text("forty-two\n")
    fake, result, got, _ = _gcp_run(tmp_path, monkeypatch, data=parse_data([f"{data}:../data"]))
    assert result.ok, result.failure
    logs = "".join(p.read_text() for p in (tmp_path / "logs").glob("node-*.log"))
    assert logs.count("read ../data/input.txt: forty-two") == 2, logs[-2000:]
    assert not list((tmp_path / "results" / "workdir").rglob("input.txt"))  # the data does not come back
    assert_everything_deleted(fake)


def test_data_above_the_working_folder_stays_in_the_run_folder():
    """DEST may climb one level beside a shipped script; never onto what the run folder holds, and never
    without a shipped script (there is no working folder of ours then)."""
    from gpucluster.errors import UsageError
    from gpucluster.infra.kubernetes import plan as k8s_plan

    assert k8s_plan.staged_rel("../data", True) == "data"
    assert k8s_plan.staged_rel("inputs/x", True) == "code/inputs/x"
    assert k8s_plan.staged_rel("inputs/x", False) == "inputs/x"
    for dest, code in (("../data", False), ("../outputs", True), ("../control", True), ("../code", True)):
        with pytest.raises(UsageError):
            k8s_plan.staged_rel(dest, code)
    assert os.path.normpath("/gpucluster-run/" + k8s_plan.staged_rel("../data", True)) == "/gpucluster-run/data"


def test_gcp_working_folders_are_uploaded_beside_gs_outputs(gcs_server, tmp_path, monkeypatch):
    """`--output gs://...`: each pod uploads its output folder to URL/RUN_ID/node-N and what the job wrote
    in its working folder to URL/RUN_ID/workdir/node-N, itself (through the same Cloud Storage program and
    service account), so nothing the job wrote is lost; checksums compared against the objects."""
    import json
    import urllib.parse
    import urllib.request

    from gpucluster.watch.outputs import summary

    for k, v in gcs_server.env.items():
        monkeypatch.setenv(k, v)
    gcs_server.make_bucket("results")
    fake, result, got, job = _gcp_run(tmp_path, monkeypatch, output="gs://results/runs")
    assert result.ok, result.failure
    run = job.run_id
    names = set(gcs_server.objects("results"))

    def fetch(name):
        q = urllib.parse.quote(name, safe="")
        with urllib.request.urlopen(f"{gcs_server.url}/storage/v1/b/results/o/{q}?alt=media", timeout=30) as r:
            return r.read()

    for n in range(2):
        assert got[n].verdict == COMPLETE, got[n].detail
        assert got[n].path == f"gs://results/runs/{run}/node-{n}"
        wrote = {}
        for name in sorted(names):
            if name.startswith(f"runs/{run}/node-{n}/wrote-rank"):
                wrote.update(json.loads(fetch(name)))
        assert wrote, f"node {n} reported nothing"
        base = f"runs/{run}/workdir/node-{n}"
        for rel, digest in wrote.items():
            assert gcs_server.sha256("results", f"{base}/{rel}") == digest, (n, rel)
        assert fetch(f"{base}/same-name.txt") == f"written by node {n}\n".encode()
        assert f"{base}/train.py" not in names and f"{base}/unchanged.txt" not in names  # shipped, unchanged
        assert not any(x.startswith(f"{base}/outputs/") for x in names)  # the output folder went on its own
        uploaded = sorted(x for x in names if x.startswith(base + "/"))
        assert got[n].workdir_files == len(uploaded) and got[n].workdir_bytes == sum(
            gcs_server.objects("results")[x] for x in uploaded)
    assert f"gs://results/runs/{run}/workdir/node-N" in summary([got[n].to_dict() for n in range(2)])
    # the Job, Service and ConfigMap are deleted; the Kubernetes service account stays with the cluster
    assert [d[1] for d in fake.of("delete")] == ["job", "service", "configmap"]
    fake.settle()
    assert set(fake.objects) == {("serviceaccount", "gpucluster-objects")} and fake.pods == {}


def test_gcp_resume_lays_the_scripts_own_snapshot_back(tmp_path, monkeypatch):
    """Issue 28 item 3 on gcp: `--resume RUN` stages RUN's outputs (its workdir/node-K included) into each pod,
    then, once the entry script has laid the shipped folder down, copies node K's working-folder files into
    the pod's working folder (gpucluster/node/workdir.py --lay-back through exec), before the job may start:
    the fixture reloads its own snapshot.pt on every rank, and the files come back with this run too."""
    from gpucluster.watch.staging import DataMount

    first = tmp_path / "first"
    first.mkdir()
    _, result, got, _ = _gcp_run(first, monkeypatch, env=(("RESUME", "1"),))
    assert result.ok, result.failure
    outputs = first / "results"
    (head,) = [n for n in range(2) if (outputs / "workdir" / f"node-{n}" / "snapshot.pt").is_file()]
    second = tmp_path / "second"
    second.mkdir()
    events = []
    real = Events.on_metric

    def keep(self, rank, record):
        events.append((rank, record))
        return real(self, rank, record)

    monkeypatch.setattr(Events, "on_metric", keep)
    fake, result, got, _ = _gcp_run(second, monkeypatch, env=(("RESUME", "1"),),
                                    resume=DataMount(str(outputs), "resume"),
                                    resume_files=(f"workdir/node-{head}", f"node {head}, which held global rank 0"))
    assert result.ok, result.failure
    logs = "".join((second / "logs" / f"node-{r}.log").read_text() for r in range(2))
    assert logs.count("resumed from snapshot.pt at epoch 1") == 2, logs[-3000:]
    laid = {r: rec for r, rec in events if rec.get("kind") == "resume_files"}
    assert set(laid) == {0, 1} and all(rec["files"] >= 1 and rec["from"].endswith(f"workdir/node-{head}")
                                       for rec in laid.values()), laid
    # the laid-back files are the job's own now: they come back with this run (a later --resume finds them)
    assert all((second / "results" / "workdir" / f"node-{n}" / "snapshot.pt").is_file() for n in range(2))
    assert [got[r].verdict for r in range(2)] == [COMPLETE, COMPLETE]
    assert_everything_deleted(fake)
