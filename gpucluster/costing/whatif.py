"""What-if projections: wall time and cost of a workload on other node counts, from the speed
measured by the runs in the ledger (never an assumed scaling). The backends of the runs' clouds
are given by the caller."""

from __future__ import annotations

import math
import statistics
from decimal import Decimal
from typing import TYPE_CHECKING, Iterable, Mapping

from gpucluster.catalog.prices import Catalog, load_catalog, normalize_gpu
from gpucluster.errors import UsageError, not_allowed
from gpucluster.ledger.records import RunRow
from gpucluster.spec import ClusterSpec, parse_int
from gpucluster.states import JsonObject, RunStatus

from .estimate import estimate
from .plan import gpus_billed_apart, is_free, pricing_of

if TYPE_CHECKING:
    from gpucluster.infra.contract import Plugin


def gpu_of(backend: Plugin | None, instance_type: str, catalog: Catalog) -> str | None:
    """The GPU a machine type carries where its price includes its GPUs (aws: an EC2 type): its price rows',
    else the backend's shapes' (`SpecRules.gpu_shapes`: a type with no price row). None where the GPUs are
    billed apart from the machine (gcp: the run's accelerator says which) or the backend is not priced."""
    pricing = pricing_of(backend)
    if backend is None or pricing is None or gpus_billed_apart(catalog, backend.name):
        return None
    row = next((r for r in catalog.rows.values() if r.cloud == backend.name and r.item == instance_type), None)
    if row is not None and row.gpu:
        return row.gpu
    shape = next((s for s in backend.spec.gpu_shapes() if s["machine"] == instance_type), None)
    return str(shape["gpu"]) if shape is not None and shape.get("gpu") else None


def _run_shape(run: RunRow, catalog: Catalog | None,
               backends: Mapping[str, Plugin]) -> tuple[str | None, str | None, str | None, int | None]:
    spec = run.spec or {}  # the spec as recorded (JSON)
    cloud = run.cloud or spec.get("cloud")
    itype = spec.get("instance_type")
    gpu = spec.get("accelerator")
    if itype and catalog is not None:
        gpu = gpu_of(backends.get(cloud or ""), itype, catalog) or gpu  # aws: the GPU the instance type carries
    if gpu:
        try:
            gpu = normalize_gpu(gpu)  # any GPU gpucluster knows, by its catalog name
        except UsageError:
            pass
    return cloud, itype, gpu, run.gpus_per_node


def _fmt_shape(shape: tuple) -> str:
    cloud, itype, gpu, gpn = shape
    return f"{cloud}" + (f" {itype}" if itype else "") + (f" {gpn} x {gpu}" if gpu else (f" {gpn} GPU" if gpn else ""))


Usable = tuple[tuple, RunRow, JsonObject, float, "float | None"]  # shape, run, metrics, epoch s, wall s


def what_if(ledger_runs: Iterable[RunRow], nodes_list: Iterable[int], workload: str, epochs: int, *,
            backends: Mapping[str, Plugin], max_nodes: int, cloud: str | None = None,
            instance_type: str | None = None, gpus_per_node: int | None = None,
            catalog: Catalog | None = None) -> JsonObject:
    """Project wall time and cost of `epochs` epochs of `workload` on each node count, from the
    runs in the ledger (succeeded, same workload, same cloud / instance type / GPU type / GPUs per
    node). Epoch time per node count is the median measured; counts not measured are projected
    from a power-law fit of epoch time against node count over the measured counts (the measured
    scaling, never an assumed linear one); with one measured count nothing else is projected.
    Set-up and tear-down time (run wall time minus training time) is the median measured at the
    nearest measured count. Raises UsageError when no run qualifies.

    `backends`: the plugins of the clouds the runs name, by name; `max_nodes`: the largest node
    count any backend takes. Both from the caller (the CLI), which looked them up."""
    nodes_list = [parse_int("nodes", n, low=1, high=max_nodes) for n in nodes_list]
    epochs = parse_int("epochs", epochs, low=1)
    if not nodes_list:
        raise UsageError("nodes: give at least one node count, e.g. --nodes 1,2,4,8")
    catalog = catalog or load_catalog()
    usable = _usable(ledger_runs, workload, catalog, backends, (cloud, instance_type, gpus_per_node))
    shape = _one_shape(usable, workload)
    measured = _measured(usable)
    fit = _fit(measured)
    latest = max((u[1] for u in usable), key=lambda r: r.created_at or 0)
    projector = _Projector(measured, fit, epochs, shape, backends.get(shape[0] or ""),
                           ClusterSpec.from_dict(latest.spec) if latest.spec else None, catalog)
    return {"workload": workload, "epochs": epochs, "shape": _fmt_shape(shape),
            "runs_used": [rid for m in measured for rid in m["runs"]], "measured": measured, "fit": fit,
            "projection": [projector.row(n) for n in nodes_list]}


def _usable(ledger_runs: Iterable[RunRow], workload: str, catalog: Catalog, backends: Mapping[str, Plugin],
            wanted: tuple[str | None, str | None, int | None]) -> list[Usable]:
    """The succeeded runs of `workload` with training metrics, of the wanted shape (cloud, instance
    type, GPUs per node; None: any); UsageError saying why when there is none."""
    cloud, instance_type, gpus_per_node = wanted
    usable: list[Usable] = []
    seen_workload = False
    for run in ledger_runs:
        if run.workload != workload:
            continue
        seen_workload = True
        summary = run.metrics or {}
        train_s, run_epochs = summary.get("train_time_s"), summary.get("epochs")
        if run.status != RunStatus.SUCCEEDED or not train_s or not run_epochs:
            continue
        shape = _run_shape(run, catalog, backends)
        if cloud and shape[0] != cloud or instance_type and shape[1] != instance_type \
                or gpus_per_node is not None and shape[3] != gpus_per_node:
            continue
        wall = float(run.ended_at) - float(run.created_at) if run.ended_at and run.created_at else None
        usable.append((shape, run, summary, float(train_s) / float(run_epochs), wall))
    if not usable:
        why = ("no succeeded run with training metrics matches" if seen_workload
               else "the ledger has no run of this workload")
        raise UsageError(f"cannot project {workload!r}: {why}; run it first (e.g. on 1 and 2 nodes) so the "
                         "projection rests on measured speed")
    return usable


