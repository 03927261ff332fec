"""The report's plots as PNG files (for pasting into a ticket), drawn by matplotlib from the same
series as the SVGs (autoopt.cli.browse.plots). Imported only by `autoopt report`."""
from __future__ import annotations

from pathlib import Path
from typing import Any

from autoopt.cli.browse.plots import Convergence, Effect, Prediction
from autoopt.cli.report.svg import BAD, BEST, GOOD, PALETTE, RUN, WEAK

DPI = 110


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")  # no display: files only
    import matplotlib.pyplot as plt

    return plt


def _save(fig: Any, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=DPI)
    _pyplot().close(fig)
    return path


def convergence(conv: Convergence, path: Path) -> Path:
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(9, 3.8))
    ax.set_yscale("log")
    ax.axhline(1.0, color="#555", linestyle=":", linewidth=1)
    for sig, color, face, label in ((True, GOOD, GOOD, "outside the noise"), (False, WEAK, "white", "within the noise")):
        pts = [p for p in conv.points if p.significant is sig]
        if pts:
            ax.errorbar([p.x_s / 60 for p in pts], [p.y for p in pts],
                        yerr=[[p.y - p.lo for p in pts], [p.hi - p.y for p in pts]], fmt="o", color=color,
                        markerfacecolor=face, markersize=4, linewidth=1, label=label)
    if conv.best_steps:
        xs = [x / 60 for x, _, _ in conv.best_steps] + [conv.x_max_s / 60]
        ys = [y for _, y, _ in conv.best_steps] + [conv.best_steps[-1][1]]
        ax.step(xs, ys, where="post", color=BEST, linewidth=2, label="best so far")
    if conv.failed_x_s:
        lo = min([p.lo for p in conv.points] + [1.0])
        ax.plot([x / 60 for _, x in conv.failed_x_s], [lo] * len(conv.failed_x_s), "x", color=BAD, label="failed")
    for i, (x, run_id) in enumerate(conv.run_starts):
        ax.axvline(x / 60, color=RUN, linestyle="--", linewidth=1, label="a run joined" if i == 0 else None)
    for i, (x, _n) in enumerate(conv.restarts):
        ax.axvline(x / 60, color=RUN, linestyle=":", linewidth=1, label="worker restart" if i == 0 else None)
    ax.set_xlabel("wall time since the study's first trial (min)")
    ax.set_ylabel(conv.y_label)
    ax.legend(fontsize=8, loc="best")
    return _save(fig, path)


def effects(groups: list[list[Effect]], path: Path) -> Path:
    plt = _pyplot()
    rows = [e for g in groups for e in g]
    fig, ax = plt.subplots(figsize=(9, max(2.5, 0.22 * len(rows) + 1)))
    ax.set_xscale("log")
    ys = list(range(len(rows)))[::-1]
    for y, e in zip(ys, rows):
        color = WEAK if e.full_range else BEST
        ax.plot([e.lo, e.hi], [y, y], color=color, linewidth=2)
        ax.plot([e.median], [y], "o", color=color, markerfacecolor="white" if e.full_range else color)
    ax.axvline(1.0, color="#555", linestyle=":", linewidth=1)
    ax.set_yticks(ys, [f"{e.knob}={e.value} (n={e.n})" for e in rows], fontsize=7)
    ax.set_xlabel("median speed-up over the baseline, 95% CI (hollow: n < 6, the range)")
    return _save(fig, path)


def buckets(names: list[str], rows: list[tuple[int, dict[str, float]]], path: Path) -> Path:
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(9, max(2.5, 0.25 * len(rows) + 1.5)))
    ys = list(range(len(rows)))[::-1]
    left = [0.0] * len(rows)
    for i, name in enumerate(names):
        widths = [b.get(name, 0.0) for _, b in rows]
        ax.barh(ys, widths, left=left, color=PALETTE[i % len(PALETTE)], label=name, height=0.8)
        left = [a + w for a, w in zip(left, widths)]
    ax.set_yticks(ys, [f"#{n}" for n, _ in rows], fontsize=7)
    ax.set_xlabel("ms per decode step")
    ax.legend(fontsize=7, ncol=5, loc="lower right")
    return _save(fig, path)


def predictions(preds: list[Prediction], path: Path) -> Path:
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6, 5))
    xs = [p.predicted * 100 for p in preds]
    ys = [p.measured * 100 for p in preds]
    err = [(p.predicted_sd or 0) * 100 for p in preds]
    ax.errorbar(xs, ys, xerr=err, fmt="none", ecolor="#bbb", linewidth=1)
    ax.scatter(xs, ys, c=[GOOD if y >= 0 else BAD for y in ys], s=14, zorder=3)
    lo, hi = min(xs + ys + [0.0]), max(xs + ys + [0.0])
    ax.plot([lo, hi], [lo, hi], color="#555", linestyle="--", linewidth=1, label="measured = predicted")
    ax.set_xlabel("predicted gain over the incumbent (%), bar: ± 1 sd")
    ax.set_ylabel("measured gain over the incumbent (%)")
    ax.legend(fontsize=8)
    return _save(fig, path)
