"""Charts drawn on the server as SVG (no charting library, nothing fetched by the browser): a phase
timeline, line charts of metrics over time, and stacked bars of spend. Every text is escaped."""

from __future__ import annotations

import math
from html import escape
from typing import Sequence

COLORS = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#17becf")
PHASE_COLORS = {"ok": "#2ca02c", "failed": "#d62728", "running": "#1f77b4", "interrupted": "#ff7f0e"}

Points = Sequence[tuple[float, float]]


def _ticks(low: float, high: float, count: int = 5) -> list[float]:
    """Round tick values from low to high (a 1-2-5 step)."""
    if not math.isfinite(low) or not math.isfinite(high) or high <= low:
        return [low]
    raw = (high - low) / count
    mag = 10 ** math.floor(math.log10(raw))
    step = next(m * mag for m in (1, 2, 5, 10) if m * mag >= raw)
    first = math.ceil(low / step) * step
    return [first + i * step for i in range(int((high - first) / step + 1e-9) + 1)]


def _num(v: float) -> str:
    if v == 0:
        return "0"
    if abs(v) >= 1000:
        return f"{v:,.0f}"
    if abs(v) >= 10:
        return f"{v:.0f}"
    return f"{v:.3g}"


def _empty(title: str, why: str, width: int, height: int) -> str:
    return (f'<svg class="chart empty" xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
            f'viewBox="0 0 {width} {height}" role="img" aria-label="{escape(title)}: {escape(why)}">'
            f'<text x="8" y="18" class="title">{escape(title)}</text>'
            f'<text x="{width / 2}" y="{height / 2}" text-anchor="middle" class="note">{escape(why)}</text></svg>')


def line_chart(title: str, series: Sequence[tuple[str, Points]], *, xlabel: str = "seconds since start",
               ylabel: str = "", width: int = 460, height: int = 240, chart_id: str = "") -> str:
    """A line per series (label, [(x, y), ...]); a dot per point when a series is short."""
    drawn = [(label, list(points)) for label, points in series if points]
    if not drawn:
        return _empty(title, "no data recorded", width, height)
    xs = [x for _, pts in drawn for x, _ in pts]
    ys = [y for _, pts in drawn for _, y in pts]
    x0, x1 = min(xs), max(xs)
    y0, y1 = min(ys), max(ys)
    if x1 == x0:
        x0, x1 = x0 - 1, x1 + 1
    if y1 == y0:
        y0, y1 = y0 - (abs(y0) * 0.1 or 1), y1 + (abs(y1) * 0.1 or 1)
    left, right, top, bottom = 54, 12, 26, 38
    pw, ph = width - left - right, height - top - bottom

    def px(x: float) -> float:
        return left + (x - x0) / (x1 - x0) * pw

    def py(y: float) -> float:
        return top + ph - (y - y0) / (y1 - y0) * ph

    out = [f'<svg class="chart" id="{escape(chart_id)}" xmlns="http://www.w3.org/2000/svg" width="{width}" '
           f'height="{height}" viewBox="0 0 {width} {height}" role="img" aria-label="{escape(title)}">',
           f'<text x="8" y="16" class="title">{escape(title)}</text>']
    for t in _ticks(y0, y1):
        out.append(f'<line class="grid" x1="{left}" x2="{left + pw}" y1="{py(t):.1f}" y2="{py(t):.1f}"/>'
                   f'<text class="tick" x="{left - 4}" y="{py(t) + 4:.1f}" text-anchor="end">{_num(t)}</text>')
    for t in _ticks(x0, x1):
        out.append(f'<text class="tick" x="{px(t):.1f}" y="{top + ph + 14}" text-anchor="middle">{_num(t)}</text>')
    out.append(f'<rect class="frame" x="{left}" y="{top}" width="{pw}" height="{ph}" fill="none"/>')
    out.append(f'<text class="axis" x="{left + pw / 2}" y="{height - 6}" text-anchor="middle">{escape(xlabel)}</text>')
    if ylabel:
        out.append(f'<text class="axis" x="12" y="{top + ph / 2}" text-anchor="middle" '
                   f'transform="rotate(-90 12 {top + ph / 2})">{escape(ylabel)}</text>')
    for i, (label, pts) in enumerate(drawn):
        color = COLORS[i % len(COLORS)]
        coords = " ".join(f"{px(x):.1f},{py(y):.1f}" for x, y in pts)
        out.append(f'<polyline class="series" data-label="{escape(label)}" data-points="{len(pts)}" fill="none" '
                   f'stroke="{color}" stroke-width="1.6" points="{coords}"/>')
        if len(pts) <= 30:
            out += [f'<circle cx="{px(x):.1f}" cy="{py(y):.1f}" r="2.2" fill="{color}"/>' for x, y in pts]
        out.append(f'<text class="legend" x="{left + pw - 4}" y="{top + 14 + 13 * i}" text-anchor="end" '
                   f'fill="{color}">{escape(label)}</text>')
    out.append("</svg>")
    return "".join(out)


