"""The trial store: open a database, record runs and trials, query them back.

    store = Store.open(url)                 # None -> $AUTOOPT_DB or sqlite:///db/autoopt.sqlite
    run_id = store.start_run(...)
    handle = store.begin_trial(run_id, study, params, config, decision)   # autoopt.trial.Decision
    store.finish_trial(handle, measurement, result)                       # autoopt.trial.TrialResult
    store.finish_run(run_id, "finished", "budget spent")

The store writes the records it is given as they are (it derives nothing: the loop computed the
result once). Writes of autoopt's rows are one write transaction each; Optuna's bookkeeping goes through its own
RDBStorage on the same URL (autoopt.store.optuna_bridge). Queries live in autoopt.store.queries.
"""
from __future__ import annotations

import math
import os
import socket
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Mapping

from sqlalchemy import select, update
from sqlalchemy.engine import Engine

import autoopt
from autoopt.errors import StoreError
from autoopt.measurement import Measurement
from autoopt.store import db, locks, optuna_bridge as ob
from autoopt.store.models import DiagnosisRow, Environment, Run, TrialRow
from autoopt.store.analysis import parse_objective
from autoopt.store.queries import StoreQueries
from autoopt.store.records import (TrialRecord, decision_columns, diagnosis_values, env_sha256, jsonable,
                                   measurement_rest, measurement_rows, result_columns, row_values, utcnow)
from autoopt.trial import FINISHED_STATES, Decision, DecisionSource, TrialResult


