"""Idle stop on gcp (`up --idle-minutes N`): the objects `infra/gcp/idle.py` installs, created through
the REAL kubernetes client against the fake API server served over HTTP (tests/k8s_fake_http.py, with
RBAC, label selectors, plain Jobs and merge patches: tests/k8s_fake_rbac.py), and the REAL watcher
(`infra/gcp/pod_idle.py`) run as its Deployment's container command says, with the ConfigMap's copy of the
program, its service account's token (RBAC applies to every call it makes) and its minute scaled to
SCALE seconds. Job pods are pods labelled as the launcher labels them (k8s_plan: managed-by and
gpucluster-job)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration  # the test tier (tests/conftest.py, docs/testing.md)

pytest.importorskip("kubernetes")

from k8s_fake import FakeApiException, FakeKubeApi  # noqa: E402
from k8s_fake_http import serve  # noqa: E402

from gpucluster.errors import SpecError  # noqa: E402
from gpucluster.infra.gcp import catalog, idle as k8s_idle  # noqa: E402
from gpucluster.infra.kubernetes import plan as k8s_plan  # noqa: E402
from gpucluster.spec import ClusterSpec  # noqa: E402

SCALE = 1.0  # seconds per "minute"
SA_TOKEN = "idle-sa-token"
JOB_LABELS = {"app.kubernetes.io/managed-by": "gpucluster", k8s_plan.JOB_LABEL: "gpucluster-r1"}


def _serial(obj):
    from kubernetes.client import ApiClient

    return ApiClient().sanitize_for_serialization(obj)


def objects(minutes=2, nodes=2, namespace="default", lifetime_s=3600.0):
    return k8s_idle.manifests(cluster="demo", namespace=namespace, minutes=minutes, nodes=nodes,
                              deadline=time.time() + lifetime_s)


class Cluster:
    """The fake API server over HTTP, the idle stop installed, and the watcher as its Deployment runs it."""

    def __init__(self, tmp_path, minutes=2, nodes=2, namespace="default", lifetime_s=3600.0):
        self.fake = FakeKubeApi({}, delete_ticks=2)
        self.api, self.stop_server = serve(self.fake)
        self.url = self.api.core.api_client.configuration.host
        self.namespace = namespace
        self.installed = k8s_idle.install(self.api, objects(minutes, nodes, namespace, lifetime_s), namespace)
        # the kubelet's part for the watcher's pod: its service account's token and the ConfigMap's files
        self.fake.sa_tokens[SA_TOKEN] = (namespace, k8s_idle.NAME)
        self.fake.tokens.add(SA_TOKEN)
        self.sa = tmp_path / "sa"
        self.sa.mkdir(parents=True)
        (self.sa / "token").write_text(SA_TOKEN)
        self.files = tmp_path / "gpucluster"
        self.files.mkdir()
        cm = self.fake.objects[("configmap", k8s_idle.NAME)]
        for key, text in cm.data.items():
            (self.files / key).write_text(text)
        self.proc: subprocess.Popen | None = None
        self.log = tmp_path / "watcher.log"

    def start(self, poll=0.1) -> float:
        dep = self.fake.objects[("deployment", k8s_idle.NAME)]
        (c,) = dep.spec.template.spec.containers
        argv = [sys.executable if w == "python" else w.replace("/gpucluster", str(self.files)) for w in c.command]
        env = {**os.environ, **{e.name: e.value for e in c.env}, "GPUCLUSTER_POLL": str(poll),
               "GPUCLUSTER_IDLE_SCALE": str(SCALE), "GPUCLUSTER_API_URL": self.url, "GPUCLUSTER_SA_DIR": str(self.sa)}
        self.proc = subprocess.Popen(argv, env=env, stdout=open(self.log, "a"), stderr=subprocess.STDOUT)
        return time.time()

    def kill(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def close(self) -> None:
        self.kill()
        self.stop_server()

    def hold(self):
        return self.fake.objects[("job", k8s_idle.HOLD)]

    def parallelism(self) -> int:
        return int(self.hold().spec.parallelism)

    def hold_pods(self, live=True):
        return [p for n, p in self.fake.pods.items() if n.startswith(k8s_idle.HOLD + "-")
                and (not live or p.terminating is None)]

    def wait_for(self, cond, timeout: float) -> float | None:
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            self.fake._tls.authorization = "Bearer fake-token"  # the test's own calls: an admin's
            try:
                self.fake.list_namespaced_pod(self.namespace)  # the kubelet's clock moves (tests/k8s_fake.py)
            except FakeApiException:  # an outage
                pass
            if cond():
                return time.time()
            time.sleep(0.05)
        return None

    def job(self, name="gpucluster-r1", nodes=1, namespace=None, labels=None):
        """A job's pods, as the Job controller makes them (Pending, then Running on a node)."""
        from kubernetes import client as k

        body = k.V1Job(metadata=k.V1ObjectMeta(name=name, labels=labels or JOB_LABELS), spec=k.V1JobSpec(
            parallelism=nodes, template=k.V1PodTemplateSpec(
                metadata=k.V1ObjectMeta(labels=labels or JOB_LABELS),
                spec=k.V1PodSpec(restart_policy="Never", containers=[k.V1Container(name="pytorch", image="x")]))))
        self.api.batch.create_namespaced_job(namespace or self.namespace, body)  # over HTTP, as an admin


