"""What `autoopt run` shows while it works: a rich Live panel on a terminal, plain log lines otherwise.

The panel: progress against the budget (and the reserve kept to confirm the best), the current trial
and its phase (restart / build / compile / warm-up / measure when the target reports phases through
a callback, else what the transition implies followed by "measuring"), the best so far with its CI
and speed-up over the baseline (the rule of `autoopt best`: outside the noise, else the baseline),
the last decision's reason, the last diagnosis, the latest trials, and at the end why it stopped. Without a TTY
(CI, pipes, `--json`) the same events are written as one line each to stderr, so stdout stays clean.

Every figure is shown in the objective's own unit (analysis.ObjectiveUnit, as the target recorded it in
each measurement's environment): tok/s, or a replayed table's column such as a Kernel Tuner time in
ms, lower is better (the loop keeps its reciprocal; speed-ups read the same either way). The space
alone does not know a replay table's unit, so the view learns it from the first measurement.
"""
from __future__ import annotations

import sys
import time
from typing import Any

from rich.console import Console, Group
from rich.live import Live
from rich.progress_bar import ProgressBar
from rich.table import Table
from rich.text import Text

from autoopt import stats
from autoopt.search.observer import NullObserver
from autoopt.store.analysis import TOK_PER_S, ObjectiveUnit, objective_unit
from autoopt.units import format_duration

_APPLY_TEXT = {"none": "", "recompile": "recompile, ", "rebuild": "rebuild, ", "restart": "restart (new worker), "}


def speedup_text(t: Any, base: Any) -> str:
    """'×1.23 [1.18, 1.29]' against the baseline (conservative interval: extreme ratios of the CIs)."""
    if t is None or base is None or not t.objective or not base.objective:
        return ""
    s = t.objective / base.objective
    if t.objective_ci and base.objective_ci:
        ratio = stats.speedup(stats.Interval(t.objective, *t.objective_ci),
                              stats.Interval(base.objective, *base.objective_ci))
        if ratio is not None:
            return f"×{ratio.median:.3f} [{ratio.ci_low:.3f}, {ratio.ci_high:.3f}]"
    return f"×{s:.3f}"


def objective_text(t: Any, unit: ObjectiveUnit = TOK_PER_S) -> str:
    """'612.3 tok/s ±1.2% [605.0, 619.6]', or in a replayed table's unit '3.585 ms ±0.5% [3.57, 3.6]'."""
    if t is None or t.objective is None:
        return "-"
    lo, hi = t.objective_ci or (t.objective, t.objective)
    iv = unit.value({"median": t.objective, "ci_low": lo, "ci_high": hi})
    num = (lambda x: f"{x:,.1f}") if unit.quantity == "tok_per_s" else (lambda x: f"{x:.4g}")  # noqa: E731
    name = unit.unit or f"({unit.quantity}, unit not recorded)"
    if not t.objective_ci:
        return f"{num(iv['median'])} {name}"
    rel = (iv["ci_high"] - iv["ci_low"]) / (2 * iv["median"]) * 100 if iv["median"] else 0.0
    return f"{num(iv['median'])} {name} ±{rel:.1f}% [{num(iv['ci_low'])}, {num(iv['ci_high'])}]"


def run_unit(trials: Any) -> ObjectiveUnit:
    """The objective of a run's trials (any that carry a measurement: baseline, best, history)."""
    return objective_unit([t for t in trials if t is not None and getattr(t, "measurement", None) is not None])


def best_text(best: Any, baseline: Any, unit: ObjectiveUnit = TOK_PER_S) -> str:
    """'#12 ×1.23 [1.18, 1.29]', or the baseline's own line when nothing beats it outside the noise."""
    if best is None:
        return "-"
    if baseline is not None and best is baseline:
        return f"#{best.number} (the baseline: no trial beats it outside the noise)"
    return f"#{best.number} {speedup_text(best, baseline) or objective_text(best, unit)}"


def status_text(t: Any) -> str:
    m = t.measurement
    if m.status == "ok":
        return "ok"
    if m.failure is not None:
        return f"{m.status}: {m.failure.kind}: {m.failure.reason.splitlines()[0][:80] if m.failure.reason else ''}"
    return m.status


