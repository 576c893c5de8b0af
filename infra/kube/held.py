"""A kept cluster on an existing Kubernetes cluster (`up --cloud kubernetes --name lab`, `gpucluster.lifecycle.held`): a
namespace of a kubeconfig context held under a name, so that `exec` runs job after job there as `run` would,
and `ssh` reaches a pod of the job running on it now.

- `hold(launcher, cluster)`: what a run checks before it creates anything, asked once (the provider's
  preflight: the API server answering, the credentials, the namespace, every permission a job uses, the pods'
  fit on the nodes, the ResourceQuotas and LimitRanges, the Kueue LocalQueue); a refusal records nothing.
  Nothing is created in the cluster: the kept cluster is one `host` row in the ledger naming the context and
  the namespace (the options are the spec `up` recorded). Each `exec` makes its own job's objects (ledger
  rows before each create) and deletes them after it, read back.
- `cluster_leftovers(...)`: `down`'s sweep of the namespace: every object labelled with this cluster's name
  (`gpucluster-cluster`) and this home's owner id, whatever run made it (a run whose rows were lost), deleted
  and read back; other owners' objects labelled with the same cluster name (another home's cluster named
  alike, in the same namespace) are listed as not ours and left alone; other clusters' are not listed at all.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Sequence

from gpucluster.domain import Cluster, Leftover

if TYPE_CHECKING:
    from gpucluster.infra.kubernetes.api import KubeApi, Retry
    from gpucluster.watch.launch import Launcher


def hold(launcher: Launcher, cluster: Cluster) -> dict[int, dict[str, object]]:
    from gpucluster.watch.launch import JobSpec

    from .limits import job_pod
    from .launcher import KubeLauncher

    assert isinstance(launcher, KubeLauncher)  # the one this plugin's `make` gives
    provider = launcher.provider  # the KubeLauncher's own provider, handed the spec by `up` (attach_held)
    spec = provider.spec
    assert spec is not None, "a kept cluster is held after `up` handed its provider the spec"
    # a job's pod as `exec` will make it (a command; the LimitRanges and quotas judge its containers)
    provider.pod = job_pod(launcher, spec, JobSpec(run_id=str(spec.run_id or "up"), command=("python", "-c", "pass")))
    provider.preflight(spec)  # UsageError (exit 2): nothing recorded, nothing created
    outputs = dict(cluster.outputs or {})
    context, namespace = str(outputs.get("context")), str(outputs.get("namespace"))
    return {0: {"row": "namespace", "context": context, "namespace": namespace,
                "label": f"namespace {namespace} of context {context}",
                "checked": list(provider.checked), "not_checked": list(provider.skipped)}}


def cluster_leftovers(api: KubeApi, namespace: str, cluster: str, owner: str, kinds: Sequence[str],
                      retry: Retry) -> tuple[list[Leftover], list[Leftover], list[str]]:
    """(this cluster's objects of this owner still there after their deletion, other owners' objects labelled
    with the same cluster name (not ours: left alone), the delete errors)."""
    from gpucluster.infra.kubernetes.gone import ROW_PREFIX, _meta, object_lists
    from gpucluster.infra.kubernetes.plan import CLUSTER_LABEL, dns_name

    from .cleanup import MANAGED, OWNER, RUN, delete

    named = f"{MANAGED},{CLUSTER_LABEL}={dns_name(cluster, 63)}"

    def found(selector: str) -> list[tuple[str, str, bool, dict[str, str]]]:
        lists = object_lists(api, namespace, selector, retry)
        out = []
        for kind in kinds:
            for item in lists[kind]():
                name, deleting = _meta(item)
                labels = (item.get("metadata") or {}).get("labels") if isinstance(item, dict) else item.metadata.labels
                out.append((kind, name, bool(deleting), dict(labels or {})))
        return out

    mine = f"{named},{OWNER}={owner}"
    errors = delete(api, namespace, [(k, n) for k, n, deleting, _ in found(mine) if not deleting], retry)
    left = [Leftover(ROW_PREFIX + k, f"{namespace}/{n}", run_id=labels.get(RUN),
                     detail=f"labelled with cluster {cluster}, no deletion under way")
            for k, n, deleting, labels in found(mine) if not deleting]
    theirs = [Leftover(ROW_PREFIX + k, f"{namespace}/{n}", run_id=labels.get(RUN), owner=labels.get(OWNER),
                       detail=f"labelled with cluster {cluster} by another owner")
              for k, n, _, labels in found(named) if labels.get(OWNER) != owner]
    return left, theirs, errors
