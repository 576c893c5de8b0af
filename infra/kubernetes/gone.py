"""Whether a run's Kubernetes objects still exist, read back from the API server by the run's label
(`gpucluster-run=<run id>`, on every object `infra.kubernetes.objects.Created` makes).

An object is in one of three states:

- `gone`: not found (404) or not listed;
- `going`: listed with `metadata.deletionTimestamp` set. The API server sets it when it accepts a
  delete of an object that has finalizers (Foreground propagation adds `foregroundDeletion`); the
  object "remains in a terminating state" while the finalizers run and is then removed by the
  control plane (Kubernetes docs, "Finalizers" and "Garbage Collection"), and a deletionTimestamp,
  once set, "may not be unset" (Kubernetes API conventions, "Metadata"). Nothing this machine does
  can bring it back or speed it up, and a GKE cluster bills its nodes, not its pods: it counts as
  confirmed going, and is said as such;
- `there`: listed with no deletionTimestamp: still there (a delete that failed, or a run that was
  killed before its cleanup): a leftover.

`ledger_rows` names the ledger rows (`k8s-<kind>`, `<namespace>/<name>`) the launcher writes for them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable, Iterable

from .api import KubeApi, KubeObject, Retry, _is_api_error, _status

if TYPE_CHECKING:
    from gpucluster.domain import Leftover
from .plan import (KUBEFLOW_GROUP, KUBEFLOW_PLURAL, KUBEFLOW_VERSION, TRAINER_GROUP, TRAINER_VERSION, TRAINJOB_PLURAL,
                   dns_name)

RUN_LABEL = "gpucluster-run"
ROW_PREFIX = "k8s-"
NAMESPACED = ("secret", "configmap", "service", "job", "pytorchjob", "trainjob")
CUSTOM = {"pytorchjob": (KUBEFLOW_GROUP, KUBEFLOW_VERSION, KUBEFLOW_PLURAL),
          "trainjob": (TRAINER_GROUP, TRAINER_VERSION, TRAINJOB_PLURAL)}  # kind -> (group, version, plural)
ROW_KINDS = tuple(ROW_PREFIX + k for k in (*NAMESPACED, "namespace"))  # the ledger kinds of a run's objects


def row_name(kind: str, namespace: str, name: str) -> str:
    return namespace if kind == "namespace" else f"{namespace}/{name}"


def _meta(item: KubeObject) -> tuple[str, object]:
    """(name, deletionTimestamp) of a listed item: a client model or a custom object's dict."""
    if isinstance(item, dict):
        meta = item.get("metadata") or {}
        return str(meta.get("name") or ""), meta.get("deletionTimestamp")
    return str(item.metadata.name), getattr(item.metadata, "deletion_timestamp", None)


def object_lists(api: KubeApi, namespace: str, selector: str, retry: Retry | None = None
                 ) -> dict[str, Callable[[], list[KubeObject]]]:
    """{kind: () -> the items of that kind in `namespace` matching the label `selector`}."""
    call = (retry or Retry(0)).call
    return {
        "job": lambda: call(api.batch.list_namespaced_job, namespace, label_selector=selector).items,
        "service": lambda: call(api.core.list_namespaced_service, namespace, label_selector=selector).items,
        "configmap": lambda: call(api.core.list_namespaced_config_map, namespace, label_selector=selector).items,
        "secret": lambda: call(api.core.list_namespaced_secret, namespace, label_selector=selector).items,
        **{kind: _custom_lister(api, namespace, selector, gvp, retry) for kind, gvp in CUSTOM.items()},
    }


def _custom_lister(api: KubeApi, namespace: str, selector: str, gvp: tuple[str, str, str],
                   retry: Retry | None) -> Callable[[], list[KubeObject]]:
    """() -> the custom objects (group, version, plural `gvp`) in `namespace` matching the label `selector`."""
    call = (retry or Retry(0)).call

    def items() -> list[KubeObject]:
        got = call(api.custom.list_namespaced_custom_object, gvp[0], gvp[1], namespace, gvp[2],
                   label_selector=selector)
        return (got or {}).get("items") or []

    return items


