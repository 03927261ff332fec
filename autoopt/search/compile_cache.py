"""Where a study's workers keep Inductor's and Triton's on-disk caches: beside the database.

    directory = compile_cache.directory(store.url, "flash-h200")   # db/cache/flash-h200/

A worker that starts again (a restart-class switch, a crash, `autoopt run --resume`, a run joining the
study) finds the kernels an earlier worker of the study compiled there instead of compiling them
again, however the temp directory is cleaned. SQLite: <the database's directory>/cache/<study>/;
another database (PostgreSQL) has no directory of its own: $XDG_CACHE_HOME (else ~/.cache)/autoopt/
<study>/. The builtin target's workers get it through their environment
(autoopt.targets.builtin.client.with_compile_cache); each trial records the directories its worker
used (what_ran["compile_cache"]) and the run its directory (settings["compile_cache"]).
"""
from __future__ import annotations

import os
from pathlib import Path

from autoopt.store.db import sqlite_path


def directory(store_url: str, study: str) -> Path:
    db_file = sqlite_path(store_url)
    if db_file is not None and str(db_file) not in ("", ".", ":memory:"):
        root = db_file.parent / "cache"
    else:
        root = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "autoopt"
    return root / ("".join(c if c.isalnum() or c in "-_." else "_" for c in study).lstrip(".") or "study")