@dataclass(frozen=True)
class TrialHandle:
    """A trial in flight: created RUNNING in Optuna and in autoopt_trials."""

    trial_id: int  # Optuna's trial_id (also autoopt_trials.trial_id)
    number: int
    study_name: str
    run_id: int | None
    params: dict[str, Any]
    started_at: datetime


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class Store(StoreQueries):
    def __init__(self, url: str, engine: Engine, busy_timeout_s: float) -> None:
        self.url = url
        self.engine = engine
        self._busy_timeout_s = busy_timeout_s
        self._storage: Any = None
        self._studies: dict[str, Any] = {}
        self._own_runs: set[int] = set()
        self._host = socket.gethostname()

    # ---- opening -------------------------------------------------------------------------------
    @classmethod
    def open(cls, url: str | None = None, *, create: bool = True,
             busy_timeout_s: float = db.DEFAULT_BUSY_TIMEOUT_S) -> "Store":
        """Open and migrate to head (create=True: create if missing), or, with create=False, open an
        existing database for reading: SQLite read-only (a database on read-only storage reads too),
        the schema checked against this code's head revision and never migrated. StoreError when the
        URL is invalid or unreachable, the file is not a database, or its schema does not fit."""
        resolved, is_default = db.resolve_url(url)
        db.check_reachable(resolved, create=create, is_default=is_default)
        engine = db.make_engine(resolved, busy_timeout_s=busy_timeout_s, read_only=not create)
        try:
            db.ping(engine, resolved)
            if not create:
                db.check_readable(engine, resolved)
            elif db.needs_migration(engine, resolved):  # checked again under the lock
                with locks.setup_lock(resolved):
                    db.migrate(engine, resolved)
        except StoreError:
            engine.dispose()
            raise
        return cls(resolved, engine, busy_timeout_s)

    def close(self) -> None:
        if self._storage is not None:
            self._storage.engine.dispose()
            self._storage = None
        self._studies.clear()
        self.engine.dispose()

    def __enter__(self) -> "Store":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # ---- Optuna --------------------------------------------------------------------------------
    @property
    def optuna_storage(self) -> Any:
        if self._storage is None:
            self._storage = ob.make_storage(self.url, self._busy_timeout_s)
        return self._storage

    def optuna_study(self, name: str, direction: str = "maximize") -> Any:
        """The Optuna study `name` on this database (created if missing)."""
        if name not in self._studies:
            self._studies[name] = ob.get_study(self.optuna_storage, name, direction)
        return self._studies[name]

    # ---- runs ----------------------------------------------------------------------------------
    def start_run(self, study_name: str, command_line: str, space_name: str | None,
                  space_sha256: str | None, target: str | None, preset: str | None,
                  seed: int | None, settings: dict[str, Any]) -> int:
        """Record one `autoopt run`. settings["objective"] (e.g. "tok_per_s@16") names the objective."""
        if settings.get("objective") is not None:
            parse_objective(str(settings["objective"]))  # fail now, not at `best`
        self.optuna_study(study_name)
        row = Run(study_name=study_name, state="running", stop_reason=None, command_line=command_line,
                  space_name=space_name, space_sha256=space_sha256, target=target, preset=preset,
                  seed=seed, settings=jsonable(settings, "settings"), host=self._host,
                  pid=os.getpid(), autoopt_version=autoopt.__version__, started_at=utcnow(),
                  finished_at=None)
        with self._write("start a run") as conn:
            run_id = conn.execute(Run.__table__.insert().values(**row_values(row))).inserted_primary_key[0]
        self._own_runs.add(int(run_id))
        return int(run_id)

    def finish_run(self, run_id: int, state: str, stop_reason: str) -> None:
        with self._write("finish a run") as conn:
            n = conn.execute(update(Run).where(Run.id == run_id).values(
                state=state, stop_reason=stop_reason, finished_at=utcnow())).rowcount
        if n != 1:
            raise StoreError(f"no run {run_id} in {db.display_url(self.url)}")

    # ---- trials --------------------------------------------------------------------------------
    def begin_trial(self, run_id: int | None, study_name: str, params: dict[str, Any],
                    config: dict[str, Any], decision: Decision | None,
                    *, distributions: Mapping[str, Any] | None = None,
                    baseline: bool | None = None) -> TrialHandle:
        """Create the trial RUNNING in Optuna (with `params`) and in autoopt_trials.

        distributions: optional {param: optuna distribution | list of choices}; without one, a param
        reuses the study's earlier distribution for that name, else it is kept only in the Optuna
        user attribute "autoopt:params". baseline: default = decision.source == "baseline", or
        (no decision) trial number 0."""
        params_j = jsonable(params, "params")
        config_j = jsonable(config, "config")
        storage = self.optuna_storage
        study_id = self.optuna_study(study_name)._study_id
        known = ob.known_distributions(storage, study_id) if set(params) - set(distributions or {}) else {}
        rec_params, rec_dists = ob.split_params(params, distributions, known)
        trial_id, number = ob.create_running_trial(storage, study_id, rec_params, rec_dists,
                                                   params_j, run_id)
        if baseline is None:
            baseline = decision.kind is DecisionSource.BASELINE if decision is not None else number == 0
        started = utcnow()
        row = TrialRow(trial_id=trial_id, study_name=study_name, number=number, run_id=run_id,
                       state="running", is_baseline=bool(baseline), params=params_j, config=config_j,
                       started_at=started)
        if decision is not None:
            for column, value in decision_columns(decision).items():
                setattr(row, column, value)
        with self._write(f"record trial {number}") as conn:
            conn.execute(TrialRow.__table__.insert().values(**row_values(row)))
        return TrialHandle(trial_id, number, study_name, run_id, params_j, started)

    def finish_trial(self, handle: TrialHandle, measurement: Measurement, result: TrialResult) -> TrialRecord:
        """Store the measurement and the loop's result as given, and tell Optuna (COMPLETE with the
        objective when the result is ok; FAIL otherwise). The result's diagnosis also goes to the
        diagnoses table."""
        if result.objective is not None and not math.isfinite(result.objective):
            raise StoreError(f"trial {handle.number}: objective {result.objective!r} is not a finite number")
        failure = measurement.failure
        fp = jsonable(measurement.environment or {}, "measurement.environment")
        values = dict(
            result_columns(result),
            failure_kind=failure.kind if failure else None,
            failure_reason=failure.reason if failure else None,
            stderr_tail=failure.stderr_tail if failure else None,
            peak_memory_bytes=measurement.peak_memory_bytes, bucket_coverage=measurement.bucket_coverage,
            kernel_count=measurement.kernel_count,
            measurement_rest=jsonable(measurement_rest(measurement), "measurement"),
            config=jsonable(measurement.config or {}, "measurement.config") or None,
            finished_at=utcnow())
        if values["config"] is None:
            del values["config"]
        rows = measurement_rows(handle.trial_id, measurement)
        with self._write(f"store trial {handle.number}") as conn:
            if fp:
                values["environment_id"] = self._environment_id(conn, fp)
            n = conn.execute(update(TrialRow).where(TrialRow.trial_id == handle.trial_id)
                             .values(**values)).rowcount
            if n != 1:
                raise StoreError(f"trial {handle.number} (id {handle.trial_id}) of study "
                                 f"{handle.study_name!r} is not in {db.display_url(self.url)}")
            for kind in ("throughput", "samples", "buckets", "costs"):
                if rows[kind]:
                    table = type(rows[kind][0]).__table__
                    conn.execute(table.insert(), [row_values(r) for r in rows[kind]])
            diag = diagnosis_values(result)
            if diag is not None:
                conn.execute(DiagnosisRow.__table__.insert().values(trial_id=handle.trial_id,
                                                                    created_at=utcnow(), **diag))
        reason = f"{failure.kind}: {failure.reason}" if failure else None
        ob.tell(self.optuna_storage, handle.trial_id, values["objective"], values["state"], reason)
        return self.trial(handle.study_name, handle.number)

    # ---- runs at the same time -----------------------------------------------------------------
    def live_runs(self, study_name: str) -> set[int]:
        """Runs of the study still at work: this Store's own, those whose process is alive on this
        host, and those on other hosts still marked running (cannot tell there)."""
        return {r.id for r in self.runs(study_name) if r.state == "running" and self._run_live(r)}

    def _run_live(self, run: Any) -> bool:
        if run.id in self._own_runs:
            return True
        if run.host != self._host:
            return run.state == "running"
        return run.pid != os.getpid() and _pid_alive(run.pid)

    def busy_trials(self, study_name: str, run_id: int | None) -> list[TrialRecord]:
        """What the study's other live runs are doing now: their running trials (number order)."""
        live = self.live_runs(study_name) - {run_id}
        return [t for t in self.trials(study_name, ("running",), with_samples=False) if t.run_id in live]

    def session_baseline(self, study_name: str, run_id: int | None) -> TrialRecord | None:
        """The baseline another live run of the study is measuring or measured (runs at the same
        time share one), the latest of them; None when none has."""
        live = self.live_runs(study_name) - {run_id}
        found = [t for t in self.trials(study_name, ("running", "ok"), with_samples=False)
                 if t.is_baseline and t.run_id in live]
        return found[-1] if found else None

    def measure_turn(self, should_stop: Any = None) -> Any:
        """This host's turn to measure (autoopt.store.locks.measure_turn)."""
        return locks.measure_turn(self.url, self._host, should_stop or (lambda: False))

    def claim(self, study_name: str, should_stop: Any = None) -> Any:
        """The study's claim lock (autoopt.store.locks.study_claim): check what others measure and
        begin a trial as one step."""
        return locks.study_claim(self.url, study_name, should_stop or (lambda: False))

    def mark_interrupted(self, study_name: str) -> list[TrialRecord]:
        """Trials left RUNNING by a process that is gone -> state "interrupted" (Optuna FAIL).

        A trial is left alone while its run is this Store's, or its run's process is alive on this
        host, or its run is on another host and still "running" (cannot tell there). Returns the
        interrupted trials (number order) so the loop can re-run them first. Also ends their runs."""
        storage = self.optuna_storage
        study_id = self.optuna_study(study_name)._study_id
        runs = {r.id: r for r in self.runs(study_name)}
        ours = {t.trial_id: t for t in self.trials(study_name, states=("running",), with_samples=False)}
        optuna_running = {t._trial_id: t for t in ob.running_trials(storage, study_id)}
        dead_runs: set[int] = set()

        def live(run_id: int | None) -> bool:
            if run_id is None or run_id not in runs:
                return False
            if run_id in self._own_runs:
                return True
            run = runs[run_id]
            if run.host != self._host:
                return run.state == "running"
            alive = run.pid != os.getpid() and _pid_alive(run.pid)
            if not alive:
                dead_runs.add(run_id)
            return alive

        interrupted: list[int] = []
        for trial_id in sorted(set(ours) | set(optuna_running)):
            rec, frozen = ours.get(trial_id), optuna_running.get(trial_id)
            run_id = rec.run_id if rec else frozen.system_attrs.get(ob.RUN_ID_ATTR)
            if live(run_id):
                continue
            row_state = self._row_state(trial_id)
            if row_state in FINISHED_STATES:  # died between our write and Optuna's tell
                done = self.trial(study_name, f"id:{trial_id}")
                ob.tell(storage, trial_id, done.objective, done.state, None)
                continue
            reason = (f"the process of run {run_id} ({runs[run_id].host} pid {runs[run_id].pid}) ended "
                      f"before the trial finished" if run_id in runs else "its process ended")
            if row_state is None:  # died between Optuna's trial and our row
                self._insert_orphan(study_name, frozen, run_id)
            with self._write(f"mark trial {trial_id} interrupted") as conn:
                conn.execute(update(TrialRow).where(TrialRow.trial_id == trial_id).values(
                    state="interrupted", failure_kind="interrupted", failure_reason=reason,
                    finished_at=utcnow()))
            ob.tell(storage, trial_id, None, "interrupted", f"interrupted: {reason}")
            interrupted.append(trial_id)
        for run_id, run in runs.items():
            if run.state == "running" and run.host == self._host and run_id not in self._own_runs \
                    and (run_id in dead_runs or not live(run_id)):
                self.finish_run(run_id, "interrupted", "the process ended without finishing the run")
        return [self.trial(study_name, f"id:{tid}") for tid in interrupted]

    # ---- internals -----------------------------------------------------------------------------
    def _write(self, what: str) -> Any:
        return db.guarded_write(self.engine, self.url, what)

    def _row_state(self, trial_id: int) -> str | None:
        with self.engine.connect() as conn:
            return conn.execute(select(TrialRow.state).where(TrialRow.trial_id == trial_id)).scalar()

    def _insert_orphan(self, study_name: str, frozen: Any, run_id: int | None) -> None:
        params = dict(frozen.user_attrs.get(ob.PARAMS_ATTR) or frozen.params)
        with self._write(f"record orphan trial {frozen.number}") as conn:
            conn.execute(TrialRow.__table__.insert().values(
                trial_id=frozen._trial_id, study_name=study_name, number=frozen.number,
                run_id=run_id if run_id is not None else None, state="running", is_baseline=False,
                params=jsonable(params, "params"), config={}, started_at=utcnow()))

    def _environment_id(self, conn: Any, fingerprint: dict[str, Any]) -> int:
        sha = env_sha256(fingerprint)
        found = conn.execute(select(Environment.id).where(Environment.sha256 == sha)).scalar()
        if found is not None:
            return int(found)
        values = dict(sha256=sha, fingerprint=fingerprint, first_seen_at=utcnow())
        if conn.dialect.name == "postgresql":
            # another process may insert the same environment between the select and the insert
            # (SQLite's BEGIN IMMEDIATE rules that out; PostgreSQL's read committed does not: two
            # runs starting together clashed on the unique sha256 in tests/test_postgres.py)
            from sqlalchemy.dialects.postgresql import insert as pg_insert

            conn.execute(pg_insert(Environment.__table__).values(**values)
                         .on_conflict_do_nothing(index_elements=["sha256"]))
            return int(conn.execute(select(Environment.id).where(Environment.sha256 == sha)).scalar_one())
        return int(conn.execute(Environment.__table__.insert().values(**values)).inserted_primary_key[0])
