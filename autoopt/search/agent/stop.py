"""The stop rule: is the next trial worth its cost?

`--min-gain GAIN/TIME` is the exchange rate between speed and time the user accepts. The default,
1%/10min, reads: a trial that costs 8 minutes (a restart, a sweep, a profile) must be expected to win
at least 0.8%. The agent stops by itself when

  - no candidate's expected gain is worth its cost: the best expected gain (the expected improvement,
    which counts the odds of a win, not just the mean) per second of transition + measurement is
    below the rate; or
  - the budget cannot fit the best candidate plus the final confirmation of the best.

The first judgement needs evidence behind it: while fewer than `min_trials` (10) configurations
were measured, "nothing is worth it" is the verdict of a model fitted on a handful of points (and a
noisy machine can make two good knobs look bad in one trial each), so a candidate that is cheap
(at most 10% of the budget left) is still tried: the most optimistic one (expected gain + 2 sd).
A dear one is not: the rule then stops as above.

The reason it gives reads like the engineer in the case study weighing "likely 3-5% against 8
minutes of restart, sweep and profiling", e.g.
  best candidate glue=compile +1.2% ± 0.9% (worth +0.5%) for 8m00s (restart 5m00s + measure
  3m00s) = 0.6%/10min < 1%/10min: stopping
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Callable

from autoopt.errors import UserError
from autoopt.units import format_duration

DEFAULT_MIN_GAIN = "1%/10min"
MIN_TRIALS = 10  # configurations measured before the model alone may say nothing is worth it ...
EXPLORE_MAX_FRACTION = 0.10  # ... unless the next trial would take more than this share of what is left
_UNITS = {"s": 1.0, "sec": 1.0, "m": 60.0, "min": 60.0, "h": 3600.0, "hr": 3600.0, "hour": 3600.0}
_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*%\s*/\s*(\d+(?:\.\d+)?)?\s*(s|sec|m|min|h|hr|hour)s?\s*$")


@dataclass(frozen=True)
class MinGain:
    gain: float  # relative gain (0.01 = 1%)
    per_s: float  # ... per this many seconds
    text: str

    @property
    def rate(self) -> float:
        """Relative gain per second below which a trial is not worth it."""
        return self.gain / self.per_s if self.per_s > 0 else 0.0

    @classmethod
    def parse(cls, text: str | None) -> "MinGain":
        """'1%/10min', '0.5%/5m', '2%/h', '0' (never stop for lack of gain)."""
        text = DEFAULT_MIN_GAIN if text is None else str(text)
        if text.strip() in ("0", "0%", "off", "none"):
            return cls(0.0, 600.0, "0%/10min")
        m = _RE.match(text.lower())
        if not m:
            raise UserError(f"--min-gain: expected GAIN%/TIME like 1%/10min, 0.5%/5m or 2%/h; got {text!r}")
        per = float(m.group(2) or 1.0) * _UNITS[m.group(3)]
        if per <= 0:
            raise UserError(f"--min-gain: the time part of {text!r} must be positive")
        return cls(float(m.group(1)) / 100.0, per, text.strip())

    def per_unit_text(self, rate: float) -> str:
        """A rate (gain per second) in this rule's unit: 0.000012 -> '0.7%/10min'."""
        return f"{100 * rate * self.per_s:.2g}%/{self._unit()}"

    def _unit(self) -> str:
        return self.text.split("/", 1)[1].strip() if "/" in self.text else format_duration(self.per_s)


def fmt_gain(mu: float, sd: float | None = None) -> str:
    txt = f"{100 * mu:+.1f}%"
    return f"{txt} ± {100 * sd:.1f}%" if sd is not None else txt


class StopRule:
    def __init__(self, min_gain: MinGain | str | None = None, min_trials: int = MIN_TRIALS,
                 explore_max_fraction: float = EXPLORE_MAX_FRACTION) -> None:
        self.min_gain = min_gain if isinstance(min_gain, MinGain) else MinGain.parse(min_gain)
        self.min_trials = min_trials
        self.explore_max_fraction = explore_max_fraction

    def worth_it(self, scored: Any) -> bool:
        return scored.rate >= self.min_gain.rate

    def not_worth_reason(self, scored: Any) -> str:
        return (f"best candidate {scored.label} {fmt_gain(scored.gain, scored.gain_sd)} "
                f"(worth {fmt_gain(scored.worth)}) for {scored.cost.text()} = "
                f"{self.min_gain.per_unit_text(scored.rate)} < {self.min_gain.text}: stopping")

    @staticmethod
    def budget_reason(scored: Any, spendable_s: float, reserve_s: float, needed_s: float | None = None) -> str:
        more = "" if needed_s is None or needed_s <= scored.cost.total_s + 0.05 else \
            f" ({format_duration(needed_s)} with this run's overruns and the loop's own seconds)"
        return (f"budget: the best candidate {scored.label} needs {scored.cost.text()}{more}, only "
                f"{format_duration(spendable_s)} left after keeping {format_duration(reserve_s)} for the final "
                "confirmation: stopping")

    def check(self, ranked: list[Any], budget_left_s: float, reserve_s: float,
              n_measured: int | None = None, needed: Callable[[float], float] | None = None
              ) -> tuple[Any | None, str | None]:
        """The candidate to try (the best that fits the budget) and None, or a cheap candidate to
        explore and why (fewer than `min_trials` configurations measured: `n_measured`), or None and
        the reason to stop.

        `ranked`: scored candidates, best first (each with .rate, .cost.total_s, .label, .gain,
        .gain_sd, .worth); `needed(expected_s)`: what a trial expected at that must find in the budget
        (the loop's check, CostModel.needed_s; by default its estimate)."""
        if not ranked:
            return None, "nothing left to try: every configuration of the space was measured or is invalid"
        best = ranked[0]
        spendable = max(0.0, budget_left_s - reserve_s)
        needed = needed or (lambda expected_s: expected_s)

        def fits(expected_s: float) -> bool:
            return needed(expected_s) <= spendable

        if not self.worth_it(best):
            if n_measured is not None and n_measured < self.min_trials:
                limit = self.explore_max_fraction * budget_left_s
                cheap = [c for c in ranked if c.cost.total_s <= limit and fits(c.cost.total_s)]
                if cheap:
                    pick = max(cheap, key=lambda c: c.gain + 2.0 * c.gain_sd)
                    return pick, (f"exploring: no candidate is worth {self.min_gain.text} by the model, "
                                  f"but it rests on {n_measured} measured configurations (fewer than "
                                  f"{self.min_trials}); the most optimistic cheap one")
            return None, self.not_worth_reason(best)
        for cand in ranked:
            if fits(cand.cost.total_s):
                if not self.worth_it(cand):
                    return None, self.budget_reason(best, spendable, reserve_s, needed(best.cost.total_s))
                return cand, None
        return None, self.budget_reason(best, spendable, reserve_s, needed(best.cost.total_s))
