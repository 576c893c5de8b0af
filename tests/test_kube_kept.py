"""A kept cluster on someone else's Kubernetes cluster (issue 44 item 1: `exec`, `ssh`; the kept cluster of issue
46): `up --cloud kubernetes --name lab` checks once as a run does and creates nothing in the cluster (one ledger
row naming the context and namespace); `exec lab -- CMD` runs a job there through the shared launcher (its
objects recorded before each create, deleted and read back after); `ssh lab [NODE]` reaches a pod of the job
running on it now, never another owner's pod labelled the same way, and says so when no job runs; `status`
shows it at $0; `down lab` deletes only this home's objects labelled with the cluster, verified.

The stand-in is the fake API server of tests/test_kube_backend.py, served over HTTP as "someone else's cluster"
(the team's Role, an exec credential plugin, other owners' objects), with the real CLI in this process."""

from __future__ import annotations

import json
import threading
import time

import pytest

pytest.importorskip("kubernetes")

from k8s_fake import PodScript  # noqa: E402
from k8s_fake_cluster import node  # noqa: E402
from test_kube_backend import ROLE_RULES, TEAM_NS, _cli, cluster  # noqa: E402,F401 - the fixture

pytestmark = pytest.mark.integration

SAY = ("--", "python", "-c", "print(1)")


def _ours(c):
    return {k for k in c.fake.objects if k[1].startswith("gpucluster-r") or k[1].startswith("gpucluster-g")}


def _labels_of_theirs(c):
    return {k for k in c.fake.objects if "theirs" in k[1] or "their-" in k[1]}


def _their_job(c):
    """Another home's kept cluster also named lab, in the same namespace: its Job running two pods labelled as
    gpucluster labels them (same cluster label, another owner), made by the cluster's admin."""
    from kubernetes import client as k

    labels = {"app.kubernetes.io/managed-by": "gpucluster", "gpucluster-run": "r20261101-000000-bbbbbb",
              "gpucluster-job": "gpucluster-theirs-job", "gpucluster-owner": "ffffeeeeddddcccc",
              "gpucluster-cluster": "lab"}
    idle = ["sh", "-c", "exec sleep 30"]
    job = k.V1Job(metadata=k.V1ObjectMeta(name="gpucluster-theirs-job", namespace=TEAM_NS, labels=labels),
                  spec=k.V1JobSpec(completions=2, parallelism=2, completion_mode="Indexed", backoff_limit=0,
                                   template=k.V1PodTemplateSpec(metadata=k.V1ObjectMeta(labels=labels), spec=k.V1PodSpec(
                                       restart_policy="Never", containers=[
                                           k.V1Container(name="pytorch", image="img", command=idle),
                                           k.V1Container(name="gpucluster", image="img", command=idle)]))))
    c.fake._tls.authorization = "Bearer fake-token"  # this thread acts as the cluster's admin
    c.fake.create_namespaced_job(TEAM_NS, job)
    end = time.monotonic() + 30
    while time.monotonic() < end:
        c.fake.list_namespaced_pod(TEAM_NS)  # each listing is a kubelet tick
        if len([p for p in c.fake.pods.values() if p.labels.get("gpucluster-owner") == "ffffeeeeddddcccc"
                and p.phase == "Running"]) == 2:
            return
        time.sleep(0.1)
    raise AssertionError("their job's pods did not come up")