def timeline(phases: Sequence[tuple[str, float, float | None, str | None]], *, start: float, now: float,
             width: int = 940) -> str:
    """Phases (name, started_at, ended_at or None while it runs, status) as bars on one time axis."""
    if not phases:
        return _empty("phases", "no phase recorded", width, 60)
    end = max([now if e is None else e for _, _, e, _ in phases] + [start + 1])
    left, right, row = 110, 16, 22
    pw = width - left - right
    height = 30 + row * len(phases) + 24
    span = max(end - start, 1e-6)

    def px(t: float) -> float:
        return left + (t - start) / span * pw

    out = [f'<svg class="chart timeline" id="timeline" xmlns="http://www.w3.org/2000/svg" width="{width}" '
           f'height="{height}" viewBox="0 0 {width} {height}" role="img" aria-label="phase timeline">',
           '<text x="8" y="16" class="title">phases</text>']
    for i, (name, s, e, status) in enumerate(phases):
        y = 26 + row * i
        state = "running" if e is None else (status or "ok")
        color = PHASE_COLORS.get(state, "#7f7f7f")
        x, w = px(s), max(2.0, px(now if e is None else e) - px(s))
        secs = (now if e is None else e) - s
        out.append(f'<text class="tick" x="{left - 6}" y="{y + 14}" text-anchor="end">{escape(name)}</text>'
                   f'<rect class="phase" data-phase="{escape(name)}" data-status="{escape(state)}" x="{x:.1f}" '
                   f'y="{y + 3}" width="{w:.1f}" height="{row - 6}" fill="{color}"><title>{escape(name)}: '
                   f'{secs:.1f} s, {escape(state)}</title></rect>'
                   + (f'<text class="tick" x="{x + w + 4:.1f}" y="{y + 14}">{secs:.1f} s</text>' if x + w + 48 < width
                      else f'<text class="inbar" x="{x + w - 4:.1f}" y="{y + 14}" text-anchor="end">{secs:.1f} s</text>'))
    base = 26 + row * len(phases) + 14
    for t in _ticks(0, span):
        out.append(f'<text class="tick" x="{px(start + t):.1f}" y="{base}" text-anchor="middle">{_num(t)} s</text>')
    out.append("</svg>")
    return "".join(out)


def stacked_bars(title: str, groups: dict[str, dict[str, float]], *, unit: str = "$", width: int = 940,
                 height: int = 260, chart_id: str = "") -> str:
    """One bar per group (a day), stacked by key (a cloud), with a legend."""
    if not groups:
        return _empty(title, "no runs recorded", width, height)
    keys = list(dict.fromkeys(k for parts in groups.values() for k in parts))
    top_value = max(sum(parts.values()) for parts in groups.values()) or 1.0
    left, right, top, bottom = 60, 12, 26, 46
    pw, ph = width - left - right, height - top - bottom
    slot = pw / len(groups)
    bar = max(2.0, min(48.0, slot * 0.7))

    def py(v: float) -> float:
        return top + ph - v / top_value * ph

    out = [f'<svg class="chart bars" id="{escape(chart_id)}" xmlns="http://www.w3.org/2000/svg" width="{width}" '
           f'height="{height}" viewBox="0 0 {width} {height}" role="img" aria-label="{escape(title)}">',
           f'<text x="8" y="16" class="title">{escape(title)}</text>']
    for t in _ticks(0, top_value):
        out.append(f'<line class="grid" x1="{left}" x2="{left + pw}" y1="{py(t):.1f}" y2="{py(t):.1f}"/>'
                   f'<text class="tick" x="{left - 4}" y="{py(t) + 4:.1f}" text-anchor="end">{unit}{_num(t)}</text>')
    every = max(1, math.ceil(len(groups) / 12))  # at most about 12 labels under the bars
    for i, (name, parts) in enumerate(groups.items()):
        x = left + slot * i + (slot - bar) / 2
        level = 0.0
        for key, value in parts.items():
            if value <= 0:
                continue
            color = COLORS[keys.index(key) % len(COLORS)]
            out.append(f'<rect class="bar" data-group="{escape(name)}" data-key="{escape(key)}" x="{x:.1f}" '
                       f'y="{py(level + value):.1f}" width="{bar:.1f}" height="{py(level) - py(level + value):.1f}" '
                       f'fill="{color}"><title>{escape(name)} {escape(key)}: {unit}{value:.2f}</title></rect>')
            level += value
        if i % every == 0:  # a name wider than its slot (about 6.5 px a character) keeps its end
            room = max(4, int(slot * every / 6.5))
            label = name if len(name) <= room else "\u2026" + name[-(room - 1):]
            out.append(f'<text class="tick" x="{x + bar / 2:.1f}" y="{top + ph + 14}" text-anchor="middle">'
                       f'{escape(label)}</text>')
    for i, key in enumerate(keys):
        out.append(f'<text class="legend" x="{left + pw - 4}" y="{top + 14 + 13 * i}" text-anchor="end" '
                   f'fill="{COLORS[i % len(COLORS)]}">{escape(key)}</text>')
    out.append("</svg>")
    return "".join(out)
