"""PNG plots and the Markdown sweep report (matplotlib, Agg backend, imported only when drawing).

- `utilisation_plot(records, path)`: CPU %, GPU %, GPU memory and power over time, one line per
  node, from a run's "util" records (`ledger.metrics(run_id, "util")`).
- `plot_run(ledger, run_id, path)`: the same for a run in the ledger (what `show --plot` calls).
- `scaling_plots(summary, outdir)`: training time and cost vs nodes with the ideal-scaling line,
  efficiency vs nodes, throughput vs nodes.
- `write_report(outdir, summary, findings, ...)`: summary.md embedding the plots.
"""

from __future__ import annotations

from decimal import Decimal
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Mapping, Protocol, Sequence

from gpucluster.errors import UsageError, require
from gpucluster.states import JsonMapping

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

    from gpucluster.ledger.store import Ledger

COLORS = ["tab:blue", "tab:orange", "tab:green", "tab:red", "tab:purple", "tab:brown", "tab:pink", "tab:gray"]


def _plt():  # -> matplotlib.pyplot (the module; imported only when drawing)
    require("matplotlib", "plot")
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    return plt


def check_plot_file(path: Path | str, what: str = "plot file") -> Path:
    """A PNG file name in an existing, writable folder (checked before any work; creates nothing)."""
    import os

    path = Path(path).expanduser()
    if path.suffix.lower() != ".png":
        raise UsageError(f"{what} {str(path)!r} is not allowed: a file name ending in .png")
    if path.is_dir():
        raise UsageError(f"{what} {str(path)!r} is a directory; give a file name ending in .png")
    folder = path.parent
    if not folder.is_dir():
        state = "is not a directory" if folder.exists() else "does not exist"
        raise UsageError(f"{what} {str(path)!r}: folder {str(folder)!r} {state}; create it first or give another path")
    if not os.access(folder, os.W_OK | os.X_OK) or (path.exists() and not os.access(path, os.W_OK)):
        raise UsageError(f"{what} {str(path)!r} cannot be written (no permission); give another path")
    return path


def save_png(fig: Figure, path: Path | str, what: str = "plot file", *, dpi: float | None = None,
             format: str | None = None) -> Path:
    """fig.savefig (None: savefig's own default), with a write failure (read-only file system, disk
    full) as one line."""
    path = Path(path)
    try:
        fig.savefig(path, dpi=dpi, format=format)
    except OSError as exc:
        raise UsageError(f"{what} {str(path)!r} cannot be written: {exc.strerror or exc}") from None
    finally:
        _plt().close(fig)
    return path


def _save(fig: Figure, path: Path | str) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    return save_png(fig, path, dpi=110)


# -- utilisation -----------------------------------------------------------------------------
Phase = tuple[str, float, "float | None"]  # a phase shaded behind: name, start, end (None: still open)


def _series(records: Sequence[JsonMapping]) -> dict[int, list[JsonMapping]]:
    nodes: dict[int, list[JsonMapping]] = {}
    for r in records:
        if r.get("kind", "util") == "util" and r.get("time") is not None:
            nodes.setdefault(int(r.get("node_rank") or 0), []).append(r)
    for recs in nodes.values():
        recs.sort(key=lambda r: r["time"])
    return nodes


def _gpu(rec: JsonMapping, key: str, how: str = "mean") -> float | None:
    vals = [g.get(key) for g in rec.get("gpu") or [] if g.get(key) is not None]
    if not vals:
        return None
    return sum(vals) / len(vals) if how == "mean" else sum(vals)


def _cpu_panel(nodes: dict[int, list[JsonMapping]]) -> tuple[str, str, float | None]:
    """CPU as the node's own processes (cores busy) where the sampler read the node's process tree;
    else the machine's busy %."""
    if any(r.get("cpu_scope") == "node" and r.get("cpu_cores") is not None for recs in nodes.values() for r in recs):
        return "cpu_cores", "CPU (cores busy, node's own processes)", None
    return "cpu_percent", "CPU busy (% of the machine)", 105.0


