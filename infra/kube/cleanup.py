"""A run's objects on an existing cluster, found by its label and read back (`infra.kubernetes.gone`), only of
the kinds the run made: on someone else's cluster a user's Role covers what gpucluster uses and nothing
more (no Kubeflow PyTorchJobs for a Job run, no Secrets without --secret), and a list it may not make is
a check that could not run, never "nothing there". `gc --cloud kubernetes --namespace N`: every object
labelled managed-by=gpucluster in N, ours (this home's owner id) deleted and read back, other owners'
listed as not ours and left alone.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Iterable, Sequence

from gpucluster.domain import Leftover
from gpucluster.infra.kubernetes import gone
from gpucluster.infra.kubernetes.gone import DELETE_ORDER, NAMESPACED, ROW_PREFIX, deleters, listed, object_lists

if TYPE_CHECKING:
    from gpucluster.infra.kubernetes.api import KubeApi, Retry

MANAGED = "app.kubernetes.io/managed-by=gpucluster"
OWNER, RUN = "gpucluster-owner", "gpucluster-run"


def kinds_of(rows: Iterable[str], mode: str = "job", secrets: bool = False) -> list[str]:
    """The namespaced kinds to look for: those the run's ledger rows name, else those its mode makes."""
    named = [r[len(ROW_PREFIX):] for r in rows if r.startswith(ROW_PREFIX) and r[len(ROW_PREFIX):] in NAMESPACED]
    if named:
        return sorted(set(named), key=NAMESPACED.index)
    made = ["configmap", "service", "job"] if mode == "job" else ["configmap", "pytorchjob"]
    return (["secret"] if secrets else []) + made


def run_leftovers(api: KubeApi, namespace: str, run_id: str, kinds: Sequence[str], retry: Retry) -> list[Leftover]:
    """The run's objects of `kinds` still there, deletion not under way (`infra.kubernetes.gone`)."""
    return gone.run_leftovers(api, namespace, run_id, retry=retry, kinds=kinds)


def delete(api: KubeApi, namespace: str, objects: Iterable[tuple[str, str]], retry: Retry) -> list[str]:
    """Delete (kind, name) objects, the workload first; the errors (not found is fine)."""
    from gpucluster.infra.kubernetes.api import _status

    delete_one, errors = deleters(api, namespace, retry), []
    for kind, name in sorted(objects, key=lambda o: DELETE_ORDER[o[0]]):
        try:
            delete_one[kind](name)
        except Exception as exc:  # noqa: BLE001 - ApiException lives in the lazily imported SDK
            if _status(exc) != 404:
                errors.append(f"{kind} {namespace}/{name}: {_status(exc)} {getattr(exc, 'reason', exc)}")
    return errors


def delete_run(api: KubeApi, namespace: str, run_id: str, kinds: Sequence[str], retry: Retry) -> list[str]:
    found = listed(api, namespace, run_id, kinds, retry=retry)
    return delete(api, namespace, [k for k, deleting in found.items() if not deleting], retry)


def managed(api: KubeApi, namespace: str, kinds: Sequence[str], retry: Retry
            ) -> list[tuple[str, str, dict[str, str], bool]]:
    """[(kind, name, labels, terminating)] of every object labelled managed-by=gpucluster in `namespace`."""
    lists = object_lists(api, namespace, MANAGED, retry)
    out = []
    for kind in kinds:
        for item in lists[kind]():
            meta = item.metadata
            out.append((kind, str(meta.name), dict(meta.labels or {}), bool(getattr(meta, "deletion_timestamp", None))))
    return out


def sweep(api: KubeApi, namespace: str, owner: str, retry: Retry, *,
          kinds: Sequence[str] = ("job", "service", "configmap"),
          remove: bool = False) -> tuple[list[Leftover], list[Leftover], list[str]]:
    """(ours, not ours, errors) among the gpucluster objects of `namespace`; with `remove`, ours are deleted
    and what is still there after (read back) is returned as ours."""
    def found() -> tuple[list[Leftover], list[Leftover]]:
        ours, theirs = [], []
        for kind, name, labels, terminating in managed(api, namespace, kinds, retry):
            lo = Leftover(ROW_PREFIX + kind, f"{namespace}/{name}", run_id=labels.get(RUN),
                          detail="deletion under way" if terminating else "labelled managed-by=gpucluster",
                          owner=labels.get(OWNER))
            if labels.get(OWNER) == owner:
                if not terminating:
                    ours.append(lo)
            else:
                theirs.append(lo)
        return ours, theirs

    ours, theirs = found()
    errors: list[str] = []
    if remove and ours:
        errors = delete(api, namespace, [(lo.kind[len(ROW_PREFIX):], lo.id.split("/", 1)[1]) for lo in ours], retry)
        ours, theirs = found()
    return ours, theirs, errors
