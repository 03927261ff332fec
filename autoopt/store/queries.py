"""Read side of the store (mixed into Store): studies, runs, trials, the baseline.

Reads run in one transaction each (a consistent snapshot under SQLite WAL) and never import Optuna,
so `autoopt history` stays fast on a laptop.
"""
from __future__ import annotations

from collections import defaultdict
from typing import Any, Iterable, Sequence

from sqlalchemy import func, select, union_all
from sqlalchemy.engine import Engine
from sqlalchemy.exc import DatabaseError
from sqlalchemy.orm import Session

from autoopt.errors import StoreError, UserError
from autoopt.store import db
from autoopt.store.models import (BucketRow, CostRow, DiagnosisRow, Environment, Run, SampleRow,
                                  ThroughputRow, TrialRow)
from autoopt.store.records import (TRIAL_STATES, RunRecord, TrialRecord, iso, rebuild_measurement,
                                   run_record, trial_record)

_CHUNK = 500  # ids per IN (...) query


def _chunks(ids: Sequence[int]) -> Iterable[Sequence[int]]:
    for i in range(0, len(ids), _CHUNK):
        yield ids[i:i + _CHUNK]


class StoreQueries:
    url: str
    engine: Engine

    def _read(self, what: str, fn: Any) -> Any:
        try:
            with Session(self.engine) as session, session.begin():
                return fn(session)
        except DatabaseError as exc:
            raise StoreError(f"cannot read {what} from {db.display_url(self.url)}: "
                             f"{db.first_line(exc)}") from None

    # ---- studies & runs ------------------------------------------------------------------------
    def studies(self) -> list[str]:
        """Study names known to autoopt, most recently active first."""
        def q(conn: Any) -> list[str]:
            acts = union_all(
                select(Run.study_name.label("s"), Run.started_at.label("t")),
                select(TrialRow.study_name.label("s"), TrialRow.started_at.label("t"))).subquery()
            rows = conn.execute(select(acts.c.s, func.max(acts.c.t).label("last"))
                                .group_by(acts.c.s).order_by(func.max(acts.c.t).desc(), acts.c.s))
            return [r[0] for r in rows]
        return self._read("the list of studies", q)

    def latest_study(self) -> str:
        """The most recently active study; UserError when the database has none."""
        names = self.studies()
        if not names:
            raise UserError(f"no studies in {db.display_url(self.url)}: run `autoopt run` first")
        return names[0]

    def resolve_study(self, name: str | None) -> str:
        """`name` if the database has it (UserError otherwise), else the latest study."""
        if name is None:
            return self.latest_study()
        names = self.studies()
        if name not in names:
            known = ", ".join(names[:8]) or "none"
            raise UserError(f"no study {name!r} in {db.display_url(self.url)} (studies: {known})")
        return name

    def runs(self, study_name: str) -> list[RunRecord]:
        def q(conn: Any) -> list[RunRecord]:
            rows = conn.scalars(select(Run).where(Run.study_name == study_name).order_by(Run.id))
            return [run_record(r) for r in rows]
        return self._read(f"the runs of study {study_name!r}", q)

    # ---- trials --------------------------------------------------------------------------------
    def trials(self, study_name: str, states: Sequence[str] | None = None, *,
               with_samples: bool = True) -> list[TrialRecord]:
        """Trials of the study in number order, optionally only those in `states`."""
        if states is not None:
            bad = [s for s in states if s not in TRIAL_STATES]
            if bad:
                raise UserError(f"unknown trial state(s) {bad}: expected some of {TRIAL_STATES}")
        stmt = select(TrialRow).where(TrialRow.study_name == study_name).order_by(TrialRow.number)
        if states is not None:
            stmt = stmt.where(TrialRow.state.in_(list(states)))
        return self._read(f"the trials of study {study_name!r}",
                          lambda conn: _load(conn, list(conn.scalars(stmt)), with_samples))

    def trial(self, study_name: str, number_or_id: int | str) -> TrialRecord:
        """One trial by number (12, "12", "#12") or by Optuna trial id ("id:345"). UserError if none."""
        key = str(number_or_id).strip()
        try:
            if key.startswith("id:"):
                col, value, label = TrialRow.trial_id, int(key[3:]), f"with trial id {key[3:]}"
            else:
                col, value, label = TrialRow.number, int(key.lstrip("#")), f"{key.lstrip('#')}"
        except ValueError:
            raise UserError(f"trial {number_or_id!r} is not a trial number (e.g. 12) or an Optuna "
                            f"trial id (e.g. id:345)") from None
        stmt = select(TrialRow).where(TrialRow.study_name == study_name, col == value)
        found = self._read(f"trial {key}", lambda conn: _load(conn, list(conn.scalars(stmt)), True))
        if not found:
            numbers = self._read("trial numbers", lambda conn: conn.execute(
                select(func.min(TrialRow.number), func.max(TrialRow.number), func.count())
                .where(TrialRow.study_name == study_name)).one())
            have = (f"it has trials {numbers[0]}-{numbers[1]}" if numbers[2] else "it has no trials")
            raise UserError(f"study {study_name!r} in {db.display_url(self.url)} has no trial {label} "
                            f"({have})")
        return found[0]

    def baseline(self, study_name: str) -> TrialRecord | None:
        """The first successful trial flagged baseline (trial 0 unless a decision said otherwise)."""
        stmt = (select(TrialRow).where(TrialRow.study_name == study_name, TrialRow.state == "ok",
                                       TrialRow.is_baseline.is_(True))
                .order_by(TrialRow.number).limit(1))
        found = self._read(f"the baseline of study {study_name!r}",
                           lambda conn: _load(conn, list(conn.scalars(stmt)), True))
        return found[0] if found else None

    def study_summary(self, study_name: str) -> dict[str, Any]:
        """Counts per state and first/last activity (for headers and `--json`)."""
        def q(conn: Any) -> dict[str, Any]:
            rows = conn.execute(select(TrialRow.state, func.count(), func.min(TrialRow.started_at),
                                       func.max(TrialRow.finished_at))
                                .where(TrialRow.study_name == study_name).group_by(TrialRow.state))
            counts, first, last = {}, None, None
            for state, n, t0, t1 in rows:
                counts[state] = n
                first = t0 if first is None or (t0 and t0 < first) else first
                last = t1 if last is None or (t1 and t1 > last) else last
            return {"study": study_name, "counts": counts, "first_started_at": iso(first),
                    "last_finished_at": iso(last)}
        return self._read(f"a summary of study {study_name!r}", q)


def _load(conn: Any, rows: list[TrialRow], with_samples: bool) -> list[TrialRecord]:
    """Trial rows -> records with their measurement rebuilt from the child tables."""
    if not rows:
        return []
    ids = [r.trial_id for r in rows]
    children: dict[str, dict[int, list[Any]]] = {k: defaultdict(list) for k in
                                                 ("throughput", "samples", "buckets", "costs", "diag")}
    models = {"throughput": ThroughputRow, "buckets": BucketRow, "costs": CostRow, "diag": DiagnosisRow}
    if with_samples:
        models["samples"] = SampleRow
    for chunk in _chunks(ids):
        for kind, model in models.items():
            for obj in conn.scalars(select(model).where(model.trial_id.in_(chunk))):
                children[kind][obj.trial_id].append(obj)
    env_ids = sorted({r.environment_id for r in rows if r.environment_id is not None})
    envs: dict[int, dict[str, Any]] = {}
    for chunk in _chunks(env_ids):
        for e in conn.execute(select(Environment.id, Environment.fingerprint)
                              .where(Environment.id.in_(chunk))):
            envs[e[0]] = e[1]
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