def utilisation_plot(records: Sequence[JsonMapping], path: Path | str, title: str | None = None, *,
                     t0: float | None = None, phases: Sequence[Phase] = ()) -> Path:
    """One line per node over time: CPU, and where GPUs were read, GPU %, memory and power.

    `t0`: the run's start, so the x axis is seconds since the run started (a short run's samples sit
    where they happened, not stretched over a few milliseconds); `phases` (name, start, end or None)
    are shaded behind, with their names. Every sample is a marker."""
    return _save(utilisation_figure(records, title, t0=t0, phases=phases), path)


def _util_panels(has_gpu: bool, cpu_key: str, cpu_label: str) -> list[tuple[str, str, str | None]]:
    """(record key, y label, how the node's GPUs combine: None for a node-wide key) per panel."""
    panels: list[tuple[str, str, str | None]] = [(cpu_key, cpu_label, None)]
    if has_gpu:
        panels += [("util", "GPU utilisation (%, mean of node's GPUs)", "mean"),
                   ("mem_used_mib", "GPU memory used (MiB, node total)", "sum"),
                   ("power_w", "GPU power (W, node total)", "sum")]
    return panels


def _shade_phases(ax: Axes, phases: Sequence[Phase], right: float) -> None:
    for i, (name, start, end) in enumerate(phases):
        stop = right if end is None else end
        ax.axvspan(start, stop, color="0.92" if i % 2 else "0.85", zorder=0, lw=0)


def _node_lines(ax: Axes, nodes: dict[int, list[JsonMapping]], key: str, how: str | None, base: float) -> None:
    for node, recs in sorted(nodes.items()):
        xs, ys = [], []
        for r in recs:
            y = r.get(key) if how is None else _gpu(r, key, how)
            if y is not None:
                xs.append(r["time"] - base)
                ys.append(y)
        if xs:
            ax.plot(xs, ys, marker="o", markersize=5, linewidth=1.2, color=COLORS[node % len(COLORS)],
                    label=f"node {node}", zorder=3)


def _panel_ylim(ax: Axes, key: str, cpu_top: float | None) -> None:
    if key in ("cpu_percent", "util"):
        ax.set_ylim(0, 105 if key == "util" else (cpu_top or 105))
    elif key == "cpu_cores":  # at least one core's height: a quiet node reads as quiet
        ax.set_ylim(0, max(1.05, ax.get_ylim()[1]))
    else:
        ax.set_ylim(bottom=0)


def _phase_names(top: Axes, phases: Sequence[Phase], right: float, pad: float) -> None:
    for name, start, end in phases:  # the phase names across the top panel
        stop = right if end is None else end
        if stop - start >= 0.04 * (right + 2 * pad):
            top.text((start + stop) / 2, 1.01, name, transform=top.get_xaxis_transform(), ha="center",
                     va="bottom", fontsize=7, color="0.3")


def _right_edge(nodes: dict[int, list[JsonMapping]], base: float, phases: Sequence[Phase]) -> float:
    """The x axis's end: the last sample, or a phase's end past it."""
    last: float = max(recs[-1]["time"] for recs in nodes.values()) - base
    ends = [e for _, _, e in phases if e is not None]
    return max([last, *ends]) if phases else last


def utilisation_figure(records: Sequence[JsonMapping], title: str | None = None, *, t0: float | None = None,
                       phases: Sequence[Phase] = ()) -> Figure:
    """The figure `utilisation_plot` saves (a matplotlib Figure)."""
    nodes = _series(records)
    if not nodes:
        raise UsageError("there are no utilisation records to plot (the run recorded no 'util' metrics)")
    first = min(recs[0]["time"] for recs in nodes.values())
    base = first if t0 is None else float(t0)
    has_gpu = any(_gpu(r, "util") is not None for recs in nodes.values() for r in recs)
    cpu_key, cpu_label, cpu_top = _cpu_panel(nodes)
    panels = _util_panels(has_gpu, cpu_key, cpu_label)
    plt = _plt()
    fig, axes = plt.subplots(len(panels), 1, figsize=(8, 2.4 * len(panels) + 0.8), sharex=True, squeeze=False)
    right = _right_edge(nodes, base, phases)
    for ax, (key, label, how) in zip(axes[:, 0], panels):
        _shade_phases(ax, phases, right)
        _node_lines(ax, nodes, key, how, base)
        ax.set_ylabel(label, fontsize=8)
        _panel_ylim(ax, key, cpu_top)
        ax.grid(alpha=0.3, zorder=1)
        ax.legend(fontsize=7, loc="upper right")
    pad = max(0.5, 0.03 * right)
    axes[0, 0].set_xlim(min(0.0, first - base) - pad if phases else -pad, right + pad)
    _phase_names(axes[0, 0], phases, right, pad)
    axes[-1, 0].set_xlabel("seconds since the run started" if t0 is not None else "seconds since the first sample")
    head = title or "utilisation"
    if not has_gpu:
        head += " (no GPU readings: no NVIDIA GPU or NVML on these nodes)"
    axes[0, 0].set_title(head, fontsize=9, pad=14 if phases else 6)
    return fig


