"""What a search loop is told (LoopSettings) and what it returns (RunResult), with its exit codes;
re-exported by autoopt.search.loop. Also, in the run summary, how well this run's predictions held: the
one cost model's transition seconds (`RunResult.transition_accuracy()`) and the strategy's predicted
gains (`RunResult.gain_calibration()`, the same count `bench-search` reports as calibration)."""
from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field
from typing import Any

from autoopt.search.strategy import TrialOutcome
from autoopt.units import format_duration

EXIT_OK, EXIT_ALL_FAILED, EXIT_BAD_INPUT, EXIT_INTERRUPTED = 0, 1, 2, 130
TRANSITION_WITHIN = 0.5  # a transition is predicted well when the actual is within 50 % of the prediction
TRANSITION_FLOOR_S = 0.5  # ... or within this many seconds of it: a sub-second miss is no miss on the clock
Z95 = 1.96  # a measured gain within the predicted mean +- Z95 sd is inside its predicted 95 % interval


@dataclass
class LoopSettings:
    study_name: str
    max_trials: int | None = None  # search trials of this run (baseline and re-runs included)
    confirm: bool = True  # re-measure the best at the end, from the reserve
    reserve_max_fraction: float = 0.25  # the reserve never exceeds this share of the budget
    propose_retries: int = 3  # proposals that do not fit the budget before stopping
    give_up_after_failures: int = 5  # stop when this many trials failed and none ever succeeded
    abort_losers: bool = True  # stop sampling a config once its CI top is under the incumbent
    handle_sigint: bool = True
    measure_lock: bool = False  # runs on one host take turns measuring (autoopt.store.locks; `run` sets it)


def transition_seconds(t: TrialOutcome) -> tuple[float, float] | None:
    """(predicted, actual) seconds of the trial's transition: the cost model's estimate stored with
    its decision, and what applying the configuration took. None without a prediction, or unless the
    trial ran (ok or wrong): a failed or interrupted one may have ended before its transition did."""
    cost = t.decision.expected_cost if t.decision is not None else None
    if cost is None or t.result.state not in ("ok", "wrong"):
        return None
    return cost.transition_s, t.result.transition_s


def transition_within(predicted_s: float, actual_s: float) -> bool:
    """The actual transition within 50 % of the predicted one (or within TRANSITION_FLOOR_S)."""
    return abs(actual_s - predicted_s) <= max(TRANSITION_WITHIN * predicted_s, TRANSITION_FLOOR_S)


@dataclass(frozen=True)
class TransitionAccuracy:
    """How the cost model's transition seconds compared with the clock over a run's trials."""

    n: int  # trials that ran, with a predicted and an actual transition
    within: int  # of them, within 50 % (transition_within)
    median_error_s: float  # median |actual - predicted|
    median_ratio: float | None  # median actual / predicted over trials predicted above the floor
    n_ratio: int = 0  # those trials

    @property
    def share_within(self) -> float:
        return self.within / self.n if self.n else 0.0

    def text(self) -> str:
        ratio = (f", actual/predicted median x{self.median_ratio:.2f} over the {self.n_ratio} predicted above "
                 f"{TRANSITION_FLOOR_S:g}s" if self.median_ratio is not None else "")
        return (f"transitions: {self.within} of {self.n} trials that ran ({100 * self.share_within:.0f}%) within 50% "
                f"of the predicted seconds; median error {format_duration(self.median_error_s)}{ratio}")

    def to_json(self) -> dict[str, Any]:
        return {"trials": self.n, "within_50pct": self.within, "share_within_50pct": self.share_within,
                "median_error_s": self.median_error_s, "median_actual_over_predicted": self.median_ratio,
                "trials_predicted_above_floor": self.n_ratio}


def transition_accuracy(trials: list[TrialOutcome]) -> TransitionAccuracy | None:
    pairs = [p for p in map(transition_seconds, trials) if p is not None]
    if not pairs:
        return None
    ratios = [a / p for p, a in pairs if p > TRANSITION_FLOOR_S]
    return TransitionAccuracy(n=len(pairs), within=sum(transition_within(p, a) for p, a in pairs),
                              median_error_s=statistics.median(abs(a - p) for p, a in pairs),
                              median_ratio=statistics.median(ratios) if ratios else None, n_ratio=len(ratios))


def gain_inside(t: TrialOutcome, base_log: float | None) -> bool | None:
    """Whether the trial's measured gain, log(objective / reference), fell inside the 95 % interval
    predicted when the trial was chosen (the decision's notes `pred_log` and `pred_sd`, which the agent
    records); None without a prediction, a measurement or a reference.

    The reference is the one the prediction was made against (the notes' `ref_log`: the agent reads
    every gain against the study's first baseline), else `base_log`. A resumed run has its own baseline,
    and on the H100 a resume's read 6 % above the study's first: against it, 9 of 114 predictions
    looked inside their interval, against the agent's own reference 111."""
    notes = t.decision.notes if t.decision is not None else None
    if not notes or notes.get("pred_log") is None or notes.get("pred_sd") is None:
        return None
    ref_log = notes.get("ref_log")
    ref_log = base_log if ref_log is None else ref_log
    if ref_log is None or not t.objective:
        return None
    return abs(math.log(t.objective) - float(ref_log) - float(notes["pred_log"])) <= Z95 * float(notes["pred_sd"])


@dataclass(frozen=True)
class GainCalibration:
    """How many of a run's measured gains fell inside the 95 % interval predicted for them."""

    n: int  # trials with a predicted gain and a measurement
    inside: int

    @property
    def share_inside(self) -> float:
        return self.inside / self.n if self.n else 0.0

    def text(self) -> str:
        return (f"calibration: {self.inside} of {self.n} measured gains ({100 * self.share_inside:.0f}%) inside "
                f"the 95% interval predicted when the trial was chosen")

    def to_json(self) -> dict[str, Any]:
        return {"trials": self.n, "inside_95pct": self.inside, "share_inside_95pct": self.share_inside}


def gain_calibration(trials: list[TrialOutcome], baseline: TrialOutcome | None) -> GainCalibration | None:
    base_log = math.log(baseline.objective) if baseline is not None and baseline.objective else None
    scored = [x for x in (gain_inside(t, base_log) for t in trials) if x is not None]
    return GainCalibration(n=len(scored), inside=sum(scored)) if scored else None


@dataclass
class RunResult:
    run_id: int
    study_name: str
    state: str  # finished | failed | interrupted
    stop_reason: str
    exit_code: int
    trials: list[TrialOutcome] = field(default_factory=list)  # evaluated by this run, in order
    history: list[TrialOutcome] = field(default_factory=list)  # the whole study (finished trials)
    best: TrialOutcome | None = None
    baseline: TrialOutcome | None = None
    confirmation: TrialOutcome | None = None
    elapsed_s: float = 0.0
    warm_start: dict[str, Any] | None = None  # the study this run started from (autoopt.search.warm_start)
    mix: str | None = None  # "C=1:0.2 C=16:0.3 C=64:0.5" when the figures are a weighted mix (else None)

    def transition_accuracy(self) -> TransitionAccuracy | None:
        """Predicted vs actual transition seconds over this run's trials (None: no prediction)."""
        return transition_accuracy(self.trials)

    def gain_calibration(self) -> GainCalibration | None:
        """This run's predicted gains against the measurements (None: no strategy predicted one)."""
        return gain_calibration(self.trials, self.baseline)
