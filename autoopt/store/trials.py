"""The trial store: open a database, record runs and trials, query them back.

    store = Store.open(url)                 # None -> $AUTOOPT_DB or sqlite:///db/autoopt.sqlite
    run_id = store.start_run(...)
    handle = store.begin_trial(run_id, study, params, config, decision)
    store.finish_trial(handle, measurement, objective, extra)
    store.finish_run(run_id, "finished", "budget spent")

Writes of autoopt's rows are one write transaction each; Optuna's bookkeeping goes through its own
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
from autoopt.results import Measurement
from autoopt.store import db, optuna_bridge as ob
from autoopt.store.models import DiagnosisRow, Environment, Run, TrialRow
from autoopt.store.analysis import concurrency_of, parse_objective
from autoopt.store.queries import StoreQueries
from autoopt.store.records import (FINISHED_STATES, TrialRecord, diagnosis_values, env_sha256, jsonable,
                                   measurement_rest, measurement_rows, row_values, utcnow)
from autoopt.strategy import Decision


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
        """Open (create=True: create if missing) and migrate to head. StoreError when the URL is
        invalid or unreachable, the file is not a database, or its schema is newer than this code."""
        resolved, is_default = db.resolve_url(url)
        db.check_reachable(resolved, create=create, is_default=is_default)
        engine = db.make_engine(resolved, busy_timeout_s=busy_timeout_s)
        try:
            db.ping(engine, resolved)
            if db.needs_migration(engine, resolved):  # checked again under the lock
                with db.setup_lock(resolved):
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
            baseline = decision.source == "baseline" if decision is not None else number == 0
        started = utcnow()
        row = TrialRow(trial_id=trial_id, study_name=study_name, number=number, run_id=run_id,
                       state="running", is_baseline=bool(baseline), params=params_j, config=config_j,
                       started_at=started)
        if decision is not None:
            row.decision_source, row.decision_reason = decision.source, decision.reason
            row.expected_gain, row.expected_gain_sd = decision.expected_gain, decision.expected_gain_sd
            row.expected_cost_s = decision.expected_cost_s
            row.decision_extra = jsonable(decision.extra, "decision.extra")
        with self._write(f"record trial {number}") as conn:
            conn.execute(TrialRow.__table__.insert().values(**row_values(row)))
        return TrialHandle(trial_id, number, study_name, run_id, params_j, started)

    def finish_trial(self, handle: TrialHandle, measurement: Measurement, objective: float | None,
                     extra: dict[str, Any] | None = None) -> TrialRecord:
        """Store the measurement and tell Optuna (COMPLETE with `objective` when status is ok and
        the objective finite; FAIL otherwise). extra: e.g. {"actual_gain", "incumbent_number",
        "diagnosis": str | {"verdict", ...}, "transition_s", "objective_name"}."""
        extra_j = jsonable(extra or {}, "extra")
        if objective is not None and not math.isfinite(objective):
            objective = None
        failure = measurement.failure
        state = "interrupted" if failure is not None and failure.kind == "interrupted" else measurement.status
        name, ci = self._objective_ci(handle.run_id, measurement, objective, extra_j)
        fp = jsonable(measurement.environment or {}, "measurement.environment")
        values = dict(
            state=state, objective=objective if state == "ok" else None, objective_name=name,
            objective_ci_low=ci[0] if ci and state == "ok" else None,
            objective_ci_high=ci[1] if ci and state == "ok" else None,
            failure_kind=failure.kind if failure else None,
            failure_reason=failure.reason if failure else None,
            stderr_tail=failure.stderr_tail if failure else None,
            peak_memory_bytes=measurement.peak_memory_bytes, bucket_coverage=measurement.bucket_coverage,
            kernel_count=measurement.kernel_count,
            measurement_rest=jsonable(measurement_rest(measurement), "measurement"),
            config=jsonable(measurement.config or {}, "measurement.config") or None,
            extra=extra_j, finished_at=utcnow())
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
            diag = diagnosis_values(extra_j)
            if diag is not None:
                conn.execute(DiagnosisRow.__table__.insert().values(trial_id=handle.trial_id,
                                                                    created_at=utcnow(), **diag))
        reason = f"{failure.kind}: {failure.reason}" if failure else None
        ob.tell(self.optuna_storage, handle.trial_id, values["objective"], state, reason)
        return self.trial(handle.study_name, handle.number)

    def record_diagnosis(self, study_name: str, number: int, verdict: str,
                         against_number: int | None = None, detail: dict[str, Any] | None = None) -> None:
        t = self.trial(study_name, number)
        with self._write(f"record a diagnosis of trial {number}") as conn:
            conn.execute(DiagnosisRow.__table__.insert().values(
                trial_id=t.trial_id, against_number=against_number, verdict=verdict,
                detail=jsonable(detail, "detail"), created_at=utcnow()))

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

    def _objective_ci(self, run_id: int | None, m: Measurement, objective: float | None,
                      extra: dict[str, Any]) -> tuple[str | None, tuple[float, float] | None]:
        """Which figure the objective is and its CI.

        Name: extra["objective_name"], else the run's settings["objective"] ("tok_per_s@C"), else
        "tok_per_s@C" for the concurrency whose median equals the objective (a weighted mix of
        several concurrencies has no such C: name None). CI: extra["objective_ci"] when the loop
        computed it, else the named concurrency's CI when the objective is that median."""
        name = extra.get("objective_name")
        if name is None and run_id is not None:
            settings = self._run_settings(run_id)
            if settings.get("objective"):
                name = str(settings["objective"])
        ci = None
        given = extra.get("objective_ci")
        if isinstance(given, (list, tuple)) and len(given) == 2 and None not in given:
            ci = (float(given[0]), float(given[1]))
        match = None
        if objective is not None:
            match = next((c for c, tp in m.tok_per_s.items()
                          if math.isclose(tp.median, objective, rel_tol=1e-9)), None)
        if name is not None:
            c = concurrency_of(str(name))
            if c is not None and ci is None and match == str(c):
                tp = m.tok_per_s[str(c)]
                ci = (tp.ci_low, tp.ci_high)
            return str(name)[:64], ci
        if match is not None:
            tp = m.tok_per_s[match]
            return f"tok_per_s@{match}", ci or (tp.ci_low, tp.ci_high)
        return None, ci

    def _run_settings(self, run_id: int) -> dict[str, Any]:
        with self.engine.connect() as conn:
            return dict(conn.execute(select(Run.settings).where(Run.id == run_id)).scalar() or {})
