"""Helpers for tests that run `autoopt` as a real subprocess and read its SQLite database back."""
from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable

REPO = Path(__file__).resolve().parents[1]
_MAIN = "import sys; from autoopt.cli import main; sys.argv = ['autoopt'] + sys.argv[1:]; main()"


def autoopt_cmd(*args: str) -> list[str]:
    return [sys.executable, "-c", _MAIN, *args]


def env() -> dict[str, str]:
    e = dict(os.environ)
    e.pop("AUTOOPT_DB", None)
    e["PYTHONUNBUFFERED"] = "1"
    return e


def run_autoopt(*args: str, timeout: float = 600, cwd: Path = REPO) -> subprocess.CompletedProcess:
    return subprocess.run(autoopt_cmd(*args), cwd=cwd, env=env(), capture_output=True, text=True,
                          timeout=timeout)


def start_autoopt(*args: str, cwd: Path = REPO, log: Path | None = None) -> subprocess.Popen:
    out = open(log, "w") if log is not None else subprocess.DEVNULL
    return subprocess.Popen(autoopt_cmd(*args), cwd=cwd, env=env(), stdout=out, stderr=subprocess.STDOUT,
                            text=True)


def trials(db: Path, study: str) -> list[Any]:
    """The study's TrialRecords through the real Store ([] while the database does not exist yet)."""
    from autoopt.errors import StoreError
    from autoopt.store import Store

    if not db.exists():
        return []
    try:
        with Store.open(str(db), create=False) as store:
            return store.trials(study, with_samples=False)
    except StoreError:
        return []  # the run is creating the schema right now


def runs(db: Path, study: str) -> list[Any]:
    from autoopt.store import Store

    with Store.open(str(db), create=False) as store:
        return store.runs(study)


def wait_for(cond: Callable[[], Any], timeout_s: float, proc: subprocess.Popen | None = None,
             what: str = "condition", log: Path | None = None) -> Any:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = cond()
        if value:
            return value
        if proc is not None and proc.poll() is not None:
            tail = log.read_text()[-3000:] if log is not None and log.exists() else ""
            raise AssertionError(f"autoopt exited ({proc.returncode}) before {what}\n{tail}")
        time.sleep(0.25)
    tail = log.read_text()[-3000:] if log is not None and log.exists() else ""
    raise AssertionError(f"timed out after {timeout_s:.0f} s waiting for {what}\n{tail}")


def free_port() -> int:
    """A TCP port free on loopback right now (for servers the tests start)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