class LiveView(NullObserver):
    """Rich Live when `live` (a terminal), else one plain line per event on `stream` (stderr)."""

    def __init__(self, live: bool | None = None, stream: Any = None, max_rows: int = 8) -> None:
        self.stream = stream or sys.stderr
        self.live_mode = self.stream.isatty() if live is None else live
        self.console = Console(file=self.stream, highlight=False, soft_wrap=not self.live_mode)
        self.max_rows = max_rows
        self._live: Live | None = None
        self._space = self._budget = self._best = self._baseline = None
        self._study, self._n_history = "", 0
        self._current: tuple[int, Any, str] | None = None
        self._phase = ""
        self._phase_t0 = 0.0
        self._last_reason = ""
        self._last_diagnosis = ""
        self._stop_reason = ""
        self._rows: list[Any] = []
        self._notes: list[str] = []
        self._unit: ObjectiveUnit | None = None  # None: a replay table's, not measured yet

    # ---- events --------------------------------------------------------------------------------
    def run_started(self, space: Any, budget: Any, n_history: int, study: str) -> None:
        self._space, self._budget, self._study, self._n_history = space, budget, study, n_history
        if getattr(space.info, "name", "") != "replay":  # the built-in and server targets measure tok/s
            self._unit = TOK_PER_S
        if self.live_mode:
            self._live = Live(console=self.console, get_renderable=self._render, refresh_per_second=4,
                              transient=False, redirect_stdout=False, redirect_stderr=False)
            self._live.start()
        else:
            self._line(self._head_text())

    def trial_started(self, number: int, decision: Any, restart_class: str) -> None:
        self._current = (number, decision, restart_class)
        self._last_reason = f"{decision.source}: {decision.reason}"
        self.phase(f"{_APPLY_TEXT.get(restart_class, '')}measuring")
        if not self.live_mode:
            cost = f", expected {format_duration(decision.expected_cost_s)}" if decision.expected_cost_s else ""
            self._line(f"trial #{number} start [{decision.source}{cost}]: {decision.reason}")

    def phase(self, name: str) -> None:
        self._phase, self._phase_t0 = name, time.monotonic()

    def trial_finished(self, outcome: Any, best: Any, baseline: Any, budget: Any) -> None:
        self._best, self._baseline, self._current = best, baseline, None
        self._rows.append(outcome)
        self._learn_unit(outcome, best, baseline)
        unit = self.unit
        diagnosis = getattr(outcome, "diagnosis", None)
        if diagnosis:
            self._last_diagnosis = f"#{outcome.number}: {diagnosis}"
        if not self.live_mode:
            speed = speedup_text(outcome, baseline)
            best_txt = f"; best {best_text(best, baseline, unit)}" if best else ""
            self._line(f"trial #{outcome.number} {status_text(outcome)}: {objective_text(outcome, unit)}"
                       f"{' ' + speed if speed else ''} ({format_duration(outcome.cost_s)}){best_txt}")
            if diagnosis:
                self._line(f"trial #{outcome.number} diagnosis: {diagnosis}")

    @property
    def unit(self) -> ObjectiveUnit:
        """The objective's unit as far as the run has measured it (tok/s until a replay table's is known)."""
        return self._unit or TOK_PER_S

    def _learn_unit(self, *trials: Any) -> None:
        """A replay space's unit, from the first measurement that records it (the target's environment;
        a failure the loop made up itself records none, hence the default until one does)."""
        if self._unit is not None:
            return
        found = run_unit(trials)
        if found is not TOK_PER_S:  # the default is returned as this very object when nothing recorded one
            self._unit = found
            if not self.live_mode:
                self._line(f"objective: {found.describe()} (as the replay table records it)")

    def _head_text(self) -> str:
        space, n = self._space, self._n_history
        return (f"study {self._study}: space {space.name} ({len(space.params)} params, {space.size()} points), "
                f"{self._objective_head()}, budget {format_duration(self._budget.total_s)}"
                + (f", continuing after {n} recorded trials" if n else ""))

    def _objective_head(self) -> str:
        if self._unit is None:
            return "objective: the replay table's column (its unit and direction with the first measurement)"
        if self._unit is TOK_PER_S and self._space is not None:
            return f"objective {self._space.objective.describe()} (higher is better)"
        return f"objective {self._unit.describe().replace(', ', ' (', 1)})"

    def note(self, text: str) -> None:
        self._notes.append(text)
        if not self.live_mode:
            self._line(text)

    def run_finished(self, result: Any) -> None:
        self._best, self._baseline = result.best, result.baseline
        self._stop_reason = result.stop_reason
        if self._live is not None:
            self._live.refresh()
            self._live.stop()
            self._live = None
        else:
            self._line(f"stop: {result.stop_reason}")

    def close(self) -> None:
        if self._live is not None:
            self._live.stop()
            self._live = None

    # ---- rendering -----------------------------------------------------------------------------
    def _line(self, text: str) -> None:
        el = self._budget.elapsed_s if self._budget is not None else 0.0
        m, s = divmod(int(el), 60)
        h, m = divmod(m, 60)
        stamp = f"{h}:{m:02d}:{s:02d}" if h else f"{m:3d}:{s:02d}"
        print(f"[{stamp}] {text}", file=self.stream, flush=True)

    def _render(self) -> Group:
        b = self._budget
        parts: list[Any] = []
        if self._space is not None:  # its objective as far as the run knows it now
            parts.append(Text(self._head_text(), style="bold"))
        if b is not None:
            bar = Table.grid(padding=(0, 1))
            bar.add_row(Text("budget", style="bold"), ProgressBar(total=b.total_s, completed=b.elapsed_s, width=40),
                        Text(f"{format_duration(b.elapsed_s)} / {format_duration(b.total_s)}"
                             f" (reserve {format_duration(b.reserve_s)} to confirm the best)"))
            parts.append(bar)
        if self._current is not None:
            number, decision, _ = self._current
            parts.append(Text(f"trial  #{number} [{decision.source}] {self._phase} "
                              f"{format_duration(time.monotonic() - self._phase_t0)}"))
        if self._best is not None:
            parts.append(Text(f"best   {best_text(self._best, self._baseline, self.unit)} "
                              f"{objective_text(self._best, self.unit)}",
                              style="green"))
        if self._last_reason:
            parts.append(Text(f"why    {self._last_reason}", overflow="fold"))  # wrapped, never cut
        if self._last_diagnosis:
            parts.append(Text(f"diag   {self._last_diagnosis}", overflow="fold"))
        if self._rows:
            t = Table(box=None, pad_edge=False, show_edge=False)
            for col in ("#", "source", "objective", "vs baseline", "cost", "status"):
                t.add_column(col)
            for o in self._rows[-self.max_rows:]:
                cells = (str(o.number), o.decision.source if o.decision else "", objective_text(o, self.unit),
                         speedup_text(o, self._baseline), format_duration(o.cost_s), status_text(o))
                # Text, not str: a source or status holding "[...]" is data, not rich markup
                t.add_row(*(c if isinstance(c, Text) else Text(str(c)) for c in cells))
            parts.append(t)
        for n in self._notes[-3:]:
            parts.append(Text(n, style="yellow"))
        if self._stop_reason:
            parts.append(Text(f"stop   {self._stop_reason}", style="bold"))
        return Group(*parts)
