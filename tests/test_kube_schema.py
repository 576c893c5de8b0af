"""The real manifests validated against the Kubernetes API schema (issue 44 item 7): every object a `--cloud
kubernetes` run sends to the API server, read as the JSON the fake API server received (tests/k8s_fake_http.py),
and every object `--dry-run` prints, checked field by field with `infra.kubernetes.schema` (the OpenAPI schema
the kubernetes client is generated from: an unknown field or a value of the wrong type is what the API server's
strict field validation refuses; Kubernetes docs, "Field validation"). Runs with each option that changes the
objects: a Kueue queue, tolerations, a GPU product (node selector), a priority class, a service account, an
image pull secret, a --secret (a Secret), --create-namespace (a Namespace), --output (the keeper container)."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("kubernetes")
import yaml  # noqa: E402

import k8s_fake_http  # noqa: E402
from k8s_fake_cluster import node  # noqa: E402
from test_kube_backend import TEAM_NS, cluster, gpucluster  # noqa: E402,F401 - the fixture

from gpucluster.infra.kubernetes.schema import errors, model_of  # noqa: E402

pytestmark = pytest.mark.integration


class _Recorded:
    """json as tests/k8s_fake_http.py uses it, keeping every request body that is an API object."""

    def __init__(self):
        self.bodies = []

    def loads(self, data, **kw):
        got = json.loads(data, **kw)
        if isinstance(got, dict) and "apiVersion" in got and "kind" in got:
            self.bodies.append(got)
        return got

    def __getattr__(self, name):
        return getattr(json, name)


def test_the_schema_check_catches_an_unknown_field_and_a_wrong_type():
    job = {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "x", "labels": {"a": "b"}},
           "spec": {"completions": 2, "template": {"spec": {"containers": [
               {"name": "c", "image": "i", "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}}}}
    assert errors(job) == []
    bad = json.loads(json.dumps(job))
    bad["spec"]["template"]["spec"]["containers"][0]["resourcez"] = {}
    bad["spec"]["completions"] = "2"
    bad["metadata"]["labels"]["n"] = 3
    bad["spec"]["template"]["spec"]["tolerations"] = {"key": "k"}
    assert sorted(errors(bad)) == sorted([
        "spec.template.spec.containers[0].resourcez: unknown field of V1Container",
        "spec.completions: str '2' where the schema has an integer",
        "metadata.labels['n']: int 3 where the schema has a string",
        "spec.template.spec.tolerations: dict where the schema has a list"])
    assert model_of({"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob"}) is None


def test_every_object_a_run_sends_and_the_dry_run_prints_is_valid(cluster, capsys, monkeypatch, tmp_path):
    c = cluster(nodes=[node("gpu-a", 4, labels={"nvidia.com/gpu.product": "NVIDIA-A100"},
                            taints=[{"key": "dedicated", "value": "ml", "effect": "NoSchedule"}]),
                       node("gpu-b", 4, labels={"nvidia.com/gpu.product": "NVIDIA-A100"},
                            taints=[{"key": "dedicated", "value": "ml", "effect": "NoSchedule"}])], admit_after_s=0.0)
    recorded = _Recorded()
    monkeypatch.setattr(k8s_fake_http, "json", recorded)
    monkeypatch.setenv("WANDB_API_KEY", "s3cr3t")
    options = ("--option", "gpu-product=NVIDIA-A100", "--option", "tolerations=dedicated=ml:NoSchedule",
               "--option", "priority-class=research", "--option", "image-pull-secret=regcred",
               "--option", "queue=team-queue", "--option", "service-account=trainer")
    code, out, err = gpucluster(capsys, *options, "--secret", "WANDB_API_KEY", "--output", str(tmp_path / "out"), "--",
                                "python", "-c", "print(1)")
    assert code == 0, (out + err)[-3000:]
    code, out, err = gpucluster(capsys, "--context", "admin", "--namespace", "scratch", "--create-namespace",
                                "--option", "tolerations=dedicated=ml:NoSchedule", "--",
                                "python", "-c", "print(1)")
    assert code == 0, (out + err)[-3000:]
    made = [b for b in recorded.bodies if b["kind"] not in ("SelfSubjectAccessReview", "DeleteOptions")]
    assert {b["kind"] for b in made} == {"Namespace", "ConfigMap", "Service", "Job", "Secret"}, {b["kind"] for b in made}
    for body in made:
        assert errors(body) == [], (body["kind"], errors(body))
    jobs = [b for b in made if b["kind"] == "Job"]
    assert any(len(j["spec"]["template"]["spec"]["containers"]) == 2 for j in jobs)  # --output: the keeper
    code, out, err = gpucluster(capsys, "--dry-run", *options, "--", "python", "-c", "print(1)")
    assert code == 0, err
    said = " ".join(out.split())
    assert "validated against the Kubernetes API schema" in said and "ConfigMap, Service, Job" in said, said[:2000]
    docs = list(yaml.safe_load_all(out[out.index("apiVersion"):out.index("not checked")]))
    assert [d["kind"] for d in docs] == ["ConfigMap", "Service", "Job"]
    for doc in docs:
        assert errors(doc) == [], (doc["kind"], errors(doc))
    assert docs[2]["metadata"]["namespace"] == TEAM_NS


def test_the_cluster_parts_apply_only_to_the_fake_given_them():
    """tests/k8s_fake_cluster.py adds its routes to the HTTP fake's module once per process: a fake given the
    parts lists its nodes; a fake served after it in the same pytest worker without them (the GKE tests')
    has no such route, as before. The old install made the second answer GET /api/v1/nodes with a
    handler error (no kube_nodes), which failed tests/test_kept_gcp.py when the files' order changed."""
    import urllib.error
    import urllib.request

    from k8s_fake import FakeKubeApi
    from k8s_fake_cluster import install

    given, bare = FakeKubeApi({}), FakeKubeApi({})
    install(given, nodes=[node("n1", 8)])
    for fake, expect in ((given, 200), (bare, 404)):
        url, stop = k8s_fake_http.serve_http(fake)
        try:
            req = urllib.request.Request(url + "/api/v1/nodes", headers={"Authorization": "Bearer fake-token"})
            try:
                with urllib.request.urlopen(req, timeout=10) as r:
                    got, body = r.status, json.loads(r.read())
            except urllib.error.HTTPError as e:
                got, body = e.code, json.loads(e.read())
        finally:
            stop()
        assert got == expect, (got, body)
        if expect == 200:
            assert [n["metadata"]["name"] for n in body["items"]] == ["n1"]
