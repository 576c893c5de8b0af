"""`--data gs://...` and `--output gs://...` on gcp, through the Kubernetes launcher: FakeKubeApi (the
in-memory FAKE API server, tests/k8s_fake.py) runs each pod's exec for real here, and a Cloud
Storage JSON API on loopback (gcp-storage-emulator behind a layer that answers as GCS does where
the emulator is kinder, tests/gcs_emulator.py) stands for GCS. Like GKE's Workload Identity, the
fake gives a pod Google credentials (here: the storage endpoint) only when it runs as a Kubernetes
service account annotated with a Google service account; any other pod's transfer fails."""

from __future__ import annotations

import hashlib
import os
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration  # the test tier (tests/conftest.py, docs/testing.md)

pytest.importorskip("kubernetes")
sys.path.insert(0, str(Path(__file__).parent))

from gcs_emulator import gcs_server  # noqa: E402,F401
from k8s_fake import FakeKubeApi  # noqa: E402
from k8s_fake_http import serve  # noqa: E402
from test_k8s_data import pod_dir  # noqa: E402
from test_k8s_launcher import NAME, RUN, Events, healthy, job  # noqa: E402
from test_k8s_outputs import with_outputs  # noqa: E402

from gpucluster.domain import Cluster  # noqa: E402
from gpucluster.errors import LaunchError  # noqa: E402
from gpucluster.infra.gcp import gcs  # noqa: E402
from gpucluster.infra.gcp.gke import GKE  # noqa: E402
from gpucluster.infra.kubernetes import launcher as k8s  # noqa: E402
from gpucluster.watch.outputs import COMPLETE, FAILED  # noqa: E402
from gpucluster.watch.staging import STAGE_KIND, parse_data  # noqa: E402
from gpucluster.infra.registry import plugin, readers  # noqa: E402

GSA = "gpuc-v100@my-proj.iam.gserviceaccount.com"


def cluster(nodes=2, objects=True):
    outputs = {"nodes": nodes, "gpus_per_node": 1}
    if objects:
        outputs.update(objects_service_account=GSA, objects_ksa=gcs.OBJECTS_KSA, objects_namespace="default")
    return Cluster(name="v100", cloud="gcp", nodes=(), gpus_per_node=1, kubeconfig="{}", outputs=outputs)


def launcher(fake, api=None):
    return k8s.KubernetesLauncher(api=api or k8s.KubeApi(fake, fake, fake, stream=fake.stream), poll_interval=0,
                                  objects=gcs.GcsTransfer(), api_retry_s=10, platform=GKE)


def test_pods_pull_gs_data_and_upload_their_outputs_as_the_bound_service_account(gcs_server, tmp_path,
                                                                                    monkeypatch):
    for k, v in gcs_server.env.items():
        monkeypatch.setenv(k, v)
    gcs_server.make_bucket("train-data")
    gcs_server.make_bucket("results")
    src = tmp_path / "ds"
    (src / "shards").mkdir(parents=True)
    for i in range(3):
        (src / "shards" / f"{i}.bin").write_bytes(os.urandom(30_000))
    want = gcs_server.put_tree("train-data", "imagenet/train", src)
    mounts = parse_data(["gs://train-data/imagenet/train:inputs"], plugin("gcp"))
    fake = FakeKubeApi({r: with_outputs(healthy(r), r) for r in range(2)})
    api, stop = serve(fake)  # the real kubernetes client: each pod's exec patches an ApiClient while it opens
    run = launcher(fake, api)
    spec = job(data=mounts, output_dir="gs://results/runs")
    events = Events()
    try:
        result = run.launch(cluster(), spec, events, tmp_path / "logs")
        assert result.ok, result.failure
        got = {o.node_rank: o for o in run.collect_outputs(spec, Events())}
    finally:
        stop()
    assert fake.rest_upgrades == [] and run.cleanup_errors == []
    # data: every pod pulled the prefix itself, checksums intact
    for rank in range(2):
        folder = pod_dir(fake, rank) / "inputs"
        assert {p.relative_to(folder).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
                for p in folder.rglob("*") if p.is_file()} == want
    stage = {r: rec for r, rec in events.metrics if rec.get("kind") == STAGE_KIND}
    assert set(stage) == {0, 1}
    assert all(rec["fetched_bytes"] == 90_000 and rec["files"] == 3 and rec["sent_bytes"] == 0 for rec in stage.values())
    assert events.phases[:2] == ["stage", "rendezvous"]
    # outputs: each pod uploaded under RUN_ID/node-N, nothing came back here
    objects = gcs_server.objects("results")
    for rank in range(2):
        assert got[rank].verdict == COMPLETE, got[rank].detail
        assert got[rank].path == f"gs://results/runs/{RUN}/node-{rank}" and got[rank].files == 2
        name = f"runs/{RUN}/node-{rank}/model.pt"
        assert name in objects
        assert gcs_server.sha256("results", name) == hashlib.sha256(fake.scripts[rank].outputs["model.pt"]).hexdigest()
    # the pods ran as the Kubernetes service account bound to the cluster's Google service account
    sa = fake.objects[("serviceaccount", gcs.OBJECTS_KSA)]
    assert sa.metadata.annotations == {"iam.gke.io/gcp-service-account": GSA}
    assert all(p.service_account == gcs.OBJECTS_KSA for p in fake.pods.values())
    # the Job, Service and ConfigMap are deleted; the service account stays with the cluster
    fake.settle()
    assert set(fake.objects) == {("serviceaccount", gcs.OBJECTS_KSA)}


