"""`--cloud kubernetes` (issue 44) against the FAKE API server run as "someone else's cluster": the real CLI
(in this process), the real kubernetes client and its kubeconfig loader, a kubeconfig with two contexts,
one of them authenticated by an exec credential plugin (a small script printing an ExecCredential, as
`gke-gcloud-auth-plugin` and `aws eks get-token` do: Kubernetes docs, "client-go credential plugins"),
a team's service account bound to a Role in its namespace (tests/k8s_fake_rbac.py), nodes with GPUs,
other people's pods and objects, and ResourceQuotas (tests/k8s_fake_cluster.py).

Bad input is one line, exit 2, and nothing created; a run creates only its own labelled objects, deletes
them by its label, and leaves everything of other owners as it was."""

from __future__ import annotations

import json
import os
import stat
import sys

import pytest

pytest.importorskip("kubernetes")
import yaml  # noqa: E402

from k8s_fake import FakeKubeApi, PodScript  # noqa: E402
from k8s_fake_cluster import foreign_pod, install, kueue, node, quota  # noqa: E402
from k8s_fake_http import serve_http  # noqa: E402

pytestmark = pytest.mark.integration

TEAM_NS, SA, SA_TOKEN = "team-a", "trainer", "team-a-token"
ALL_VERBS = ("create", "get", "list", "delete")
ROLE_RULES = [  # what the team's Role grants: everything a run uses (permissions.py), in its namespace
    ("", ["configmaps", "services", "secrets"], list(ALL_VERBS)),
    ("", ["pods", "pods/log", "events", "resourcequotas", "limitranges"], ["get", "list"]),
    ("kueue.x-k8s.io", ["localqueues"], ["get", "list"]),
    ("", ["pods/exec", "pods/portforward"], ["create", "get"]),  # the fake reads a websocket's GET as get
    ("batch", ["jobs"], list(ALL_VERBS)),
]
PLUGIN = """#!{python}
import json, os, sys
token = open(os.environ["FAKE_TOKEN_FILE"]).read().strip()
if not token:
    sys.stderr.write("not logged in\\n"); sys.exit(1)
print(json.dumps({{"apiVersion": "client.authentication.k8s.io/v1beta1", "kind": "ExecCredential",
                  "status": {{"token": token, "expirationTimestamp": "2099-01-01T00:00:00Z"}}}}))
"""


def _role(fake, rules, name="trainer"):
    from kubernetes.client import RbacV1Subject, V1ObjectMeta, V1PolicyRule, V1Role, V1RoleBinding, V1RoleRef

    fake.create_namespaced_role(TEAM_NS, V1Role(metadata=V1ObjectMeta(name=name), rules=[
        V1PolicyRule(api_groups=[g], resources=r, verbs=v) for g, r, v in rules]))
    fake.create_namespaced_role_binding(TEAM_NS, V1RoleBinding(
        metadata=V1ObjectMeta(name=name), role_ref=V1RoleRef(api_group="rbac.authorization.k8s.io", kind="Role",
                                                             name=name),
        subjects=[RbacV1Subject(kind="ServiceAccount", name=SA, namespace=TEAM_NS)]))


def _theirs(fake):
    """Another gpucluster owner's run objects in the team's namespace (labelled managed-by=gpucluster)."""
    from kubernetes.client import V1ConfigMap, V1ObjectMeta, V1Service, V1ServicePort, V1ServiceSpec

    labels = {"app.kubernetes.io/managed-by": "gpucluster", "gpucluster-owner": "ffffeeeeddddcccc",
              "gpucluster-run": "r20261101-000000-aaaaaa"}
    fake.create_namespaced_config_map(TEAM_NS, V1ConfigMap(metadata=V1ObjectMeta(name="gpucluster-theirs",
                                                                                 labels=labels), data={"a": "b"}))
    fake.create_namespaced_service(TEAM_NS, V1Service(metadata=V1ObjectMeta(name="gpucluster-theirs", labels=labels),
                                                      spec=V1ServiceSpec(cluster_ip="None", ports=[V1ServicePort(port=1)])))


