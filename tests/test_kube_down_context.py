"""`gpucluster down NAME --context C` of a kubernetes cluster (issue 44, item 5), against the fake API server run
as someone else's cluster (tests/test_kube_backend.py): C must be the context the ledger recorded with the
cluster's runs, or stand in for it once the kubeconfig no longer holds it (a renamed context); the objects are
then found by the run's label (a kept namespace's: its cluster label and this home's owner id) and deleted, other
owners' left as they were (a kept namespace's: listed as not ours). A context the kubeconfig lacks, another context it holds, `--context` with `--all` or
for a cluster of another cloud: one line, exit 2, nothing touched."""

from __future__ import annotations

import pytest

pytest.importorskip("kubernetes")
import yaml  # noqa: E402

from test_kube_backend import TEAM_NS, _cli, cluster, gpucluster  # noqa: E402,F401 - the fixture

pytestmark = pytest.mark.integration


def _rename(c, old, new):
    """`kubectl config rename-context old new` on the first kubeconfig file."""
    config = yaml.safe_load(c.kubeconfig.read_text())
    config["contexts"] = [{**ctx, "name": new} if ctx["name"] == old else ctx for ctx in config["contexts"]]
    config["current-context"] = new if config["current-context"] == old else config["current-context"]
    c.kubeconfig.write_text(yaml.safe_dump(config))


def _refused(capsys, *args):
    code, text, _ = _cli(capsys, *args)
    lines = [ln for ln in text.strip().splitlines() if ln.strip()]
    assert code == 2 and len(lines) == 1 and lines[0].startswith("gpucluster: error: "), (code, text[-2000:])
    return lines[0]


def _ours(c):
    return {k for k in c.fake.objects if k[1].startswith("gpucluster-r") or k[1] == "gpucluster-lost"}


def test_down_of_a_run_in_a_renamed_context(cluster, capsys):
    c = cluster()
    c.fake.refuse_delete = {"job": 403, "service": 403, "configmap": 403}
    code, out, err = gpucluster(capsys, "--", "python", "-c", "print(1)")
    assert code == 3 and "teardown: LEFTOVERS" in out + err, (out + err)[-3000:]
    c.fake.refuse_delete = {}
    name = next(ln.split("cluster ")[1].split()[0] for ln in (out + err).splitlines() if " cluster gpucluster-" in ln)
    assert {k[0] for k in _ours(c)} == {"job", "service", "configmap"}
    line = _refused(capsys, "down", name, "--context", "nope", "--yes")
    assert "context 'nope' is not in kubeconfig" in line and "known contexts: team, expired, admin, gone" in line, line
    line = _refused(capsys, "down", name, "--context", "admin", "--yes")
    assert "was made in context 'team', which kubeconfig" in line and "give --context team" in line, line
    line = _refused(capsys, "down", "--all", "--context", "team", "--yes")
    assert "--context goes with one cluster's name" in line, line
    line = _refused(capsys, "down", "elsewhere", "--cloud", "aws", "--context", "team", "--yes")
    assert "cluster elsewhere's cloud is aws" in line and "--context names a kubeconfig context" in line, line
    assert {k[0] for k in _ours(c)} == {"job", "service", "configmap"}  # nothing touched
    _rename(c, "team", "team-renamed")
    code, text, _ = _cli(capsys, "down", name, "--yes")  # the recorded context is gone: not checked, said how
    said = " ".join(text.split())
    assert code == 3 and "NOT VERIFIED" in said and f"gpucluster down {name} --context NEW_NAME" in said, said[-3000:]
    code, text, _ = _cli(capsys, "down", name, "--context", "team-renamed", "--yes")
    said = " ".join(text.split())
    assert code == 0 and "verified by run label" in said, said[-3000:]
    assert "its context 'team' is no longer in the kubeconfig; its objects are looked for in context " \
           "'team-renamed' (--context)" in said, said[-3000:]
    c.fake.settle()
    assert not _ours(c)
    assert ("configmap", "gpucluster-theirs") in c.fake.objects and ("service", "gpucluster-theirs") in c.fake.objects


def test_down_of_a_kept_namespace_with_its_context(cluster, capsys):
    c = cluster()
    for kept in ("lab", "lab2"):
        code, text, _ = _cli(capsys, "up", "--cloud", "kubernetes", "--name", kept, "--nodes", "1", "--yes")
        assert code == 0, text[-3000:]
    code, text, _ = _cli(capsys, "down", "lab", "--context", "team", "--yes")  # the recorded one: as without it
    assert code == 0 and "verified by run label" in text, text[-3000:]
    from kubernetes.client import V1ConfigMap, V1ObjectMeta

    from gpucluster.ownership import installation_id

    c.fake._tls.authorization = "Bearer fake-token"  # the cluster's admin puts them there
    for name, owner in (("gpucluster-lost", installation_id()), ("gpucluster-their-lab2", "ffffeeeeddddcccc")):
        # a job of lab2 whose ledger rows are lost, and another home's cluster named lab2 too
        c.fake.create_namespaced_config_map(TEAM_NS, V1ConfigMap(metadata=V1ObjectMeta(name=name, labels={
            "app.kubernetes.io/managed-by": "gpucluster", "gpucluster-run": "r20261101-000000-cccccc",
            "gpucluster-cluster": "lab2", "gpucluster-owner": owner}), data={"a": "b"}))
    line = _refused(capsys, "down", "lab2", "--context", "admin", "--yes")
    assert "was made in context 'team'" in line, line
    _rename(c, "team", "team-renamed")
    code, text, _ = _cli(capsys, "down", "lab2", "--context", "team-renamed", "--yes")
    said = " ".join(text.split())
    assert code == 0 and "verified by run label" in said and "1 resource(s) not ours left alone" in said, said[-3000:]
    assert "not touched: k8s-configmap team-a/gpucluster-their-lab2: not ours (owner ffffeeeeddddcccc" in said, said
    c.fake.settle()
    assert ("configmap", "gpucluster-lost") not in c.fake.objects and ("configmap", "gpucluster-theirs") in c.fake.objects
    assert ("configmap", "gpucluster-their-lab2") in c.fake.objects
