"""The report's plots as inline SVG (no script, no network): what autoopt.cli.browse.plots computed,
drawn with a small SVG writer. Every label from the database is escaped."""
from __future__ import annotations

import math
from html import escape
from typing import Any

from autoopt.cli.browse.plots import Convergence, Effect, Prediction
from autoopt.cli.browse.textplot import duration_label

PALETTE = ("#4e79a7", "#f28e2b", "#e15759", "#76b7b2", "#59a14f", "#edc948", "#b07aa1", "#ff9da7",
           "#9c755f", "#bab0ac", "#1f77b4", "#8c564b")
GOOD, WEAK, BAD, BEST, RUN = "#2e7d32", "#e69f00", "#c62828", "#1565c0", "#8e24aa"


class Svg:
    def __init__(self, width: int, height: int, label: str) -> None:
        self.width, self.height = width, height
        self.parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
                      f'viewBox="0 0 {width} {height}" role="img" aria-label="{escape(label)}" '
                      f'font-family="sans-serif" font-size="12">',
                      f'<rect width="{width}" height="{height}" fill="white"/>']

    def add(self, tag: str, title: str | None = None, **attrs: Any) -> None:
        text = " ".join(f'{k.rstrip("_").replace("_", "-")}="{escape(str(v))}"' for k, v in attrs.items())
        inner = f"<title>{escape(title)}</title>" if title else ""
        self.parts.append(f"<{tag} {text}>{inner}</{tag}>")

    def line(self, x1: float, y1: float, x2: float, y2: float, stroke: str = "#999", **kw: Any) -> None:
        self.add("line", x1=f"{x1:.1f}", y1=f"{y1:.1f}", x2=f"{x2:.1f}", y2=f"{y2:.1f}", stroke=stroke, **kw)

    def text(self, x: float, y: float, s: str, anchor: str = "start", **kw: Any) -> None:
        attrs = " ".join(f'{k.replace("_", "-")}="{escape(str(v))}"' for k, v in kw.items())
        self.parts.append(f'<text x="{x:.1f}" y="{y:.1f}" text-anchor="{anchor}" {attrs}>{escape(s)}</text>')

    def render(self) -> str:
        return "\n".join(self.parts + ["</svg>"])


class Axis:
    """value -> pixel between p0 and p1, linear or log (log needs positive values)."""

    def __init__(self, lo: float, hi: float, p0: float, p1: float, log: bool = False) -> None:
        self.log = log
        f = math.log if log else float
        self.lo, self.hi = f(lo), f(hi)
        if self.hi - self.lo < 1e-12:
            self.lo, self.hi = self.lo - 0.5, self.hi + 0.5
        self.p0, self.p1 = p0, p1

    def __call__(self, v: float) -> float:
        v = math.log(max(v, 1e-12)) if self.log else v
        return self.p0 + (v - self.lo) / (self.hi - self.lo) * (self.p1 - self.p0)

    def ticks(self, n: int = 5) -> list[float]:
        """n evenly spaced values; on a log axis the 1-2-5 values inside it when there are 3 or more."""
        if self.log:
            lo, hi = math.exp(self.lo), math.exp(self.hi)
            nice = [k * 10.0 ** e for e in range(math.floor(math.log10(lo)), math.ceil(math.log10(hi)) + 1)
                    for k in (1, 2, 5) if lo <= k * 10.0 ** e <= hi]
            if len(nice) >= 3:
                return nice
        vals = [self.lo + (self.hi - self.lo) * i / (n - 1) for i in range(n)]
        return [math.exp(v) for v in vals] if self.log else vals


def _log_range(values: list[float], pad: float = 1.15) -> tuple[float, float]:
    vals = [v for v in values if v > 0] + [1.0]
    return min(vals) / pad, max(vals) * pad


