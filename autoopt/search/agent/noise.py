"""A gain inside the noise is never a win: pooled repeats, and a challenger that must separate.

Every measured trial gives log(objective) and its own sd (from the measurement's confidence
interval: half-width / 1.96 in log units). Repeats of one configuration are pooled by inverse
variance. CIs from one run can promise more or less than runs really scatter (a restart lands on
other clocks, other memory placement; an order-statistic CI of few samples is wide): once repeats
give enough degrees of freedom, every sd is calibrated against the scatter actually observed.

A challenger that measured better than the incumbent becomes the new best only when the difference
is above `z` sds of the difference (one-sided 99.5% by default: the test is repeated after every
repeat, and many challengers are tested in one run, so 95% would crown a tie every other run), judged
on its repeats only: its
first measurement is the one that made it look best among many (the winner's curse), so only the
measurements taken after it was singled out are an unbiased look. A first measurement that is above
`z_single` (3) sds is a win at once. While it is not, the agent
re-measures, interleaving challenger and incumbent: each confirmation measures whichever of the two
shrinks the sd of the difference most per second (the one built now is cheap, so runs pair up
without paying a restart for every sample). After `max_repeats` measurements of each the
challenger is a tie: the incumbent stays. So is one whose lead after its first repeat (plus one sd)
is below what `max_repeats` of each could separate from the noise: more repeats would be futile.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Hashable

Z_ONE_SIDED_995 = 2.576
PRIOR_DOF = 8.0  # the CIs' own word counts as this many repeats
Z_SINGLE = 3.0  # one measurement this far ahead is a win without a repeat (0.13% false wins)
SD_FLOOR = 0.0005  # a CI of no width does not make a measurement exact: 0.05% ...
EXACT_FLOOR = 1e-5  # ... unless repeats showed it is (EXACT_DOF of them, scattering under SD_FLOOR / 10)
EXACT_DOF = 2


@dataclass
class Pooled:
    n: int
    mean: float  # log objective
    se: float

    @property
    def value(self) -> float:
        return math.exp(self.mean)


def measurement_sd(objective: float, ci: tuple[float, float] | None) -> float:
    """sd of log(objective) from a 95% CI (0 when the measurement has no spread)."""
    if not ci or objective <= 0 or ci[0] <= 0 or ci[1] <= 0:
        return 0.0
    return max(0.0, (math.log(ci[1]) - math.log(ci[0])) / (2 * 1.96))


class NoiseTracker:
    def __init__(self, z: float = Z_ONE_SIDED_995, max_repeats: int = 4, z_single: float = Z_SINGLE) -> None:
        self.z = z
        self.z_single = z_single
        self.max_repeats = max_repeats
        self.obs: dict[Hashable, list[tuple[float, float]]] = {}  # key -> [(log objective, sd)]
        self.tau2 = 0.0  # scatter added to CIs that promise none
        self.calibration = 1.0  # observed scatter / what the CIs promised
        self.floor = SD_FLOOR  # lowered when repeats show the target measures the same figure again

    def add(self, key: Hashable, objective: float, ci: tuple[float, float] | None) -> None:
        self.obs.setdefault(key, []).append((math.log(objective), measurement_sd(objective, ci)))
        if len(self.obs[key]) > 1:
            self._update_tau()

    def _update_tau(self) -> None:
        """Calibrate the CIs against how repeats actually scatter, pooled over repeated configs:
        every measurement's variance is its CI's variance times (observed scatter / scatter the CIs
        promised), shrunk towards 1 as if the CIs were worth PRIOR_DOF repeats (a handful of repeats
        scatter by chance alone); CIs with no width get the scatter added."""
        num, dof, within = 0.0, 0, []
        for vals in self.obs.values():
            if len(vals) < 2:
                continue
            m = sum(v for v, _ in vals) / len(vals)
            num += sum((v - m) ** 2 for v, _ in vals)
            dof += len(vals) - 1
            within += [s * s for _, s in vals]
        if not dof:
            return
        scatter, promised = num / dof, sum(within) / len(within)
        exact = dof >= EXACT_DOF and scatter < (SD_FLOOR / 10) ** 2 and promised < SD_FLOOR ** 2
        self.floor = max(EXACT_FLOOR, math.sqrt(scatter)) if exact else SD_FLOOR
        if promised > SD_FLOOR ** 2:
            ratio = (dof * scatter / promised + PRIOR_DOF) / (dof + PRIOR_DOF)
            self.calibration = min(100.0, max(0.25, ratio))
            self.tau2 = 0.0
        else:
            self.tau2 = max(0.0, scatter - promised)

    def var(self, s: float) -> float:
        """Variance of one log-measurement whose CI says sd `s`."""
        return max(self.floor ** 2, self.calibration * s * s + self.tau2)

    def sd_of_one(self, key: Hashable) -> float:
        """sd of a single new measurement of `key` (what a repeat would add)."""
        vals = self.obs.get(key) or []
        s2 = (sum(s * s for _, s in vals) / len(vals)) if vals else self.typical_var()
        return math.sqrt(self.var(math.sqrt(s2)))

    def typical_var(self) -> float:
        all_s = [s * s for vals in self.obs.values() for _, s in vals]
        return sum(all_s) / len(all_s) if all_s else 0.0

    def pooled(self, key: Hashable, skip_first: bool = False) -> Pooled | None:
        vals = self.obs.get(key)
        if vals and skip_first and len(vals) > 1:
            vals = vals[1:]
        if not vals:
            return None
        w = [1.0 / self.var(s) for _, s in vals]
        mean = sum(wi * v for wi, (v, _) in zip(w, vals)) / sum(w)
        return Pooled(n=len(vals), mean=mean, se=math.sqrt(1.0 / sum(w)))

    def n(self, key: Hashable) -> int:
        return len(self.obs.get(key) or [])

    def compare(self, challenger: Hashable, incumbent: Hashable) -> tuple[str, float, float]:
        """('win' | 'loss' | 'open', gain, sd of the gain): gain = exp(difference) - 1."""
        single = self.n(challenger) < 2
        a, b = self.pooled(challenger, skip_first=True), self.pooled(incumbent)
        if a is None or b is None:
            return "open", 0.0, math.inf
        d = a.mean - b.mean
        sd = math.sqrt(a.se ** 2 + b.se ** 2)
        if d > (self.z_single if single else self.z) * sd:
            verdict = "win"
        elif (d <= 0 and self.n(challenger) >= 3) or \
                (self.n(challenger) >= self.max_repeats and self.n(incumbent) >= self.max_repeats):
            verdict = "loss"  # not better on two unbiased looks, or a tie after enough repeats
        elif not single and d + sd < self.z * self.sd_at_max(challenger, incumbent):
            verdict = "loss"  # a tie: even max_repeats of each could not lift this lead out of the noise
        else:
            verdict = "open"
        return verdict, math.expm1(d), sd

    def sd_at_max(self, challenger: Hashable, incumbent: Hashable) -> float:
        """sd of the difference once both have max_repeats measurements (the challenger's first
        one not counted)."""
        a = self.sd_of_one(challenger) ** 2 / max(1, self.max_repeats - 1)
        b = self.sd_of_one(incumbent) ** 2 / max(1, self.max_repeats)
        return math.sqrt(a + b)

    def next_to_measure(self, challenger: Hashable, incumbent: Hashable,
                        cost_s: dict[Hashable, float]) -> Hashable:
        """Which of the two shrinks the sd of their difference most per second of measuring (the
        challenger first until it has a repeat: its first measurement does not count)."""
        if self.n(challenger) < 2:
            return challenger
        best, best_rate = challenger, -1.0
        for key, skip in ((challenger, True), (incumbent, False)):
            if self.n(key) >= self.max_repeats:
                continue
            p = self.pooled(key, skip_first=skip)
            new_var = 1.0 / (1.0 / max(p.se ** 2, 1e-12) + 1.0 / self.sd_of_one(key) ** 2)
            rate = (p.se ** 2 - new_var) / max(cost_s.get(key, 1.0), 1.0)
            if rate > best_rate:
                best, best_rate = key, rate
        return best

    def describe(self, key: Hashable) -> str:
        p = self.pooled(key)
        if p is None:
            return "unmeasured"
        return f"{p.value:.4g} ± {100 * 1.96 * p.se:.1f}% (n={p.n})"

