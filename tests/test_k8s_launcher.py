"""The Kubernetes launcher's run logic against FakeKubeApi, an in-memory FAKE of the API server.

No cluster is involved: tests/k8s_fake.py simulates pods and their logs and records every call
(create, list, log, delete), so these tests check what the launcher asks Kubernetes to do.
"""

from __future__ import annotations

import json
import time
from types import SimpleNamespace as NS

import pytest

pytestmark = pytest.mark.integration  # the test tier (tests/conftest.py, docs/testing.md)

pytest.importorskip("kubernetes")

from k8s_fake import FakeApiException, FakeKubeApi, PodScript  # noqa: E402

from gpucluster.infra.gcp.gke import GKE, api_from_gke  # noqa: E402
from gpucluster.infra.kubernetes import launcher as k8s  # noqa: E402
from gpucluster.errors import LaunchError  # noqa: E402
from gpucluster.domain import Cluster  # noqa: E402
from gpucluster.events import NullEvents  # noqa: E402
from gpucluster.watch.launch import JobSpec  # noqa: E402
from gpucluster.workloads.protocol import PREFIX  # noqa: E402

RUN = "r20261122-040000-feed01"
NAME = f"gpucluster-{RUN}"


class Events(NullEvents):
    def __init__(self):
        self.lines, self.metrics, self.phases = [], [], []

    def on_line(self, node_rank, line):
        self.lines.append((node_rank, line))

    def on_metric(self, node_rank, record):
        self.metrics.append((node_rank, record))

    def on_phase(self, phase):
        self.phases.append(phase)


def metric(kind, **fields):
    return PREFIX + json.dumps({"kind": kind, **fields})


def healthy(rank, world=2):
    lines = [f"node {rank} says hello", metric("start", rank=rank, world_size=world)]
    if rank == 0:
        lines.append(metric("epoch", rank=0, epoch=1, loss=0.5, accuracy=0.9, samples_per_s=1000.0))
    lines.append(metric("final", rank=rank, epochs=1, loss=0.5, accuracy=0.9, ok=True))
    return PodScript(lines=lines)


def cluster(nodes=2):
    return Cluster(name="v100", cloud="gcp", nodes=(), gpus_per_node=1, kubeconfig="{}",
                   outputs={"nodes": nodes, "gpus_per_node": 1})


def job(**kw):
    base = dict(run_id=RUN, workload="digits", nproc_per_node=1)
    base.update(kw)
    return JobSpec(**base)


API_RETRY_S = 5  # the launcher's bound on retrying a failing API (600 s for real), scaled down for the tests


def launch(fake, tmp_path, nodes=2, mode="job", api_retry_s=API_RETRY_S, **job_kw):
    events = Events()
    launcher = k8s.KubernetesLauncher(api=k8s.KubeApi(fake, fake, fake), poll_interval=0, mode=mode,
                                      api_retry_s=api_retry_s)
    result = launcher.launch(cluster(nodes), job(**job_kw), events, tmp_path / "logs")
    return result, events, launcher


def assert_everything_deleted(fake, kinds=("job", "service", "configmap")):
    deletes = fake.of("delete")
    assert [d[1] for d in deletes] == list(kinds)
    assert all(d[3] == NAME and d[2] == "default" for d in deletes)
    # deletion takes time on a real API server: what was deleted is terminating, then gone
    assert set(fake.terminating) == {(k, NAME) for k, _ in fake.terminating}
    fake.settle()
    assert fake.objects == {} and fake.pods == {}


def test_success_streams_logs_parses_metrics_and_cleans_up(tmp_path):
    fake = FakeKubeApi({0: healthy(0), 1: healthy(1)})
    result, events, launcher = launch(fake, tmp_path)
    assert result.ok, result.failure
    assert [n.exit_code for n in result.nodes] == [0, 0]
    assert [n.host for n in result.nodes] == [f"{NAME}-0.{NAME}", f"{NAME}-1.{NAME}"]
    # lines arrived whole (the fake splits them across 7-byte chunks), tagged with their node
    assert (0, "node 0 says hello") in events.lines and (1, "node 1 says hello") in events.lines
    assert sorted(result.metrics.finals) == [0, 1]
    assert result.metrics.accuracy == 0.9 and result.metrics.world_size == 2
    assert {r for r, rec in events.metrics if rec["kind"] == "final"} == {0, 1}
    assert "rendezvous" in events.phases and "train" in events.phases
    assert "node 1 says hello" in (tmp_path / "logs" / "node-1.log").read_text()
    # created in order, logs followed on the training container, everything deleted
    assert [c[1] for c in fake.of("create")] == ["configmap", "service", "job"]
    assert {(c[4], c[5]) for c in fake.of("log")} == {("pytorch", True)}
    assert_everything_deleted(fake)
    job_delete = [d for d in fake.of("delete") if d[1] == "job"][0]
    assert job_delete[4] == "Foreground"
    assert all(r.released for r in fake.responses)
    assert launcher.cleanup_errors == []


