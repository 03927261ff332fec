"""The trial store: Optuna's study + autoopt's own tables in one database (SQLite or PostgreSQL).

    from autoopt.store import Store
    store = Store.open(None)        # $AUTOOPT_DB or sqlite:///<cwd>/db/autoopt.sqlite, migrated on open

See autoopt/store/store.py for the write API, queries.py for reads, db/README.md for the schema.
Importing this package imports neither torch, triton, optuna nor SQLAlchemy: its names load when
first used, so a reading command that opens a SQLite file through autoopt.store.reading.open_for_reading
never pays for SQLAlchemy (autoopt.store.sqlite_files says why).
"""
from __future__ import annotations

import importlib
from typing import Any

from autoopt.store.sqlite_files import ENV_VAR, VERSION_TABLE
from autoopt.trial import FINISHED_STATES, TRIAL_STATES

_WHERE = {"Store": "autoopt.store.store", "TrialHandle": "autoopt.store.store",
          "TrialRecord": "autoopt.store.records", "RunRecord": "autoopt.store.records",
          "display_url": "autoopt.store.db", "resolve_url": "autoopt.store.db"}

__all__ = [
    "Store", "TrialHandle", "TrialRecord", "RunRecord", "TRIAL_STATES", "FINISHED_STATES",
    "ENV_VAR", "VERSION_TABLE", "display_url", "resolve_url",
]


def __getattr__(name: str) -> Any:
    if name not in _WHERE:
        raise AttributeError(f"module 'autoopt.store' has no attribute {name!r}")
    return getattr(importlib.import_module(_WHERE[name]), name)
