"""The study as the browser sees it: the documents of autoopt.store.reports, kept up to date.

A full load is the history document (`autoopt history --json`). A poll first asks the store for the
study's summary (counts per state and last activity: one small query); only when that moved does it
read the trials that are new since the last look and the ones that were still running, one by one,
and turn them into the same summary rows with reports.summary. Anything it cannot patch in (a gap in
the numbers while another process writes, a new run that may name another objective, the baseline
appearing) makes it reload the history document instead, so the table never shows a state the store
does not have.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from autoopt.errors import UserError
from autoopt.store import analysis as an, reports
from autoopt.store.analysis import ObjectiveKey, key_of


@dataclass(frozen=True)
class StudyInfo:
    """One line of the studies list."""

    name: str
    counts: dict[str, int]
    first_started_at: str | None
    last_finished_at: str | None

    @property
    def total(self) -> int:
        return sum(self.counts.values())


def list_studies(store: Any) -> list[StudyInfo]:
    """Every study in the database, most recently active first, with its counts per state."""
    out = []
    for name in store.studies():
        s = store.study_summary(name)
        out.append(StudyInfo(name, dict(s["counts"]), s["first_started_at"], s["last_finished_at"]))
    return out


class StudySource:
    """One study's trials as summary rows (db/README.md "Trial summary"), refreshed by poll(). Every
    speed-up is over the baseline of the trial's own session (analysis.baseline_before, as `autoopt
    best` reads it) and the best is analysis.select_best's pick, through reports.best_number."""

    def __init__(self, store: Any, study: str) -> None:
        self.store = store
        self.study = study
        self.rows: dict[int, dict[str, Any]] = {}
        self.head: dict[str, Any] = {}
        self.full_loads = 0  # how often poll() had to fall back to a full load (tests read it)
        self._records: dict[int, Any] = {}  # the trials' records (no timing samples), by number
        self._details: dict[int, dict[str, Any]] = {}
        self._c: ObjectiveKey | None = None
        self._unit = an.TOK_PER_S
        self._mark: tuple[Any, ...] | None = None
        self._n_runs = 0
        self.load()

    # ---- loading -------------------------------------------------------------------------------
    def load(self) -> None:
        """Read the whole history document again."""
        self.full_loads += 1
        mark = self._summary_mark()
        trials = self.store.trials(self.study, with_samples=False)
        try:
            doc = reports.history(self.store, self.study, trials=trials)
        except UserError:  # a study whose first trial is not written yet: an empty table, not a crash
            doc = {"objective": None, "baseline_number": None, "baselines": [], "best_number": None,
                   "counts": {}, "total": 0, "trials": []}
        self.head = {k: v for k, v in doc.items() if k != "trials"}
        self.rows = {row["number"]: row for row in doc["trials"]}
        self._records = {t.number: t for t in trials}
        self._c = key_of(doc)
        self._unit = an.objective_unit(trials)
        self._n_runs = len(self.store.runs(self.study))
        self._details = {n: d for n, d in self._details.items() if n in self.rows}
        self._mark = mark

    def poll(self) -> list[int]:
        """Bring the rows up to date; -> the numbers of the rows that were added or changed."""
        mark = self._summary_mark()
        if mark == self._mark:
            return []
        before = {n: r["state"] for n, r in self.rows.items()}
        if self._needs_full_load():
            return self._reload(before)
        changed = [n for n, state in before.items() if state == "running"]
        updated = [self.store.trial(self.study, n) for n in changed] + self._read_from(max(self.rows, default=-1) + 1)
        known_baselines = self._baselines()
        self._records.update((t.number, t) for t in updated)
        if self._baselines() != known_baselines:  # a baseline finished: the rows after it compare with it
            return self._reload(before)
        for t in updated:
            self.rows[t.number] = reports.summary(t, self._baseline_of(t), self._c, self._unit)
            self._details.pop(t.number, None)
        counts = dict(self.store.study_summary(self.study)["counts"])
        if sum(counts.values()) != len(self.rows):  # a gap in the numbers: read everything
            self.load()
            return sorted(self.rows)
        best, significant = reports.best_number([self._records[n] for n in sorted(self._records)], self._c)
        self.head.update(counts=counts, total=len(self.rows), best_number=best, best_significant=significant)
        self._mark = mark
        return sorted({t.number for t in updated})

    def _reload(self, before: dict[int, str]) -> list[int]:
        self.load()
        return sorted(n for n, r in self.rows.items() if before.get(n) != r["state"] or n not in before)

    def _baselines(self) -> list[Any]:
        return an.session_baselines([self._records[n] for n in sorted(self._records)])

    def _baseline_of(self, trial: Any) -> Any:
        """The baseline record `trial`'s speed-up is over: its own session's."""
        return an.baseline_before(trial, self._baselines())

    def _summary_mark(self) -> tuple[Any, ...]:
        s = self.store.study_summary(self.study)
        return tuple(sorted(s["counts"].items())), s["first_started_at"], s["last_finished_at"]

    def _needs_full_load(self) -> bool:
        if not self.rows or self.head.get("baseline_number") is None:
            return True
        return len(self.store.runs(self.study)) != self._n_runs

    def _read_from(self, number: int) -> list[Any]:
        found = []
        while True:
            try:
                found.append(self.store.trial(self.study, number))
            except UserError:
                return found
            number += 1

    # ---- one trial, two trials, all of them ----------------------------------------------------
    @property
    def objective(self) -> str | None:
        return self.head.get("objective")

    @property
    def baseline_number(self) -> int | None:
        return self.head.get("baseline_number")

    @property
    def objective_unit(self) -> dict[str, Any]:
        """What the objective measures (analysis.ObjectiveUnit.to_json)."""
        return self._unit.to_json()

    def best_number(self) -> int | None:
        """The trial `autoopt best` takes (analysis.select_best: outside the noise over its own
        session's baseline, else the latest baseline); None without a baseline at the objective's C."""
        return self.head.get("best_number")

    def detail(self, number: int) -> dict[str, Any]:
        """The trial part of `autoopt show N --json` (cached once the trial has finished)."""
        if number not in self._details:
            t = self.store.trial(self.study, number)
            doc = reports.trial_detail(t, self._baseline_of(t), self._c, self._unit)
            if doc["state"] == "running":
                return doc
            self._details[number] = doc
        return self._details[number]

    def diff(self, a: int, b: int) -> dict[str, Any]:
        """`autoopt diff A B --json`."""
        return reports.diff(self.store, a, b, self.study)

    def details(self) -> list[dict[str, Any]]:
        """Every trial's detail document in number order (the plots need decisions and buckets; the
        records read with the rows carry no timing samples, which no plot draws)."""
        running: dict[int, dict[str, Any]] = {}
        for n in sorted(set(self.rows) - set(self._details)):
            t = self._records[n]
            doc = reports.trial_detail(t, self._baseline_of(t), self._c, self._unit)
            (running if doc["state"] == "running" else self._details)[t.number] = doc
        return [self._details.get(n) or running[n] for n in sorted(self.rows)
                if n in self._details or n in running]

    def knobs(self) -> dict[str, list[Any]]:
        """Each param name -> the values the trials used (filter completion, effects)."""
        seen: dict[str, list[Any]] = {}
        for row in self.rows.values():
            for k, v in (row["params"] or {}).items():
                if v not in seen.setdefault(k, []):
                    seen[k].append(v)
        return seen
