"""The `Platform` `--cloud kubernetes` gives the shared launcher (`infra.kubernetes`): the API of the
kubeconfig context the run names (access.py), and what the user's options add to the run's objects
(`Platform.shape`), each where the Kubernetes and Kueue docs put it:

- `queue`: the label `kueue.x-k8s.io/queue-name` on the Job (Kueue docs, "Run a Job": Kueue's webhook then
  suspends the Job until its workload is admitted, and un-suspends it; the pods are not labelled, so
  Kueue's pod integration does not gate them a second time);
- `priorityClass`: the pods' `priorityClassName` ("Pod Priority and Preemption");
- `nodeSelector` and `gpuProduct`: merged into the pods' nodeSelector ("Assigning Pods to Nodes");
- `--gpu TYPE`: the product values of the nodes carrying it (gpus.py), in the nodeSelector (one value) or a
  required node affinity `In` them (several);
- `tolerations`: added to the pods' own ("Taints and Tolerations");
- `serviceAccount`: the pods' `serviceAccountName`;
- `imagePullSecret`: the pods' `imagePullSecrets` ("Pull an Image from a Private Registry").
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Mapping

from gpucluster.domain import Cluster
from gpucluster.states import JsonObject

from gpucluster.infra.kubernetes.api import KubeApi
from gpucluster.infra.kubernetes.platform import Platform, Shape

from .gpus import GpuNodes
from .options import QUEUE_LABEL, Passthrough, passthrough

if TYPE_CHECKING:
    from gpucluster.infra.kubernetes.api import KubeObject


class OptionView:
    """`spec.option(key)` over an option mapping (what `Transport.make` is given)."""

    def __init__(self, options: Mapping[str, object]):
        self.options = dict(options)
        self.spot, self.accelerator = False, None

    def option(self, key: str, default: object = None) -> object:
        return self.options.get(key, default)


def context_api(cluster: Cluster, credentials: object = None) -> KubeApi:
    """The API of the context the run's cluster names (its outputs), through the kubeconfig loader."""
    from . import access

    outputs = dict(cluster.outputs or {})
    context = str(outputs.get("context") or "")
    return KubeApi.from_api_client(access.api_client(context, outputs.get("kubeconfig_path") or None))


def _gpu_nodes(spec: JsonObject, gpu: GpuNodes) -> None:
    """--gpu TYPE: the nodes carrying it (gpus.py), by nodeSelector for one product value, else by a required
    node affinity term (ANDed with the nodeSelector and the pods' own anti-affinity: "Assigning Pods to Nodes")."""
    if gpu.selector():
        spec["nodeSelector"] = {**(spec.get("nodeSelector") or {}), **gpu.selector()}
        return
    affinity = dict(spec.get("affinity") or {})
    node = dict(affinity.get("nodeAffinity") or {})
    required = dict(node.get("requiredDuringSchedulingIgnoredDuringExecution") or {})
    terms = list(required.get("nodeSelectorTerms") or []) or [{}]
    # the terms are ORed, a term's expressions ANDed: the GPU's expressions go into every term
    required["nodeSelectorTerms"] = [{**t, "matchExpressions": list(t.get("matchExpressions") or []) + gpu.affinity()}
                                     for t in terms]
    node["requiredDuringSchedulingIgnoredDuringExecution"] = required
    affinity["nodeAffinity"] = node
    spec["affinity"] = affinity


def _pod_spec(spec: JsonObject, extra: Passthrough, gpu: GpuNodes | None = None) -> None:
    """The options' additions to a pod spec in the API's JSON form."""
    if gpu is not None:
        _gpu_nodes(spec, gpu)
    if extra.priority_class:
        spec["priorityClassName"] = extra.priority_class
    if extra.node_selector:
        spec["nodeSelector"] = {**(spec.get("nodeSelector") or {}), **dict(extra.node_selector)}
    if extra.tolerations:
        spec["tolerations"] = list(spec.get("tolerations") or []) + [
            {"key": t.key, "operator": "Equal" if t.value is not None else "Exists", "effect": t.effect,
             **({"value": t.value} if t.value is not None else {})} for t in extra.tolerations]
    if extra.service_account and not spec.get("serviceAccountName"):
        spec["serviceAccountName"] = extra.service_account
    if extra.image_pull_secret:
        spec["imagePullSecrets"] = [{"name": extra.image_pull_secret}]


def shaper(extra: Passthrough, gpu: GpuNodes | None = None) -> Shape:
    """(kind, manifest) -> the manifest with the options' additions and the GPU's nodes (a typed model comes
    back typed)."""

    def shape(kind: str, manifest: KubeObject) -> KubeObject:
        if kind not in ("job", "pytorchjob") or (extra == Passthrough() and gpu is None):
            return manifest
        from kubernetes.client import ApiClient

        client = ApiClient()
        body = manifest if isinstance(manifest, dict) else client.sanitize_for_serialization(manifest)
        if extra.queue:
            body["metadata"]["labels"] = {**(body["metadata"].get("labels") or {}), QUEUE_LABEL: extra.queue}
        if kind == "job":
            _pod_spec(body["spec"]["template"]["spec"], extra, gpu)
        else:
            for replica in body["spec"]["pytorchReplicaSpecs"].values():
                _pod_spec(replica["template"]["spec"], extra, gpu)
        if isinstance(manifest, dict):
            return body
        # the typed model the launcher sends, through the client's public deserializer (it reads `.data`)
        import json
        from types import SimpleNamespace

        return client.deserialize(SimpleNamespace(data=json.dumps(body)), "V1Job")

    return shape


def kube_platform(options: Mapping[str, object], gpu: GpuNodes | None = None) -> Platform:
    """`gpu`: the nodes of the GPU --gpu names, as the provider's preflight found them (or the rule's values)."""
    return Platform(name="kubernetes", api=context_api, shape=shaper(passthrough(OptionView(options)), gpu),
                    between_jobs="between jobs no pod of ours runs in the namespace", shared=True)