@pytest.fixture
def cluster(tmp_path):
    made = []

    def make(**kw):
        c = Cluster(tmp_path / f"c{len(made)}", **kw)
        made.append(c)
        return c

    yield make
    for c in made:
        c.close()


# -- what is installed ----------------------------------------------------------------------------
def test_the_objects_validate_and_the_role_allows_only_what_the_watcher_needs():
    objs = objects(minutes=30, nodes=3, namespace="team")
    assert list(objs) == list(k8s_idle.PARTS)
    for kind, obj in objs.items():
        d = _serial(obj)
        assert d["metadata"]["namespace"] == "team" and d["metadata"]["labels"]["gpucluster-cluster"] == "demo"
        assert k8s_plan.JOB_LABEL not in d["metadata"]["labels"]  # never counted as a job
    role = _serial(objs["role"])
    assert role["rules"] == [{"apiGroups": [""], "resources": ["pods"], "verbs": ["list"]},
                             {"apiGroups": ["batch"], "resources": ["jobs"], "resourceNames": [k8s_idle.HOLD],
                              "verbs": ["get", "patch"]}]
    binding = _serial(objs["rolebinding"])
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": k8s_idle.NAME, "namespace": "team"}]
    hold = _serial(objs["job"])
    assert hold["spec"]["parallelism"] == 3 and "completionMode" not in hold["spec"]
    assert 3500 <= hold["spec"]["activeDeadlineSeconds"] <= 3600  # the max lifetime: a dead-man for the pins
    pod = hold["spec"]["template"]
    assert pod["metadata"]["annotations"] == {"cluster-autoscaler.kubernetes.io/safe-to-evict": "false"}
    assert k8s_plan.JOB_LABEL not in pod["metadata"]["labels"]
    spec = pod["spec"]
    assert spec["restartPolicy"] == "Never" and spec["nodeSelector"] == {"cloud.google.com/gke-nodepool": "gpu"}
    assert spec["tolerations"] == [{"effect": "NoSchedule", "key": "nvidia.com/gpu", "operator": "Exists"}]
    (c,) = spec["containers"]
    assert c["resources"] == {"requests": {"cpu": "0", "memory": "0"}}  # never takes room from a training pod
    assert "nvidia.com/gpu" not in str(c)
    assert "requiredDuringSchedulingIgnoredDuringExecution" not in str(spec["affinity"])  # never pending for a node
    dep = _serial(objs["deployment"])
    tpl = dep["spec"]["template"]["spec"]
    assert dep["spec"]["replicas"] == 1 and dep["spec"]["strategy"] == {"type": "Recreate"}
    assert tpl["serviceAccountName"] == k8s_idle.NAME
    assert tpl["nodeSelector"] == {"cloud.google.com/gke-nodepool": "system"}
    (w,) = tpl["containers"]
    env = {e["name"]: e["value"] for e in w["env"]}
    assert env["GPUCLUSTER_IDLE_MINUTES"] == "30" and env["GPUCLUSTER_NODES"] == "3" and env["GPUCLUSTER_NAMESPACE"] == "team"
    assert w["command"] == ["python", "/gpucluster/idle.py"]
    assert _serial(objs["configmap"])["data"]["idle.py"] == Path(k8s_idle.__file__).with_name("pod_idle.py").read_text()


