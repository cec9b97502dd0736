"""Small static SVG line charts, rendered on the scheduler (no JavaScript, no Bokeh)."""

from __future__ import annotations

import html
import math
from collections.abc import Sequence

#: Share of a linear axis's span left free beyond the outermost points, so that no point
#: (a lone one included) sits on the frame with half its dot cut off.
MARGIN = 0.05


def _nice_step(lo: float, hi: float, count: int = 5, integer: bool = False) -> float:
    """A round step (1, 2, 2.5 or 5 times a power of ten) giving about ``count`` ticks over [lo, hi]."""
    raw = (hi - lo) / max(1, count)
    if integer:
        raw = max(raw, 1.0)
    mag = 10 ** math.floor(math.log10(raw))
    return float(next(m * mag for m in (1, 2, 2.5, 5, 10) if m * mag >= raw))


def _nice_range(lo: float, hi: float, *, pinned_low: bool, integer: bool = False) -> tuple[float, float]:
    """[lo, hi] widened by :data:`MARGIN` of its span on each side (not below a ``pinned_low``
    bound, the axis's origin), then out to whole ticks, so the outermost ticks frame the points."""
    pad = MARGIN * (hi - lo)
    lo2, hi2 = (lo if pinned_low else lo - pad), hi + pad
    step = _nice_step(lo2, hi2, integer=integer)
    lo2 = lo if pinned_low else math.floor(lo2 / step) * step
    return lo2, math.ceil(hi2 / step) * step


def _nice_ticks(lo: float, hi: float, count: int = 5, integer: bool = False) -> list[float]:
    """Round tick values covering [lo, hi] (whole numbers only when ``integer``)."""
    if not (math.isfinite(lo) and math.isfinite(hi)):
        return []
    if hi <= lo:
        hi = lo + 1.0
    step = _nice_step(lo, hi, count, integer)
    start = math.floor(lo / step) * step
    ticks = []
    t = start
    while t <= hi + step * 1e-9:
        if t >= lo - step * 1e-9:
            ticks.append(round(t, 12))
        t += step
    return ticks


def _fmt(v: float) -> str:
    if v == 0:
        return "0"
    if abs(v) >= 1e5 or abs(v) < 1e-3:
        return f"{v:.0e}"
    if abs(v) >= 1000:
        return f"{v:,.0f}"
    return f"{v:g}"