class Cluster:
    """Someone else's cluster: the fake served over HTTP, and a kubeconfig of two contexts."""

    def __init__(self, tmp_path, monkeypatch, *, nodes=None, quotas=None, rules=ROLE_RULES, foreign=None,
                 admit_after_s=None):
        self.fake = FakeKubeApi({r: PodScript(lines=[f"hello from {r}"]) for r in range(4)})
        install(self.fake, nodes=nodes if nodes is not None else [node("gpu-a", 4), node("gpu-b", 4)],
                quotas=quotas, foreign_pods=foreign or {},
                cluster_grants={(TEAM_NS, SA): [("", "nodes", ("list",)), ("", "pods", ("list",))]})
        self.fake.namespaces[TEAM_NS] = {}
        self.fake.sa_tokens[SA_TOKEN] = (TEAM_NS, SA)
        self.fake.tokens.add(SA_TOKEN)
        _role(self.fake, rules)
        _theirs(self.fake)
        if admit_after_s is not None:
            kueue(self.fake, admit_after_s)
        url, self.stop = serve_http(self.fake)  # from here on every call needs a token the server accepts
        self.token_file = tmp_path / "token"
        self.token_file.write_text(SA_TOKEN)
        plugin = tmp_path / "fake-auth-plugin"
        plugin.write_text(PLUGIN.format(python=sys.executable))
        plugin.chmod(plugin.stat().st_mode | stat.S_IXUSR)
        self.kubeconfig = tmp_path / "kubeconfig"
        other = tmp_path / "other-kubeconfig"  # a second file in $KUBECONFIG, merged as kubectl does
        self.kubeconfig.write_text(yaml.safe_dump({
            "apiVersion": "v1", "kind": "Config", "current-context": "team",
            "clusters": [{"name": "lab", "cluster": {"server": url}},
                         {"name": "gone", "cluster": {"server": "http://127.0.0.1:9"}}],
            "users": [{"name": "admin", "user": {"token": "fake-token"}},
                      {"name": "expired", "user": {"token": "expired-token"}},
                      {"name": "team", "user": {"exec": {"apiVersion": "client.authentication.k8s.io/v1beta1",
                                                          "command": str(plugin),
                                                          "env": [{"name": "FAKE_TOKEN_FILE",
                                                                   "value": str(self.token_file)}]}}}],
            "contexts": [{"name": "team", "context": {"cluster": "lab", "user": "team", "namespace": TEAM_NS}},
                         {"name": "expired", "context": {"cluster": "lab", "user": "expired", "namespace": TEAM_NS}}],
        }))
        other.write_text(yaml.safe_dump({
            "apiVersion": "v1", "kind": "Config",
            "clusters": [{"name": "lab", "cluster": {"server": url}},
                         {"name": "gone", "cluster": {"server": "http://127.0.0.1:9"}}],
            "users": [{"name": "admin", "user": {"token": "fake-token"}}],
            "contexts": [{"name": "admin", "context": {"cluster": "lab", "user": "admin"}},
                         {"name": "gone", "context": {"cluster": "gone", "user": "admin"}}]}))
        monkeypatch.setenv("KUBECONFIG", f"{self.kubeconfig}{os.pathsep}{other}")
        monkeypatch.setenv("GPUCLUSTER_HOME", str(tmp_path / "home"))
        self.jobs = []
        created = self.fake.create_namespaced_job

        def record(namespace, body, **kw):  # the Job as the API server received it
            from kubernetes.client import ApiClient

            self.jobs.append(ApiClient().sanitize_for_serialization(body))
            return created(namespace, body, **kw)

        self.fake.create_namespaced_job = record
        self.before = set(self.fake.objects)

    def created(self):
        return [c for c in self.fake.calls if c[0] == "create" and c[1] not in ("role", "rolebinding")
                and (c[1], c[3]) not in self.before]


@pytest.fixture
def cluster(tmp_path, monkeypatch):
    made = []

    def make(**kw):
        c = Cluster(tmp_path, monkeypatch, **kw)
        made.append(c)
        return c

    yield make
    for c in made:
        c.stop()


def gpucluster(capsys, *args):
    from gpucluster.cli.main import main

    code = main(["run", "--cloud", "kubernetes", "--yes", "--nodes", "2", "--start-deadline", "2", *args])
    out = capsys.readouterr()
    return code, out.out, out.err


def refused(capsys, c, *args):
    """exit 2, one line naming the problem, no traceback, nothing created."""
    code, out, err = gpucluster(capsys, *args)
    lines = [ln for ln in err.strip().splitlines() if ln.strip()]
    assert code == 2, (code, out[-2000:], err[-2000:])
    assert len(lines) == 1 and lines[0].startswith("gpucluster: error: "), err
    assert "Traceback" not in out + err
    assert c.created() == [], c.created()
    return lines[0]