def test_idle_minutes_are_checked_by_the_gcp_rules():
    spec = ClusterSpec(cloud="gcp", nodes=2, max_lifetime_minutes=240)
    assert catalog.idle_minutes(spec.replace(options=(("idleMinutes", "30"),))) == 30
    assert catalog.validate_spec(spec.replace(options=(("idleMinutes", "30"),))) == []
    for bad in ("0", "241", "ten"):
        with pytest.raises(SpecError, match=f"idle minutes '{bad}' is not allowed: a whole number of minutes from 1"):
            catalog.validate_spec(spec.replace(options=(("idleMinutes", bad),)))
    with pytest.raises(SpecError, match="not allowed with option autoscale=false: a fixed GPU pool keeps its nodes"):
        catalog.validate_spec(spec.replace(options=(("idleMinutes", "30"), ("autoscale", "false"))))


def test_install_goes_through_the_real_client_and_a_second_up_replaces_it(cluster):
    c = cluster(namespace="team")
    assert c.installed == [f"{kind} team/{k8s_idle.HOLD if kind == 'job' else k8s_idle.NAME}" for kind in k8s_idle.PARTS]
    assert c.fake.namespaces["team"] == {"app.kubernetes.io/managed-by": "gpucluster"}  # made before any run
    assert c.wait_for(lambda: len([p for p in c.hold_pods() if p.phase == "Running"]) == 2, 5)
    # a later `up` of the same stack: every part replaced, the hold raised again and its count restarted
    c.fake.patch_namespaced_job(k8s_idle.HOLD, "team", {"spec": {"parallelism": 0}})
    again = k8s_idle.install(c.api, objects(minutes=5, nodes=2, namespace="team"), "team")
    assert again == c.installed
    assert c.parallelism() == 2
    assert [x[1] for x in c.fake.calls if x[0] == "replace"] == ["serviceaccount", "role", "rolebinding",
                                                                 "configmap", "deployment"]
    env = {e.name: e.value for e in c.fake.objects[("deployment", k8s_idle.NAME)].spec.template.spec.containers[0].env}
    assert env["GPUCLUSTER_IDLE_MINUTES"] == "5"


# -- the watcher --------------------------------------------------------------------------------
def test_no_job_releases_the_gpu_nodes_after_the_idle_time(cluster):
    c = cluster(minutes=2)
    assert c.wait_for(lambda: len(c.hold_pods()) == 2, 5)
    t0 = c.start()
    at = c.wait_for(lambda: c.parallelism() == 0, 30)
    assert at is not None, c.log.read_text()
    installed_at = float(c.fake.objects[("job", k8s_idle.HOLD)].metadata.annotations[k8s_idle.LAST_ANNOTATION])
    assert 2 * SCALE - 0.3 <= at - installed_at <= 2 * SCALE + 8.0, at - installed_at  # counted from `up`
    assert at >= t0
    assert c.wait_for(lambda: not c.hold_pods(live=False), 5)  # the pods went (terminating first)
    assert c.wait_for(lambda: "released the GPU nodes (hold 2 -> 0): no gpucluster job for 2 minutes"
                      in c.log.read_text(), 5), c.log.read_text()
    assert c.proc.poll() is None  # it stays, for the next job


