"""`autoopt run --warm-start STUDY [--warm-start-db URL]`: the agent starts from another study's trials.

The other study (another preset, another GPU, the CPU; in this database or another) is read once,
before the run starts: its successful trials, mapped onto this run's space, become the agent's prior
evidence (autoopt.search.agent.warmstart: discounted, never taken as measured here). Mapping: a knob
both spaces have keeps the other study's value; a knob only this space has is read at this space's
baseline (the other study never varied it); a knob only the other space had is dropped. A trial whose
values are not points of this space is not used. What was used is said once, in the first proposal's
reason and the run summary, recorded in the run's settings and, on every decision taken while the
agent still uses it, in the decision's notes (`warm_start`).

Bad input is one line, exit 2: an unknown study (the studies there are listed), a study without a
successful trial, a strategy other than the agent, a space sharing no knob with this one, or no trial
at this space's baseline (the other study's gains are read against it).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from autoopt.errors import StoreError, UserError
from autoopt.trial import Decision, DecisionSource

STRATEGIES = ("agent",)  # strategies that take warm_start= (their factory in autoopt.search.registry)
_SAID = 6  # knobs named in a message before "..."


@dataclass
class WarmStart:
    """Another study's trials, read and mapped onto this run's space."""

    study: str
    db: str | None  # its database, as given (None: this run's own)
    db_text: str  # where it was read, for people (password hidden)
    same_db: bool  # it is this run's database
    records: list[Any]  # its successful trials (autoopt.store.records.TrialRecord)
    trials: list[Any] = field(default_factory=list)  # of them, mapped onto this space and usable
    shared: tuple[str, ...] = ()  # parameters both spaces have
    filled: tuple[str, ...] = ()  # parameters only this space has: read at its baseline
    configurations: int = 0  # distinct configurations the agent took in
    dropped_after: int | None = None  # trial number after which the agent stopped using it

    @property
    def label(self) -> str:
        return f"study {self.study!r}" + ("" if self.same_db else f" ({self.db_text})")

    def text(self) -> str:
        filled = f"; {_names(self.filled)} read at this space's baseline" if self.filled else ""
        return (f"warm start from {self.label}: {len(self.trials)} of its {len(self.records)} successful trials "
                f"({self.configurations} configurations, {len(self.shared)} shared knobs{filled})")

    def to_json(self) -> dict[str, Any]:
        return {"study": self.study, "db": None if self.same_db else self.db_text, "trials_used": len(self.trials),
                "successful_trials": len(self.records), "configurations": self.configurations,
                "shared": list(self.shared), "filled": list(self.filled), "dropped_after": self.dropped_after}


def _names(names: tuple[str, ...] | list[str]) -> str:
    return ", ".join(names[:_SAID]) + (f", ... ({len(names)} in all)" if len(names) > _SAID else "")


def check_strategy(study: str | None, strategy: str | None) -> None:
    from autoopt.search import registry

    strategy = strategy or registry.default_name()
    if study is not None and strategy not in STRATEGIES:
        raise UserError(f"--warm-start {study}: only the agent strategy starts from another study's "
                        f"trials, not --strategy {strategy}")


def read(study: str, db: str | None, own_store: Any) -> WarmStart:
    """The other study's successful trials (its database opened read-only when it is another one)."""
    from autoopt.store import Store, display_url, resolve_url

    same = db is None or resolve_url(db)[0] == own_store.url
    try:
        store = own_store if same else Store.open(db, create=False)
    except StoreError as exc:
        raise UserError(f"--warm-start-db {db}: {exc}") from None
    try:
        names = store.studies()
        if study not in names:
            known = ", ".join(names[:8]) + (", ..." if len(names) > 8 else "") if names else "none"
            raise UserError(f"--warm-start {study}: no such study in {display_url(store.url)} "
                            f"(studies there: {known})")
        records = store.trials(study, ("ok",), with_samples=False)
        records = [r for r in records if r.objective is not None and r.objective > 0]
        if not records:
            raise UserError(f"--warm-start {study}: the study has no successful trial to start from")
        return WarmStart(study, db, display_url(store.url), same, records)
    finally:
        if store is not own_store:
            store.close()


def fit(ws: WarmStart, space: Any, own_study: str) -> WarmStart:
    """Map the other study's trials onto `space` (module docstring); UserError when none can be used."""
    from autoopt.search.agent.view import SpaceView

    if ws.same_db and ws.study == own_study:
        raise UserError(f"--warm-start {ws.study}: that is this run's own study (its trials are this "
                        "run's history already)")
    mine = [p.name for p in space.params]
    theirs = sorted({k for r in ws.records for k in r.params})
    ws.shared = tuple(n for n in mine if n in theirs)
    if not ws.shared:
        raise UserError(f"--warm-start {ws.study}: its space shares no knob with this one (its knobs: "
                        f"{_names(theirs) or 'none'}; this space's: {_names(mine)})")
    ws.filled = tuple(n for n in mine if n not in theirs)
    base = space.baseline_params()
    view = SpaceView(space)
    mapped = [(r, {n: r.params.get(n, base[n]) for n in mine}) for r in ws.records]
    ws.trials = [_Prior(r.number, params, float(r.objective)) for r, params in mapped
                 if view.encode(params) is not None]
    if not ws.trials:
        raise UserError(f"--warm-start {ws.study}: none of its {len(ws.records)} successful trials is a "
                        f"point of this space (values this space does not have)")
    base_code = tuple(int(c) for c in view.base_code)
    if not any(tuple(int(c) for c in view.encode(t.params)) == base_code for t in ws.trials):
        shown = ", ".join(f"{n}={base[n]}" for n in ws.shared[:_SAID])
        raise UserError(f"--warm-start {ws.study}: none of its trials measured this space's baseline "
                        f"({shown}{', ...' if len(ws.shared) > _SAID else ''}), which its gains are read against")
    return ws


@dataclass
class _Prior:
    """One trial of the other study as the agent reads it (.params, .objective)."""

    number: int
    params: dict[str, Any]
    objective: float


class WarmStartedStrategy:
    """The agent, with what it started from said where a person reads it: the first proposal's
    reason names the study and the trials used, each decision taken while the agent still uses them
    records it (notes["warm_start"]), and the agent's warm-start lines (taken in, dropped as useless)
    go to the run's log. Everything else is the agent's."""

    def __init__(self, inner: Any, ws: WarmStart, observer: Any = None) -> None:
        self._inner, self.warm = inner, ws
        self._observer = observer
        self._said = False
        self._notes_seen = 0
        ws.configurations = len(inner.prior) if getattr(inner, "prior", None) is not None else 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    def propose(self, ctx: Any) -> Any:
        decision = self._inner.propose(ctx)
        self._forward_notes(ctx)
        if not isinstance(decision, Decision) or decision.kind is DecisionSource.BASELINE:
            return decision
        if self.in_use():
            decision.notes["warm_start"] = f"{self.warm.study}: {len(self.warm.trials)} trials"
        if not self._said:
            decision.reason = f"{self.warm.text()}; {decision.reason}"
            self._said = True
        return decision

    def in_use(self) -> bool:
        prior = getattr(self._inner, "prior", None)
        return prior is not None and bool(prior.useful)

    def _forward_notes(self, ctx: Any) -> None:
        notes = getattr(self._inner, "notes", [])
        fresh, self._notes_seen = notes[self._notes_seen:], len(notes)
        for line in fresh:
            if line.startswith("warm start") and self._observer is not None:
                self._observer.note(line)
        if self.warm.dropped_after is None and not self.in_use() and ctx.history:
            self.warm.dropped_after = max(t.number for t in ctx.history)
