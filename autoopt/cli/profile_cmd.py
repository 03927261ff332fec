"""autoopt profile: time per bucket of a Chrome trace, and with --vs what moved between two traces.

Parse the options and hand them to autoopt.cli.render_profile (imported when the command runs). No
torch: reading a trace is plain JSON.
"""
from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from autoopt.cli.app import app


@app.command("profile")
def profile_command(
    trace: Path = typer.Argument(..., help="Chrome trace (.json or .json.gz) from torch.profiler "
                                 "or a serving process."),
    vs: Optional[Path] = typer.Option(None, "--vs", help="A second trace (the 'after'): show what "
                                      "moved, bucket by bucket, and a one-line verdict."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON document instead of tables."),
    top: int = typer.Option(10, "--top", min=0, help="How many of the most expensive kernels to list."),
) -> None:
    """Time per profile bucket (gemm_tensorop, gemm_simt, attention, copy_cast, ...) of a trace.

    GPU traces count kernels, memcpys and memsets; CPU-only traces count operators by self time.
    With ProfilerStep marks in the trace, every figure is per step.

    Examples:

      autoopt profile before.json.gz

      autoopt profile before.json.gz --vs after.json.gz

      autoopt profile before.json.gz --vs after.json.gz --json --top 5
    """
    from autoopt.cli.render_profile import run

    run(trace, vs, as_json, top)