def test_a_job_holds_it_off_its_end_starts_the_count_again_and_a_later_job_pins_its_nodes_again(cluster):
    c = cluster(minutes=2)
    c.job(nodes=1)
    c.start()
    time.sleep(3 * SCALE)
    assert c.parallelism() == 2  # the job runs: nothing released
    c.fake.finish_pods("gpucluster-r1")
    ended = time.time()
    at = c.wait_for(lambda: c.parallelism() == 0, 30)
    assert at is not None and 2 * SCALE - 0.3 <= at - ended <= 2 * SCALE + 8.0, at - ended
    # `exec` starts a job after the release: once its pod has a node, that node is held again (one, not the
    # two of the pool: a hold pod that found no node would make the autoscaler add one)
    c.job(name="gpucluster-r2", nodes=1, labels={**JOB_LABELS, k8s_plan.JOB_LABEL: "gpucluster-r2"})
    assert c.wait_for(lambda: c.parallelism() == 1, 10), c.log.read_text()
    assert c.wait_for(lambda: "holding 1 GPU node(s)" in c.log.read_text(), 5), c.log.read_text()


def test_a_restarted_watcher_keeps_the_time_of_the_last_job(cluster):
    c = cluster(minutes=3)
    first = c.start()
    time.sleep(1.5)
    c.kill()
    assert c.parallelism() == 2
    c.start()
    at = c.wait_for(lambda: c.parallelism() == 0, 30)
    assert at is not None and 3 * SCALE - 0.3 <= at - first <= 3 * SCALE + 8.0, at - first


def test_it_rides_out_an_api_outage(cluster):
    c = cluster(minutes=3)
    c.start()
    time.sleep(0.5)
    c.fake.outage(1.5)
    at = c.wait_for(lambda: c.parallelism() == 0, 30)
    assert at is not None and c.proc.poll() is None
    assert c.wait_for(lambda: "API call failed" in c.log.read_text(), 5), c.log.read_text()


def test_it_never_touches_pods_or_objects_that_are_not_the_clusters(cluster):
    c = cluster(minutes=2, namespace="team")
    # someone else's Job in the namespace, a pod of a gpucluster job in ANOTHER namespace, and a pod that
    # carries only the job label (not made by gpucluster): none of them is a job of this cluster
    c.job(name="their-batch", nodes=1, labels={"app": "theirs"})
    c.job(name="gpucluster-other", nodes=1, namespace="default")
    c.job(name="lookalike", nodes=1, labels={k8s_plan.JOB_LABEL: "lookalike"})
    t0 = c.start()
    at = c.wait_for(lambda: c.parallelism() == 0, 30)
    assert at is not None and at - t0 <= 2 * SCALE + 8.0  # they did not hold it off
    mine = [x for x in c.fake.calls if x[0] in ("patch", "delete", "replace", "create") and x[1] != "pod"]
    touched = {(x[0], x[1], x[3]) for x in mine if x[0] != "create"}
    assert touched == {("patch", "job", k8s_idle.HOLD)}, touched  # the watcher patched its hold Job only
    assert c.fake.objects[("job", "their-batch")].spec.parallelism == 1
    assert all(p.terminating is None for n, p in c.fake.pods.items() if not n.startswith(k8s_idle.HOLD))
    # and it could not have: its token may patch the hold Job alone (RBAC)
    req = urllib.request.Request(f"{c.url}/apis/batch/v1/namespaces/team/jobs/their-batch", method="PATCH",
                                 data=b'{"spec":{"parallelism":0}}',
                                 headers={"Authorization": f"Bearer {SA_TOKEN}",
                                          "Content-Type": "application/merge-patch+json"})
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(req, timeout=10)
    assert refused.value.code == 403 and b'cannot patch resource \\"jobs\\"' in refused.value.read()
    req = urllib.request.Request(f"{c.url}/api/v1/namespaces/default/pods", headers={"Authorization": f"Bearer {SA_TOKEN}"})
    with pytest.raises(urllib.error.HTTPError) as other_ns:
        urllib.request.urlopen(req, timeout=10)
    assert other_ns.value.code == 403


