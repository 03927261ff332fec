"""Plain records the store hands out (no SQLAlchemy objects escape), and their row <-> record maps.
A trial's decision and result are autoopt.trial's typed records, read back through their one
(de)serialiser."""
from __future__ import annotations

import dataclasses
import hashlib
import numbers
import json
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping

from autoopt.errors import StoreError
from autoopt.measurement import Failure, Measurement, Throughput
from autoopt.trial import APPLY_PHASES, Decision, TrialResult

if TYPE_CHECKING:  # the readers hand plain rows with the same attributes (autoopt.store.queries)
    from autoopt.store.models import BucketRow, CostRow, Run, SampleRow, ThroughputRow, TrialRow
# Measurement fields stored as rows/columns rather than in trial.measurement_rest
_ROW_FIELDS = ("tok_per_s", "mbu", "buckets_ms", "costs_s", "environment", "failure",
               "bucket_coverage", "kernel_count", "peak_memory_bytes", "config")


def utcnow() -> datetime:
    """Naive UTC (what the DateTime columns hold)."""
    return datetime.now(timezone.utc).replace(tzinfo=None)


def iso(ts: datetime | None) -> str | None:
    return None if ts is None else ts.isoformat(timespec="milliseconds") + "Z"


def env_sha256(fingerprint: dict[str, Any]) -> str:
    blob = json.dumps(fingerprint, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(blob.encode()).hexdigest()


@dataclass
class RunRecord:
    id: int
    study: str
    state: str
    stop_reason: str | None
    command_line: str
    space_name: str | None
    space_sha256: str | None
    target: str | None
    preset: str | None
    seed: int | None
    settings: dict[str, Any]
    host: str
    pid: int
    autoopt_version: str
    started_at: datetime
    finished_at: datetime | None

    def to_dict(self) -> dict[str, Any]:
        d = dict(self.__dict__)
        d["started_at"], d["finished_at"] = iso(self.started_at), iso(self.finished_at)
        return d


@dataclass
class TrialRecord:
    study: str
    number: int
    trial_id: int  # Optuna's trial_id
    state: str  # running | ok | wrong | failed | interrupted
    params: dict[str, Any]
    config: dict[str, Any]
    measurement: Measurement | None  # None while running / when interrupted before measuring
    decision: Decision | None  # None for a trial begun without one
    result: TrialResult  # while running: state "running", no objective
    started_at: datetime
    finished_at: datetime | None
    run_id: int | None
    is_baseline: bool = False
    diagnoses: list[dict[str, Any]] = field(default_factory=list)
    failure: Failure | None = None  # also set when there is no measurement (interrupted)

    def __post_init__(self) -> None:
        if self.failure is None and self.measurement is not None:
            self.failure = self.measurement.failure

    @property
    def objective(self) -> float | None:
        return self.result.objective

    @property
    def objective_ci(self) -> tuple[float, float] | None:
        return self.result.objective_ci

    @property
    def objective_name(self) -> str | None:
        return self.result.objective_name

    @property
    def duration_s(self) -> float | None:
        if self.finished_at is None:
            return None
        return (self.finished_at - self.started_at).total_seconds()


def run_record(row: Run) -> RunRecord:
    return RunRecord(
        id=row.id, study=row.study_name, state=row.state, stop_reason=row.stop_reason,
        command_line=row.command_line, space_name=row.space_name, space_sha256=row.space_sha256,
        target=row.target, preset=row.preset, seed=row.seed, settings=dict(row.settings or {}),
        host=row.host, pid=row.pid, autoopt_version=row.autoopt_version,
        started_at=row.started_at, finished_at=row.finished_at)


def concurrency_key(c: Any) -> int:
    try:
        return int(str(c))
    except ValueError:
        raise StoreError(f"measurement concurrency key {c!r} is not an integer") from None


def measurement_rows(trial_id: int, m: Measurement) -> dict[str, list[Any]]:
    """The normalised rows of one Measurement."""
    from autoopt.store.models import BucketRow, CostRow, SampleRow, ThroughputRow  # SQLAlchemy: writers only

    throughput, samples = [], []
    for c, tp in m.tok_per_s.items():
        ci = concurrency_key(c)
        mbu = m.mbu.get(str(c))
        throughput.append(ThroughputRow(trial_id=trial_id, concurrency=ci, median=float(tp.median),
                                        ci_low=float(tp.ci_low), ci_high=float(tp.ci_high),
                                        n=int(tp.n), mbu=None if mbu is None else float(mbu)))
        samples += [SampleRow(trial_id=trial_id, concurrency=ci, idx=i, step_s=float(s))
                    for i, s in enumerate(tp.samples_step_s)]
    for c, v in m.mbu.items():  # MBU for a concurrency without tok/s (unusual, kept anyway)
        if str(c) not in m.tok_per_s:
            raise StoreError(f"measurement has MBU at C={c} but no tok/s there")
    buckets = [BucketRow(trial_id=trial_id, bucket=str(b), position=i, ms=float(ms))
               for i, (b, ms) in enumerate(m.buckets_ms.items())]
    costs = [CostRow(trial_id=trial_id, phase=str(p), position=i, seconds=float(s))
             for i, (p, s) in enumerate(m.costs_s.items())]
    return {"throughput": throughput, "samples": samples, "buckets": buckets, "costs": costs}


def measurement_rest(m: Measurement) -> dict[str, Any]:
    d = m.to_dict()
    return {k: v for k, v in d.items() if k not in _ROW_FIELDS}


def rebuild_measurement(row: TrialRow, throughput: list[ThroughputRow], samples: list[SampleRow],
                        buckets: list[BucketRow], costs: list[CostRow],
                        environment: dict[str, Any] | None) -> Measurement | None:
    if row.measurement_rest is None:
        return None
    by_c: dict[int, list[tuple[int, float]]] = {}
    for s in samples:
        by_c.setdefault(s.concurrency, []).append((s.idx, s.step_s))
    tok = {}
    mbu = {}
    for t in sorted(throughput, key=lambda t: t.concurrency):
        steps = [v for _, v in sorted(by_c.get(t.concurrency, []))]
        tok[str(t.concurrency)] = Throughput(median=t.median, ci_low=t.ci_low, ci_high=t.ci_high,
                                             n=t.n, samples_step_s=steps)
        if t.mbu is not None:
            mbu[str(t.concurrency)] = t.mbu
    doc = dict(row.measurement_rest)
    doc.update(
        config=dict(row.config or {}),
        tok_per_s={},
        mbu=mbu,
        buckets_ms={b.bucket: b.ms for b in sorted(buckets, key=lambda b: b.position)},
        costs_s={c.phase: c.seconds for c in sorted(costs, key=lambda c: c.position)},
        environment=dict(environment or {}),
        bucket_coverage=row.bucket_coverage,
        kernel_count=row.kernel_count,
        peak_memory_bytes=row.peak_memory_bytes,
        failure=None,
    )
    if row.failure_kind is not None:
        doc["failure"] = {"kind": row.failure_kind, "reason": row.failure_reason or "",
                          "stderr_tail": row.stderr_tail or ""}
    m = Measurement.from_dict(doc)
    m.tok_per_s = tok
    return m


def decision_of(row: TrialRow) -> Decision | None:
    if row.decision_source is None and not row.decision_extra:
        return None
    return Decision.from_json(row.params or {}, row.decision_source, row.decision_reason, row.expected_gain,
                              row.expected_gain_sd, row.expected_cost_s, row.decision_extra)


def decision_columns(decision: Decision) -> dict[str, Any]:
    """The decision as the trial row's columns (decision_extra: its typed extras, as JSON)."""
    return dict(decision_source=decision.source, decision_reason=decision.reason,
                expected_gain=decision.expected_gain, expected_gain_sd=decision.expected_gain_sd,
                expected_cost_s=decision.expected_cost_s,
                decision_extra=jsonable(decision.extra_json(), "decision"))


def result_of(row: TrialRow, measurement: Measurement | None) -> TrialResult:
    ci = None
    if row.objective_ci_low is not None and row.objective_ci_high is not None:
        ci = (row.objective_ci_low, row.objective_ci_high)
    costs = measurement.costs_s if measurement is not None else {}
    total = costs.get("total", sum(v for k, v in costs.items() if k != "total"))
    return TrialResult.from_json(row.state, row.objective, ci, row.objective_name, row.extra,
                                 default_cost_s=total,
                                 default_transition_s=sum(costs.get(k, 0.0) for k in APPLY_PHASES))


def trial_record(row: TrialRow, measurement: Measurement | None,
                 diagnoses: list[dict[str, Any]] | None = None) -> TrialRecord:
    return TrialRecord(
        study=row.study_name, number=row.number, trial_id=row.trial_id, state=row.state,
        params=dict(row.params or {}), config=dict(row.config or {}), measurement=measurement,
        decision=decision_of(row), result=result_of(row, measurement),
        started_at=row.started_at, finished_at=row.finished_at,
        run_id=row.run_id, is_baseline=bool(row.is_baseline),
        diagnoses=list(diagnoses or []),
        failure=(Failure(row.failure_kind, row.failure_reason or "", row.stderr_tail or "")
                 if row.failure_kind is not None else None))


def jsonable(value: Any, where: str) -> Any:
    """A JSON-safe copy: dataclasses -> dicts, tuples -> lists, Paths -> str; anything else -> error."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return jsonable(dataclasses.asdict(value), where)
    if isinstance(value, Mapping):
        return {str(k): jsonable(v, f"{where}.{k}") for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [jsonable(v, f"{where}[{i}]") for i, v in enumerate(value)]
    if isinstance(value, Path):
        return str(value)
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, numbers.Integral):  # numpy integers
        return int(value)
    if isinstance(value, numbers.Real):  # numpy floats
        return float(value)
    raise StoreError(f"{where} = {value!r} ({type(value).__name__}) cannot be stored as JSON")


def row_values(row: Any) -> dict[str, Any]:
    cols = type(row).__table__.columns
    return {c.name: getattr(row, c.key) for c in cols if getattr(row, c.key) is not None
            or c.nullable}


def result_columns(result: TrialResult) -> dict[str, Any]:
    """The result as the trial row's columns, as given (objective and its CI only for an ok trial)."""
    ok = result.state == "ok"
    ci = result.objective_ci if ok else None
    return dict(state=result.state, objective=result.objective if ok else None,
                objective_name=result.objective_name[:64] if result.objective_name else None,
                objective_ci_low=ci[0] if ci else None, objective_ci_high=ci[1] if ci else None,
                extra=jsonable(result.to_json(), "result"))


def diagnosis_values(result: TrialResult) -> dict[str, Any] | None:
    d = result.diagnosis
    if d is None:
        return None
    return {"verdict": d.verdict, "against_number": d.against, "detail": jsonable(d.to_json(), "diagnosis")}
