"""The plots of plots.py drawn with characters into rich Text: a terminal of any size, no mouse, no
graphics protocol (works over SSH). Speed-ups use a log axis: x2 and x0.5 are the same distance
from the baseline.
"""
from __future__ import annotations

import math
from typing import Any

from rich.text import Text

from autoopt.cli.browse.plots import Convergence, Effect

STYLE = {"point": "bold green", "weak": "yellow", "failed": "red", "best": "bold cyan", "run": "magenta",
         "restart": "bold magenta", "axis": "dim", "base": "dim"}


class Canvas:
    """A grid of (character, style) cells; row 0 is the top."""

    def __init__(self, width: int, height: int) -> None:
        self.width, self.height = max(width, 4), max(height, 3)
        self.cells = [[(" ", "")] * self.width for _ in range(self.height)]

    def put(self, col: int, row: int, ch: str, style: str = "", over: bool = True) -> None:
        if 0 <= col < self.width and 0 <= row < self.height:
            if over or self.cells[row][col][0] == " ":
                self.cells[row][col] = (ch, style)

    def text(self, row: int) -> Text:
        out = Text()
        for ch, style in self.cells[row]:
            out.append(ch, style)
        return out


class LogScale:
    """Map positive values onto 0..span-1 on a log axis (1.0 always inside the range)."""

    def __init__(self, values: list[float], span: int) -> None:
        vals = [v for v in values if v > 0] + [1.0]
        self.lo, self.hi = math.log(min(vals)), math.log(max(vals))
        if self.hi - self.lo < 1e-9:
            self.lo, self.hi = self.lo - 0.1, self.hi + 0.1
        self.span = span

    def __call__(self, v: float) -> int:
        v = max(v, 1e-12)
        return round((math.log(v) - self.lo) / (self.hi - self.lo) * (self.span - 1))

    def ticks(self, n: int = 4) -> list[float]:
        return [math.exp(self.lo + (self.hi - self.lo) * i / (n - 1)) for i in range(n)]


def duration_label(s: float) -> str:
    return f"{s:.0f}s" if s < 120 else f"{s / 60:.0f}m" if s < 7200 else f"{s / 3600:.1f}h"


def _draw_best(canvas: Canvas, conv: Convergence, xcol: Any, yrow: Any) -> None:
    steps = conv.best_steps
    for i, (x, y, _n) in enumerate(steps):
        c0, r = xcol(x), yrow(y)
        c1 = xcol(steps[i + 1][0]) if i + 1 < len(steps) else canvas.width
        for c in range(c0, c1):
            canvas.put(c, r, "─", STYLE["best"], over=False)
        if i + 1 < len(steps):
            r1 = yrow(steps[i + 1][1])
            for rr in range(min(r, r1) + 1, max(r, r1)):
                canvas.put(c1, rr, "│", STYLE["best"], over=False)


def convergence_lines(conv: Convergence, width: int, height: int) -> list[Text]:
    """The convergence plot as at most `height` lines of at most `width` cells (axes and legend
    included)."""
    keys = legend(conv, width)
    gutter, plot_w, plot_h = 8, max(width - 8, 10), max(height - 2 - len(keys), 4)
    canvas = Canvas(plot_w, plot_h)
    ys = [p.y for p in conv.points] + [y for _, y, _ in conv.best_steps]
    scale = LogScale(ys, plot_h)
    x_max = conv.x_max_s or 1.0

    def xcol(x: float) -> int:
        return round(x / x_max * (plot_w - 1))

    def yrow(y: float) -> int:
        return plot_h - 1 - scale(y)

    for c in range(plot_w):
        canvas.put(c, yrow(1.0), "┈", STYLE["base"])
    for x, _run_id in conv.run_starts:
        for r in range(plot_h):
            canvas.put(xcol(x), r, "┊", STYLE["run"])
    _draw_best(canvas, conv, xcol, yrow)
    for p in conv.points:
        canvas.put(xcol(p.x_s), yrow(p.y), "●" if p.significant else "○",
                   STYLE["point"] if p.significant else STYLE["weak"])
    for _n, x in conv.failed_x_s:
        canvas.put(xcol(x), plot_h - 1, "✗", STYLE["failed"])
    for x, _n in conv.restarts:
        canvas.put(xcol(x), 0, "↻", STYLE["restart"])
    ticks = {yrow(v): v for v in scale.ticks(min(4, plot_h))}
    lines = [Text(conv.y_label, style="bold")]
    for r in range(plot_h):
        label = f"x{ticks[r]:.2f}" if r in ticks else ""
        lines.append(Text(f"{label:>{gutter - 1}} ", style=STYLE["axis"]) + canvas.text(r))
    mid = duration_label(x_max / 2)
    axis = f"{'0':<{plot_w // 2}}{mid:<{plot_w - plot_w // 2 - 6}}{duration_label(x_max):>6}"
    lines.append(Text(" " * gutter + axis, style=STYLE["axis"]))
    return lines + keys