def test_the_max_lifetime_releases_the_nodes_even_while_a_job_runs(cluster):
    c = cluster(minutes=30, lifetime_s=2.0)
    c.job(nodes=1)
    c.start()
    assert c.wait_for(lambda: c.parallelism() == 0, 20)
    # the watcher says it once its patch was answered
    assert c.wait_for(lambda: "the cluster's max lifetime has passed" in c.log.read_text(), 5), c.log.read_text()


# -- where it is installed, and what `status` says ------------------------------------------------
def _provider_up(monkeypatch, served, spec):
    """`PulumiProvider.up` of a gcp stack against the fake Pulumi CLI; the cluster's API is the fake's."""
    pytest.importorskip("pulumi.automation")
    from pulumi_fake import FakePulumiCommand

    from gpucluster.infra.pulumi.engine import PulumiDriver
    from gpucluster.infra.gcp import gke
    from gpucluster.infra.pulumi.provider import PulumiProvider
    from gpucluster.infra.registry import plugin

    outputs = {"cluster_name": spec.name, "location": "us-central1-a", "zone": "us-central1-a",
               "endpoint": "203.0.113.10", "kubeconfig": "apiVersion: v1\nkind: Config\n", "node_pool_name": "gpu",
               "system_pool_name": "system", "machine_type": "n1-standard-4", "accelerator_type": "nvidia-tesla-v100",
               "gpus_per_node": 1, "nodes": spec.nodes}
    fake = FakePulumiCommand(resources=[("gcp:container/cluster:Cluster", spec.name, "projects/p/clusters/x")],
                             outputs=outputs, secret_keys=["kubeconfig"])
    asked = []
    monkeypatch.setattr(gke, "api_from_gke", lambda kubeconfig, **kw: asked.append(kubeconfig) or served)
    prov = PulumiProvider(plugin("gcp"), driver=PulumiDriver(pulumi_command=fake, program_runner=lambda s: None),
                          find=lambda cloud, **kw: [], delete=lambda items: [])

    class Events:
        messages: list[str] = []

        def __getattr__(self, name):
            return lambda *a, **kw: self.messages.append(a[0]) if name == "message" else None

    events = Events()
    return prov.up(spec, events), events.messages, asked


def test_up_of_a_gcp_stack_installs_the_idle_stop_in_the_cluster_and_a_refusal_fails_it(home, monkeypatch):
    fake = FakeKubeApi({}, delete_ticks=2)
    api, stop = serve(fake)
    try:
        spec = ClusterSpec(cloud="gcp", nodes=2, name="demo", zone="us-central1-a", project="my-proj",
                           options=(("idleMinutes", "30"),))
        cluster, messages, asked = _provider_up(monkeypatch, api, spec)
        assert asked == ["apiVersion: v1\nkind: Config\n"]  # the stack's kubeconfig (a bearer token from ADC)
        assert {k for k, _ in fake.objects} >= {"serviceaccount", "role", "rolebinding", "configmap", "job", "deployment"}
        assert fake.objects[("job", k8s_idle.HOLD)].spec.parallelism == 2
        assert any("idle stop: the GPU nodes are released after 30 min" in m and "bill until `gpucluster down demo`" in m
                   for m in messages), messages
        # without the option nothing is asked of the cluster's API
        fake.objects.clear()
        _, _, asked = _provider_up(monkeypatch, api, spec.replace(options=()))
        assert asked == [] and not fake.objects
        # the account may not create a Role: `up` fails naming it (the lifecycle then tears the stack down)
        fake.refuse["role"] = 403
        from gpucluster.errors import LaunchError

        with pytest.raises(LaunchError, match="cannot install the idle stop: role default/gpucluster-idle: 403"):
            _provider_up(monkeypatch, api, spec)
    finally:
        stop()