def test_created_objects_are_the_typed_manifests(tmp_path):
    fake = FakeKubeApi({0: healthy(0, 1)})
    launch(fake, tmp_path, nodes=1)
    # the fake kept nothing (all deleted); the calls show what was created, in what namespace
    assert fake.of("create")[2][1:] == ("job", "default", NAME)
    assert fake.of("list")[0][3] == f"gpucluster-job={NAME}"


def test_one_failing_pod_fails_fast_and_the_rest_are_deleted(tmp_path):
    fake = FakeKubeApi({
        0: PodScript(lines=["rank 0 training forever"], exit_code=None),
        1: PodScript(lines=["rank 1 boom", "Traceback: RuntimeError: NCCL error"], exit_code=3),
    })
    start = time.monotonic()
    result, events, _ = launch(fake, tmp_path, max_seconds=15)
    assert time.monotonic() - start < 10  # did not wait for node 0, which never ends on its own
    assert not result.ok and not result.timed_out
    assert result.failed_node == 1
    assert "node 1" in result.failure and "ended with exit code 3 (Error)" in result.failure
    assert result.nodes[0].exit_code is None and result.nodes[1].exit_code == 3
    assert "Traceback: RuntimeError: NCCL error" in result.nodes[1].last_lines
    assert (0, "rank 0 training forever") in events.lines
    assert_everything_deleted(fake)


def test_image_pull_failure_is_reported_without_waiting_for_the_deadline(tmp_path):
    fake = FakeKubeApi({0: PodScript(waiting_reason="ImagePullBackOff"), 1: healthy(1)})
    result, _, _ = launch(fake, tmp_path)
    assert not result.ok and result.failed_node == 0
    # the image is pulled first for the init container (Kubernetes docs, "Init Containers",
    # https://kubernetes.io/docs/concepts/workloads/pods/init-containers/): ErrImagePull, then
    # ImagePullBackOff, show on it while the app container waits in PodInitializing
    assert "init container wait-for-peers" in result.failure and "ErrImagePull" in result.failure
    assert "pytorch/pytorch:" in result.failure  # the image named
    assert_everything_deleted(fake)


def test_deadline_stops_a_pending_job_and_says_why_it_waited(tmp_path):
    fake = FakeKubeApi({0: PodScript(start_after=10**6), 1: PodScript(start_after=10**6, unschedulable=True)})
    result, _, _ = launch(fake, tmp_path, max_seconds=0.5)
    assert not result.ok and result.timed_out
    assert "time limit" in result.failure and "Insufficient nvidia.com/gpu" in result.failure
    assert_everything_deleted(fake)


def test_every_node_exits_zero_but_a_final_record_is_missing(tmp_path):
    fake = FakeKubeApi({0: healthy(0), 1: PodScript(lines=["no metrics from me"])})
    result, _, _ = launch(fake, tmp_path)
    assert not result.ok and "rank(s) 1 wrote no final record" in result.failure


def test_keyboard_interrupt_still_deletes_everything(tmp_path):
    fake = FakeKubeApi({0: PodScript(exit_code=None), 1: PodScript(exit_code=None)}, interrupt_on_list=3)
    with pytest.raises(KeyboardInterrupt):
        launch(fake, tmp_path)
    assert_everything_deleted(fake)


def test_refused_create_raises_and_removes_what_was_made(tmp_path):
    fake = FakeKubeApi({}, refuse={"job": 403})
    with pytest.raises(LaunchError, match=f"forbade creating job default/{NAME} \\(403 Forbidden\\)"):
        launch(fake, tmp_path)
    # the Job delete is attempted too (an interrupted create may have succeeded) and 404 is fine
    assert [d[1] for d in fake.of("delete")] == ["job", "service", "configmap"]
    fake.settle()
    assert fake.objects == {}


