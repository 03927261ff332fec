"""The Optuna side of the store: an RDBStorage on autoopt's database URL, studies, and trials that
are created already RUNNING with their parameters (atomically, one transaction in Optuna's storage).

Why not `study.enqueue_trial(params)` + `study.ask()`: with two processes on one study, process B's
`ask()` may pop the trial that process A enqueued (the queue is shared). Creating the trial from a
template FrozenTrial in state RUNNING is what enqueue+ask amounts to, minus that race.

Optuna is imported here only, lazily (read-only commands never need it).
"""
from __future__ import annotations

import contextlib
import logging
import math
from datetime import datetime
from typing import Any, Iterator, Mapping, Sequence

from sqlalchemy.exc import DatabaseError

from autoopt.errors import StoreError
from autoopt.store.db import display_url, first_line, sqlite_path
from autoopt.store.locks import setup_lock

RUN_ID_ATTR = "autoopt:run_id"  # system attr on each Optuna trial: the autoopt run that owns it
PARAMS_ATTR = "autoopt:params"  # user attr: the full flat params (shown by optuna-dashboard)
STATE_ATTR = "autoopt:state"  # user attr: ok | wrong | failed | interrupted
FAILURE_ATTR = "autoopt:failure"  # user attr: "<kind>: <reason>"


@contextlib.contextmanager
def guarded(storage: Any, what: str) -> Iterator[None]:
    """Optuna's storage errors (lock timeouts, lost connections) -> one-line StoreError."""
    from optuna.exceptions import StorageInternalError

    try:
        yield
    except (StorageInternalError, DatabaseError) as exc:
        # Optuna's own words ("An exception is raised during the commit ...") hide the cause
        raise StoreError(f"cannot {what} in {display_url(storage.url)}: {first_line(exc)}") from None


def make_storage(url: str, busy_timeout_s: float) -> Any:
    """Optuna's RDBStorage on the same URL (creates Optuna's tables under the setup lock)."""
    import optuna
    from sqlalchemy import event

    logging.getLogger("optuna").setLevel(logging.WARNING)
    engine_kwargs: dict[str, Any] = {}
    is_sqlite = sqlite_path(url) is not None
    if is_sqlite:
        engine_kwargs["connect_args"] = {"timeout": busy_timeout_s}
    else:
        engine_kwargs["pool_pre_ping"] = True
    with setup_lock(url):
        try:
            storage = optuna.storages.RDBStorage(url, engine_kwargs=engine_kwargs)
        except optuna.exceptions.StorageInternalError as exc:
            raise StoreError(f"database {display_url(url)}: Optuna cannot open its tables: {exc}") from None
        except RuntimeError as exc:  # Optuna's schema-version mismatch message
            raise StoreError(f"database {display_url(url)}: {str(exc).splitlines()[0]}") from None
    if is_sqlite:
        @event.listens_for(storage.engine, "connect")
        def _on_connect(dbapi_conn: Any, _record: Any) -> None:
            cur = dbapi_conn.cursor()
            cur.execute(f"PRAGMA busy_timeout = {int(busy_timeout_s * 1000)}")
            cur.execute("PRAGMA journal_mode = WAL")  # persistent in the file; a no-op when set
            cur.close()
    return storage


def get_study(storage: Any, name: str, direction: str) -> Any:
    import optuna

    if direction not in ("maximize", "minimize"):
        raise StoreError(f"study direction must be 'maximize' or 'minimize', got {direction!r}")
    with guarded(storage, f"open Optuna study {name!r}"):
        study = optuna.create_study(storage=storage, study_name=name, direction=direction,
                                    load_if_exists=True)
    have = study.direction.name.lower()
    if have != direction:
        raise StoreError(f"study {name!r} in {display_url(storage.url)} was created to {have}, "
                         f"not {direction}: use another study name")
    return study