def test_status_says_when_the_gpu_nodes_go_and_what_bills_on(home, monkeypatch):
    from gpucluster.cli import status
    from gpucluster.ledger.store import Ledger

    monkeypatch.setattr(status, "ended_resources", lambda cloud, rows, lifetime: {})
    led = Ledger.open_default()
    spec = ClusterSpec(cloud="gcp", nodes=2, name="demo", zone="us-central1-a", options=(("idleMinutes", "30"),))
    now = time.time()
    led.create_run("r20261126-000000-aaaaaa", cloud="gcp", cluster="demo", nodes=2, gpus_per_node=1,
                   command=["gpucluster", "up"], spec=spec.to_dict(), now=now - 600)
    led.resource_requested("r20261126-000000-aaaaaa", "gke-cluster", "demo", now=now - 600)
    led.finish_run("r20261126-000000-aaaaaa", status="succeeded", exit_code=0, teardown="kept", now=now - 540)
    (row,) = status.cluster_rows(led, now=now)
    assert row["idle_minutes"] == 30 and abs(row["idle_stop_in_s"] - 21 * 60) < 1
    assert row["idle_stop_keeps"] == "the cluster fee and the system pool"
    assert row["state"] == ("kept, idle stop in 21 min (of the GPU nodes; the cluster fee and the system pool "
                            "bill until down)")


def test_what_bills_on_after_the_idle_stop_comes_from_the_clusters_priced_plan():
    """`status` reads it from the plan of the recorded spec (its fee, its system pool): nothing for a cloud
    whose plan has neither, for an unpriced backend, a cloud no backend is called, or a spec that cannot be
    priced (then nothing is claimed)."""
    from gpucluster.cli import status

    gke = ClusterSpec(cloud="gcp", nodes=2, name="demo", zone="us-central1-a", options=(("idleMinutes", "30"),))
    assert status._kept_billing("gcp", gke.to_dict()) == "the cluster fee and the system pool"
    ec2 = ClusterSpec(cloud="aws", nodes=1, name="idle", instance_type="g5.xlarge", region="us-east-1")
    assert status._kept_billing("aws", ec2.to_dict()) == ""
    assert status._kept_billing("ssh", {**gke.to_dict(), "cloud": "ssh"}) == ""
    assert status._kept_billing("nowhere", gke.to_dict()) == "" and status._kept_billing("gcp", None) == ""
    assert status._kept_billing("gcp", {**gke.to_dict(), "instance_type": "n9-nothing-1"}) == ""


def test_the_dry_run_lists_what_up_installs_in_the_cluster():
    pytest.importorskip("pulumi")
    from gpucluster.infra.registry import plugin

    spec = ClusterSpec(cloud="gcp", nodes=2, name="demo", zone="us-central1-a", project="my-proj",
                       options=(("idleMinutes", "30"), ("namespace", "team")))
    p = plugin("gcp")
    result = p.ops.dry_run(p.spec.resolve(spec), None, None)
    assert [(o["kind"], o["namespace"], o["name"]) for o in result["idle_stop"]] == [
        ("ServiceAccount", "team", "gpucluster-idle"), ("Role", "team", "gpucluster-idle"),
        ("RoleBinding", "team", "gpucluster-idle"), ("ConfigMap", "team", "gpucluster-idle"),
        ("Job", "team", "gpucluster-hold"), ("Deployment", "team", "gpucluster-idle")]
    assert "installed after the stack is up (the idle stop; they go with the cluster)" in result["text"]
    assert "idle stop: 30 min after the last gpucluster job the GPU nodes are released" in result["text"]
    assert plugin("gcp").ops.dry_run(p.spec.resolve(spec.replace(options=())), None, None)["idle_stop"] == []


