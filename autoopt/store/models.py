"""autoopt's own tables (SQLAlchemy 2 declarative). Optuna's tables live beside them, untouched.

Every table is prefixed `autoopt_` so it can never collide with Optuna's (`studies`, `trials`, ...).
A trial row is keyed by Optuna's `trials.trial_id` (no declared foreign key into Optuna's schema, so
Optuna's own migrations stay free to rebuild its tables). Figures a person queries (tok/s per
concurrency, each timing sample, buckets, costs) are rows; documents (params, config, correctness,
what ran, environment fingerprint, settings, decision extras) are JSON columns. No pickles.
Times are naive UTC. db/README.md describes every column.

A schema change = edit here + a new file in migrations/versions/ (batch ops for SQLite).
"""
from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import JSON, BigInteger, Boolean, DateTime, Float, ForeignKey, Integer, String, Text
from sqlalchemy import UniqueConstraint
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column


class Base(DeclarativeBase):
    pass


class Run(Base):
    """One `autoopt run` invocation (several may append to one study: resume, parallel workers)."""

    __tablename__ = "autoopt_runs"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    study_name: Mapped[str] = mapped_column(String(512), index=True)
    state: Mapped[str] = mapped_column(String(32))  # running | finished | interrupted | failed | ...
    stop_reason: Mapped[str | None] = mapped_column(Text)
    command_line: Mapped[str] = mapped_column(Text)
    space_name: Mapped[str | None] = mapped_column(String(256))
    space_sha256: Mapped[str | None] = mapped_column(String(64))
    target: Mapped[str | None] = mapped_column(String(256))
    preset: Mapped[str | None] = mapped_column(String(256))
    seed: Mapped[int | None] = mapped_column(Integer)
    settings: Mapped[dict[str, Any]] = mapped_column(JSON)
    host: Mapped[str] = mapped_column(String(256))
    pid: Mapped[int] = mapped_column(Integer)
    autoopt_version: Mapped[str] = mapped_column(String(64))
    started_at: Mapped[datetime] = mapped_column(DateTime)
    finished_at: Mapped[datetime | None] = mapped_column(DateTime)


class Environment(Base):
    """A measured environment fingerprint, stored once (trials point at it)."""

    __tablename__ = "autoopt_environments"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    sha256: Mapped[str] = mapped_column(String(64), unique=True)
    fingerprint: Mapped[dict[str, Any]] = mapped_column(JSON)
    first_seen_at: Mapped[datetime] = mapped_column(DateTime)


class TrialRow(Base):
    """autoopt's record of one Optuna trial."""

    __tablename__ = "autoopt_trials"
    __table_args__ = (UniqueConstraint("study_name", "number", name="uq_autoopt_trials_study_number"),)

    trial_id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=False)  # Optuna's
    study_name: Mapped[str] = mapped_column(String(512), index=True)
    number: Mapped[int] = mapped_column(Integer)  # Optuna's trial number within the study
    run_id: Mapped[int | None] = mapped_column(ForeignKey("autoopt_runs.id"), index=True)
    state: Mapped[str] = mapped_column(String(16), index=True)  # running|ok|wrong|failed|interrupted
    is_baseline: Mapped[bool] = mapped_column(Boolean, default=False)
    params: Mapped[dict[str, Any]] = mapped_column(JSON)
    config: Mapped[dict[str, Any]] = mapped_column(JSON)
    objective_name: Mapped[str | None] = mapped_column(String(64))  # e.g. "tok_per_s@16"
    objective: Mapped[float | None] = mapped_column(Float)
    objective_ci_low: Mapped[float | None] = mapped_column(Float)
    objective_ci_high: Mapped[float | None] = mapped_column(Float)
    decision_source: Mapped[str | None] = mapped_column(String(128))
    decision_reason: Mapped[str | None] = mapped_column(Text)
    expected_gain: Mapped[float | None] = mapped_column(Float)
    expected_gain_sd: Mapped[float | None] = mapped_column(Float)
    expected_cost_s: Mapped[float | None] = mapped_column(Float)
    decision_extra: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    failure_kind: Mapped[str | None] = mapped_column(String(32))
    failure_reason: Mapped[str | None] = mapped_column(Text)
    stderr_tail: Mapped[str | None] = mapped_column(Text)
    environment_id: Mapped[int | None] = mapped_column(ForeignKey("autoopt_environments.id"))
    peak_memory_bytes: Mapped[int | None] = mapped_column(BigInteger)
    bucket_coverage: Mapped[float | None] = mapped_column(Float)
    kernel_count: Mapped[int | None] = mapped_column(Integer)
    # the rest of the Measurement document (status, correctness, what_ran, unknown future fields);
    # the parts stored as rows (tok/s, samples, mbu, buckets, costs, environment, failure) are not here
    measurement_rest: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    extra: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    started_at: Mapped[datetime] = mapped_column(DateTime)
    finished_at: Mapped[datetime | None] = mapped_column(DateTime)


