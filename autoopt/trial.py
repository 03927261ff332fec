"""A trial as one typed record on its whole path: the Decision a strategy makes, the cost estimate the
one cost model gives for it, and the TrialResult the loop computes once from the measurement.

These sit at the bottom (nothing above autoopt.units) so that the search loop, the targets
and the store share them without the store knowing any search code. The database keeps JSON columns;
`Decision.to_json` / `from_json` and `TrialResult.to_json` / `from_json` are the one (de)serialiser
of those columns (`autoopt_trials.decision_extra` and `autoopt_trials.extra`, db/README.md).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from typing import Any, Iterable, Union

from autoopt.units import format_duration

JSONable = Union[None, bool, int, float, str, list, dict]  # what a JSON column can hold


class RestartClass(str, Enum):
    """What applying a change costs, cheapest first: a runtime switch, a recompile of kernels, a
    rebuild of the model in the live worker, a new worker process."""

    NONE = "none"
    RECOMPILE = "recompile"
    REBUILD = "rebuild"
    RESTART = "restart"

    @property
    def rank(self) -> int:
        return _CLASS_ORDER.index(self)

    @classmethod
    def dearest(cls, classes: Iterable[str]) -> "RestartClass":
        """The most expensive of `classes` (NONE for none at all)."""
        return max((cls(c) for c in classes), key=lambda c: c.rank, default=cls.NONE)


_CLASS_ORDER = tuple(RestartClass)
RESTART_CLASSES = tuple(c.value for c in RestartClass)


class TrialState(str, Enum):
    RUNNING = "running"
    OK = "ok"
    WRONG = "wrong"
    FAILED = "failed"
    INTERRUPTED = "interrupted"


TRIAL_STATES = tuple(s.value for s in TrialState)
FINISHED_STATES = tuple(s.value for s in TrialState if s is not TrialState.RUNNING)


class FailureKind(str, Enum):
    CRASH = "crash"
    HANG = "hang"
    OOM = "oom"
    EXCEPTION = "exception"
    COMPILE = "compile"
    CUDA = "cuda"
    EXCLUDED = "excluded"
    INTERRUPTED = "interrupted"


FAILURE_KINDS = tuple(k.value for k in FailureKind)
APPLY_PHASES = ("restart", "build", "compile")  # the measured phases (costs_s keys) of a transition


class DecisionSource(str, Enum):
    """Where a decision came from. A stored source is one of these values, optionally followed by
    ":detail" (e.g. "sampler:tpe", "profile:attention"); `Decision.kind` gives the member."""

    BASELINE = "baseline"
    RESUME = "resume"  # re-run of a trial a killed process left unfinished
    CONFIRM = "confirm"  # the final re-measurement of the best
    REPEAT = "repeat"  # the agent re-measuring a challenger or the incumbent inside the noise
    SAMPLER = "sampler"
    PROFILE = "profile"
    NEIGHBOUR = "neighbour"
    SCAN = "scan"
    GRID = "grid"
    RECORDED = "recorded"  # measured outside autoopt and stored by `autoopt record`
    UNKNOWN = "unknown"

    @classmethod
    def of(cls, source: str | None) -> "DecisionSource":
        head = (source or "").split(":", 1)[0]
        try:
            return cls(head)
        except ValueError:
            return cls.UNKNOWN


@dataclass
class CostEstimate:
    """What a trial is expected to cost (autoopt.search.cost.CostModel, the one estimate the loop's
    budget check, the agent's choice and `autoopt show` all read)."""

    transition_s: float  # applying the configuration: restart / rebuild / recompile
    measure_s: float
    restart_class: str  # a RestartClass value
    changed: tuple[str, ...] = ()
    cached: bool = False  # the target has these kernels compiled already
    known_s: float | None = None  # the target's own figure for the transition, when it knows one
    redone: tuple[str, ...] = ()  # parameters whose build work is redone though they keep their value

    @property
    def total_s(self) -> float:
        return self.transition_s + self.measure_s

    def text(self) -> str:
        fmt = format_duration
        if self.transition_s < 0.5:
            return f"{fmt(self.total_s)} (measure {fmt(self.measure_s)}, no rebuild)"
        noun = "rebuild" if self.restart_class == RestartClass.NONE else self.restart_class
        return f"{fmt(self.total_s)} ({noun} {fmt(self.transition_s)} + measure {fmt(self.measure_s)})"

    def to_json(self) -> dict[str, JSONable]:
        return {"transition_s": self.transition_s, "measure_s": self.measure_s,
                "restart_class": str(RestartClass(self.restart_class).value),
                "changed": list(self.changed), "cached": self.cached, "known_s": self.known_s,
                "redone": list(self.redone)}

    @classmethod
    def from_json(cls, d: dict[str, Any] | None) -> "CostEstimate | None":
        if not isinstance(d, dict) or not isinstance(d.get("transition_s"), (int, float)):
            return None
        return cls(float(d["transition_s"]), float(d.get("measure_s") or 0.0),
                   str(d.get("restart_class") or "none"), tuple(d.get("changed") or ()),
                   bool(d.get("cached", False)), _num(d.get("known_s")), tuple(d.get("redone") or ()))


_DECISION_FIELDS = ("parent", "profile", "confirms", "rerun_of", "expected_cost", "notes")


@dataclass
class Decision:
    """What to try next, and why. `params` are the space's flat parameters (autoopt.space.space)."""

    params: dict[str, Any]
    source: str  # a DecisionSource value, optionally ":detail"
    reason: str  # one line a person can read: expected gain, cost, why this one
    expected_gain: float | None = None  # relative objective gain over the parent (0.05 = +5%)
    expected_gain_sd: float | None = None
    expected_cost: CostEstimate | None = None  # set by the loop from the one cost model
    parent: int | None = None  # the trial this one is compared with (its diagnosis is against it)
    profile: bool = False  # ask the target for a profile (buckets) with the measurement
    confirms: int | None = None  # the trial a "confirm" decision re-measures
    rerun_of: int | None = None  # the interrupted trial this one re-runs
    # The strategy's own bookkeeping (e.g. the agent's worth, p_fail, repeat_of; the sampler's
    # seed). Opaque to the loop and the store: stored and shown as given, never read by them.
    notes: dict[str, JSONable] = field(default_factory=dict)

    @property
    def kind(self) -> DecisionSource:
        return DecisionSource.of(self.source)

    @property
    def expected_cost_s(self) -> float | None:
        return self.expected_cost.total_s if self.expected_cost is not None else None

    def extra_json(self) -> dict[str, JSONable]:
        """The typed fields beyond the row's columns, as stored in `decision_extra`."""
        out: dict[str, JSONable] = {"parent": self.parent, "profile": self.profile or None,
                                    "confirms": self.confirms, "rerun_of": self.rerun_of,
                                    "expected_cost": self.expected_cost.to_json() if self.expected_cost else None,
                                    "notes": dict(self.notes) or None}
        return {k: v for k, v in out.items() if v is not None}

    def to_json(self) -> dict[str, JSONable]:
        """The document `autoopt show --json` prints as "decision" (db/README.md)."""
        return {"source": self.source, "reason": self.reason, "expected_gain": self.expected_gain,
                "expected_gain_sd": self.expected_gain_sd, "expected_cost_s": self.expected_cost_s,
                "extra": self.extra_json()}

    @classmethod
    def from_json(cls, params: dict[str, Any], source: str | None, reason: str | None,
                  expected_gain: float | None, expected_gain_sd: float | None,
                  expected_cost_s: float | None, extra: dict[str, Any] | None) -> "Decision":
        """A stored decision back. Rows written before these records kept every field flat in
        `extra`: the typed keys are taken from there, the rest become notes."""
        extra = dict(extra or {})
        notes = dict(extra.pop("notes", None) or {})
        notes.update({k: v for k, v in extra.items() if k not in _DECISION_FIELDS})
        cost = CostEstimate.from_json(extra.get("expected_cost"))
        if cost is None and isinstance(expected_cost_s, (int, float)):
            notes["expected_cost_s"] = expected_cost_s  # an old row: a total without its split, kept as given
        return cls(params=dict(params), source=source or DecisionSource.UNKNOWN.value, reason=reason or "",
                   expected_gain=expected_gain, expected_gain_sd=expected_gain_sd, expected_cost=cost,
                   parent=_int(extra.get("parent")), profile=bool(extra.get("profile", False)),
                   confirms=_int(extra.get("confirms")), rerun_of=_int(extra.get("rerun_of")), notes=notes)


@dataclass
class Diagnosis:
    """A strategy's one-line explanation of a trial's outcome, against its parent."""

    verdict: str
    against: int | None = None
    predicted_gain: float | None = None
    actual_gain: float | None = None
    detail: dict[str, JSONable] = field(default_factory=dict)  # the strategy's own fields, shown as given

    def to_json(self) -> dict[str, JSONable]:
        return {**self.detail, "verdict": self.verdict, "against": self.against,
                **({"predicted_gain": self.predicted_gain} if self.predicted_gain is not None else {}),
                **({"actual_gain": self.actual_gain} if self.actual_gain is not None else {})}

    @classmethod
    def from_json(cls, d: Any) -> "Diagnosis | None":
        if isinstance(d, str) and d.strip():
            return cls(d.strip())
        if not isinstance(d, dict) or not isinstance(d.get("verdict"), str) or not d["verdict"].strip():
            return None
        detail = {k: v for k, v in d.items()
                  if k not in ("verdict", "against", "parent", "line", "predicted_gain", "actual_gain")}
        return cls(d["verdict"].strip(), _int(d.get("against", d.get("parent"))),
                   _num(d.get("predicted_gain")), _num(d.get("actual_gain")), detail)


@dataclass
class TrialResult:
    """What the loop makes of one measurement, computed once and stored as given."""

    state: str  # a TrialState value
    objective: float | None  # None unless state is ok
    objective_ci: tuple[float, float] | None = None
    objective_name: str | None = None  # "tok_per_s@C"; None for a weighted mix
    objective_text: str | None = None  # how the space describes its objective
    cost_s: float = 0.0  # wall (or simulated) seconds of the whole trial
    transition_s: float = 0.0  # of which applying the configuration
    restart_class: str | None = None  # the transition the target reported for it
    speedup: float | None = None  # objective / the baseline's, when there was one
    diagnosis: Diagnosis | None = None

    @property
    def ok(self) -> bool:
        return self.state == TrialState.OK

    @property
    def measure_s(self) -> float:
        return max(0.0, self.cost_s - self.transition_s)

    def to_json(self) -> dict[str, JSONable]:
        """The `autoopt_trials.extra` document (db/README.md; objective and CI also have columns)."""
        out: dict[str, JSONable] = {"cost_s": self.cost_s, "transition_s": self.transition_s,
                                    "restart_class": self.restart_class,
                                    "objective_text": self.objective_text}
        if self.objective_ci is not None:
            out["objective_ci"] = list(self.objective_ci)
        if self.objective_name is not None:
            out["objective_name"] = self.objective_name
        if self.speedup is not None:
            out["speedup"] = self.speedup
        d = self.diagnosis
        if d is not None:
            out["diagnosis"] = d.to_json()
            if d.against is not None:
                out["incumbent_number"] = d.against
            for key in ("predicted_gain", "actual_gain"):
                if getattr(d, key) is not None:
                    out[key] = getattr(d, key)
        return out

    @classmethod
    def from_json(cls, state: str, objective: float | None, objective_ci: tuple[float, float] | None,
                  objective_name: str | None, extra: dict[str, Any] | None, *,
                  default_cost_s: float = 0.0, default_transition_s: float = 0.0) -> "TrialResult":
        """A stored result back; the defaults stand in for rows that recorded no cost (the measured
        phases, when the store has them)."""
        e = extra or {}
        ci = objective_ci
        if ci is None and isinstance(e.get("objective_ci"), (list, tuple)) and len(e["objective_ci"]) == 2:
            ci = (float(e["objective_ci"][0]), float(e["objective_ci"][1]))
        diag = Diagnosis.from_json(e.get("diagnosis"))
        if diag is not None:
            diag.against = diag.against if diag.against is not None else _int(e.get("incumbent_number"))
            diag.predicted_gain = diag.predicted_gain if diag.predicted_gain is not None \
                else _num(e.get("predicted_gain"))
            diag.actual_gain = diag.actual_gain if diag.actual_gain is not None else _num(e.get("actual_gain"))
        return cls(state=state, objective=objective, objective_ci=ci,
                   objective_name=objective_name or e.get("objective_name"),
                   objective_text=e.get("objective_text"), cost_s=_or(_num(e.get("cost_s")), default_cost_s),
                   transition_s=_or(_num(e.get("transition_s")), default_transition_s),
                   restart_class=e.get("restart_class"), speedup=_num(e.get("speedup")), diagnosis=diag)


def _int(v: Any) -> int | None:
    return int(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None


def _num(v: Any) -> float | None:
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None


def _or(v: float | None, default: float) -> float:
    return float(default) if v is None else v