def _custom_deleter(api: KubeApi, namespace: str, gvp: tuple[str, str, str], body: KubeObject,
                    retry: Retry | None) -> Callable[[str], object]:
    """name -> delete that custom object (group, version, plural `gvp`) of `namespace`."""
    call = (retry or Retry(0)).call

    def delete(name: str) -> object:
        return call(api.custom.delete_namespaced_custom_object, gvp[0], gvp[1], namespace, gvp[2], name, body=body)

    return delete


def deleters(api: KubeApi, namespace: str, retry: Retry | None = None) -> dict[str, Callable[[str], object]]:
    """{kind: name -> delete it} (a Job or PyTorchJob with Foreground propagation, so its pods go first)."""
    from .manifests import kube_models

    call = (retry or Retry(0)).call
    body = kube_models().V1DeleteOptions(propagation_policy="Foreground")
    return {
        "job": lambda n: call(api.batch.delete_namespaced_job, n, namespace, body=body),
        **{kind: _custom_deleter(api, namespace, gvp, body, retry) for kind, gvp in CUSTOM.items()},
        "service": lambda n: call(api.core.delete_namespaced_service, n, namespace),
        "configmap": lambda n: call(api.core.delete_namespaced_config_map, n, namespace),
        "secret": lambda n: call(api.core.delete_namespaced_secret, n, namespace),
    }


DELETE_ORDER = {k: i for i, k in enumerate(("job", "pytorchjob", "trainjob", "service", "configmap", "secret"))}  # workload first


def listed(api: KubeApi, namespace: str, run_id: str, kinds: Iterable[str] = NAMESPACED,
           retry: Retry | None = None) -> dict[tuple[str, str], bool]:
    """{(kind, name): terminating} of the run's namespaced objects the API server lists now. A
    namespace that does not exist holds nothing (404: {}). Other API errors raise."""
    lists = object_lists(api, namespace, f"{RUN_LABEL}={dns_name(run_id, 63)}", retry)
    found: dict[tuple[str, str], bool] = {}
    for kind in kinds:
        try:
            items = lists[kind]()
        except Exception as exc:  # ApiException is in the lazily imported SDK: non-API errors re-raise
            if _is_api_error(exc) and _status(exc) == 404:
                if kind in CUSTOM:
                    continue  # no Kubeflow operator (its CRD is missing): nothing of that kind exists
                return {}  # the namespace is gone, and everything in it
            raise
        for item in items:
            name, deleting = _meta(item)
            found[(kind, name)] = bool(deleting)
    return found


def namespace_state(api: KubeApi, namespace: str, retry: Retry | None = None) -> str:
    """"gone", "going" (Terminating, or a deletionTimestamp) or "there"."""
    try:
        ns = (retry or Retry(0)).call(api.core.read_namespace, namespace)
    except Exception as exc:  # ApiException is in the lazily imported SDK
        if _is_api_error(exc) and _status(exc) == 404:
            return "gone"
        raise
    terminating = getattr(getattr(ns, "status", None), "phase", None) == "Terminating"
    return "going" if terminating or getattr(ns.metadata, "deletion_timestamp", None) else "there"


def run_leftovers(api: KubeApi, namespace: str, run_id: str, retry: Retry | None = None,
                  kinds: Iterable[str] = NAMESPACED) -> list[Leftover]:
    """The run's objects still there (`Leftover`s, kind `k8s-<kind>`, id `<namespace>/<name>`); those
    being deleted (a deletionTimestamp) are not leftovers (see the module docstring)."""
    from gpucluster.domain import Leftover

    found = listed(api, namespace, run_id, kinds, retry=retry)
    return [Leftover(ROW_PREFIX + kind, row_name(kind, namespace, name), run_id=run_id,
                     detail="labelled with the run, no deletion under way")
            for (kind, name), deleting in sorted(found.items()) if not deleting]


def delete_run_objects(api: KubeApi, namespace: str, run_id: str, retry: Retry | None = None) -> None:
    """Delete the run's namespaced objects found by its label (a Job with Foreground propagation, so
    its pods go first). Not found is fine; other API errors raise (the read-back says what is left)."""
    delete, order = deleters(api, namespace, retry), DELETE_ORDER
    found = listed(api, namespace, run_id, retry=retry)
    for (kind, name), deleting in sorted(found.items(), key=lambda kv: order[kv[0][0]]):
        if deleting:
            continue
        try:
            delete[kind](name)
        except Exception as exc:  # ApiException is in the lazily imported SDK
            if not (_is_api_error(exc) and _status(exc) == 404):
                raise
