"""Read side of the store: studies, runs, trials, the baseline, as plain SQL over two connections.

StoreQueries is mixed into Store (its reads go through the SQLAlchemy engine, SQLite or PostgreSQL)
and into autoopt.store.reading.SqliteReader, which reads a SQLite file through the standard
library's sqlite3 alone (the reading commands never import SQLAlchemy or Optuna for a SQLite file:
autoopt.store.sqlite_files says why). Both run the same statements and decode the same columns, so
a record reads the same either way (tests/test_history_readers.py compares them).
Reads run in one transaction each: a consistent snapshot under SQLite WAL.
"""
from __future__ import annotations

import json
import sqlite3
from collections import defaultdict
from datetime import datetime
from types import SimpleNamespace
from typing import Any, Callable, Iterable, Sequence

from autoopt.errors import StoreError, UserError
from autoopt.store.driver_errors import explain
from autoopt.store.records import RunRecord, TrialRecord, iso, rebuild_measurement, run_record, trial_record
from autoopt.trial import TRIAL_STATES

_CHUNK = 500  # ids per IN (...) query
# How the driver hands each kind of column back to plain SQL (SQLite: JSON and times as text, booleans
# as 0/1): decoded here the way SQLAlchemy's column types would (tests check this against models.py).
JSON_COLUMNS = frozenset({"params", "config", "settings", "decision_extra", "measurement_rest", "extra",
                          "fingerprint", "detail"})
TIME_COLUMNS = frozenset({"started_at", "finished_at", "created_at"})
BOOL_COLUMNS = frozenset({"is_baseline"})
TABLE_COLUMNS = {
    "autoopt_runs": ("id", "study_name", "state", "stop_reason", "command_line", "space_name", "space_sha256",
                     "target", "preset", "seed", "settings", "host", "pid", "autoopt_version", "started_at",
                     "finished_at"),
    "autoopt_trials": ("trial_id", "study_name", "number", "run_id", "state", "is_baseline", "params", "config",
                       "objective_name", "objective", "objective_ci_low", "objective_ci_high", "decision_source",
                       "decision_reason", "expected_gain", "expected_gain_sd", "expected_cost_s",
                       "decision_extra", "failure_kind", "failure_reason", "stderr_tail", "environment_id",
                       "peak_memory_bytes", "bucket_coverage", "kernel_count", "measurement_rest", "extra",
                       "started_at", "finished_at"),
    "autoopt_throughput": ("trial_id", "concurrency", "median", "ci_low", "ci_high", "n", "mbu"),
    "autoopt_samples": ("trial_id", "concurrency", "idx", "step_s"),
    "autoopt_buckets": ("trial_id", "bucket", "position", "ms"),
    "autoopt_costs": ("trial_id", "phase", "position", "seconds"),
    "autoopt_diagnoses": ("id", "trial_id", "against_number", "verdict", "detail", "created_at"),
}
_CHILDREN = {"throughput": "autoopt_throughput", "buckets": "autoopt_buckets", "costs": "autoopt_costs",
             "diag": "autoopt_diagnoses", "samples": "autoopt_samples"}


def _select(table: str, where: str = "", tail: str = "") -> str:
    return f"SELECT {', '.join(TABLE_COLUMNS[table])} FROM {table}" + (f" WHERE {where}" if where else "") + tail


def _json(value: Any) -> Any:
    return json.loads(value) if isinstance(value, (str, bytes)) else value  # PostgreSQL's driver parses JSON


def _time(value: Any) -> Any:
    return datetime.fromisoformat(value) if isinstance(value, str) else value


def _decoder(name: str) -> Callable[[Any], Any] | None:
    return _json if name in JSON_COLUMNS else _time if name in TIME_COLUMNS else bool if name in BOOL_COLUMNS else None


def _rows(keys: Sequence[str], raw: Iterable[Sequence[Any]]) -> list[SimpleNamespace]:
    decoders = [(i, fn) for i, fn in enumerate(map(_decoder, keys)) if fn is not None]
    out = []
    for r in raw:
        values = list(r)
        for i, fn in decoders:
            if values[i] is not None:
                values[i] = fn(values[i])
        out.append(SimpleNamespace(**dict(zip(keys, values))))
    return out


