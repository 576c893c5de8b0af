"""The `kubernetes` plugin: an existing cluster (machines that exist), reached through a kubeconfig context;
the run's objects made and removed by the shared Kubernetes launcher."""

from __future__ import annotations

from decimal import Decimal
from typing import TYPE_CHECKING, Mapping

from gpucluster.domain import Check, Leftover, Provider
from gpucluster.infra.contract import ExistingMachines, LaunchOptions, Operations, Record, SpecRules, Transport
from gpucluster.infra.kubernetes.launcher import KubernetesLauncher

from . import TRAITS, options
from .context import gone_hint, in_context
from .held import hold
from .launcher import KubeLauncher
from .platform import kube_platform
from .provider import KubeProvider, hourly, prepare, run_where

if TYPE_CHECKING:
    from gpucluster.spec import ClusterSpec


def make(opts: LaunchOptions) -> tuple[KubeProvider, KubeLauncher]:
    provider = KubeProvider()
    kw: dict[str, float] = {}
    if opts.start_deadline_s:
        kw["start_deadline_s"] = opts.start_deadline_s
    given = dict(opts.spec_options)
    return provider, KubeLauncher(provider, queue=given.get("queue") or None, options=given, mode=str(given.get("launcher") or "job").strip().lower(),
                                  image=given.get("image") or None,
                                  namespace=given.get("namespace") or options.DEFAULT_NAMESPACE,
                                  platform=kube_platform(given), **kw)


def check_down(provider_: Provider, name: str, runs: Mapping[str, Record]) -> Check:
    """Each run's objects, found by its label (and of the kinds its ledger rows name) in the context and
    namespace it recorded, deleted and read back."""
    from gpucluster.infra.kubernetes.api import KubeApi, Retry

    from . import access
    from .cleanup import delete_run, kinds_of, run_leftovers

    check = Check()
    for rid in sorted(runs):
        record = runs[rid] or {}
        where = run_where(record)
        if where is None:
            check = check.with_unchecked(f"run {rid}: the ledger holds no context and namespace for it")
            continue
        context, namespace = where
        resources = record.get("resources")
        rows = [str(r.get("kind")) for r in (resources if isinstance(resources, list) else []) if isinstance(r, Mapping)]
        kinds = kinds_of(rows)
        try:
            api, retry = KubeApi.from_api_client(access.api_client(context)), Retry(30)
            errors = delete_run(api, namespace, rid, kinds, retry)
            found: list[Leftover] = run_leftovers(api, namespace, rid, kinds, retry)
        except Exception as exc:  # noqa: BLE001 - unreachable, refused: not checked, said
            check = check.with_unchecked(f"run {rid} in context {context}, namespace {namespace}: "
                                         f"{getattr(exc, 'message', None) or exc}{gone_hint(context, name)}")
            continue
        check = (check + Check.of(found)).with_unchecked(*(f"delete {e}" for e in errors if found))
    return Check.of(check + held_down(name, runs), how="by run label")


def held_down(name: str, runs: Mapping[str, Record]) -> Check:
    """A kept cluster (`up --cloud kubernetes --name`, a `host` row): every object of its namespace labelled
    with the cluster's name and this home's owner, whatever run made it, deleted and read back; another owner's
    labelled with the same name listed as not ours."""
    from gpucluster.lifecycle.held import HOST_KIND
    from gpucluster.infra.kubernetes.api import KubeApi, Retry
    from gpucluster.infra.kubernetes.gone import NAMESPACED
    from gpucluster.ownership import installation_id

    from . import access
    from .cleanup import kinds_of
    from .held import cluster_leftovers

    places, named, modes = _held_places(runs, HOST_KIND)
    # the kinds the runs' rows name, and those a job makes (no Secret unless a run made one: a Role may lack it)
    kinds = sorted(set(kinds_of(named)) | {k for m in modes for k in kinds_of((), m)}, key=NAMESPACED.index)
    check = Check()
    for context, namespace in sorted(places):
        try:
            api = KubeApi.from_api_client(access.api_client(context))
            left, theirs, errors = cluster_leftovers(api, namespace, name, installation_id(), kinds, Retry(30))
        except Exception as exc:  # noqa: BLE001 - unreachable, refused: not checked, said
            check = check.with_unchecked(f"cluster {name} in context {context}, namespace {namespace}: "
                                         f"{getattr(exc, 'message', None) or exc}{gone_hint(context, name)}")
            continue
        check = (check + Check.of(left) + Check(not_ours=tuple(theirs))).with_unchecked(
            *(f"delete {e}" for e in errors if left))
    return check


