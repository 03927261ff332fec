"""What `autoopt run` shows while it works: a rich Live panel on a terminal, plain log lines otherwise.

The panel: progress against the budget (and the reserve kept to confirm the best), the current trial
and its phase (restart / build / compile / warm-up / measure when the target reports phases through
a callback, else what the transition implies followed by "measuring"), the best so far with its CI
and speed-up over the baseline (the rule of `autoopt best`: outside the noise, else the baseline),
the last decision's reason, the last diagnosis, the latest trials, and at the end why it stopped. Without a TTY
(CI, pipes, `--json`) the same events are written as one line each to stderr, so stdout stays clean.
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

from autoopt.budget import format_duration

_APPLY_TEXT = {"none": "", "recompile": "recompile, ", "rebuild": "rebuild, ", "restart": "restart (new worker), "}


class NullObserver:
    """The loop's observer interface; every event is a no-op here."""

    def run_started(self, space: Any, budget: Any, n_history: int, study: str) -> None: ...
    def trial_started(self, number: int, decision: Any, restart_class: str) -> None: ...
    def phase(self, name: str) -> None: ...
    def trial_finished(self, outcome: Any, best: Any, baseline: Any, budget: Any) -> None: ...
    def note(self, text: str) -> None: ...
    def run_finished(self, result: Any) -> None: ...
    def close(self) -> None: ...


def speedup_text(t: Any, base: Any) -> str:
    """'×1.23 [1.18, 1.29]' against the baseline (conservative interval: extreme ratios of the CIs)."""
    if t is None or base is None or not t.objective or not base.objective:
        return ""
    s = t.objective / base.objective
    if t.objective_ci and base.objective_ci and base.objective_ci[0] > 0 and base.objective_ci[1] > 0:
        lo, hi = t.objective_ci[0] / base.objective_ci[1], t.objective_ci[1] / base.objective_ci[0]
        return f"×{s:.3f} [{lo:.3f}, {hi:.3f}]"
    return f"×{s:.3f}"


def objective_text(t: Any) -> str:
    if t is None or t.objective is None:
        return "-"
    if t.objective_ci:
        lo, hi = t.objective_ci
        rel = (hi - lo) / (2 * t.objective) * 100 if t.objective else 0.0
        return f"{t.objective:,.1f} tok/s ±{rel:.1f}% [{lo:,.1f}, {hi:,.1f}]"
    return f"{t.objective:,.1f} tok/s"


def best_text(best: Any, baseline: Any) -> str:
    """'#12 ×1.23 [1.18, 1.29]', or the baseline's own line when nothing beats it outside the noise."""
    if best is None:
        return "-"
    if baseline is not None and best is baseline:
        return f"#{best.number} (the baseline: no trial beats it outside the noise)"
    return f"#{best.number} {speedup_text(best, baseline) or objective_text(best)}"


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
        self._study = ""
        self._current: tuple[int, Any, str] | None = None
        self._phase = ""
        self._phase_t0 = 0.0
        self._last_reason = ""
        self._last_diagnosis = ""
        self._stop_reason = ""
        self._rows: list[Any] = []
        self._notes: list[str] = []

    # ---- events --------------------------------------------------------------------------------
    def run_started(self, space: Any, budget: Any, n_history: int, study: str) -> None:
        self._space, self._budget, self._study = space, budget, study
        head = (f"study {study}: space {space.name} ({len(space.params)} params, {space.size()} points), "
                f"objective {space.objective.describe()}, budget {format_duration(budget.total_s)}"
                + (f", continuing after {n_history} recorded trials" if n_history else ""))
        if self.live_mode:
            self._live = Live(console=self.console, get_renderable=self._render, refresh_per_second=4,
                              transient=False, redirect_stdout=False, redirect_stderr=False)
            self._live.start()
            self._notes.append(head)
        else:
            self._line(head)

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
        diagnosis = getattr(outcome, "diagnosis", None)
        if diagnosis:
            self._last_diagnosis = f"#{outcome.number}: {diagnosis}"
        if not self.live_mode:
            speed = speedup_text(outcome, baseline)
            best_txt = f"; best {best_text(best, baseline)}" if best else ""
            self._line(f"trial #{outcome.number} {status_text(outcome)}: {objective_text(outcome)}"
                       f"{' ' + speed if speed else ''} ({format_duration(outcome.cost_s)}){best_txt}")
            if diagnosis:
                self._line(f"trial #{outcome.number} diagnosis: {diagnosis}")

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
        if self._notes:
            parts.append(Text(self._notes[0], style="bold"))
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
            parts.append(Text(f"best   {best_text(self._best, self._baseline)} {objective_text(self._best)}",
                              style="green"))
        if self._last_reason:
            parts.append(Text(f"why    {self._last_reason}", overflow="ellipsis", no_wrap=True))
        if self._last_diagnosis:
            parts.append(Text(f"diag   {self._last_diagnosis}", overflow="ellipsis", no_wrap=True))
        if self._rows:
            t = Table(box=None, pad_edge=False, show_edge=False)
            for col in ("#", "source", "objective", "vs baseline", "cost", "status"):
                t.add_column(col)
            for o in self._rows[-self.max_rows:]:
                t.add_row(str(o.number), o.decision.source if o.decision else "", objective_text(o),
                          speedup_text(o, self._baseline), format_duration(o.cost_s), status_text(o))
            parts.append(t)
        for n in self._notes[1:][-3:]:
            parts.append(Text(n, style="yellow"))
        if self._stop_reason:
            parts.append(Text(f"stop   {self._stop_reason}", style="bold"))
        return Group(*parts)