class ThroughputRow(Base):
    """tok/s at one concurrency: median and its 95 % CI (+ MBU)."""

    __tablename__ = "autoopt_throughput"

    trial_id: Mapped[int] = mapped_column(ForeignKey("autoopt_trials.trial_id", ondelete="CASCADE"),
                                          primary_key=True)
    concurrency: Mapped[int] = mapped_column(Integer, primary_key=True)
    median: Mapped[float] = mapped_column(Float)
    ci_low: Mapped[float] = mapped_column(Float)
    ci_high: Mapped[float] = mapped_column(Float)
    n: Mapped[int] = mapped_column(Integer)
    mbu: Mapped[float | None] = mapped_column(Float)


class SampleRow(Base):
    """Every timed decode step (seconds), in the order measured."""

    __tablename__ = "autoopt_samples"

    trial_id: Mapped[int] = mapped_column(ForeignKey("autoopt_trials.trial_id", ondelete="CASCADE"),
                                          primary_key=True)
    concurrency: Mapped[int] = mapped_column(Integer, primary_key=True)
    idx: Mapped[int] = mapped_column(Integer, primary_key=True)
    step_s: Mapped[float] = mapped_column(Float)


class BucketRow(Base):
    """Profile bucket time, ms per decode step."""

    __tablename__ = "autoopt_buckets"

    trial_id: Mapped[int] = mapped_column(ForeignKey("autoopt_trials.trial_id", ondelete="CASCADE"),
                                          primary_key=True)
    bucket: Mapped[str] = mapped_column(String(128), primary_key=True)
    position: Mapped[int] = mapped_column(Integer)
    ms: Mapped[float] = mapped_column(Float)


class CostRow(Base):
    """Seconds one phase of the trial took (restart, build, compile, warmup, measure, ..., total)."""

    __tablename__ = "autoopt_costs"

    trial_id: Mapped[int] = mapped_column(ForeignKey("autoopt_trials.trial_id", ondelete="CASCADE"),
                                          primary_key=True)
    phase: Mapped[str] = mapped_column(String(64), primary_key=True)
    position: Mapped[int] = mapped_column(Integer)
    seconds: Mapped[float] = mapped_column(Float)


class DiagnosisRow(Base):
    """A one-line diagnosis of a trial (e.g. "GEMM -505 ms, copies +310 ms: the casts ate 61 %")."""

    __tablename__ = "autoopt_diagnoses"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    trial_id: Mapped[int] = mapped_column(ForeignKey("autoopt_trials.trial_id", ondelete="CASCADE"),
                                          index=True)
    against_number: Mapped[int | None] = mapped_column(Integer)  # the trial it was compared with
    verdict: Mapped[str] = mapped_column(Text)
    detail: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    created_at: Mapped[datetime] = mapped_column(DateTime)


AUTOOPT_TABLES = tuple(sorted(Base.metadata.tables))