def _held_places(runs: Mapping[str, Record], host_kind: str) -> tuple[set[tuple[str, str]], list[str], set[str]]:
    """From the runs' records: the (context, namespace) of each kept cluster's `host` row, the kinds their rows
    name, and the launcher modes their specs use ("job" always)."""
    places, named, modes = set(), [], {"job"}
    for record in runs.values():
        rows = (record or {}).get("resources")
        for r in rows if isinstance(rows, list) else []:
            detail = r.get("detail") if isinstance(r, Mapping) else None
            named.append(str(r.get("kind")) if isinstance(r, Mapping) else "")
            if r.get("kind") == host_kind and isinstance(detail, Mapping) and detail.get("namespace"):
                places.add((str(detail.get("context")), str(detail.get("namespace"))))
        spec = (record or {}).get("spec")
        opts = dict(spec.get("options") or ()) if isinstance(spec, Mapping) else {}
        modes.add(str(opts.get("launcher") or "job").lower())
    return places, named, modes


def sweep(context: str | None, namespace: str, owner: str, remove: bool) -> tuple[list[Leftover], list[Leftover],
                                                                              list[str]]:
    """`gc --cloud kubernetes --namespace N`: the gpucluster objects of N, ours (owner) removed with `remove`."""
    from gpucluster.errors import UsageError
    from gpucluster.infra.kubernetes.api import KubeApi, Retry

    from . import access
    from .cleanup import sweep as sweep_

    where = access.target(context, namespace)
    api = KubeApi.from_api_client(access.api_client(where.context))
    try:
        return sweep_(api, where.namespace, owner, Retry(30), remove=remove)
    except Exception as exc:  # noqa: BLE001 - unreachable, 401, 403: one line
        said = access.refused(exc, where.context, f"listing namespace {where.namespace}")
        if said is not None:
            raise said from None
        from gpucluster.infra.kubernetes.api import _status

        raise UsageError(f"context {where.context!r} could not list gpucluster's objects in namespace "
                         f"{where.namespace}: {_status(exc)} {getattr(exc, 'reason', exc)}") from None


def preview(spec: ClusterSpec, job: object, launcher: object) -> dict[str, object]:
    """Imported here: the preview imports the kubernetes client and yaml."""
    from gpucluster.watch.launch import JobSpec

    from .preview import preview as preview_

    assert isinstance(job, JobSpec) and isinstance(launcher, KubernetesLauncher)  # what Operations.dry_run hands it

    return preview_(spec, job, launcher)


def plan_line(spec: ClusterSpec, nproc: int, hourly_: Decimal | None) -> str:
    gpu = options.gpu(spec)
    gpus = (f"{spec.gpus_per_node}{' ' + gpu if gpu else ''} {options.gpu_resource(spec)}/pod" if spec.gpus_per_node
            else "CPU only")
    where = f"context {spec.option('context') or '(current)'}, namespace {spec.option('namespace') or '(the context’s)'}"
    price = options.price_per_gpu_hour(spec)
    cost = (f", internal price ${hourly(spec):.2f}/hour: ${price}/GPU-hour from {options.price_source(spec)}"
            if price is not None else ", $0 (not rented by gpucluster)")
    return f"{spec.nodes} pod(s) on kubernetes ({where}; {gpus}, {nproc} process(es)/pod{cost})"


PLUGIN = ExistingMachines(
    traits=TRAITS,
    spec=SpecRules(options=options.OPTIONS, validate=options.validate_spec, resolve=options.resolve, prepare=prepare,
                   plan_line=plan_line),
    transport=Transport(make=make),
    ops=Operations(check_down=check_down, sweep=sweep, dry_run=preview, hold=hold,
                   in_context=in_context),
)