def convergence(conv: Convergence, width: int = 900, height: int = 400) -> str:
    svg = Svg(width, height, "convergence: speed-up of each trial and the best so far against wall time")
    left, right, top, bottom = 60, 20, 30, 70
    x_max = conv.x_max_s or 1.0
    xa = Axis(0, x_max * 1.02, left, width - right)
    ya = Axis(*_log_range([p.lo for p in conv.points] + [p.hi for p in conv.points]), height - bottom, top, log=True)
    _frame(svg, xa, ya, conv.y_label, "wall time since the study's first trial", duration_label, "x{:g}")
    svg.line(left, ya(1.0), width - right, ya(1.0), "#555", stroke_dasharray="2 3")
    for x, run_id in conv.run_starts:
        svg.line(xa(x), top, xa(x), height - bottom, RUN, stroke_dasharray="5 4")
        svg.text(xa(x) + 4, top + 12, f"run {run_id} joined", fill=RUN)
    for x, number in conv.restarts:
        svg.add("path", title=f"trial {number}: the worker restarted", d=f"M{xa(x):.1f} {top} l-5 -9 h10 z", fill=RUN)
    if conv.best_steps:
        pts, last_y = [], None
        for x, y, _n in conv.best_steps:
            if last_y is not None:
                pts.append(f"{xa(x):.1f},{ya(last_y):.1f}")
            pts.append(f"{xa(x):.1f},{ya(y):.1f}")
            last_y = y
        pts.append(f"{xa(x_max):.1f},{ya(last_y):.1f}")
        svg.add("polyline", points=" ".join(pts), fill="none", stroke=BEST, stroke_width=2, class_="best-so-far")
    for p in conv.points:
        color = GOOD if p.significant else WEAK
        svg.line(xa(p.x_s), ya(p.lo), xa(p.x_s), ya(p.hi), color)
        svg.add("circle", title=f"trial {p.number}: x{p.y:.3f} [{p.lo:.3f}, {p.hi:.3f}]", cx=f"{xa(p.x_s):.1f}",
                cy=f"{ya(p.y):.1f}", r=3.5, fill=color if p.significant else "white", stroke=color, class_="trial")
    for number, x in conv.failed_x_s:
        cx, cy = xa(x), height - bottom - 6
        svg.add("path", title=f"trial {number}: no figure (failed)", d=f"M{cx - 4:.1f} {cy - 4:.1f} l8 8 m0 -8 l-8 8",
                stroke=BAD, stroke_width=2)
    _legend(svg, left, height - 10, [("outside the noise", GOOD), ("within the noise", WEAK),
                                                     ("best so far", BEST), ("failed", BAD), ("a run joined", RUN)])
    return svg.render()


def _frame(svg: Svg, xa: Axis, ya: Axis, y_label: str, x_label: str, x_fmt: Any, y_fmt: str) -> None:
    x0, x1, y0, y1 = xa.p0, xa.p1, ya.p0, ya.p1
    svg.line(x0, y0, x1, y0, "#333")
    svg.line(x0, y0, x0, y1, "#333")
    for v in xa.ticks():
        svg.line(xa(v), y0, xa(v), y0 + 4, "#333")
        svg.text(xa(v), y0 + 16, x_fmt(v), "middle")
    for v in ya.ticks():
        svg.line(x0 - 4, ya(v), x0, ya(v), "#333")
        svg.line(x0, ya(v), x1, ya(v), "#eee")
        svg.text(x0 - 6, ya(v) + 4, y_fmt.format(v), "end")
    svg.text(x0, y1 - 12, y_label, font_weight="bold")
    svg.text((x0 + x1) / 2, y0 + 32, x_label, "middle", fill="#555")


def _legend(svg: Svg, x: float, y: float, items: list[tuple[str, str]]) -> None:
    for label, color in items:
        svg.add("rect", x=f"{x:.1f}", y=f"{y - 9:.1f}", width=10, height=10, fill=color)
        svg.text(x + 14, y, label)
        x += 20 + 7 * len(label)


