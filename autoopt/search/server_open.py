"""`autoopt run` on a server space (`target: server` in the file, or `--target server:FILE.yaml`):
the ServerTarget and its SearchSpace, opened for autoopt.search.session.

The server's trial folders (its log per start, the config file written per trial, each trial's
bench.json) go beside the database, under server_runs/<study>/, so the store's what_ran paths stay
valid after the run; a database that is not a SQLite file puts them in a new temporary folder.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

SERVER_PREFIX = "server:"


def is_server(target_spec: str | None) -> bool:
    return target_spec == "server" or (target_spec or "").startswith(SERVER_PREFIX)


def space_of(target_spec: str | None) -> str | None:
    """The space file a `--target server:FILE.yaml` names (it is the space too), else None."""
    if (target_spec or "").startswith(SERVER_PREFIX):
        return str(target_spec)[len(SERVER_PREFIX):]
    return None


def run_dir(db_url: str | None, study: str) -> Path | None:
    """<database folder>/server_runs/<study> for a SQLite database; None (a temporary folder) else."""
    from sqlalchemy.engine import make_url

    from autoopt.store.db import resolve_url

    resolved, _ = resolve_url(db_url)
    parsed = make_url(resolved)
    if parsed.get_backend_name() != "sqlite" or not parsed.database:
        return None
    safe = "".join(ch if ch.isalnum() or ch in "-_." else "_" for ch in study) or "study"
    return Path(parsed.database).expanduser().resolve().parent / "server_runs" / safe


def open_server(target_spec: str, doc: Any, db_url: str | None,
                study: str | None) -> tuple[Any, Callable[[], Any], str]:
    """(ServerTarget, a function building its SearchSpace, the target spec to record:
    server:<absolute space path>). Nothing is started here: the first trial starts the server."""
    from autoopt.targets.server.searchspace import server_space
    from autoopt.targets.server.target import from_spec

    spec = f"{SERVER_PREFIX}{doc.path.resolve()}" if target_spec == "server" else target_spec
    name = study or str(doc.header("name", "") or doc.path.stem)
    target, _ = from_spec(spec, run_dir=run_dir(db_url, name))
    return target, (lambda: server_space(target)), spec