def line_chart(
    points: Sequence[Sequence[float]],
    *,
    title: str,
    xlabel: str,
    ylabel: str,
    logy: bool = False,
    element_id: str | None = None,
    width: int = 460,
    height: int = 260,
    color: str = "#1f77b4",
    empty_text: str = "no data yet",
    from_zero: bool = False,
) -> str:
    """An SVG line chart of ``points`` ([x, y] pairs); ``logy`` plots log10(y).

    Non-finite values (and non-positive ones on a log axis) are skipped. ``from_zero`` starts
    both axes at 0 (for counts that grow from nothing, such as a dictionary's size against
    rows seen: with one point, an axis spanning that point alone showed no scale). Linear
    axes end at a round tick at least :data:`MARGIN` of their span beyond the outermost
    point (one point at the top of the range sat on the frame); log axes end at whole decades.
    """
    left, right, top, bottom = 62, 14, 28, 42
    pw, ph = width - left - right, height - top - bottom
    pts = [(float(x), float(y)) for x, y in points
           if math.isfinite(float(x)) and math.isfinite(float(y)) and (not logy or float(y) > 0)]
    ident = f' id="{html.escape(element_id)}"' if element_id else ""
    parts = [
        f'<svg{ident} class="daskkrr-chart" xmlns="http://www.w3.org/2000/svg" width="{width}" '
        f'height="{height}" viewBox="0 0 {width} {height}" role="img" aria-label="{html.escape(title)}">',
        f'<rect x="0" y="0" width="{width}" height="{height}" fill="white"/>',
        f'<text x="{width / 2:.0f}" y="18" text-anchor="middle" font-size="14" font-weight="bold">'
        f"{html.escape(title)}</text>",
        f'<rect x="{left}" y="{top}" width="{pw}" height="{ph}" fill="#fafafa" stroke="#999"/>',
        f'<text x="{left + pw / 2:.0f}" y="{height - 6}" text-anchor="middle" font-size="12">'
        f"{html.escape(xlabel)}</text>",
        f'<text x="14" y="{top + ph / 2:.0f}" text-anchor="middle" font-size="12" '
        f'transform="rotate(-90 14 {top + ph / 2:.0f})">{html.escape(ylabel)}</text>',
    ]
    if not pts:
        parts.append(f'<text x="{left + pw / 2:.0f}" y="{top + ph / 2:.0f}" text-anchor="middle" '
                     f'font-size="13" fill="#777">{html.escape(empty_text)}</text></svg>')
        return "".join(parts)

    xs = [p[0] for p in pts]
    ys = [math.log10(p[1]) if logy else p[1] for p in pts]
    x0, x1 = min(xs), max(xs)
    y0, y1 = min(ys), max(ys)
    if from_zero:
        x0, y0 = min(x0, 0.0), y0 if logy else min(y0, 0.0)
    if logy:
        y0, y1 = math.floor(y0), math.ceil(y1)
    if x1 == x0:
        x1 = x0 + 1
    if y1 == y0:
        y0, y1 = y0 - (1 if logy else abs(y0) * 0.1 + 1), y1 + (1 if logy else abs(y1) * 0.1 + 1)
    integer_x = all(float(x).is_integer() for x in xs)
    x0, x1 = _nice_range(x0, x1, pinned_low=from_zero and x0 == 0.0, integer=integer_x)
    if not logy:
        y0, y1 = _nice_range(y0, y1, pinned_low=from_zero and y0 == 0.0)

    def sx(x: float) -> float:
        return left + (x - x0) / (x1 - x0) * pw

    def sy(y: float) -> float:
        return top + ph - (y - y0) / (y1 - y0) * ph

    for t in _nice_ticks(x0, x1, integer=integer_x):
        parts.append(f'<line x1="{sx(t):.1f}" y1="{top + ph}" x2="{sx(t):.1f}" y2="{top + ph + 4}" stroke="#555"/>'
                     f'<text x="{sx(t):.1f}" y="{top + ph + 16}" text-anchor="middle" font-size="11">{_fmt(t)}</text>')
    yticks = [float(k) for k in range(int(y0), int(y1) + 1)] if logy else _nice_ticks(y0, y1)
    if logy and len(yticks) > 7:
        stride = math.ceil(len(yticks) / 6)
        yticks = yticks[::stride]
    for t in yticks:
        label = f"1e{int(t)}" if logy else _fmt(t)
        parts.append(f'<line x1="{left}" y1="{sy(t):.1f}" x2="{left + pw}" y2="{sy(t):.1f}" stroke="#e3e3e3"/>'
                     f'<text x="{left - 6}" y="{sy(t) + 4:.1f}" text-anchor="end" font-size="11">{label}</text>')
    path = " ".join(f"{sx(x):.1f},{sy(y):.1f}" for x, y in zip(xs, ys))
    parts.append(f'<polyline points="{path}" fill="none" stroke="{color}" stroke-width="2"/>')
    for x, y in zip(xs[-60:], ys[-60:]):
        parts.append(f'<circle cx="{sx(x):.1f}" cy="{sy(y):.1f}" r="2.5" fill="{color}"/>')
    parts.append("</svg>")
    return "".join(parts)


def progress_bar(fraction: float | None, *, element_id: str | None = None, width: int = 460) -> str:
    """A horizontal SVG bar filled to ``fraction`` (an empty outline when None)."""
    ident = f' id="{html.escape(element_id)}"' if element_id else ""
    frac = 0.0 if fraction is None else max(0.0, min(1.0, float(fraction)))
    label = "" if fraction is None else f"{frac * 100:.0f}%"
    return (
        f'<svg{ident} xmlns="http://www.w3.org/2000/svg" width="{width}" height="22" viewBox="0 0 {width} 22">'
        f'<rect x="0" y="2" width="{width}" height="18" fill="#eee" stroke="#999"/>'
        f'<rect x="0" y="2" width="{frac * width:.1f}" height="18" fill="#4a90d9"/>'
        f'<text x="{width / 2:.0f}" y="16" text-anchor="middle" font-size="12">{label}</text></svg>'
    )