def plot_run(ledger: Ledger, run_id: str, path: Path | str) -> Path:
    """`gpucluster show RUN --plot FILE.png`: the run's utilisation over time, its phases behind."""
    path = check_plot_file(path, "--plot file")
    run = ledger.get_run(run_id)
    if run is None or run.id is None:  # a stored run always has its id
        raise UsageError(f"run {run_id!r} is not in the ledger; list runs with 'gpucluster runs'")
    records = ledger.metrics(run.id, "util")
    if not records:
        raise UsageError(f"run {run.id} has no utilisation records to plot (it ran before sampling existed, "
                         "or GPUCLUSTER_UTIL_INTERVAL=0)")
    t0 = float(run.run.created_at or min(r["time"] for r in records if r.get("time") is not None))
    phases = [(p.name, float(p.started_at) - t0, None if p.ended_at is None else float(p.ended_at) - t0)
              for p in run.phases if p.started_at is not None]
    return utilisation_plot(records, path, title=f"run {run.id}: {run.run.nodes} node(s), {run.run.workload or ''}",
                            t0=t0, phases=phases)


# -- scaling ---------------------------------------------------------------------------------
class StatLike(Protocol):
    """A figure's median and spread over a size's repeats (gpucluster.sweep.runner.Stat)."""

    @property
    def median(self) -> float | Decimal: ...
    @property
    def min(self) -> float | Decimal: ...
    @property
    def max(self) -> float | Decimal: ...
    @property
    def n(self) -> int: ...


class SizeLike(Protocol):
    """One sweep size's summary as the plots and tables read it (gpucluster.sweep.runner.SizeResult;
    the sweep sits above costing in the package order)."""

    @property
    def nodes(self) -> int: ...
    @property
    def gpus_per_node(self) -> int: ...
    @property
    def runs(self) -> Sequence[str]: ...
    @property
    def failed(self) -> Sequence[str]: ...
    @property
    def wall_s(self) -> StatLike | None: ...
    @property
    def phases(self) -> Mapping[str, StatLike]: ...
    @property
    def train_s(self) -> StatLike | None: ...
    @property
    def samples_per_s(self) -> StatLike | None: ...
    @property
    def accuracy(self) -> StatLike | None: ...
    @property
    def loss(self) -> StatLike | None: ...
    @property
    def cost_usd(self) -> StatLike | None: ...
    @property
    def cost_per_epoch_usd(self) -> StatLike | None: ...
    @property
    def efficiency(self) -> float | None: ...
    @property
    def efficiency_range(self) -> tuple[float, float] | None: ...
    @property
    def speedup(self) -> float | None: ...


class FindingLike(Protocol):
    """A diagnosis line (gpucluster.sweep.diagnose.Finding)."""

    @property
    def rule(self) -> str: ...
    @property
    def severity(self) -> str: ...
    @property
    def message(self) -> str: ...


class ComparisonLike(Protocol):
    """A CPU-vs-GPU row (gpucluster.sweep.runner.Comparison)."""

    @property
    def nodes(self) -> int: ...
    @property
    def gpus_per_node(self) -> int: ...
    @property
    def cpu_train_s(self) -> float: ...
    @property
    def gpu_train_s(self) -> float: ...
    @property
    def speedup(self) -> float: ...
    @property
    def cpu_cost_usd(self) -> Decimal | None: ...
    @property
    def gpu_cost_usd(self) -> Decimal | None: ...


Getter = Callable[[SizeLike], "StatLike | None"]
Ideal = Callable[[SizeLike, float], "float | None"]


