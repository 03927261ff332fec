"""Command-line entry point. Each command module parses, calls the library, renders; no logic.

Importing this package must not import torch or triton (tests/test_cli_imports.py): commands
import the heavy parts inside their bodies.
"""
from __future__ import annotations

import sys

from autoopt.cli.app import app
from autoopt.cli import (  # noqa: F401  (each module registers its commands on `app`)
    bench_cmd, best_cmd, diff_cmd, history_cmd, measure_cmd, profile_cmd, run_cmd, show_cmd, spaces_cmd,
)
from autoopt.errors import UserError


def main() -> None:
    try:
        app()
    except UserError as exc:
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(exc.exit_code)