def test_pod_that_disappears_counts_as_a_failure(tmp_path):
    fake = FakeKubeApi({0: PodScript(exit_code=None), 1: PodScript(exit_code=None)})
    original = fake.list_namespaced_pod

    def list_and_preempt(namespace, label_selector=None, **kw):
        out = original(namespace, label_selector=label_selector, **kw)
        if fake.lists == 4:  # node 1's VM is preempted: its pod vanishes
            name = [n for n in fake.pods if n.startswith(f"{NAME}-1-")][0]
            fake.pods.pop(name).deleted.set()
        return out

    fake.list_namespaced_pod = list_and_preempt
    result, _, _ = launch(fake, tmp_path)
    assert not result.ok and result.failed_node == 1 and "disappeared" in result.failure


def test_pytorchjob_mode_creates_and_deletes_the_custom_object(tmp_path):
    fake = FakeKubeApi({}, refuse={"pytorchjobs.kubeflow.org": 404})
    with pytest.raises(LaunchError, match="training operator installed"):
        launch(fake, tmp_path, mode="pytorchjob")
    assert [c[1] for c in fake.of("create")] == ["configmap", "pytorchjobs.kubeflow.org"]
    assert [d[1] for d in fake.of("delete")] == ["pytorchjobs.kubeflow.org", "configmap"]
    fake.settle()
    assert fake.objects == {}


def test_pytorchjob_mode_runs_master_and_workers_by_operator_labels(tmp_path):
    fake = FakeKubeApi({r: healthy(r, world=3) for r in range(3)})
    result, events, _ = launch(fake, tmp_path, nodes=3, mode="pytorchjob")
    assert result.ok, result.failure
    assert [n.host for n in result.nodes] == [f"{NAME}-master-0", f"{NAME}-worker-0", f"{NAME}-worker-1"]
    assert (2, "node 2 says hello") in events.lines  # worker 1 is node rank 2
    assert sorted(result.metrics.finals) == [0, 1, 2]
    deletes = fake.of("delete")
    assert [d[1] for d in deletes] == ["pytorchjobs.kubeflow.org", "configmap"]
    fake.settle()
    assert deletes[0][4] == "Foreground" and fake.objects == {} and fake.pods == {}


def test_api_blips_while_watching_are_tolerated(tmp_path):
    fake = FakeKubeApi({0: healthy(0), 1: healthy(1)}, list_errors=(2, 3, 4))
    result, _, _ = launch(fake, tmp_path)
    assert result.ok, result.failure


def test_losing_the_api_for_longer_than_the_retry_bound_fails_the_launch_and_still_cleans_up(tmp_path):
    fake = FakeKubeApi({0: PodScript(exit_code=None), 1: PodScript(exit_code=None)},
                       list_errors=tuple(range(3, 10**6)))
    t0 = time.monotonic()
    with pytest.raises(LaunchError, match="lost the Kubernetes API while watching the job's pods for [0-9]+ s: .*503"):
        launch(fake, tmp_path, api_retry_s=2)
    assert 2 <= time.monotonic() - t0 < 30  # retried with backoff up to the bound, not given up at once
    assert_everything_deleted(fake)


# -- the realistic fake's worst cases (sources in tests/k8s_fake.py) ---------------------------------
def test_pods_start_with_skew_head_last_and_the_run_still_succeeds(tmp_path):
    fake = FakeKubeApi({0: healthy(0, 3), 1: healthy(1, 3), 2: healthy(2, 3)}, skew=3)
    result, _, _ = launch(fake, tmp_path, nodes=3)
    assert result.ok, result.failure
    order = [name.split("-")[-2] for name in fake.networks[NAME].placed]  # pods: <job>-<index>-fake<index>
    assert order == ["2", "1", "0"], order  # the head's pod was placed last