def _groups(summary: Sequence[SizeLike]) -> dict[int, list[SizeLike]]:
    groups: dict[int, list[SizeLike]] = {}
    for r in summary:
        groups.setdefault(r.gpus_per_node, []).append(r)
    for g in groups.values():
        g.sort(key=lambda r: r.nodes)
    return groups


def _group_label(gpn: int) -> str:
    return "CPU only" if gpn == 0 else f"{gpn} GPU/node"


def _stat_plot(ax: Axes, rows: Sequence[SizeLike], getter: Getter, color: str, label: str, ideal: Ideal | None = None,
               style: str = "-") -> bool:
    """Median with min-max bars; `ideal(row, median)` draws the ideal-scaling line where defined."""
    pts = [(r, st) for r in rows if (st := getter(r)) is not None]
    if not pts:
        return False
    xs = [r.nodes for r, _ in pts]
    med = [float(st.median) for _, st in pts]
    lo = [float(st.median) - float(st.min) for _, st in pts]
    hi = [float(st.max) - float(st.median) for _, st in pts]
    ax.errorbar(xs, med, yerr=[lo, hi], marker="o", capsize=3, color=color, linestyle=style,
                label=f"{label} (median, min-max)")
    if ideal:
        ideal_pts = [(r.nodes, y) for (r, _), m in zip(pts, med) if (y := ideal(r, m)) is not None]
        if ideal_pts:
            ax.plot([x for x, _ in ideal_pts], [y for _, y in ideal_pts], linestyle="--", color=color, alpha=0.6,
                    label=f"{label}: ideal scaling")
    return True


def _at_ideal(r: SizeLike, value: float) -> float | None:
    """Time (or cost) the same work would have taken at perfect scaling: value x efficiency.
    For a fixed job (strong scaling) that is T_base x N_base / N; for fixed work per rank (weak
    scaling) it is T_base."""
    return None if r.efficiency is None else value * r.efficiency


def _throughput_ideal(r: SizeLike, v: float) -> float | None:
    return v / r.efficiency if r.efficiency else None


def _nodes_axis(ax: Axes, summary: Sequence[SizeLike]) -> None:
    ns = sorted({r.nodes for r in summary})
    ax.set_xticks(ns)
    ax.set_xlabel("nodes")
    ax.grid(alpha=0.3)


def _time_plot(summary: Sequence[SizeLike], groups: dict[int, list[SizeLike]], outdir: Path) -> Path:
    fig, ax = _plt().subplots(figsize=(6.5, 4.2))
    for i, (gpn, rows) in enumerate(sorted(groups.items())):
        _stat_plot(ax, rows, lambda r: r.train_s, COLORS[i % len(COLORS)], _group_label(gpn), ideal=_at_ideal)
        _stat_plot(ax, rows, lambda r: r.wall_s, COLORS[i % len(COLORS)], f"{_group_label(gpn)} wall", style=":")
    ax.set_ylabel("seconds")
    ax.set_title("training time vs nodes (dashed: the same work at ideal scaling; dotted: wall)", fontsize=9)
    _nodes_axis(ax, summary)
    ax.legend(fontsize=7)
    return _save(fig, outdir / "time_vs_nodes.png")


def _cost_plot(summary: Sequence[SizeLike], groups: dict[int, list[SizeLike]], outdir: Path) -> Path:
    fig, ax = _plt().subplots(figsize=(6.5, 4.2))
    drawn = False
    for i, (gpn, rows) in enumerate(sorted(groups.items())):
        drawn |= _stat_plot(ax, rows, lambda r: r.cost_usd, COLORS[i % len(COLORS)], _group_label(gpn),
                            ideal=_at_ideal)
    if not drawn:
        ax.text(0.5, 0.5, "cost unknown for these runs", ha="center", va="center", transform=ax.transAxes)
    elif all(r.cost_usd is None or r.cost_usd.max == Decimal(0) for r in summary):
        ax.text(0.5, 0.6, "$0: machines gpucluster does not rent (local/ssh)", ha="center", transform=ax.transAxes,
                fontsize=8)
    ax.set_ylabel("USD per run")
    ax.set_title("cost per run vs nodes (dashed: the same work at ideal scaling)", fontsize=9)
    _nodes_axis(ax, summary)
    if drawn:
        ax.legend(fontsize=7)
    return _save(fig, outdir / "cost_vs_nodes.png")