def test_bad_input_each_one_line_and_nothing_created(cluster, capsys, tmp_path, monkeypatch):
    c = cluster()
    line = refused(capsys, c, "--context", "nope")
    assert "context 'nope' is not in kubeconfig" in line and "team, expired, admin, gone" in line, line
    line = refused(capsys, c, "--context", "gone")
    assert "API server of context 'gone' cannot be reached" in line, line
    line = refused(capsys, c, "--context", "expired")
    assert "refused its credentials (401 Unauthorized" in line and "expired" in line, line
    c.token_file.write_text("")  # the plugin fails (not logged in): the loader logs it, the API answers 401
    line = refused(capsys, c)
    assert "401" in line and "not logged in" in line, line
    c.token_file.write_text(SA_TOKEN)
    line = refused(capsys, c, "--namespace", "nowhere", "--context", "admin")
    assert "namespace 'nowhere' does not exist in context 'admin'" in line and "--create-namespace" in line, line
    line = refused(capsys, c, "--option", "gpu-resource=amd.com/gpu")
    assert "no node of the cluster offers amd.com/gpu (offered: nvidia.com/gpu)" in line, line
    c.fake.limit_ranges = {TEAM_NS: [{"metadata": {"name": "per-pod"}, "spec": {"limits": [
        {"type": "Container", "max": {"nvidia.com/gpu": "2"}}]}}]}
    line = refused(capsys, c, "--gpus-per-node", "3")
    assert "LimitRange per-pod in namespace team-a refuses the run's pods: Maximum nvidia.com/gpu usage per " \
           "Container is 2, but limit is 3. (container pytorch)" in line, line
    c.fake.limit_ranges = {}
    line = refused(capsys, c, "--gpus-per-node", "8")
    assert "2 nodes × 8 GPUs requested; the largest node has 4 allocatable nvidia.com/gpu" in line, line
    for bad in ("tolerations=gpu:Sometimes", "node-selector=a b", "queue=-team-", "priority-class=Upper_Case",
                "price-per-gpu-hour=-1", "service-account=a/b", "image-pull-secret=_x", "gpu-product=a b"):
        line = refused(capsys, c, "--option", bad)
        assert "is not allowed" in line, line
    bad_file = tmp_path / "broken"
    bad_file.write_text("clusters: [\n  - {")
    monkeypatch.setenv("KUBECONFIG", str(bad_file))
    line = refused(capsys, c)
    assert f"kubeconfig {bad_file} cannot be read" in line, line


def test_a_role_lacking_one_verb_is_named_before_anything_is_created(cluster, capsys):
    rules = [r if r[0] != "batch" else ("batch", ["jobs"], ["create", "get", "list"]) for r in ROLE_RULES]
    c = cluster(rules=rules)
    line = refused(capsys, c)
    assert "context 'team' may not delete jobs.batch in namespace team-a" in line, line
    asked = {(v, r, s) for v, r, s, ns, ok in c.fake.reviews}
    assert ("create", "pods", "exec") in asked and ("delete", "jobs", None) in asked


def test_a_resource_quota_that_refuses_the_job(cluster, capsys):
    c = cluster(quotas={TEAM_NS: [quota("team-gpus", {"requests.nvidia.com/gpu": "4"},
                                        {"requests.nvidia.com/gpu": "3"})]})
    line = refused(capsys, c)
    assert "ResourceQuota team-gpus in namespace team-a allows requests.nvidia.com/gpu 4 with 3 in use; " \
           "the run needs 2: it does not fit now" in line, line


def test_gpus_other_people_hold_now(cluster, capsys):
    c = cluster(foreign={"lab-b": [foreign_pod("their-0", "lab-b", "gpu-a", 4), foreign_pod("their-1", "lab-b",
                                                                                          "gpu-b", 3)]})
    line = refused(capsys, c, "--gpus-per-node", "2")
    assert "0 node(s) have 2 free nvidia.com/gpu now" in line and "--option queue=NAME" in line, line