def test_start_deadline_fails_with_the_schedulers_reason_from_events(tmp_path):
    fake = FakeKubeApi({0: healthy(0), 1: PodScript(unschedulable=True)})
    launcher = k8s.KubernetesLauncher(api=k8s.KubeApi(fake, fake, fake), poll_interval=0.05)
    launcher.start_deadline_s = 1  # the flag's floor is 1 minute; a second keeps the test short
    t0 = time.monotonic()
    result = launcher.launch(cluster(2), job(), Events(), tmp_path / "logs")
    assert not result.ok and result.failed_node == 1 and time.monotonic() - t0 < 30
    assert "not running after the 1 s start deadline: FailedScheduling: 0/3 nodes are available" in result.failure
    assert "Insufficient nvidia.com/gpu" in result.failure
    assert ("list", "event", "default", f"involvedObject.name={NAME}-1-fake1") in fake.calls
    assert_everything_deleted(fake)


class FakeCredentials:
    """FAKE google-auth credentials: `valid` until expired; refresh() mints the next token."""

    def __init__(self):
        self.n, self.token, self.valid, self.refreshes = 0, None, False, 0

    def refresh(self, request):
        self.n += 1
        self.refreshes += 1
        self.token, self.valid = f"tok{self.n}", True


KUBECONFIG = json.dumps({"clusters": [{"name": "c", "cluster": {"server": "https://192.0.2.10",
                                                                 "certificate-authority-data": "LS0tQ0EtLS0="}}],
                         "users": [{"name": "c", "user": {"exec": {"command": "gke-gcloud-auth-plugin"}}}]})


def test_gke_access_uses_a_bearer_token_from_adc_and_refreshes_it():
    creds = FakeCredentials()
    api = api_from_gke(KUBECONFIG, credentials=creds)
    config = api.core.api_client.configuration
    assert config.host == "https://192.0.2.10"
    with open(config.ssl_ca_cert, "rb") as f:
        assert f.read() == b"---CA---"
    assert config.get_api_key_with_prefix("authorization") == "Bearer tok1"
    creds.valid = False  # expired (google-auth marks it invalid inside its refresh margin)
    assert config.get_api_key_with_prefix("authorization") == "Bearer tok2"
    assert creds.refreshes == 2


def test_the_fake_refuses_unauthenticated_calls_and_the_launch_names_the_fix(tmp_path):
    """An API server refuses a request no authenticator accepts with 401 (Kubernetes docs,
    "Authenticating": "requests that are rejected by all authenticators are ... HTTP status code 401");
    a GKE access token is an OAuth token that expires (google-auth refreshes it inside its margin), and
    a refreshed token the cluster does not accept is such a request. The fake checks the bearer token
    the client's refresh hook would send (`auth`, `tokens`).
    Checked once by hand (2026-11-26): with the fake's token check removed (the old, kinder fake that
    accepted any call), this test fails ("DID NOT RAISE LaunchError")."""
    creds = FakeCredentials()
    api = api_from_gke(KUBECONFIG, credentials=creds)
    config = api.core.api_client.configuration
    fake = FakeKubeApi({0: healthy(0, 1)}, auth=lambda: config.get_api_key_with_prefix("authorization"),
                       tokens=("Bearer tok1",))
    result, _, _ = launch(fake, tmp_path, nodes=1)  # the token the hook sends is accepted
    assert result.ok, result.failure
    creds.valid = False  # expired: the hook refreshes to tok2, which this server does not accept
    fake2 = FakeKubeApi({0: healthy(0, 1)}, auth=lambda: config.get_api_key_with_prefix("authorization"),
                        tokens=("Bearer tok1",))
    with pytest.raises(LaunchError) as err:
        launch(fake2, tmp_path, nodes=1)
    assert "refused gpucluster's credentials" in err.value.message and "401" in err.value.message
    assert "application-default login" in err.value.hint


def test_missing_adc_is_one_line_before_anything_is_created(tmp_path, monkeypatch):
    import google.auth
    from google.auth.exceptions import DefaultCredentialsError

    def no_adc(**kw):
        raise DefaultCredentialsError("Your default credentials were not found.")

    monkeypatch.setattr(google.auth, "default", no_adc)
    launcher = k8s.KubernetesLauncher(poll_interval=0, platform=GKE)  # gcp's: Google credentials for the API
    c = Cluster(name="v100", cloud="gcp", nodes=(), gpus_per_node=1, kubeconfig=KUBECONFIG,
                outputs={"nodes": 1, "gpus_per_node": 1})
    with pytest.raises(LaunchError) as err:
        launcher.launch(c, job(), Events(), tmp_path / "logs")
    assert err.value.message.startswith("cannot authenticate to the GKE cluster: no Google application-default")
    assert "\n" not in err.value.message and "application-default login" in err.value.hint


