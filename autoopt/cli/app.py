"""The typer application object. Command modules register on it; nothing here imports torch."""
from __future__ import annotations

import typer

app = typer.Typer(
    name="autoopt",
    help="Agent-driven autotuner for LLM decode paths (DeepSeek-V4 decode step built in).\n\n"
    "Examples:\n\n"
    "  autoopt measure --preset tiny --json\n\n"
    "  autoopt run --budget 2m\n\n"
    "  autoopt best --export config.yaml",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