def _efficiency_bars(ax: Axes, rows: Sequence[SizeLike], color: str, label: str) -> None:
    pts = [(r, r.efficiency) for r in rows if r.efficiency is not None]
    if pts:
        xs = [r.nodes for r, _ in pts]
        ys = [e for _, e in pts]
        lo = [e - (r.efficiency_range or (e,) * 2)[0] for r, e in pts]
        hi = [(r.efficiency_range or (e,) * 2)[1] - e for r, e in pts]
        ax.errorbar(xs, ys, yerr=[lo, hi], marker="o", capsize=3, color=color, label=label)


def _efficiency_plot(summary: Sequence[SizeLike], groups: dict[int, list[SizeLike]], outdir: Path,
                     threshold: float) -> Path:
    fig, ax = _plt().subplots(figsize=(6.5, 4.2))
    for i, (gpn, rows) in enumerate(sorted(groups.items())):
        _efficiency_bars(ax, rows, COLORS[i % len(COLORS)], _group_label(gpn))
    ax.axhline(1.0, linestyle="--", color="gray", label="ideal")
    ax.axhline(threshold, linestyle=":", color="red", label=f"threshold {threshold:g}")
    ax.set_ylim(bottom=0)
    ax.set_ylabel("scaling efficiency")
    ax.set_title("efficiency vs nodes: samples/s at N / (N x samples/s at the baseline)", fontsize=9)
    _nodes_axis(ax, summary)
    ax.legend(fontsize=7)
    return _save(fig, outdir / "efficiency_vs_nodes.png")


def _throughput_plot(summary: Sequence[SizeLike], groups: dict[int, list[SizeLike]], outdir: Path) -> Path:
    fig, ax = _plt().subplots(figsize=(6.5, 4.2))
    drawn = False
    for i, (gpn, rows) in enumerate(sorted(groups.items())):
        drawn |= _stat_plot(ax, rows, lambda r: r.samples_per_s, COLORS[i % len(COLORS)], _group_label(gpn),
                            ideal=_throughput_ideal)
    if not drawn:
        ax.text(0.5, 0.5, "the workload reported no samples/s", ha="center", va="center", transform=ax.transAxes)
    ax.set_ylabel("global samples/s")
    ax.set_title("throughput vs nodes (dashed: ideal)", fontsize=9)
    _nodes_axis(ax, summary)
    if drawn:
        ax.legend(fontsize=7)
    return _save(fig, outdir / "throughput_vs_nodes.png")


def scaling_plots(summary: Sequence[SizeLike], outdir: Path | str, threshold: float = 0.7) -> dict[str, Path]:
    """time_vs_nodes.png, cost_vs_nodes.png, efficiency_vs_nodes.png, throughput_vs_nodes.png."""
    outdir = Path(outdir)
    groups = _groups(summary)
    out: dict[str, Path] = {}
    out["time"] = _time_plot(summary, groups, outdir)
    out["cost"] = _cost_plot(summary, groups, outdir)
    out["efficiency"] = _efficiency_plot(summary, groups, outdir, threshold)
    out["throughput"] = _throughput_plot(summary, groups, outdir)
    return out


# -- the Markdown report ---------------------------------------------------------------------
def _fmt(stat: StatLike | None, unit: str = "", digits: int = 1) -> str:
    if stat is None:
        return "-"
    if isinstance(stat.median, Decimal):
        m = f"${stat.median:.4f}"
        return m if stat.n < 2 else f"{m} (${stat.min:.4f}-${stat.max:.4f})"
    m = f"{stat.median:,.{digits}f}{unit}"
    return m if stat.n < 2 or stat.min == stat.max else f"{m} ({stat.min:,.{digits}f}-{stat.max:,.{digits}f})"