def legend(conv: Convergence, width: int) -> list[Text]:
    """The key to the symbols, wrapped to `width`, then where each later run joined."""
    lines, current = [], Text("")
    for ch, style, what in (("●", "point", "outside the noise"), ("○", "weak", "within the noise"),
                            ("─", "best", "best so far"), ("✗", "failed", "failed"),
                            ("┊", "run", "a run joined"), ("↻", "restart", "worker restart")):
        item = Text(ch, style=STYLE[style]) + Text(f" {what}  ")
        if current.cell_len + item.cell_len > width:
            lines.append(current)
            current = Text("")
        current += item
    lines.append(current)
    if conv.run_starts:
        runs = ", ".join(f"run {rid} joined at {duration_label(x)}" for x, rid in conv.run_starts)
        lines.append(Text(runs[:width], style=STYLE["axis"]))
    return lines


def effect_lines(groups: list[list[Effect]], width: int) -> list[Text]:
    """A forest plot: one line per knob value, its CI as a bar on a shared log axis, 1.0 marked."""
    rows = [e for g in groups for e in g]
    if not rows:
        return [Text("no knob took two values among successful trials: nothing to compare")]
    name_w = min(max(len(f"{e.knob}={e.value}") for e in rows), max(width // 3, 12))
    text_w = 30
    bar_w = max(width - name_w - text_w - 3, 10)
    scale = LogScale([e.lo for e in rows] + [e.hi for e in rows], bar_w)
    one = scale(1.0)
    lines = [Text(f"{'knob=value':<{name_w}}  {'n':>3} {'median speed-up [95% CI]':<{text_w - 4}} ",
                  style="bold") + Text(f"x{math.exp(scale.lo):.2f}".ljust(bar_w - 6) + f"x{math.exp(scale.hi):.2f}",
                                       style=STYLE["axis"])]
    for g in groups:
        for e in g:
            label = f"{e.knob}={e.value}"
            label = label if len(label) <= name_w else label[:name_w - 1] + "…"
            ci = f"x{e.median:.3f} [{e.lo:.3f}, {e.hi:.3f}]" + ("ʳ" if e.full_range else "")
            bar = Canvas(bar_w, 1)
            bar.put(one, 0, "┆", STYLE["base"])
            for c in range(scale(e.lo), scale(e.hi) + 1):
                bar.put(c, 0, "─", STYLE["weak"] if e.full_range else STYLE["best"])
            bar.put(scale(e.median), 0, "●", STYLE["point"])
            lines.append(Text(f"{label:<{name_w}}  {e.n:>3} {ci:<{text_w - 4}} ") + bar.text(0))
        lines.append(Text(""))
    lines.append(Text("ʳ n < 6: the interval is the sample's range (less than 95 %). Marginal, not "
                      "controlled: trials with a value differ in other knobs too.", style=STYLE["axis"]))
    return lines