def test_the_fake_validates_like_the_api_server():
    """The fake's field validation answers 422 Unprocessable Entity as the API server does (Kubernetes
    docs, "Object Names and IDs": ConfigMap and Job names are DNS-1123 subdomains, Service names
    DNS-1035 labels; "ConfigMaps": keys [-._a-zA-Z0-9]+, at most 1 MiB; "Jobs": an Indexed Job needs
    `completions`, its pod template's restartPolicy Never or OnFailure; "Labels and Selectors": a
    malformed selector is a 400). Every launcher test's objects go through it, so a manifest the API
    server would refuse fails those tests; no launcher path sends such an object today (the spec
    rules refuse bad names first, exit 2), so only this test fails without it.
    Checked once by hand (2026-11-26): with `_validate` a no-op (the old, kinder fake), this test
    fails ("DID NOT RAISE") and the other 22 tests of this file pass."""
    from kubernetes import client as kc

    fake = FakeKubeApi({})
    bad_name = kc.V1ConfigMap(metadata=kc.V1ObjectMeta(name="Bad_Name"), data={"ok": "1"})
    with pytest.raises(Exception, match="422.*metadata.name"):
        fake.create_namespaced_config_map("default", bad_name)
    bad_key = kc.V1ConfigMap(metadata=kc.V1ObjectMeta(name="ok"), data={"a/b": "1"})
    with pytest.raises(Exception, match="Invalid key"):
        fake.create_namespaced_config_map("default", bad_key)
    with pytest.raises(Exception, match="400.*unable to parse"):
        fake.list_namespaced_pod("default", label_selector="a b")
    pod = kc.V1PodSpec(restart_policy="Always", containers=[kc.V1Container(name="c", image="i")])
    bad_job = kc.V1Job(metadata=kc.V1ObjectMeta(name="j"), spec=kc.V1JobSpec(
        completion_mode="Indexed", template=kc.V1PodTemplateSpec(metadata=kc.V1ObjectMeta(labels={}), spec=pod)))
    with pytest.raises(Exception, match="completions: Required.*restartPolicy"):
        fake.create_namespaced_job("default", bad_job)


def test_a_refused_delete_is_kept_as_a_cleanup_error_and_the_rest_is_still_deleted(tmp_path):
    # an API server answers 500 when its storage (etcd) fails a request (Kubernetes docs, "API Concepts":
    # status codes); the launcher must say what it left, not drop it
    fake = FakeKubeApi({0: healthy(0), 1: healthy(1)})
    fake.refuse_delete = {"service": 500}
    result, _, launcher = launch(fake, tmp_path, api_retry_s=3)
    assert result.ok, result.failure
    deletes = [d[1] for d in fake.of("delete")]
    assert deletes[0] == "job" and deletes[-1] == "configmap"  # the others still went
    assert deletes.count("service") >= 2  # a 500 is retried (with backoff, for up to the bound) before it is kept
    assert len(launcher.cleanup_errors) == 1 and launcher.cleanup_errors[0].startswith(f"service default/{NAME}: ")
    assert "500" in launcher.cleanup_errors[0]


# -- the namespace option (issue 26 item 9) ---------------------------------------------------------
def test_a_missing_namespace_is_made_for_the_run_and_removed_after_it(tmp_path):
    fake = FakeKubeApi({0: healthy(0), 1: healthy(1)})
    launcher = k8s.KubernetesLauncher(api=k8s.KubeApi(fake, fake, fake), poll_interval=0, namespace="team-a",
                                      api_retry_s=API_RETRY_S)
    result = launcher.launch(cluster(2), job(), Events(), tmp_path / "logs")
    assert result.ok, result.failure
    creates = fake.of("create")
    assert creates[0][1:] == ("namespace", "", "team-a")
    assert [c[2] for c in creates[1:]] == ["team-a"] * 3  # configmap, service, job in it
    made = fake.objects.get(("namespace", "team-a")) or None
    assert made is None or made.metadata.labels["app.kubernetes.io/managed-by"] == "gpucluster"
    deletes = fake.of("delete")
    assert [d[1] for d in deletes] == ["job", "service", "configmap", "namespace"]  # the namespace last
    fake.settle()
    assert "team-a" not in fake.namespaces and fake.objects == {}