def summary_rows(summary: Sequence[SizeLike]) -> list[list[str]]:
    """Rows of the size table, shared by the terminal table and the Markdown report."""
    rows = []
    for r in summary:
        eff = "-" if r.efficiency is None else f"{r.efficiency:.2f}"
        if r.efficiency_range and r.efficiency_range[0] != r.efficiency_range[1]:
            eff += f" ({r.efficiency_range[0]:.2f}-{r.efficiency_range[1]:.2f})"
        acc = "-" if r.accuracy is None else _fmt(r.accuracy, "", 4)
        rows.append([
            str(r.nodes), str(r.gpus_per_node) if r.gpus_per_node else "CPU",
            f"{len(r.runs) - len(r.failed)}/{len(r.runs)}", _fmt(r.wall_s, " s"), _fmt(r.train_s, " s", 2),
            _fmt(r.samples_per_s, "", 0), eff, "-" if r.speedup is None else f"{r.speedup:.2f}x",
            acc, _fmt(r.loss, "", 4), _fmt(r.cost_usd), _fmt(r.cost_per_epoch_usd),
        ])
    return rows


SUMMARY_HEADERS = ["nodes", "GPUs/node", "ok", "wall", "training", "samples/s", "efficiency", "speed-up",
                   "accuracy", "loss", "cost/run", "cost/epoch"]


def _md_table(headers: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    lines += ["| " + " | ".join(c.replace("|", "/") for c in row) + " |" for row in rows]
    return "\n".join(lines)


def write_report(outdir: Path | str, summary: Sequence[SizeLike], findings: Sequence[FindingLike], *, sweep_id: str,
                 util_runs: Sequence[tuple[str, str, Sequence[JsonMapping]]] = (),
                 comparisons: Sequence[ComparisonLike] = (),
                 threshold: float = 0.7, title: str = "Scaling sweep") -> Path:
    """Write the plots and summary.md into outdir; returns summary.md's path.

    util_runs: (run_id, label, util records) for the utilisation plots, one PNG each.
    """
    outdir = Path(outdir)
    outdir.mkdir(parents=True, exist_ok=True)
    plots = scaling_plots(summary, outdir, threshold=threshold)
    md = [f"# {title}: {sweep_id}", ""]
    md += [_md_table(SUMMARY_HEADERS, summary_rows(summary)), ""]
    md += ["Efficiency: global samples/s at N nodes / (N / N_base x samples/s at N_base), N_base the smallest "
           f"size of the same GPUs-per-node group; below {threshold:g} is flagged. Medians, (min-max) over repeats.", ""]
    from gpucluster.ledger.schema import PHASES

    phase_names = [p for p in PHASES if any(p in r.phases for r in summary)]
    if phase_names:
        md += ["## Wall time per phase (median seconds)", ""]
        md += [_md_table(["nodes", "GPUs/node", *phase_names],
                         [[str(r.nodes), str(r.gpus_per_node) if r.gpus_per_node else "CPU",
                           *[f"{r.phases[p].median:.2f}" if r.phases.get(p) else "-" for p in phase_names]]
                          for r in summary]), ""]
    if comparisons:
        md += ["## CPU vs GPU", ""]
        md += [_md_table(["nodes", "GPUs/node", "CPU training", "GPU training", "GPU speed-up", "CPU cost", "GPU cost"],
                         [[str(c.nodes), str(c.gpus_per_node), f"{c.cpu_train_s:.2f} s", f"{c.gpu_train_s:.2f} s",
                           f"{c.speedup:.1f}x" + ("" if c.speedup >= 1 else " (slower)"), "-" if c.cpu_cost_usd is None else f"${c.cpu_cost_usd:.4f}",
                           "-" if c.gpu_cost_usd is None else f"${c.gpu_cost_usd:.4f}"] for c in comparisons]), ""]
    md += ["## Diagnosis", ""]
    if findings:
        md += [f"- **{f.rule}** ({f.severity}): {f.message}" for f in findings]
    else:
        md += [f"No size fell below efficiency {threshold:g} or trained slower than a smaller size."]
    md += ["", "## Plots", ""]
    for key, caption in (("time", "Training time vs nodes"), ("cost", "Cost per run vs nodes"),
                         ("efficiency", "Scaling efficiency vs nodes"), ("throughput", "Throughput vs nodes")):
        md += [f"![{caption}]({plots[key].name})", ""]
    for run_id, label, records in util_runs:
        if not records:
            continue
        p = utilisation_plot(records, outdir / f"util_{run_id}.png", title=f"{label} ({run_id})")
        md += [f"![Utilisation, {label}]({p.name})", ""]
    path = outdir / "summary.md"
    path.write_text("\n".join(md) + "\n")
    return path
