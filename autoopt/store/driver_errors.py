"""A database driver's error in the user's words: SQLite's (and PostgreSQL's) messages for a full
disk, a damaged page, a file that is not a database or read-only storage, found anywhere in an
exception's chain (Optuna wraps them in its own commit message), else the driver's first line."""
from __future__ import annotations

from typing import Iterator

# What SQLite's (and PostgreSQL's) own words mean for the user, found anywhere in an error's chain
_EXPLAINED = (
    ("database or disk is full", "the disk holding the database is full (or the database reached its "
     "size limit): free some space and run again; what was recorded before is kept"),
    ("no space left on device", "the disk holding the database is full: free some space and run again; "
     "what was recorded before is kept"),
    ("database disk image is malformed", "the database file is damaged (a corrupt page): restore it from a "
     "copy, or salvage it with `sqlite3 FILE .recover | sqlite3 NEW`"),
    ("file is not a database", "the file is not a SQLite database (or its header is damaged)"),
    ("attempt to write a readonly database", "the database is read-only here: reading commands work, "
     "`autoopt run` needs it writable"),
    ("disk i/o error", "the disk returned an I/O error while reading or writing the database"),
)


def _driver_errors(exc: BaseException) -> Iterator[BaseException]:
    seen: set[int] = set()
    todo: list[BaseException | None] = [exc]
    while todo:
        e = todo.pop()
        if e is None or id(e) in seen:
            continue
        seen.add(id(e))
        yield e
        todo += [getattr(e, "orig", None), e.__cause__, e.__context__]


def explain(exc: BaseException) -> str:
    """One line saying what went wrong with the database."""
    for e in _driver_errors(exc):
        low = str(e).lower()
        for needle, meaning in _EXPLAINED:
            if needle in low:
                return f"{meaning} ({needle})"
    orig = getattr(exc, "orig", None) or exc
    return str(orig).strip().splitlines()[0] if str(orig).strip() else type(orig).__name__
