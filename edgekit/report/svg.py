"""Small inline-SVG charts for the HTML report, drawn from numbers in Python.

Every chart is a string ``<svg id=... class="chart chart-KIND">`` with a fixed viewBox that CSS
scales to the column; hovering a bar or point shows an SVG ``<title>`` (no script needed).
Every string that reaches the markup goes through ``esc``: labels can come from imported files.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from html import escape

import numpy as np

WIDTH = 760  # viewBox width of every chart
LEFT, RIGHT, TOP, BOTTOM = 62, 18, 16, 42
GRID, AXIS, MUTED, INK = "#e8eaee", "#b6bcc6", "#6b7280", "#374151"
WARMUP_FILL, ALERT = "#f1f2f5", "#b91c1c"
MAX_POINTS = 1500  # above this a timeline is thinned to each bucket's min and max (spikes stay visible)


def esc(value: object) -> str:
    return escape(str(value), quote=True)


def num(value: float) -> str:
    """About three significant digits, never scientific notation: 1234, 12.3, 0.0179."""
    a = abs(value)
    if a >= 100 or a == 0:
        return f"{value:.0f}"
    if a >= 10:
        return f"{value:.1f}".removesuffix(".0")
    if a >= 1:
        return f"{value:.2f}".removesuffix(".00")
    return f"{value:.{max(2, 2 - math.floor(math.log10(a)))}f}".rstrip("0")


@dataclass(frozen=True)
class Scale:
    """Data domain -> pixel range; log10 when ``log``."""

    lo: float
    hi: float
    r0: float
    r1: float
    log: bool = False

    @classmethod
    def fit(cls, lo: float, hi: float, r0: float, r1: float, *, log: bool = False, zero: bool = False) -> Scale:
        """A scale over [lo, hi] widened to round ticks (to 0 when ``zero``); copes with one value."""
        if log and lo > 0:
            return cls(lo / 1.08, hi * 1.08, r0, r1, True)
        if zero:
            lo = min(0.0, lo)
        if hi <= lo:
            lo, hi = (lo - abs(lo) * 0.1 - 1e-9, hi + abs(hi) * 0.1 + 1e-9) if not zero else (0.0, hi or 1.0)
        step = _step(hi - lo)
        return cls(math.floor(lo / step) * step if not zero else lo, math.ceil(hi / step) * step, r0, r1)

    def __call__(self, v: float) -> float:
        if self.log:
            a, b, v = math.log10(self.lo), math.log10(self.hi), math.log10(max(v, self.lo))
        else:
            a, b = self.lo, self.hi
        return self.r0 + (v - a) / (b - a) * (self.r1 - self.r0)

    def ticks(self, most: int = 8) -> list[float]:
        if self.log:
            e0, e1 = math.floor(math.log10(self.lo)), math.ceil(math.log10(self.hi))
            every = [(m, m * 10.0**e) for e in range(e0, e1 + 1) for m in (1, 2, 5)]
            inside = [(m, t) for m, t in every if self.lo <= t <= self.hi]
            keep = (1, 2, 5) if len(inside) <= most else (1, 5) if len(inside) * 2 <= most * 3 else (1,)
            return [t for m, t in inside if m in keep]
        step = _step(self.hi - self.lo)
        first = math.ceil(self.lo / step - 1e-9)
        return [round((first + i) * step, 12) for i in range(int((self.hi - first * step) / step + 1e-9) + 1)]


def _step(span: float) -> float:
    raw = span / 5
    mag = 10 ** math.floor(math.log10(raw))
    return next(m * mag for m in (1, 2, 2.5, 5, 10) if m * mag >= raw)


def use_log(values: Sequence[float]) -> bool:
    """Latencies spread over more than 5x (a long tail) read better on a log axis."""
    lo = min(values)
    return lo > 0 and max(values) / lo >= 5


def _svg(chart_id: str, kind: str, height: float, label: str, body: list[str]) -> str:
    return (
        f'<svg id="{esc(chart_id)}" class="chart chart-{kind}" viewBox="0 0 {WIDTH} {height:.0f}" '
        f'role="img" aria-label="{esc(label)}" xmlns="http://www.w3.org/2000/svg">'
        f"<title>{esc(label)}</title>{''.join(body)}</svg>"
    )


def _x_axis(x: Scale, y1: float, label: str) -> list[str]:
    out = []
    for t in x.ticks():
        px = x(t)
        out.append(f'<line x1="{px:.1f}" x2="{px:.1f}" y1="{TOP:.1f}" y2="{y1:.1f}" stroke="{GRID}"/>')
        out.append(f'<text x="{px:.1f}" y="{y1 + 15:.1f}" text-anchor="middle">{num(t)}</text>')
    out.append(f'<line x1="{x.r0:.1f}" x2="{x.r1:.1f}" y1="{y1:.1f}" y2="{y1:.1f}" stroke="{AXIS}"/>')
    out.append(f'<text class="axis-label" x="{(x.r0 + x.r1) / 2:.1f}" y="{y1 + 33:.1f}" text-anchor="middle">{esc(label)}</text>')
    return out


def _y_axis(y: Scale, label: str) -> list[str]:
    out = []
    for t in y.ticks(most=5):
        py = y(t)
        out.append(f'<line x1="{LEFT:.1f}" x2="{WIDTH - RIGHT:.1f}" y1="{py:.1f}" y2="{py:.1f}" stroke="{GRID}"/>')
        out.append(f'<text x="{LEFT - 6:.1f}" y="{py + 4:.1f}" text-anchor="end">{num(t)}</text>')
    mid = (y.r0 + y.r1) / 2
    out.append(
        f'<text class="axis-label" x="14" y="{mid:.1f}" text-anchor="middle" transform="rotate(-90 14 {mid:.1f})">{esc(label)}</text>'
    )
    return out


def _marker(x: float, bottom: float, text: str, row: int) -> list[str]:
    """A vertical line with its label beside it: on the right unless that would leave the plot."""
    dash = ' stroke-dasharray="5 3"' if row else ""
    anchor, dx = ("end", -4) if x > WIDTH - RIGHT - 7 * len(text) else ("start", 4)
    return [
        f'<line class="marker" x1="{x:.1f}" x2="{x:.1f}" y1="{TOP:.1f}" y2="{bottom:.1f}" stroke="{INK}" stroke-width="1.5"{dash}/>',
        f'<text class="marker-label" x="{x + dx:.1f}" y="{TOP + 10 + 14 * row:.1f}" text-anchor="{anchor}" fill="{INK}">{esc(text)}</text>',
    ]


def histogram(
    chart_id: str, values: Sequence[float], *, domain: tuple[float, float], log: bool, color: str, unit: str,
    markers: Sequence[tuple[float, str]], label: str, bins: int = 48, height: int = 200,
) -> str:  # fmt: skip
    """Sample counts per latency bin over a shared ``domain``; ``markers`` (value, text) as vertical lines."""
    bottom = height - BOTTOM
    x = Scale.fit(*domain, LEFT, WIDTH - RIGHT, log=log)
    edges = np.geomspace(x.lo, x.hi, bins + 1) if log else np.linspace(x.lo, x.hi, bins + 1)
    counts, _ = np.histogram(np.clip(values, x.lo, x.hi), edges)
    y = Scale.fit(0, float(counts.max()), bottom, TOP, zero=True)
    body = _y_axis(y, "samples")
    body += _x_axis(x, bottom, f"latency ({unit}{', log scale' if log else ''})")
    for n, a, b in zip(counts, edges[:-1], edges[1:], strict=True):
        if n:
            x0, x1, top = x(a), x(b), y(float(n))
            body.append(
                f'<rect class="bin" x="{x0 + 0.5:.1f}" y="{top:.1f}" width="{max(x1 - x0 - 1, 0.8):.1f}" '
                f'height="{bottom - top:.1f}" fill="{color}"><title>{num(a)}-{num(b)} {esc(unit)}: '
                f"{n} samples</title></rect>"
            )
    for i, (value, text) in enumerate(markers):
        body += _marker(x(value), bottom, f"{text} {num(value)} {unit}", i)
    return _svg(chart_id, "latency", height, label, body)


def timeline(
    chart_id: str, warmup: Sequence[float], timed: Sequence[float], *, color: str, unit: str, p50: float,
    label: str, start_note: str = "", end_note: str = "", alert: str = "", height: int = 220,
) -> str:  # fmt: skip
    """Latency per iteration in execution order: warm-up on a shaded band, then the timed run."""
    bottom, every = height - BOTTOM, [*warmup, *timed]
    log = use_log(every)
    x = Scale(0.5, len(every) + 0.5, LEFT, WIDTH - RIGHT)
    y = Scale.fit(min(every), max(every), bottom, TOP + 28, log=log, zero=not log)  # room for the notes
    body = []
    if warmup:
        edge = x(len(warmup) + 0.5)
        body.append(f'<rect class="warmup" x="{LEFT}" y="{TOP}" width="{edge - LEFT:.1f}" height="{bottom - TOP}" fill="{WARMUP_FILL}"/>')
        body.append(f'<text x="{LEFT + 4}" y="{TOP + 10}" fill="{MUTED}">warm-up ({len(warmup)})</text>')
    body += _y_axis(y, f"{unit}{' (log)' if log else ''}")
    body += _x_axis(x, bottom, "iteration")
    for part, first, stroke in ((warmup, 1, "#9ca3af"), (timed, len(warmup) + 1, color)):
        points = _thin([(first + i, v) for i, v in enumerate(part)])
        if points:
            path = " ".join(f"{'M' if i == 0 else 'L'}{x(px):.1f} {y(py):.1f}" for i, (px, py) in enumerate(points))
            body.append(f'<path class="series" d="{path}" fill="none" stroke="{stroke}" stroke-width="1.2" stroke-linejoin="round"/>')
            if len(points) <= 300:
                body += [f'<circle cx="{x(px):.1f}" cy="{y(py):.1f}" r="1.8" fill="{stroke}"/>' for px, py in points]
    py = y(p50)
    body.append(f'<line class="marker" x1="{LEFT}" x2="{WIDTH - RIGHT}" y1="{py:.1f}" y2="{py:.1f}" stroke="{INK}" stroke-dasharray="5 3"/>')
    body.append(f'<text class="marker-label" x="{WIDTH - RIGHT - 4}" y="{py - 4:.1f}" text-anchor="end" fill="{INK}">p50 {num(p50)} {esc(unit)}</text>')
    if start_note:
        body.append(f'<text class="state" x="{x(len(warmup) + 0.5) + 4:.1f}" y="{TOP + 24}" fill="{MUTED}">{esc(start_note)}</text>')
    if end_note:
        body.append(f'<text class="state" x="{WIDTH - RIGHT - 4}" y="{TOP + 24}" text-anchor="end" fill="{MUTED}">{esc(end_note)}</text>')
    if alert:
        body.append(f'<rect class="throttled" x="{LEFT}" y="{bottom - 4}" width="{WIDTH - RIGHT - LEFT}" height="4" fill="{ALERT}"/>')
        body.append(f'<text class="alert" x="{(LEFT + WIDTH - RIGHT) / 2:.0f}" y="{TOP + 10}" text-anchor="middle" fill="{ALERT}">{esc(alert)}</text>')
    return _svg(chart_id, "timeline", height, label, body)


def _thin(points: list[tuple[int, float]]) -> list[tuple[int, float]]:
    if len(points) <= MAX_POINTS:
        return points
    out: list[tuple[int, float]] = []
    size = math.ceil(len(points) / (MAX_POINTS // 2))
    for i in range(0, len(points), size):
        bucket = points[i : i + size]
        lo, hi = min(bucket, key=lambda p: p[1]), max(bucket, key=lambda p: p[1])
        out += sorted({lo, hi})
    return out


@dataclass(frozen=True)
class Bar:
    label: str
    sublabel: str
    value: float  # the bar (p50)
    whisker: float | None  # its whisker's end (p99)
    color: str
    note: str  # printed after the whisker
    tip: str


def bars(chart_id: str, rows: Sequence[Bar], *, unit: str, label: str, axis: str) -> str:
    """Horizontal bars with whiskers, one row per variant."""
    row_h, label_w = 40, 150
    height = TOP + row_h * len(rows) + BOTTOM
    right = max((r.whisker or r.value) for r in rows)
    x = Scale.fit(0, right * 1.35, LEFT + label_w, WIDTH - RIGHT, zero=True)  # room for the note
    bottom = height - BOTTOM
    body = _x_axis(x, bottom, axis)
    for i, r in enumerate(rows):
        top = TOP + i * row_h + 8
        mid = top + 12
        end = x(r.value)
        body.append(f'<text x="{LEFT + label_w - 10}" y="{mid - 1:.1f}" text-anchor="end" class="bar-label" fill="{INK}">{esc(r.label)}</text>')
        body.append(f'<text x="{LEFT + label_w - 10}" y="{mid + 12:.1f}" text-anchor="end" fill="{MUTED}">{esc(r.sublabel)}</text>')
        body.append(
            f'<rect class="bar" x="{x.r0:.1f}" y="{top:.1f}" width="{max(end - x.r0, 1):.1f}" height="24" rx="3" '
            f'fill="{r.color}"><title>{esc(r.tip)}</title></rect>'
        )
        tail = end
        if r.whisker is not None and r.whisker > r.value:
            tail = x(r.whisker)
            body.append(f'<line class="whisker" x1="{end:.1f}" x2="{tail:.1f}" y1="{mid:.1f}" y2="{mid:.1f}" stroke="{INK}"/>')
            body.append(f'<line x1="{tail:.1f}" x2="{tail:.1f}" y1="{mid - 6:.1f}" y2="{mid + 6:.1f}" stroke="{INK}"/>')
        body.append(f'<text x="{tail + 6:.1f}" y="{mid + 4:.1f}" fill="{INK}">{esc(r.note)}</text>')
    return _svg(chart_id, "compare", height, label, body)


@dataclass(frozen=True)
class LayerRow:
    name: str
    op: str
    time_share: float  # 0..1 of the inference
    ns: float
    error_share: float | None  # 0..1 of the summed quantization noise, None: not measured
    snr_db: float | None


def layers(chart_id: str, rows: Sequence[LayerRow], *, color: str, label: str) -> str:
    """Per-layer share of the time, and beside it the layer's share of the quantization error."""
    row_h, name_w = 22, 230
    with_error = any(r.error_share is not None for r in rows)
    t0 = LEFT + name_w - 40
    t1 = WIDTH - RIGHT - (220 if with_error else 60)
    height = TOP + 18 + row_h * len(rows) + 10
    body = [f'<text x="{t0}" y="{TOP + 6}" class="col-head" fill="{MUTED}">share of the time per inference</text>']
    if with_error:
        body.append(f'<text x="{t1 + 60}" y="{TOP + 6}" class="col-head" fill="{MUTED}">share of the int8 error</text>')
    top_share = max((r.time_share for r in rows), default=1.0) or 1.0
    top_err = max((r.error_share or 0.0 for r in rows), default=1.0) or 1.0
    for i, r in enumerate(rows):
        top = TOP + 18 + i * row_h
        mid = top + row_h / 2 + 4
        body.append(f'<text x="{t0 - 8}" y="{mid:.1f}" text-anchor="end" fill="{INK}">{esc(r.name)} <tspan fill="{MUTED}">{esc(r.op)}</tspan></text>')
        body += _layer_bar(
            "layer-bar", t0, (t1 - t0 - 50) * r.time_share / top_share, top + 4, row_h - 8, f'fill="{color}"',
            f"{esc(r.name)}: {num(r.ns / 1e3)} µs per inference, {r.time_share * 100:.1f}% of the time",
            mid, f"{r.time_share * 100:.1f}%",
        )  # fmt: skip
        if r.error_share is not None and r.snr_db is not None:
            e0 = t1 + 60
            body += _layer_bar(
                "error-bar", e0, (WIDTH - RIGHT - e0 - 90) * r.error_share / top_err, top + 4, row_h - 8,
                f'fill="{ALERT}" fill-opacity="0.75"',
                f"{esc(r.name)}: SNR {r.snr_db:.1f} dB at its output, {r.error_share * 100:.1f}% of the summed error",
                mid, f'{r.error_share * 100:.0f}% <tspan fill="{MUTED}">({r.snr_db:.1f} dB)</tspan>',
            )  # fmt: skip
    return _svg(chart_id, "layers", height, label, body)