def to_distribution(name: str, spec: Any) -> Any:
    """An Optuna distribution from a distribution object or a sequence of choices."""
    from optuna.distributions import BaseDistribution, CategoricalDistribution

    if isinstance(spec, BaseDistribution):
        return spec
    if isinstance(spec, (list, tuple)) and spec:
        return CategoricalDistribution(tuple(spec))
    raise StoreError(f"distribution for parameter {name!r} must be an optuna distribution or a "
                     f"non-empty list of choices, got {spec!r}")


def _compatible(dist: Any, value: Any) -> bool:
    try:
        return bool(dist._contains(dist.to_internal_repr(value)))
    except (ValueError, TypeError):
        return False


def known_distributions(storage: Any, study_id: int) -> dict[str, Any]:
    """The latest distribution recorded for each parameter name in the study."""
    out: dict[str, Any] = {}
    with guarded(storage, "read the study's distributions"):
        for t in storage.get_all_trials(study_id, deepcopy=False):
            out.update(t.distributions)
    return out


def split_params(params: Mapping[str, Any], given: Mapping[str, Any] | None,
                 known: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """-> (params Optuna records with distributions, their distributions). A parameter whose
    distribution is neither given nor already known in the study (or whose value falls outside it)
    is kept in the trial's user attribute `autoopt:params` only (always written, all params)."""
    rec_params, rec_dists = {}, {}
    for k, v in params.items():
        dist = None
        if given and k in given:
            dist = to_distribution(k, given[k])
            if not _compatible(dist, v):
                raise StoreError(f"parameter {k}={v!r} is outside its declared distribution {dist}")
        elif k in known and _compatible(known[k], v):
            dist = known[k]
        if dist is not None:
            rec_params[k], rec_dists[k] = v, dist
    return rec_params, rec_dists


def create_running_trial(storage: Any, study_id: int, params: dict[str, Any],
                         distributions: dict[str, Any], all_params: dict[str, Any],
                         run_id: int | None) -> tuple[int, int]:
    """-> (trial_id, number) of a new RUNNING trial carrying `params`."""
    from optuna.trial import FrozenTrial, TrialState

    template = FrozenTrial(
        number=-1, state=TrialState.RUNNING, value=None, datetime_start=datetime.now(),
        datetime_complete=None, params=params, distributions=distributions,
        user_attrs={PARAMS_ATTR: all_params}, system_attrs={RUN_ID_ATTR: run_id},
        intermediate_values={}, trial_id=-1)
    try:
        with guarded(storage, "create an Optuna trial"):
            frozen = storage._create_new_trial(study_id, template_trial=template)
    except ValueError as exc:  # incompatible distribution with earlier trials of the study
        raise StoreError(f"study {study_id}: cannot record params in Optuna: {exc}") from None
    return frozen._trial_id, frozen.number


def tell(storage: Any, trial_id: int, objective: float | None, state: str,
         failure: str | None) -> bool:
    """Finish the Optuna trial: COMPLETE with the objective, or FAIL. False if already finished."""
    from optuna.exceptions import UpdateFinishedTrialError
    from optuna.trial import TrialState

    try:
        with guarded(storage, f"finish Optuna trial id {trial_id}"):
            storage.set_trial_user_attr(trial_id, STATE_ATTR, state)
            if failure:
                storage.set_trial_user_attr(trial_id, FAILURE_ATTR, failure)
            if objective is not None and math.isfinite(objective) and state == "ok":
                return storage.set_trial_state_values(trial_id, TrialState.COMPLETE, [float(objective)])
            return storage.set_trial_state_values(trial_id, TrialState.FAIL)
    except UpdateFinishedTrialError:
        return False


def running_trials(storage: Any, study_id: int) -> list[Any]:
    from optuna.trial import TrialState

    with guarded(storage, "list running trials"):
        return list(storage.get_all_trials(study_id, deepcopy=False, states=(TrialState.RUNNING,)))


__all__: Sequence[str] = (
    "make_storage", "get_study", "split_params", "create_running_trial", "tell", "running_trials",
    "known_distributions",
)
