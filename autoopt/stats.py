"""The statistics every layer shares, computed in one place: the distribution-free confidence
interval of a median, and the speed-up of one figure over another with its conservative interval.

    speedup   of T over B: median T.med / B.med, interval [T.lo / B.hi, T.hi / B.lo] (the extreme
              ratios of the two 95 % CIs; db/README.md "Definitions").
"""
from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from typing import Protocol


@dataclass(frozen=True)
class Interval:
    median: float
    ci_low: float
    ci_high: float

    def to_dict(self) -> dict[str, float]:
        return {"median": self.median, "ci_low": self.ci_low, "ci_high": self.ci_high}


class Figure(Protocol):
    median: float
    ci_low: float
    ci_high: float


def median_ci(values: list[float], confidence: float = 0.95) -> tuple[float, float, float]:
    """Median and a distribution-free confidence interval for it (binomial order statistics).

    With n samples the CI is [x_(l), x_(u)] where l, u are chosen so that
    P(l <= #samples below the true median < u) >= confidence. Needs n >= 6 for a 95% interval;
    with fewer samples the interval is the full range (honestly wide).
    """
    if not values:
        raise ValueError("median_ci of no values")
    xs = sorted(values)
    n = len(xs)
    med = statistics.median(xs)
    alpha = 1.0 - confidence
    # smallest k with P(Bin(n, 1/2) <= k-1) >= alpha/2  ->  CI = [x_(k), x_(n-k+1)] (1-based)
    cdf, k = 0.0, 0
    while k < n:
        p = math.comb(n, k) * 0.5 ** n
        if cdf + p > alpha / 2:
            break
        cdf += p
        k += 1
    if k == 0:
        return med, xs[0], xs[-1]
    return med, xs[k - 1], xs[n - k]


def speedup(t: Figure, base: Figure) -> Interval | None:
    """t over base with the conservative interval; None when the base has no positive figure.
    Either may be any figure with median / ci_low / ci_high (an Interval, a measured Throughput)."""
    if base.median <= 0 or base.ci_low <= 0 or base.ci_high <= 0:
        return None
    return Interval(t.median / base.median, t.ci_low / base.ci_high, t.ci_high / base.ci_low)