def test_up_exec_status_ssh_and_down_of_a_kept_namespace(cluster, capsys):
    c = cluster(nodes=[node("gpu-a", 4), node("gpu-b", 4)])
    theirs = _labels_of_theirs(c)
    code, text, _ = _cli(capsys, "up", "--cloud", "kubernetes", "--name", "lab", "--nodes", "2", "--yes")
    assert code == 0, text[-3000:]
    said = " ".join(text.split())
    assert "kept cluster lab: namespace team-a of context team, checked as a run checks it; nothing created" in said, said
    assert c.created() == [] and c.fake.reviews, c.created()  # asked (permissions), created nothing
    from gpucluster.lifecycle.held import HOST_KIND
    from gpucluster.ledger.store import Ledger

    ledger = Ledger.open_default()
    (row,) = [r for r in ledger.open_resources("lab") if r["kind"] == HOST_KIND]
    assert row["detail"]["context"] == "team" and row["detail"]["namespace"] == TEAM_NS, row
    code, text, stdout = _cli(capsys, "status", "--json")
    assert code == 0, text
    (lab,) = [r for r in json.loads(stdout) if r["cluster"] == "lab"]
    assert lab["state"] == "kept" and lab["accrued_usd"] in ("0", "0.0000") and lab["cloud"] == "kubernetes", lab
    code, text, _ = _cli(capsys, "ssh", "lab", "1", "--", "hostname")
    assert code == 2 and "cluster 'lab': no job is running on it" in text and "gpucluster exec lab" in text, text
    runs = []
    for _ in range(2):
        code, text, _ = _cli(capsys, "exec", "lab", *SAY)
        assert code == 0 and "Traceback" not in text, text[-3000:]
        said = " ".join(text.split())
        assert "exec on kept cluster lab (2 node(s) on kubernetes" in said and "checked before creating: fits" in said, said
        assert "stays kept (a namespace of an existing Kubernetes cluster, $0 here)" in said, said
        runs.append(ledger.list_runs()[0].id)
    for rid in runs:
        rec = ledger.get_run(rid)
        rows = [r for r in rec.resources if r.kind.startswith("k8s-")]
        assert {r.kind for r in rows} == {"k8s-configmap", "k8s-service", "k8s-job"} and all(
            r.confirmed_gone for r in rows), rows
        assert rec.run.teardown == "kept" and rec.run.status == "succeeded", rec.run
    jobs = [j for j in c.jobs]
    assert len(jobs) == 2 and all(j["metadata"]["labels"]["gpucluster-cluster"] == "lab" for j in jobs)
    assert all(j["spec"]["template"]["metadata"]["labels"]["gpucluster-cluster"] == "lab" for j in jobs)
    from kubernetes.client import V1ConfigMap, V1ObjectMeta

    from gpucluster.ownership import installation_id

    c.fake._tls.authorization = "Bearer fake-token"  # the cluster's admin puts them there
    for name, owner in (("gpucluster-lost", installation_id()), ("gpucluster-their-lab", "ffffeeeeddddcccc")):
        # a job of lab whose ledger rows are gone (its record lost), and another home's cluster named lab too
        c.fake.create_namespaced_config_map(TEAM_NS, V1ConfigMap(metadata=V1ObjectMeta(name=name, labels={
            "app.kubernetes.io/managed-by": "gpucluster", "gpucluster-run": "r20261101-000000-cccccc",
            "gpucluster-cluster": "lab", "gpucluster-owner": owner}), data={"a": "b"}))
    code, text, _ = _cli(capsys, "down", "lab", "--yes")
    assert code == 0 and "verified by run label" in text, text[-3000:]
    assert ledger.open_resources("lab") == []
    c.fake.settle()
    assert ("configmap", "gpucluster-lost") not in c.fake.objects  # found by the cluster's label and this owner
    assert ("configmap", "gpucluster-their-lab") in c.fake.objects
    assert _labels_of_theirs(c) == theirs | {("configmap", "gpucluster-their-lab")} and not _ours(c)
    assert not [d for d in c.fake.calls if d[0] == "delete" and "theirs" in str(d)]


def test_up_refused_before_anything_is_recorded(cluster, capsys):
    rules = [r if r[0] != "batch" else ("batch", ["jobs"], ["create", "get", "list"]) for r in ROLE_RULES]
    c = cluster(rules=rules)
    code, text, _ = _cli(capsys, "up", "--cloud", "kubernetes", "--name", "lab", "--nodes", "2", "--yes")
    lines = [ln for ln in text.strip().splitlines() if ln.startswith("gpucluster: error")]
    assert code == 2 and lines and "may not delete jobs.batch in namespace team-a" in lines[0], text
    assert "Traceback" not in text and c.created() == []
    code, text, _ = _cli(capsys, "up", "--cloud", "kubernetes", "--name", "lab2", "--nodes", "2", "--gpus-per-node",
                         "8", "--context", "admin", "--namespace", TEAM_NS, "--yes")
    assert code == 2 and "the largest node has 4 allocatable nvidia.com/gpu" in text, text
    from gpucluster.ledger.store import Ledger

    assert Ledger.open_default().list_runs() == []


def test_ssh_reaches_the_running_jobs_pod_and_never_another_owners(cluster, capsys):
    """A job runs on the kept cluster (in a thread, as a second terminal would): `ssh lab 1 -- CMD` runs CMD in
    node 1's pod of that job; another home's kept cluster of the same name in the same namespace, its job
    running too, is never reached (its pods carry the same cluster label, another owner)."""
    c = cluster()
    c.fake.scripts = {r: PodScript(lines=[f"hello from {r}"], run_s=8.0) for r in range(2)}
    code, text, _ = _cli(capsys, "up", "--cloud", "kubernetes", "--name", "lab", "--nodes", "2", "--yes")
    assert code == 0, text[-3000:]
    import gpucluster

    done: dict = {}
    worker = threading.Thread(target=lambda: done.setdefault("rec", gpucluster.Cluster("lab", "kubernetes", []).exec(
        ["python", "-c", "print(1)"])), daemon=True)
    worker.start()
    end = time.monotonic() + 60
    while time.monotonic() < end and not [p for p in c.fake.pods.values() if p.phase == "Running"
                                          and p.labels.get("gpucluster-cluster") == "lab" and p.index == 1]:
        time.sleep(0.2)
    time.sleep(1.1)  # creationTimestamp is to the second
    _their_job(c)  # started after ours: the newest running gpucluster pods of the namespace are theirs
    code, text, _ = _cli(capsys, "ssh", "lab", "1", "--", "python", "-c", "print('inside', 6 * 7)")
    assert code == 0 and "inside 42" in text, text[-3000:]
    (ours,) = {j["metadata"]["name"] for j in c.jobs if "theirs" not in j["metadata"]["name"]}
    execs = [call[3] for call in c.fake.calls if call[0] == "exec" and call[4][:2] == ("python", "-c")
             and "inside" in call[4][2]]
    assert len(execs) == 1 and execs[0].startswith(f"{ours}-1-"), execs  # node 1's pod of our job, not theirs
    worker.join(90)
    assert done["rec"].run.status == "succeeded", done["rec"].run.failure