def _in(name: str, values: Sequence[Any]) -> tuple[str, dict[str, Any]]:
    """`IN (:name0, :name1, ...)` and its parameters (the same text runs on both drivers)."""
    params = {f"{name}{i}": v for i, v in enumerate(values)}
    return "IN (" + ", ".join(f":{k}" for k in params) + ")", params


class Sqlite3Reads:
    def __init__(self, conn: sqlite3.Connection) -> None:
        self._conn = conn

    def rows(self, sql: str, params: dict[str, Any] | None = None) -> list[SimpleNamespace]:
        cur = self._conn.execute(sql, params or {})
        return _rows([d[0] for d in cur.description], cur.fetchall())


class _EngineReads:
    def __init__(self, conn: Any) -> None:
        from sqlalchemy import text

        self._conn, self._text = conn, text

    def rows(self, sql: str, params: dict[str, Any] | None = None) -> list[SimpleNamespace]:
        result = self._conn.execute(self._text(sql), params or {})
        return _rows(list(result.keys()), result)


class StoreQueries:
    url: str
    engine: Any

    def _read(self, what: str, fn: Callable[[Any], Any]) -> Any:
        from sqlalchemy.exc import DatabaseError

        try:
            with self.engine.connect() as conn, conn.begin():
                return fn(_EngineReads(conn))
        except DatabaseError as exc:
            raise StoreError(f"cannot read {what} from {self.shown_url()}: {explain(exc)}") from None

    def shown_url(self) -> str:
        """The URL as it may be printed (password hidden)."""
        from autoopt.store.db import display_url

        return display_url(self.url)

    # ---- studies & runs ------------------------------------------------------------------------
    def studies(self) -> list[str]:
        """Study names known to autoopt, most recently active first."""
        sql = ("SELECT s, MAX(t) AS last FROM (SELECT study_name AS s, started_at AS t FROM autoopt_runs "
               "UNION ALL SELECT study_name AS s, started_at AS t FROM autoopt_trials) acts "
               "GROUP BY s ORDER BY MAX(t) DESC, s")
        return [r.s for r in self._read("the list of studies", lambda conn: conn.rows(sql))]

    def latest_study(self) -> str:
        """The most recently active study; UserError when the database has none."""
        names = self.studies()
        if not names:
            raise UserError(f"no studies in {self.shown_url()}: run `autoopt run` first")
        return names[0]

    def resolve_study(self, name: str | None) -> str:
        """`name` if the database has it (UserError otherwise), else the latest study."""
        if name is None:
            return self.latest_study()
        names = self.studies()
        if name not in names:
            known = ", ".join(names[:8]) or "none"
            raise UserError(f"no study {name!r} in {self.shown_url()} (studies: {known})")
        return name

    def runs(self, study_name: str) -> list[RunRecord]:
        sql = _select("autoopt_runs", "study_name = :s", " ORDER BY id")
        rows = self._read(f"the runs of study {study_name!r}", lambda conn: conn.rows(sql, {"s": study_name}))
        return [run_record(r) for r in rows]

    # ---- trials --------------------------------------------------------------------------------
    def trials(self, study_name: str, states: Sequence[str] | None = None, *,
               with_samples: bool = True) -> list[TrialRecord]:
        """Trials of the study in number order, optionally only those in `states`."""
        where, params = "study_name = :s", {"s": study_name}
        if states is not None:
            bad = [s for s in states if s not in TRIAL_STATES]
            if bad:
                raise UserError(f"unknown trial state(s) {bad}: expected some of {TRIAL_STATES}")
            clause, more = _in("state", list(states))
            where, params = f"{where} AND state {clause}", {**params, **more}
        sql = _select("autoopt_trials", where, " ORDER BY number")
        return self._read(f"the trials of study {study_name!r}",
                          lambda conn: _load(conn, conn.rows(sql, params), with_samples))

    def trial(self, study_name: str, number_or_id: int | str) -> TrialRecord:
        """One trial by number (12, "12", "#12") or by Optuna trial id ("id:345"). UserError if none."""
        key = str(number_or_id).strip()
        try:
            if key.startswith("id:"):
                col, value, label = "trial_id", int(key[3:]), f"with trial id {key[3:]}"
            else:
                col, value, label = "number", int(key.lstrip("#")), f"{key.lstrip('#')}"
        except ValueError:
            raise UserError(f"trial {number_or_id!r} is not a trial number (e.g. 12) or an Optuna "
                            f"trial id (e.g. id:345)") from None
        sql = _select("autoopt_trials", f"study_name = :s AND {col} = :v")
        found = self._read(f"trial {key}", lambda conn: _load(conn, conn.rows(sql, {"s": study_name, "v": value}),
                                                              True))
        if not found:
            count = ("SELECT MIN(number) AS lo, MAX(number) AS hi, COUNT(*) AS n FROM autoopt_trials "
                     "WHERE study_name = :s")
            have = self._read("trial numbers", lambda conn: conn.rows(count, {"s": study_name}))[0]
            told = f"it has trials {have.lo}-{have.hi}" if have.n else "it has no trials"
            raise UserError(f"study {study_name!r} in {self.shown_url()} has no trial {label} ({told})")
        return found[0]

    def baseline(self, study_name: str) -> TrialRecord | None:
        """The first successful trial flagged baseline (trial 0 unless a decision said otherwise)."""
        sql = _select("autoopt_trials", "study_name = :s AND state = 'ok' AND is_baseline = :yes",
                      " ORDER BY number LIMIT 1")
        found = self._read(f"the baseline of study {study_name!r}",
                           lambda conn: _load(conn, conn.rows(sql, {"s": study_name, "yes": True}), True))
        return found[0] if found else None

    def study_summary(self, study_name: str) -> dict[str, Any]:
        """Counts per state and first/last activity (for headers and `--json`)."""
        sql = ("SELECT state, COUNT(*) AS n, MIN(started_at) AS started_at, MAX(finished_at) AS finished_at "
               "FROM autoopt_trials WHERE study_name = :s GROUP BY state")
        rows = self._read(f"a summary of study {study_name!r}", lambda conn: conn.rows(sql, {"s": study_name}))
        counts, first, last = {}, None, None
        for r in rows:
            counts[r.state] = r.n
            first = r.started_at if first is None or (r.started_at and r.started_at < first) else first
            last = r.finished_at if last is None or (r.finished_at and r.finished_at > last) else last
        return {"study": study_name, "counts": counts, "first_started_at": iso(first), "last_finished_at": iso(last)}