def effects(groups: list[list[Effect]], width: int = 900) -> str:
    rows = [e for g in groups for e in g]
    row_h, top, left, right = 18, 40, 300, 30
    height = top + row_h * (len(rows) + len(groups)) + 40
    svg = Svg(width, height, "per-knob effects: median speed-up of the trials with each value, 95% CI")
    xa = Axis(*_log_range([e.lo for e in rows] + [e.hi for e in rows]), left, width - right, log=True)
    svg.text(10, 18, "median speed-up over the baseline of the successful trials with each knob value "
                     "(95% CI; hollow: n < 6, the range)", font_weight="bold")
    for v in xa.ticks(6):
        svg.line(xa(v), top - 8, xa(v), height - 30, "#eee")
        svg.text(xa(v), height - 14, f"x{v:g}", "middle")
    svg.line(xa(1.0), top - 8, xa(1.0), height - 30, "#555", stroke_dasharray="2 3")
    y = top
    for g in groups:
        for e in g:
            color = WEAK if e.full_range else BEST
            svg.text(left - 8, y + 4, f"{e.knob}={e.value}  (n={e.n})", "end")
            svg.line(xa(e.lo), y, xa(e.hi), y, color, stroke_width=2)
            svg.add("circle", title=f"{e.knob}={e.value}: x{e.median:.3f} [{e.lo:.3f}, {e.hi:.3f}], n={e.n}",
                    cx=f"{xa(e.median):.1f}", cy=f"{y:.1f}", r=4, fill="white" if e.full_range else color,
                    stroke=color, class_="effect")
            y += row_h
        y += row_h
    return svg.render()


def buckets(names: list[str], rows: list[tuple[int, dict[str, float]]], width: int = 900) -> str:
    row_h, top, left, right = 16, 40, 70, 30
    height = top + row_h * len(rows) + 60
    svg = Svg(width, height, "profile buckets per trial, ms per decode step")
    svg.text(10, 18, "where each profiled trial's decode step went (ms per step, by bucket)", font_weight="bold")
    xa = Axis(0, max((sum(b.values()) for _, b in rows), default=1.0) * 1.1, left, width - right)
    color = {n: PALETTE[i % len(PALETTE)] for i, n in enumerate(names)}
    y = top
    for number, b in rows:
        svg.text(left - 6, y + row_h - 5, f"#{number}", "end")
        x = 0.0
        for name in names:
            ms = b.get(name, 0.0)
            if ms > 0:
                svg.add("rect", title=f"trial {number} {name}: {ms:.3f} ms", x=f"{xa(x):.1f}", y=f"{y + 1:.1f}",
                        width=f"{xa(x + ms) - xa(x):.2f}", height=row_h - 2, fill=color[name], class_="bucket")
            x += ms
        svg.text(xa(x) + 4, y + row_h - 5, f"{x:.2f} ms", fill="#555")
        y += row_h
    for v in xa.ticks(6):
        svg.text(xa(v), y + 16, f"{v:.1f}", "middle")
    _legend(svg, left, y + 40, [(n, color[n]) for n in names])
    return svg.render()


def predictions(preds: list[Prediction], width: int = 900, height: int = 420) -> str:
    svg = Svg(width, height, "predicted gain against measured gain over the incumbent")
    left, right, top, bottom = 70, 20, 30, 60
    xs = [p.predicted * 100 for p in preds] + [(p.predicted + (p.predicted_sd or 0)) * 100 for p in preds]
    ys = [p.measured * 100 for p in preds]
    lo, hi = min(xs + ys + [0.0]), max(xs + ys + [0.0])
    xa, ya = Axis(lo, hi, left, width - right), Axis(lo, hi, height - bottom, top)
    _frame(svg, xa, ya, "measured gain over the incumbent (%)", "predicted gain (%), bar: ± 1 sd",
           lambda v: f"{v:+.0f}", "{:+.0f}")
    svg.line(xa(lo), ya(lo), xa(hi), ya(hi), "#555", stroke_dasharray="4 3")
    for p in preds:
        x, y = xa(p.predicted * 100), ya(p.measured * 100)
        if p.predicted_sd:
            svg.line(xa((p.predicted - p.predicted_sd) * 100), y, xa((p.predicted + p.predicted_sd) * 100), y, "#bbb")
        svg.add("circle", title=f"trial {p.number} ({p.source}): predicted {p.predicted:+.1%}, measured {p.measured:+.1%}",
                cx=f"{x:.1f}", cy=f"{y:.1f}", r=3.5, fill=GOOD if p.measured >= 0 else BAD, class_="prediction")
    svg.text(width - right - 4, top + 12, "dashed: measured = predicted", "end", fill="#555")
    return svg.render()
