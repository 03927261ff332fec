"""The run's ranking of its trials (autoopt.search.incumbent): never below the baseline on the
objective, and on a weighted mix ranked by the mix, as `autoopt best` ranks the stored study."""
from __future__ import annotations


def test_the_best_is_never_below_the_baseline_on_the_objective():
    """A weighted mix can fall while its heaviest concurrency rises outside the noise: that trial is
    not called best (issue 12 item 4: the live view said `best #7 ×0.885`)."""
    from autoopt.measurement import Measurement, Throughput
    from autoopt.search import incumbent
    from autoopt.search.strategy import TrialOutcome
    from autoopt.trial import TrialResult

    def outcome(number: int, at_16: float, objective: float) -> TrialOutcome:
        m = Measurement(status="ok", config={}, tok_per_s={"16": Throughput(at_16, at_16 * 0.98, at_16 * 1.02, 20)})
        return TrialOutcome(number, {}, m, TrialResult("ok", objective, (objective * 0.98, objective * 1.02)))

    base, mixed_down, real_gain = outcome(0, 100.0, 100.0), outcome(1, 120.0, 88.5), outcome(2, 110.0, 104.0)
    assert incumbent.best_of([base, mixed_down], base, 16) is base
    assert incumbent.best_of([base, mixed_down, real_gain], base, 16) is real_gain


def test_on_a_mix_the_run_calls_best_what_autoopt_best_names():
    """A weighted mix is ranked on the mix, as `autoopt best` reads the study back: a trial ahead at
    the heaviest concurrency but behind on the mix is not the run's best (an H100 run printed best
    #121, the fastest at C=64, while `autoopt best` named #83, the fastest on the mix)."""
    from autoopt.measurement import Measurement, Throughput
    from autoopt.search import incumbent
    from autoopt.search.strategy import TrialOutcome
    from autoopt.store.analysis import Mix, select_best
    from autoopt.trial import TrialResult

    mix = Mix.of({1: 0.5, 64: 0.5})

    def outcome(number: int, at_1: float, at_64: float, spread: float = 0.01) -> TrialOutcome:
        tp = {c: Throughput(v, v * (1 - spread), v * (1 + spread), 10) for c, v in (("1", at_1), ("64", at_64))}
        m = Measurement(status="ok", config={}, tok_per_s=tp)
        value = (at_1 * at_64) ** 0.5
        return TrialOutcome(number, {}, m, TrialResult("ok", value, (value * (1 - spread), value * (1 + spread))))

    base, ahead_at_64, ahead_on_mix = outcome(0, 100.0, 1000.0), outcome(1, 110.0, 1500.0), outcome(2, 150.0, 1400.0)
    noisy = outcome(3, 160.0, 1450.0, spread=0.9)  # the highest mix, inside the noise: not a gain
    trials = [base, ahead_at_64, ahead_on_mix, noisy]
    assert incumbent.best_of(trials, base, mix) is ahead_on_mix
    assert incumbent.best_of(trials, base, 64) is ahead_at_64  # one concurrency: ranked at it

    class Stored:  # the store's view of the same trials, for the rule of `autoopt best`
        def __init__(self, t: TrialOutcome) -> None:
            self.number, self.trial_id, self.state, self.measurement = t.number, t.number, "ok", t.measurement
            self.is_baseline = t.number == 0
            self.environment = {}

    stored = [Stored(t) for t in trials]
    assert select_best(stored, stored[:1], mix).trial.number == ahead_on_mix.number


def test_the_objective_key_of_a_space_is_its_concurrency_or_its_mix():
    from types import SimpleNamespace
    from autoopt.search import incumbent
    from autoopt.store.analysis import Mix

    one = SimpleNamespace(objective=SimpleNamespace(weights={64: 1.0}))
    several = SimpleNamespace(objective=SimpleNamespace(weights={1: 0.2, 16: 0.3, 64: 0.5}))
    assert incumbent.objective_key(one) == 64
    assert incumbent.objective_key(several) == Mix.of({1: 0.2, 16: 0.3, 64: 0.5})