def _layer_bar(cls: str, x0: float, w: float, y: float, h: int, fill: str, tip: str, mid: float, text: str) -> list[str]:
    """A bar of a layers chart with its tooltip, and its figure just past its end."""
    return [
        f'<rect class="{cls}" x="{x0}" y="{y:.1f}" width="{max(w, 1):.1f}" height="{h}" rx="2" {fill}><title>{tip}</title></rect>',
        f'<text x="{x0 + w + 5:.1f}" y="{mid:.1f}" fill="{INK}">{text}</text>',
    ]


@dataclass(frozen=True)
class Series:
    name: str
    color: str
    points: Sequence[tuple[float, float, str, bool]]  # (p50, p99, tip, is a run of this report)


def history(chart_id: str, series: Sequence[Series], *, unit: str, label: str, first: str, last: str, height: int = 230) -> str:
    """p50 per run, oldest to newest, the newest at the right edge; the p99 as a faint line above."""
    bottom = height - BOTTOM
    n = max(len(s.points) for s in series)
    values = [v for s in series for p in s.points for v in p[:2]]
    log = use_log(values)
    x = Scale(-0.5, n - 0.5, LEFT, WIDTH - RIGHT)
    y = Scale.fit(min(values), max(values), bottom, TOP + 16, log=log)
    body = _y_axis(y, f"latency ({unit}{', log' if log else ''})")
    body.append(f'<line x1="{LEFT}" x2="{WIDTH - RIGHT}" y1="{bottom}" y2="{bottom}" stroke="{AXIS}"/>')
    body.append(f'<text x="{LEFT}" y="{bottom + 15}" fill="{MUTED}">{esc(first)}</text>')
    body.append(f'<text x="{WIDTH - RIGHT}" y="{bottom + 15}" text-anchor="end" fill="{MUTED}">{esc(last)}</text>')
    body.append(f'<text class="axis-label" x="{(LEFT + WIDTH - RIGHT) / 2:.0f}" y="{bottom + 33}" text-anchor="middle">run, oldest to newest</text>')
    for k, s in enumerate(series):
        body.append(f'<rect x="{LEFT + 8 + k * 120}" y="{TOP - 6}" width="10" height="10" rx="2" fill="{s.color}"/>')
        body.append(f'<text x="{LEFT + 22 + k * 120}" y="{TOP + 3}" fill="{INK}">{esc(s.name)} p50</text>')
        start = n - len(s.points)
        for col, dash, width in ((0, "", 2), (1, ' stroke-dasharray="2 3"', 1)):
            path = " ".join(f"{'M' if i == 0 else 'L'}{x(start + i):.1f} {y(p[col]):.1f}" for i, p in enumerate(s.points))
            body.append(f'<path class="series" d="{path}" fill="none" stroke="{s.color}" stroke-width="{width}"{dash} stroke-opacity="{1 if col == 0 else 0.6}"/>')
        for i, (p50, _, tip, current) in enumerate(s.points):
            r, ring = (4.5, f' stroke="{INK}" stroke-width="1.5"') if current else (3, "")
            body.append(f'<circle class="run" cx="{x(start + i):.1f}" cy="{y(p50):.1f}" r="{r}" fill="{s.color}"{ring}><title>{esc(tip)}</title></circle>')
    return _svg(chart_id, "history", height, label, body)