def test_exec_can_attach_to_a_kept_gke_cluster_whose_nodes_the_autoscaler_owns():
    """A GKE cluster's `Cluster` lists no nodes (the launcher places one pod per node); `exec` must not take
    that for "no node up" (it did: every `exec` on gcp was refused), or no job could reset the idle stop."""
    from types import SimpleNamespace

    from gpucluster.lifecycle import kept
    from gpucluster.errors import UsageError
    from gpucluster.infra.gcp.component import cluster_from_outputs

    gke = cluster_from_outputs({"cluster_name": "demo", "zone": "us-central1-a", "nodes": 2, "gpus_per_node": 1,
                                "kubeconfig": "apiVersion: v1\n"})
    record = SimpleNamespace(name="demo")
    assert kept.attach(SimpleNamespace(attach=lambda name: gke), record) is gke
    none_up = cluster_from_outputs({"cluster_name": "demo", "zone": "us-central1-a", "nodes": 0})
    with pytest.raises(UsageError, match="has no node up"):
        kept.attach(SimpleNamespace(attach=lambda name: none_up), record)


@pytest.mark.parametrize("args, said", [
    (("--idle-minutes", "30", "--option", "autoscale=false"),
     "gpucluster: error: idle minutes '30' is not allowed with option autoscale=false: a fixed GPU pool keeps"),
    (("--idle-minutes", "300"), "gpucluster: error: idle minutes '300' is not allowed: a whole number of minutes "
                                "from 1 to the max lifetime (240)"),
])
def test_bad_idle_minutes_on_gcp_are_one_line_exit_2_and_nothing_made(home, args, said):
    from conftest import gpucluster_argv

    p = subprocess.run(gpucluster_argv("up", "--cloud", "gcp", "--name", "demo", "--project", "my-proj", *args,
                                       "--dry-run"), capture_output=True, text=True, timeout=120)
    assert p.returncode == 2, p.stderr
    assert p.stderr.startswith(said) and p.stderr.count("\n") == 1 and "Traceback" not in p.stderr
    assert not home.exists() or not any(home.rglob("*"))  # no ledger, no run folder: nothing recorded


def test_a_job_the_real_launcher_runs_holds_the_idle_stop_off(cluster, tmp_path):
    """The pods of a job as the Kubernetes launcher makes them (its Indexed Job, labels, real entry script,
    through the real client) are what the watcher counts: `exec` resets the count."""
    import json as _json

    from gpucluster.domain import Cluster as GkeCluster
    from gpucluster.events import NullEvents
    from gpucluster.infra.kubernetes import launcher as k8s
    from gpucluster.watch.launch import JobSpec
    from gpucluster.workloads.protocol import PREFIX
    from k8s_fake import PodScript

    c = cluster(minutes=2)
    final = PREFIX + _json.dumps({"kind": "final", "rank": 0, "epochs": 1, "loss": 0.5, "accuracy": 0.9, "ok": True})
    c.fake.scripts[0] = PodScript(lines=["training", final], run_s=5 * SCALE)
    started = c.start()
    launcher = k8s.KubernetesLauncher(api=c.api, poll_interval=0.05, api_retry_s=5)
    gke = GkeCluster(name="demo", cloud="gcp", nodes=(), gpus_per_node=1, kubeconfig="{}",
                     outputs={"nodes": 1, "gpus_per_node": 1})
    last_line: list[float] = []

    class Events(NullEvents):
        def on_line(self, node_rank, line):
            last_line.append(time.time())  # the job's last line: its pod ends right after

    result = launcher.launch(gke, JobSpec(run_id="r20261126-130000-abc123", workload="digits", nproc_per_node=1),
                             Events(), tmp_path / "logs")
    ended = time.time()  # the launcher's cleanup (deletes, read-backs) came after the pod's end
    assert result.ok, result
    assert last_line and ended - started > 2 * SCALE + 1  # the job outlived the idle time...
    assert c.parallelism() == 2  # ...and the hold was kept all along
    at = c.wait_for(lambda: c.parallelism() == 0, 30)
    # counted from the job's end (its pod last seen), not from when the launcher returned
    assert at is not None and 2 * SCALE - 0.3 <= at - last_line[-1] and at - ended <= 2 * SCALE + 8.0, \
        (at - last_line[-1], at - ended)
