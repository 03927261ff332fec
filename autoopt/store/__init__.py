"""The trial store: Optuna's study + autoopt's own tables in one database (SQLite or PostgreSQL).

    from autoopt.store import Store
    store = Store.open(None)        # $AUTOOPT_DB or sqlite:///<cwd>/db/autoopt.sqlite, migrated on open

See autoopt/store/trials.py for the write API, queries.py for reads, db/README.md for the schema.
Importing this package imports neither torch, triton nor optuna.
"""
from __future__ import annotations

from autoopt.store.db import ENV_VAR, VERSION_TABLE, display_url, resolve_url
from autoopt.store.records import FINISHED_STATES, TRIAL_STATES, RunRecord, TrialRecord
from autoopt.store.trials import Store, TrialHandle

__all__ = [
    "Store", "TrialHandle", "TrialRecord", "RunRecord", "TRIAL_STATES", "FINISHED_STATES",
    "ENV_VAR", "VERSION_TABLE", "display_url", "resolve_url",
]