def test_a_run_on_someone_elses_cluster_touches_only_its_own(cluster, capsys):
    """Through the exec plugin's context (the current one) and its namespace; the options reach the Job;
    other owners' objects and pods stay; ours are deleted by their label and read back."""
    c = cluster(nodes=[node("gpu-a", 4, labels={"nvidia.com/gpu.product": "NVIDIA-A100"},
                            taints=[{"key": "dedicated", "value": "ml", "effect": "NoSchedule"}]),
                       node("gpu-b", 4, labels={"nvidia.com/gpu.product": "NVIDIA-A100"},
                            taints=[{"key": "dedicated", "value": "ml", "effect": "NoSchedule"}]),
                       node("gpu-c", 8, labels={"nvidia.com/gpu.product": "NVIDIA-T4"})], admit_after_s=0.0)
    code, out, err = gpucluster(capsys, "--option", "gpu-product=NVIDIA-A100", "--option", "tolerations=dedicated=ml:NoSchedule",
                                "--option", "priority-class=research", "--option", "image-pull-secret=regcred",
                                "--option", "queue=team-queue", "--option", "price-per-gpu-hour=2.5", "--", "python", "-c",
                                "print(1)")
    assert code == 0, (out[-3000:], err[-3000:])
    text = out + err
    assert "context team, namespace team-a (the context's namespace)" in text, text[-3000:]
    assert "internal price $5.00/hour" in text and "checked before creating: fits" in text, text[-3000:]
    assert "an internal price of $2.5/GPU-hour (--option price-per-gpu-hour) × 2 GPU(s)" in text, text[-3000:]
    assert "namespace team-a: used as it is (it must exist)" in " ".join(text.split()), text[-3000:]
    (job,) = c.jobs
    assert job["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "team-queue"
    pod = job["spec"]["template"]["spec"]
    assert pod["priorityClassName"] == "research" and pod["imagePullSecrets"] == [{"name": "regcred"}]
    assert pod["nodeSelector"] == {"nvidia.com/gpu.product": "NVIDIA-A100"}
    assert {"key": "dedicated", "operator": "Equal", "value": "ml", "effect": "NoSchedule"} in pod["tolerations"]
    assert "kueue.x-k8s.io/queue-name" not in job["spec"]["template"]["metadata"]["labels"]
    c.fake.settle()
    left = {k for k in c.fake.objects if k[0] in ("configmap", "service", "job", "secret")}
    assert left == {("configmap", "gpucluster-theirs"), ("service", "gpucluster-theirs")}, left
    assert not [d for d in c.fake.calls if d[0] == "delete" and "theirs" in str(d)]
    first_create = next(i for i, call in enumerate(c.fake.calls) if call in c.created())
    assert c.fake.reviews and len(c.fake.reviews) >= 14 and first_create > 0
    from gpucluster.ledger.store import Ledger

    ledger = Ledger.open_default()
    (run,) = ledger.list_runs()
    record = ledger.get_run(run.id).to_dict()
    assert dict(record["spec"]["options"])["context"] == "team"
    rows = [r for r in record["resources"] if r["kind"].startswith("k8s-")]
    assert {r["kind"] for r in rows} == {"k8s-configmap", "k8s-service", "k8s-job"} and all(
        r["confirmed_gone"] for r in rows), rows
    assert json.dumps(record).count("team-token") == 0  # the plugin's token is never recorded
    code, text, _ = _cli(capsys, "show", run.id)
    assert code == 0 and "teardown: verified" in text, text[-2000:]
    code, text, _ = _cli(capsys, "logs", run.id, "--node", "1")
    assert code == 0 and "hello from 1" in text, text[-2000:]


def test_create_namespace_makes_it_for_the_run_and_removes_it(cluster, capsys):
    """The admin's context (no namespace of its own): --create-namespace makes the namespace, the run's objects
    go in it, and it goes with them; without the flag the same run is refused (bad-input test)."""
    c = cluster()
    code, out, err = gpucluster(capsys, "--context", "admin", "--namespace", "scratch", "--create-namespace", "--",
                                "python", "-c", "print(1)")
    assert code == 0, (out + err)[-3000:]
    assert ("create", "namespace", "", "scratch") in c.fake.calls
    c.fake.settle()
    assert "scratch" not in c.fake.namespaces


def _cli(capsys, *args):
    from gpucluster.cli.main import main

    code = main(list(args))
    out = capsys.readouterr()
    return code, out.out + out.err, out.out


def test_down_finishes_a_run_whose_teardown_failed_and_gc_sweeps_only_ours(cluster, capsys):
    """The API refuses the deletes (403) during the run's teardown: leftovers, the objects named. `down`
    then deletes them by the run's label in the context and namespace the ledger recorded; `gc` lists the
    other owner's objects as not ours and leaves them."""
    c = cluster()
    c.fake.refuse_delete = {"job": 403, "service": 403, "configmap": 403}
    code, out, err = gpucluster(capsys, "--", "python", "-c", "print(1)")
    assert code == 3 and "teardown: LEFTOVERS" in out + err and "still exists: k8s-job team-a/" in out + err, \
        (out + err)[-3000:]
    ours = {k for k in c.fake.objects if k[1].startswith("gpucluster-r")}
    assert {k[0] for k in ours} == {"job", "service", "configmap"}, ours
    c.fake.refuse_delete = {}
    secret_run = c.fake.reviews[:]
    assert not any(r[1] == "secrets" for r in secret_run)  # no --secret: no Secret asked for
    name = next(ln.split("cluster ")[1].split()[0] for ln in (out + err).splitlines() if " cluster gpucluster-" in ln)
    code, text, _ = _cli(capsys, "status")
    assert code == 0 and name in text, text[-2000:]
    code, text, _ = _cli(capsys, "down", name, "--yes")
    assert code == 0 and "verified by run label" in text, text[-3000:]
    c.fake.settle()
    assert not {k for k in c.fake.objects if k[1].startswith("gpucluster-r")}
    assert ("configmap", "gpucluster-theirs") in c.fake.objects and ("service", "gpucluster-theirs") in c.fake.objects
    from kubernetes.client import V1ConfigMap, V1ObjectMeta

    from gpucluster.ownership import installation_id

    c.fake._tls.authorization = "Bearer fake-token"  # this thread acts as the cluster's admin, putting it there
    c.fake.create_namespaced_config_map(TEAM_NS, V1ConfigMap(metadata=V1ObjectMeta(  # a killed run of this home's
        name="gpucluster-killed", labels={"app.kubernetes.io/managed-by": "gpucluster", "gpucluster-run": "r1",
                                          "gpucluster-owner": installation_id()}), data={"a": "b"}))
    code, text, stdout = _cli(capsys, "gc", "--cloud", "kubernetes", "--namespace", TEAM_NS, "--yes", "--json")
    assert code == 0, text
    report = json.loads(stdout)
    assert report["verdict"] == "verified" and [lo["id"] for lo in report["found"]] == [f"{TEAM_NS}/gpucluster-killed"]
    c.fake.settle()
    assert ("configmap", "gpucluster-killed") not in c.fake.objects
    assert {lo["id"] for lo in report["not_ours"]} == {f"{TEAM_NS}/gpucluster-theirs"}
    assert {lo["owner"] for lo in report["not_ours"]} == {"ffffeeeeddddcccc"}
    assert ("configmap", "gpucluster-theirs") in c.fake.objects
    code, text, _ = _cli(capsys, "gc", "--cloud", "kubernetes")
    assert code == 2 and "needs --namespace" in text, text


def test_dry_run_prints_the_manifests_without_reaching_the_cluster(cluster, capsys):
    c = cluster()
    calls = len(c.fake.calls)
    code, out, err = gpucluster(capsys, "--dry-run", "--gpus-per-node", "2", "--option", "queue=team-queue",
                                "--option", "priority-class=research")
    assert code == 0, (out + err)[-3000:]
    assert len(c.fake.calls) == calls and c.fake.reviews == []  # nothing asked of the API server
    text = out + err
    docs = list(yaml.safe_load_all(text[text.index("apiVersion"):text.index("not checked")]))
    assert [d["kind"] for d in docs] == ["ConfigMap", "Service", "Job"]
    job = docs[2]
    assert job["metadata"]["namespace"] == TEAM_NS and job["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "team-queue"
    pod = job["spec"]["template"]["spec"]
    assert pod["priorityClassName"] == "research"
    assert pod["containers"][0]["resources"]["limits"] == {"nvidia.com/gpu": "2"}
    assert "permissions: a SelfSubjectAccessReview" in text and "the namespace's ResourceQuota" in text


def test_a_queued_job_waits_for_kueue_admission_within_the_start_deadline(cluster, capsys):
    """GPUs others hold now: without a queue the run is refused; with one, the Job is created suspended,
    waits for admission (no pods meanwhile), and runs once admitted."""
    c = cluster(foreign={"lab-b": [foreign_pod("their-0", "lab-b", "gpu-a", 4), foreign_pod("their-1", "lab-b",
                                                                                          "gpu-b", 4)]},
                admit_after_s=4.0)
    line = refused(capsys, c, "--option", "queue=team-qeueu")
    assert "no Kueue LocalQueue 'team-qeueu' in namespace team-a" in line, line
    code, out, err = gpucluster(capsys, "--option", "queue=team-queue", "--", "python", "-c", "print(1)")
    assert code == 0, (out + err)[-3000:]
    said = " ".join((out + err).split())  # the console wraps long lines
    assert "0 node(s) have 1 free nvidia.com/gpu now" in said and "the queue's admission is waited for" in said, said
    assert len(c.fake.admitted) == 1 and c.jobs[0]["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "team-queue"


def test_a_run_with_a_secret_asks_for_the_secret_permissions_first(cluster, capsys, monkeypatch):
    rules = [r if r[1][0] != "configmaps" else ("", ["configmaps", "services"], list(ALL_VERBS)) for r in ROLE_RULES]
    c = cluster(rules=rules)  # no Secrets in the team's Role
    monkeypatch.setenv("WANDB_API_KEY", "s3cr3t")
    line = refused(capsys, c, "--secret", "WANDB_API_KEY", "--", "python", "-c", "print(1)")
    assert "context 'team' may not create secrets in namespace team-a" in line, line


def test_a_task_file_names_the_context_and_namespace(cluster, capsys, tmp_path):
    """Task-file keys resources.context, namespace and create_namespace reach their flags (docs/tasks.md)."""
    c = cluster()
    task = tmp_path / "task.yaml"
    task.write_text("resources:\n  cloud: kubernetes\n  nodes: 1\n  context: admin\n  namespace: scratch\n"
                    "  create_namespace: true\nrun: python -c 'print(1)'\n")
    from gpucluster.cli.main import main

    code = main(["run", str(task), "--dry-run"])
    text = " ".join((capsys.readouterr().out).split())
    assert code == 0 and "context admin, namespace scratch" in text and '"namespace": "scratch"' not in text, text[-2000:]
    assert c.fake.reviews == []


def test_a_job_kueue_never_admits_fails_at_the_start_deadline_saying_so(tmp_path):
    """The launcher's own start deadline passes while Kueue holds the Job suspended: the run fails naming
    the queue, and the Job goes. (The flag's least is 30 s; the launcher is given 4 s after it is made:
    the same check, 26 s sooner.)"""
    from k8s_fake_http import serve
    from test_k8s_launcher import Events

    from gpucluster.domain import Cluster
    from gpucluster.infra.kube.platform import kube_platform
    from gpucluster.infra.kube.plugin import KubeLauncher
    from gpucluster.infra.kube.provider import KubeProvider
    from gpucluster.watch.launch import JobSpec

    fake = FakeKubeApi({})
    install(fake)
    kueue(fake, admit_after_s=3600)
    api, stop = serve(fake)
    launcher = KubeLauncher(KubeProvider(), queue="team-queue", api=api, start_deadline_s=30, poll_interval=0.5,
                            api_retry_s=5, platform=kube_platform({"queue": "team-queue"}))
    launcher.start_deadline_s = 4
    cluster_ = Cluster(name="lab", cloud="kubernetes", nodes=(), gpus_per_node=1,
                       outputs={"nodes": 2, "namespace": "default", "context": "admin"})
    try:
        result = launcher.launch(cluster_, JobSpec(run_id="r20261128-000000-abcdef", command=("python", "-c", "1"),
                                                   nproc_per_node=1, threads_per_proc=1), Events(), tmp_path / "logs")
    finally:
        stop()
    assert not result.ok and "the Job made no pod for it" in result.failure, result.failure
    assert "waiting for Kueue to admit it from LocalQueue team-queue" in result.failure, result.failure
    assert fake.admitted == [] and [d[1] for d in fake.calls if d[0] == "delete"][:1] == ["job"]


def test_a_limit_range_on_memory_refuses_the_pods_and_is_caught_before_anything_is_created(cluster, capsys):
    """A Pod `max` on memory: gpucluster's containers state no memory limit, so the API server's LimitRanger would
    refuse every pod the Job makes (tests/k8s_fake_limits.py) and the run would wait out its start deadline; the
    check says so before anything exists. The same Job, made anyway through the fake, gets no pod."""
    c = cluster()
    c.fake.limit_ranges = {TEAM_NS: [{"metadata": {"name": "mem"}, "spec": {"limits": [
        {"type": "Pod", "max": {"memory": "16Gi"}}]}}]}
    line = refused(capsys, c, "--", "python", "-c", "print(1)")
    assert "LimitRange mem in namespace team-a refuses the run's pods: Maximum memory usage per Pod is 16Gi.  " \
           "No limit is specified." in line, line
    code, out, err = gpucluster(capsys, "--dry-run", "--", "python", "-c", "print(1)")
    assert code == 0, err
    from kubernetes.client import ApiClient

    (job,) = [d for d in yaml.safe_load_all(out[out.index("apiVersion"):out.index("not checked")]) if d["kind"] == "Job"]
    c.fake._tls.authorization = "Bearer fake-token"  # the cluster's admin makes it anyway
    c.fake.create_namespaced_job(TEAM_NS, ApiClient()._ApiClient__deserialize(job, "V1Job"))
    assert "is forbidden: [maximum memory usage per Pod is 16Gi, no limit is specified]" in \
        c.fake.refused_jobs[job["metadata"]["name"]]
    assert not [p for p in c.fake.pods.values() if p.name.startswith(job["metadata"]["name"])]
    c.fake.limit_ranges = {TEAM_NS: [{"metadata": {"name": "cpu"}, "spec": {"limits": [
        {"type": "Container", "max": {"cpu": "4", "memory": "8Gi"}}]}}]}  # its defaults fill every container
    code, out, err = gpucluster(capsys, "--", "python", "-c", "print(1)")
    assert code == 0 and "pass the namespace's LimitRanges (cpu)" in " ".join((out + err).split()), (out + err)[-3000:]


def _cluster_queue(gpus, cohort=None, borrowing=None):
    res = {"name": "nvidia.com/gpu", "nominalQuota": str(gpus), **({"borrowingLimit": str(borrowing)} if borrowing else {})}
    return {"spec": {**({"cohort": cohort} if cohort else {}), "resourceGroups": [
        {"coveredResources": ["nvidia.com/gpu"], "flavors": [{"name": "a100", "resources": [res]}]}]}}


def test_a_job_over_its_cluster_queue_is_refused_and_a_user_who_may_not_read_it_is_told(cluster, capsys):
    """Kueue's ClusterQueue behind the LocalQueue holds 4 GPUs: 2 × 3 would never be admitted (the fake's Kueue
    leaves it pending for ever, tests/k8s_fake_cluster.py `kueue_capacity`), so it is refused before creating; a
    cohort's borrowingLimit adds room. The team's own context may not read clusterqueues (cluster-scoped): its
    plan says "not checked" and the run goes on."""
    c = cluster(admit_after_s=0.0)
    c.fake.cluster_queues = {"cluster-queue": _cluster_queue(4)}
    admin = ("--context", "admin", "--namespace", TEAM_NS, "--option", "queue=team-queue", "--gpus-per-node", "3")
    line = refused(capsys, c, *admin)
    assert "6 nvidia.com/gpu requested; Kueue ClusterQueue cluster-queue (of LocalQueue team-queue) can admit at " \
           "most a100 4 (nominalQuota): it would never be admitted" in line, line
    c.fake.cluster_queues = {"cluster-queue": _cluster_queue(4, cohort="lab", borrowing=2)}
    code, out, err = gpucluster(capsys, *admin, "--", "python", "-c", "print(1)")
    said = " ".join((out + err).split())
    assert code == 0 and "Kueue ClusterQueue cluster-queue has room for 6 nvidia.com/gpu in flavor a100" in said, said[-3000:]
    c.fake.cluster_queues = {"cluster-queue": _cluster_queue(8)}
    code, out, err = gpucluster(capsys, "--option", "queue=team-queue", "--", "python", "-c", "print(1)")
    said = " ".join((out + err).split())
    assert code == 0 and "not checked: the room in Kueue ClusterQueue cluster-queue of LocalQueue team-queue (this user may not " \
           "get clusterqueues)" in said, said[-3000:]
