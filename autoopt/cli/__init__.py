"""Command-line entry point. Each command module parses, calls the library, renders; no logic.

Importing this package must not import torch or triton (tests/test_cli_imports.py): commands
import the heavy parts inside their bodies.
"""
from __future__ import annotations

import signal
import sys


def _interrupted_while_starting(signum: int, frame: object) -> None:
    print("error: interrupted", file=sys.stderr)
    sys.exit(130)  # Ctrl-C during the imports below: the same exit as later, no traceback


signal.signal(signal.SIGINT, _interrupted_while_starting)

import typer  # noqa: E402

from autoopt.cli.app import app  # noqa: E402
from autoopt.cli import (  # noqa: E402  # noqa: F401  (each module registers its commands on `app`)
    bench_cmd, bench_serve_cmd, best_cmd, browse_cmd, diff_cmd, history_cmd, measure_cmd, profile_cmd,
    record_cmd, report_cmd, run_cmd, show_cmd, spaces_cmd, suggest_cmd,
)
from autoopt.errors import UserError  # noqa: E402

signal.signal(signal.SIGINT, signal.default_int_handler)  # from here: KeyboardInterrupt, handled in main()


def main() -> None:
    try:
        code = app(standalone_mode=False)  # click's usage errors come here, not as a boxed usage
    except UserError as exc:
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(exc.exit_code)
    except (typer.Abort, KeyboardInterrupt):  # Ctrl-C outside a command's own handling
        print("error: interrupted", file=sys.stderr)
        sys.exit(130)  # the README's exit code for Ctrl-C
    except Exception as exc:  # noqa: BLE001 - only click's own errors are handled, the rest re-raised
        # click's exceptions (vendored by typer as typer._click, a private module): a bad flag or
        # argument (UsageError, exit 2) gets one line like any bad input
        if not (hasattr(exc, "format_message") and isinstance(getattr(exc, "exit_code", None), int)):
            raise
        ctx = getattr(exc, "ctx", None)
        where = f"{ctx.command_path}: " if ctx is not None else ""
        hint = f" (see {ctx.command_path} --help)" if ctx is not None and exc.exit_code == 2 else ""
        message = exc.format_message() or "a command is needed"  # no arguments: the help, above
        print(f"error: {where}{message}{hint}", file=sys.stderr)
        sys.exit(exc.exit_code)
    sys.exit(code if isinstance(code, int) else 0)