def _load(conn: Any, rows: list[Any], with_samples: bool) -> list[TrialRecord]:
    """Trial rows -> records with their measurement rebuilt from the child tables."""
    if not rows:
        return []
    ids = [r.trial_id for r in rows]
    children: dict[str, dict[int, list[Any]]] = {k: defaultdict(list) for k in _CHILDREN}
    kinds = [k for k in _CHILDREN if with_samples or k != "samples"]
    envs: dict[int, dict[str, Any]] = {}
    env_ids = sorted({r.environment_id for r in rows if r.environment_id is not None})
    for i in range(0, len(ids), _CHUNK):
        clause, params = _in("t", ids[i:i + _CHUNK])
        for kind in kinds:
            for obj in conn.rows(_select(_CHILDREN[kind], f"trial_id {clause}"), params):
                children[kind][obj.trial_id].append(obj)
    for i in range(0, len(env_ids), _CHUNK):
        clause, params = _in("e", env_ids[i:i + _CHUNK])
        for e in conn.rows(f"SELECT id, fingerprint FROM autoopt_environments WHERE id {clause}", params):
            envs[e.id] = e.fingerprint
    out = []
    for r in rows:
        tid = r.trial_id
        m = rebuild_measurement(r, children["throughput"][tid], children["samples"][tid],
                                children["buckets"][tid], children["costs"][tid],
                                envs.get(r.environment_id) if r.environment_id else None)
        diags = [{"verdict": d.verdict, "against_number": d.against_number, "detail": d.detail,
                  "created_at": iso(d.created_at)}
                 for d in sorted(children["diag"][tid], key=lambda d: d.id)]
        out.append(trial_record(r, m, diags))
    return out