def test_a_namespace_the_run_made_is_kept_while_another_runs_job_is_in_it(tmp_path):
    fake = FakeKubeApi({0: healthy(0), 1: healthy(1)})

    def another_run_starts(f):  # between our creating the namespace and our cleanup
        if "team-a" in f.namespaces and ("job", "gpucluster-other") not in f.objects:
            f.objects[("job", "gpucluster-other")] = NS(metadata=NS(
                name="gpucluster-other", labels={"app.kubernetes.io/managed-by": "gpucluster",
                                                 "gpucluster-job": "gpucluster-other"}))
            f.object_ns[("job", "gpucluster-other")] = "team-a"
        return False

    fake.interrupt_when = another_run_starts
    launcher = k8s.KubernetesLauncher(api=k8s.KubeApi(fake, fake, fake), poll_interval=0, namespace="team-a",
                                      api_retry_s=API_RETRY_S)
    assert launcher.launch(cluster(2), job(), Events(), tmp_path / "logs").ok
    assert "namespace" not in [d[1] for d in fake.of("delete")] and launcher.cleanup_errors == []
    fake.settle()
    assert "team-a" in fake.namespaces  # the other run's Job is still in it


def test_a_namespace_the_run_made_goes_when_the_other_job_in_it_is_being_deleted(tmp_path):
    """Another run's Job in the namespace was deleted just before our cleanup; the API server still lists
    it, with a deletionTimestamp, until its pods are gone (Kubernetes docs, "Garbage Collection":
    with Foreground propagation the owner stays, with a deletionTimestamp, until its dependents are
    deleted; the fake keeps it listed for `delete_ticks` listings). It is going, so it does not keep
    the namespace: ours is deleted.
    Checked once by hand (2026-11-26): with the launcher's `deletion_timestamp` filter removed
    (k8s_objects._delete_namespace), this test fails on this fake (the namespace is kept); on the
    old, kinder fake (delete_ticks=0: a deleted Job is gone at once) the same broken launcher passes
    it, the bug hidden."""
    fake = FakeKubeApi({0: healthy(0), 1: healthy(1)})
    other = ("job", "gpucluster-other")

    delete_job = fake.delete_namespaced_job

    def another_run_ends_first(name, namespace, **kw):  # its Job, in our namespace, is deleted as ours is
        if name != other[1] and other not in fake.objects:
            fake.objects[other] = NS(metadata=NS(name=other[1], labels={"app.kubernetes.io/managed-by": "gpucluster",
                                                                           "gpucluster-job": other[1]}))
            fake.object_ns[other] = "team-a"
            delete_job(other[1], "team-a")
        return delete_job(name, namespace, **kw)

    fake.delete_namespaced_job = another_run_ends_first
    launcher = k8s.KubernetesLauncher(api=k8s.KubeApi(fake, fake, fake), poll_interval=0, namespace="team-a",
                                      api_retry_s=API_RETRY_S)
    assert launcher.launch(cluster(2), job(), Events(), tmp_path / "logs").ok
    assert [d[1] for d in fake.of("delete")][-1] == "namespace" and launcher.cleanup_errors == []
    fake.settle()
    assert "team-a" not in fake.namespaces and fake.objects == {}


def test_the_fake_refuses_objects_in_a_namespace_that_does_not_exist():
    from gpucluster.infra.kubernetes import plan as k8s_plan
    from gpucluster.infra.kubernetes.manifests import config_map_manifest

    fake = FakeKubeApi({})
    plan = k8s_plan.plan_job(cluster(1), job(), namespace="nope")
    with pytest.raises(FakeApiException, match='namespaces "nope" not found') as err:
        fake.create_namespaced_config_map("nope", config_map_manifest(plan))
    assert err.value.status == 404


def test_pytorchjob_mode_without_the_operator_is_refused_before_anything_is_created(tmp_path):
    """An API server serves a custom resource only when its CRD is installed; otherwise 404 "the server
    could not find the requested resource" (Kubernetes docs, "Custom Resources")."""
    fake = FakeKubeApi({r: healthy(r) for r in range(2)})
    fake.missing_crds = {"pytorchjobs.kubeflow.org"}
    with pytest.raises(LaunchError) as err:
        launch(fake, tmp_path, mode="pytorchjob")
    assert "training operator" in str(err.value) and "nothing was created" in str(err.value)
    assert fake.of("create") == []
