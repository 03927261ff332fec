"""The objective a space declares: tok/s at one concurrency, or a weighted geometric mean of several
(`objective: {concurrency: 4}` or `{weights: {1: 0.2, 16: 0.3, 64: 0.5}}`), read off a Measurement."""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Objective:
    """tok/s at one concurrency, or a weighted geometric mean over several (weights sum to 1)."""

    weights: dict[int, float]

    def value(self, m: Any) -> float | None:
        if m is None or getattr(m, "status", None) != "ok":
            return None
        meds = {c: m.objective(c) for c in self.weights}
        if any(v is None or v <= 0 for v in meds.values()):
            return None
        return math.exp(sum(w * math.log(meds[c]) for c, w in self.weights.items()))

    def ci(self, m: Any) -> tuple[float, float] | None:
        if self.value(m) is None:
            return None
        tps = {c: m.tok_per_s[str(c)] for c in self.weights}
        if any(tp.ci_low <= 0 or tp.ci_high <= 0 for tp in tps.values()):
            return None
        lo = math.exp(sum(w * math.log(tps[c].ci_low) for c, w in self.weights.items()))
        hi = math.exp(sum(w * math.log(tps[c].ci_high) for c, w in self.weights.items()))
        return lo, hi

    def describe(self) -> str:
        if len(self.weights) == 1:
            return f"tok/s at C={next(iter(self.weights))}"
        return "tok/s, weighted geometric mean of " + " ".join(
            f"C={c}:{w:g}" for c, w in self.weights.items())
