"""Noise: pooled repeats, wins that must clear the noise, interleaved re-measurement."""
from __future__ import annotations

import math
import random

from autoopt.search.agent.noise import NoiseTracker, measurement_sd


def ci(v, rel):
    return (v * (1 - 1.96 * rel), v * (1 + 1.96 * rel))


def test_measurement_sd_from_ci():
    assert math.isclose(measurement_sd(100, ci(100, 0.01)), 0.01, rel_tol=0.02)
    assert measurement_sd(100, None) == 0.0 and measurement_sd(100, (100, 100)) == 0.0


def test_a_gain_inside_the_noise_is_never_a_win():
    nt = NoiseTracker(max_repeats=3)
    nt.add("inc", 100.0, ci(100.0, 0.02))
    nt.add("ch", 101.0, ci(101.0, 0.02))  # +1% with 2% noise
    assert nt.compare("ch", "inc")[0] == "open"
    nt.add("ch", 100.5, ci(100.5, 0.02))
    nt.add("inc", 100.2, ci(100.2, 0.02))
    nt.add("ch", 100.4, ci(100.4, 0.02))
    nt.add("inc", 99.9, ci(99.9, 0.02))
    verdict, gain, sd = nt.compare("ch", "inc")
    assert verdict == "loss" and 0 < gain < 1.645 * sd  # a tie after the repeats: not a win


def test_a_clear_gain_wins_at_once():
    nt = NoiseTracker()
    nt.add("inc", 100.0, ci(100.0, 0.01))
    nt.add("ch", 110.0, ci(110.0, 0.01))
    verdict, gain, _ = nt.compare("ch", "inc")
    assert verdict == "win" and math.isclose(gain, 0.10, rel_tol=1e-6)
    assert nt.compare("inc", "ch")[0] == "open"  # below on its one, selecting look: one more to be sure


def test_repeats_separate_a_real_small_gain():
    rng = random.Random(0)
    nt = NoiseTracker(max_repeats=12)
    for _ in range(12):
        for key, true in (("inc", 100.0), ("ch", 102.5)):
            v = true * (1 + rng.gauss(0, 0.01))
            nt.add(key, v, ci(v, 0.01))
        if nt.compare("ch", "inc")[0] == "win":
            break
    assert nt.compare("ch", "inc")[0] == "win"


def test_next_to_measure_interleaves_and_prefers_the_cheap_one():
    nt = NoiseTracker(max_repeats=4)
    nt.add("inc", 100.0, ci(100.0, 0.02))
    nt.add("ch", 101.0, ci(101.0, 0.02))
    # the challenger's first measurement singled it out: a repeat of it comes first, whatever it costs
    assert nt.next_to_measure("ch", "inc", {"ch": 600, "inc": 60}) == "ch"
    nt.add("ch", 101.0, ci(101.0, 0.02))
    nt.add("ch", 101.0, ci(101.0, 0.02))
    # equal cost: the one measured fewer times shrinks the difference's sd most
    assert nt.next_to_measure("ch", "inc", {"ch": 60, "inc": 60}) == "inc"
    # the incumbent needs a 10-minute restart: the challenger is measured again first
    assert nt.next_to_measure("ch", "inc", {"ch": 60, "inc": 660}) == "ch"


def test_run_to_run_scatter_beyond_the_cis_is_learned():
    nt = NoiseTracker()
    for v in (100.0, 104.0, 96.0, 103.0, 97.0, 101.0, 98.0, 104.0, 96.0, 100.0):  # CIs: 0.5%; scatter ~3%
        nt.add("a", v, ci(v, 0.005))
    assert 0.02 < nt.sd_of_one("a") < 0.05
    assert nt.sd_of_one("a") < 0.031  # a few repeats are not the whole truth: shrunk towards the CIs
    wide = NoiseTracker()
    for i in range(16):  # CIs say 3%, repeats scatter ~0.4%
        v = 100.0 + (0.5 if i % 2 else -0.5)
        wide.add("a", v, ci(v, 0.03))
    assert 0.03 * 0.5 <= wide.sd_of_one("a") < 0.03 * 0.7  # calibrated down, never below half the sd
    flat = NoiseTracker()
    for v in (100.0, 102.0, 98.0):  # CIs with no width at all: the scatter is added
        flat.add("a", v, (v, v))
    assert 0.015 < flat.sd_of_one("a") < 0.025