def test_a_second_run_reuses_the_service_account_and_a_failed_upload_names_the_node(gcs_server, tmp_path,
                                                                                   monkeypatch):
    for k, v in gcs_server.env.items():
        monkeypatch.setenv(k, v)
    fake = FakeKubeApi({r: with_outputs(healthy(r), r) for r in range(2)})
    fake.create_namespaced_service_account("default", _ksa())  # an earlier run made it (409 now)
    run = launcher(fake)
    spec = job(output_dir="gs://no-such-bucket/runs")
    assert run.launch(cluster(), spec, Events(), tmp_path / "logs").ok
    got = {o.node_rank: o for o in run.collect_outputs(spec, Events())}
    for rank in range(2):
        assert got[rank].verdict == FAILED
        assert f"node {rank} (pod {NAME}-{rank}-fake{rank})" in got[rank].detail
        assert "no-such-bucket" in got[rank].detail


def test_a_cluster_made_without_object_access_is_refused_before_anything_is_created(tmp_path):
    fake = FakeKubeApi({r: healthy(r) for r in range(2)})
    spec = job(data=parse_data(["gs://train-data/x"], plugin("gcp")))
    with pytest.raises(LaunchError) as exc:
        launcher(fake).launch(cluster(objects=False), spec, Events(), tmp_path / "logs")
    assert "gs://train-data/x" in str(exc.value) and "gcsRead" in str(exc.value)
    assert fake.of("create") == []


def _ksa():
    from gpucluster.infra.kubernetes.manifests import kube_models

    k = kube_models()
    return k.V1ServiceAccount(metadata=k.V1ObjectMeta(name=gcs.OBJECTS_KSA, namespace="default",
                                                      annotations={"iam.gke.io/gcp-service-account": GSA}))


def test_resume_from_outputs_a_run_uploaded_to_gs_is_pulled_by_every_pod(gcs_server, tmp_path, monkeypatch):
    """`--resume` of a run whose pods uploaded to gs://: the ledger's rows name the URLs; the new run's
    pods pull PREFIX/RUN_ID (every node-N/) into resume/ themselves."""
    from gpucluster.ledger.store import Ledger
    from gpucluster.plan.resume import resume_source

    for k, v in gcs_server.env.items():
        monkeypatch.setenv(k, v)
    gcs_server.make_bucket("results")
    earlier = "r20261122-030000-beef00"
    ckpt = os.urandom(7000)
    gcs_server.put("results", f"runs/{earlier}/node-0/checkpoint.pt", ckpt)
    ledger = Ledger(tmp_path / "ledger.sqlite3")
    ledger.create_run(earlier, cloud="gcp", cluster="v100", nodes=2, gpus_per_node=1, command=["x"], spec={})
    ledger.finish_run(earlier, status="interrupted", exit_code=130)
    ledger.record_outputs(earlier, [{"node_rank": n, "path": f"gs://results/runs/{earlier}/node-{n}",
                                     "files": 1 - n, "bytes": 7000 * (1 - n), "verdict": "complete"} for n in (0, 1)])
    rid, mount = resume_source(ledger, earlier[:16], plugin("gcp"))
    assert rid == earlier and mount.src == f"gs://results/runs/{earlier}" and mount.dest == "resume"
    with pytest.raises(Exception) as exc:  # another cloud's nodes cannot read gs://
        resume_source(ledger, earlier, plugin("aws"), readers())
    assert "gs:// works with --cloud gcp" in str(exc.value)
    ledger.close()
    fake = FakeKubeApi({r: healthy(r) for r in range(2)})
    events = Events()
    result = launcher(fake).launch(cluster(), job(resume=mount), events, tmp_path / "logs")
    assert result.ok, result.failure
    for rank in range(2):
        got = pod_dir(fake, rank) / "resume" / "node-0" / "checkpoint.pt"
        assert hashlib.sha256(got.read_bytes()).hexdigest() == hashlib.sha256(ckpt).hexdigest()
