"""A real PostgreSQL server on loopback for the store's tests: initdb into a temporary folder, start
it on a free port, hand out one fresh database per test, stop it at the end.

Skips (with the reason) where the server binaries or the psycopg driver are missing; `.ci/run`
installs both. initdb refuses to run as root, so as root the server runs as the `postgres` user.
"""
from __future__ import annotations

import glob
import os
import shutil
import subprocess
import tempfile
import uuid
from pathlib import Path

import pytest

from cli_helpers import free_port

USER = "autoopt"


def _binary(name: str) -> str | None:
    found = shutil.which(name)
    if found:
        return found
    versions = sorted(glob.glob(f"/usr/lib/postgresql/*/bin/{name}"))
    return versions[-1] if versions else None



class PostgresServer:
    def __init__(self) -> None:
        pytest.importorskip("psycopg", reason="the psycopg driver is not installed (pip install 'psycopg[binary]')")
        initdb, pg_ctl = _binary("initdb"), _binary("pg_ctl")
        if not initdb or not pg_ctl:
            pytest.skip("PostgreSQL server binaries (initdb, pg_ctl) are not installed on this machine")
        self.prefix: list[str] = []
        self.dir = Path(tempfile.mkdtemp(prefix="autoopt-pg-"))
        if os.geteuid() == 0:  # initdb refuses root: run the server as the postgres user
            if not shutil.which("runuser"):
                pytest.skip("running as root without runuser: cannot start PostgreSQL as another user")
            try:
                shutil.chown(self.dir, user="postgres")
            except (LookupError, PermissionError):
                pytest.skip("running as root and there is no `postgres` user to run the server as")
            self.prefix = ["runuser", "-u", "postgres", "--"]
        self.pg_ctl, self.port, self.data = pg_ctl, free_port(), self.dir / "data"
        self._run([initdb, "-D", str(self.data), "-A", "trust", "-U", USER, "-E", "UTF8"])
        self._run([pg_ctl, "-D", str(self.data), "-l", str(self.dir / "server.log"), "-w", "-t", "60",
                   "-o", f"-p {self.port} -k {self.dir} -c listen_addresses=127.0.0.1", "start"])

    def _run(self, cmd: list[str]) -> None:
        proc = subprocess.run(self.prefix + cmd, capture_output=True, text=True, timeout=120)
        if proc.returncode:
            log = self.dir / "server.log"
            raise RuntimeError(f"{' '.join(cmd[:1])} failed ({proc.returncode}): {proc.stderr[-2000:]}"
                               + (log.read_text()[-2000:] if log.exists() else ""))

    def url(self, database: str) -> str:
        return f"postgresql+psycopg://{USER}@127.0.0.1:{self.port}/{database}"

    def new_database(self) -> str:
        """A fresh, empty database; returns its SQLAlchemy URL."""
        import psycopg

        name = f"t_{uuid.uuid4().hex[:12]}"
        with psycopg.connect(f"host=127.0.0.1 port={self.port} user={USER} dbname=postgres",
                             autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{name}"')
        return self.url(name)

    def stop(self) -> None:
        try:
            self._run([self.pg_ctl, "-D", str(self.data), "-m", "fast", "-w", "stop"])
        finally:
            shutil.rmtree(self.dir, ignore_errors=True)