def _one_shape(usable: list[Usable], workload: str) -> tuple:
    shapes = sorted({u[0] for u in usable}, key=str)
    if len(shapes) > 1:
        listed = "; ".join(_fmt_shape(s) for s in shapes)
        raise UsageError(f"runs of {workload!r} were measured on several node shapes ({listed}); choose one with "
                         "--cloud / --instance-type / --gpus")
    return shapes[0]


def _measured(usable: list[Usable]) -> list[JsonObject]:
    """Per measured node count: the runs, median epoch time, overhead and samples/s, and the
    efficiency against the smallest count."""
    by_nodes: dict[int, list[tuple[RunRow, JsonObject, float, float | None]]] = {}
    for _, run, summary, epoch_s, wall in usable:
        # nodes is NOT NULL in the ledger
        by_nodes.setdefault(int(run.nodes), []).append((run, summary, epoch_s, wall))  # type: ignore[arg-type]
    measured: list[JsonObject] = []
    for n in sorted(by_nodes):
        rows = by_nodes[n]
        epoch_s = statistics.median(e for _, _, e, _ in rows)
        overheads = [max(w - e * float(m["epochs"]), 0.0) for _, m, e, w in rows if w is not None]
        sps = [float(m["samples_per_s"]) for _, m, _, _ in rows if m.get("samples_per_s")]
        measured.append({"nodes": n, "runs": [r.id for r, _, _, _ in rows], "epoch_s": epoch_s,
                         "overhead_s": statistics.median(overheads) if overheads else 0.0,
                         "samples_per_s": statistics.median(sps) if sps else None})
    base = measured[0]
    for m in measured:
        m["efficiency"] = (base["epoch_s"] * base["nodes"]) / (m["epoch_s"] * m["nodes"])
    return measured


def _fit(measured: list[JsonObject]) -> JsonObject | None:
    """The least-squares power law epoch time ~ nodes^b over the measured counts (None: one count)."""
    if len(measured) < 2:
        return None
    xs = [math.log(m["nodes"]) for m in measured]
    ys = [math.log(m["epoch_s"]) for m in measured]
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    b = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sum((x - mx) ** 2 for x in xs)
    return {"exponent": b, "intercept": my - b * mx,
            "meaning": "epoch time ~ nodes^exponent; -1 would be perfect scaling, 0 none, > 0 slower"}


class _Projector:
    """One projection row per node count: measured, fitted between measured counts, extrapolated
    beyond them, or not projected at all (one measured count); priced with the latest run's spec."""

    def __init__(self, measured: list[JsonObject], fit: JsonObject | None, epochs: int, shape: tuple,
                 backend: Plugin | None, spec_base: ClusterSpec | None, catalog: Catalog) -> None:
        self.measured, self.fit, self.epochs, self.shape = measured, fit, epochs, shape
        self.backend, self.spec_base, self.catalog = backend, spec_base, catalog
        self.known = {m["nodes"]: m for m in measured}
        self.lo, self.hi = measured[0]["nodes"], measured[-1]["nodes"]

    def row(self, n: int) -> JsonObject:
        row: JsonObject = {"nodes": n}
        nearest = min(self.measured, key=lambda m: (abs(math.log(m["nodes"]) - math.log(n)), m["nodes"]))
        if n in self.known:
            epoch_s, basis = self.known[n]["epoch_s"], "measured"
        elif self.fit is not None:
            epoch_s = math.exp(self.fit["intercept"] + self.fit["exponent"] * math.log(n))
            basis = "fitted" if self.lo < n < self.hi else "extrapolated"
        else:
            row.update(basis=None, note=f"not measured: only {self.lo} node(s) measured, so scaling to {n} is "
                                        f"unknown; run it on {n} nodes (or one more node count) first")
            return row
        base = self.measured[0]
        train_s = epoch_s * self.epochs
        wall_s = train_s + nearest["overhead_s"]
        row.update(basis=basis, epoch_s=round(epoch_s, 3), train_s=round(train_s, 3), wall_s=round(wall_s, 3),
                   efficiency=round((base["epoch_s"] * base["nodes"]) / (epoch_s * n), 4),
                   overhead_from_nodes=nearest["nodes"])
        row.update(self._priced(n, wall_s))
        return row

    def _priced(self, n: int, wall_s: float) -> JsonObject:
        if is_free(self.backend) or self.spec_base is None:
            return {"cost": "0", "hourly": "0", "note": f"{self.shape[0]} runs cost $0"}
        if self.backend is None:  # a ledger row may name a cloud no registered backend is called
            raise UsageError(not_allowed("cloud", self.shape[0], "no registered backend has that name, so its runs "
                                         "cannot be priced"))
        est = estimate(self.spec_base.replace(nodes=n), Decimal(str(round(wall_s, 3))) / 3600, backend=self.backend,
                       catalog=self.catalog)
        return {"cost": str(est.total), "hourly": str(est.hourly), "price_date": est.price_date}
