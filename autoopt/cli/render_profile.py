"""What `autoopt profile` prints: the buckets of one trace, and with --vs what moved and the verdict.

Imported by the command when it runs (the regex rules compile on import; `autoopt --help` stays fast).
"""
from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from autoopt.profile import trace as profiling
from autoopt.profile.host import host_line
from autoopt.profile.diff import compare, fmt_ms
from autoopt.errors import UserError
from autoopt.profile.rules import BUCKETS

BAR_WIDTH = 24
NAME_WIDTH = 40  # keeps a kernel row on one line of an 80-column terminal


def _bar(frac: float) -> str:
    return "█" * round(max(0.0, min(frac, 1.0)) * BAR_WIDTH)


def _trace_json(p: profiling.BucketProfile) -> dict[str, Any]:
    d = p.to_dict()
    keep = ("buckets_ms", "kernel_count", "total_ms", "coverage", "covered_ms", "wall_ms", "steps",
            "per_step", "source", "top_kernels", "notes", "host_ms", "host_buckets_ms",
            "host_sections_ms", "step_wall_ms", "step_wall_clock", "device_busy_ms", "step_host_ms",
            "launches", "kernels_by_bucket")
    return {k: d[k] for k in keep} | {"host_bucket_ms": p.host_bucket_ms}


def _unit(p: profiling.BucketProfile) -> str:
    return "ms/step" if p.per_step else "ms (trace total)"


def _kind(p: profiling.BucketProfile) -> str:
    host = " (with host time of dsv4:: code sections)" if p.host_ms else ""
    return f"{'per-step' if p.per_step else 'whole-trace'} {p.source.upper()} figures{host}"


def _render_one(console: Console, path: str, p: profiling.BucketProfile, top: int) -> None:
    what = "GPU kernels" if p.source == "gpu" else "CPU ops (self time)"
    if p.host_ms:
        what += " + host time of dsv4:: code sections"
    steps = f"{p.steps} profiler steps, per-step figures" if p.per_step else "no ProfilerStep marks, totals"
    console.print(f"[bold]{escape(path)}[/bold]: {what}; {steps}")
    console.print(f"  {p.kernel_count} {'kernels' if p.source == 'gpu' else 'ops'}"
                  f"{'/step' if p.per_step else ''}, {fmt_ms(p.total_ms, sign=False)} {_unit(p)} "
                  f"bucketed, coverage {p.coverage:.0%} of {fmt_ms(p.wall_ms, sign=False)} ms wall")
    console.print("  " + escape(host_line(p.step_wall_ms, p.device_busy_ms, p.launches, p.step_wall_clock,
                                          p.source, _unit(p))))
    table = Table(show_edge=False, pad_edge=False)
    for col, justify in (("bucket", "left"), (_unit(p), "right"), ("%", "right"), ("", "left")):
        table.add_column(col, justify=justify)
    for bucket in BUCKETS:
        ms = p.buckets_ms.get(bucket, 0.0)
        if ms <= 0:
            continue
        frac = ms / p.total_ms if p.total_ms else 0.0
        table.add_row(bucket, fmt_ms(ms, sign=False), f"{frac:.1%}", _bar(frac))
    console.print(table)
    if top > 0 and p.top_kernels:
        kt = Table(title=f"top {min(top, len(p.top_kernels))} by time", show_edge=False, pad_edge=False)
        # one line per kernel: the short name is cut with an ellipsis, never folded over lines
        kt.add_column("name", no_wrap=True, overflow="ellipsis", max_width=NAME_WIDTH)
        kt.add_column("bucket", no_wrap=True, min_width=13)
        kt.add_column(_unit(p), justify="right", no_wrap=True, min_width=7)
        kt.add_column("calls" + ("/step" if p.per_step else ""), justify="right", no_wrap=True,
                      min_width=10)
        for name, bucket, ms, count in p.top_kernels[:top]:
            kt.add_row(escape(profiling.short_name(name, width=70)), bucket, fmt_ms(ms, sign=False),
                       f"{count:g}")
        console.print(kt)
    for note in p.notes:
        console.print(f"  [yellow]note:[/yellow] {escape(note)}")


def run(trace: Path, vs: Path | None, as_json: bool, top: int) -> None:
    """Bucket TRACE (and VS), then print the JSON document or the tables and the verdict."""
    profiles, diag = _profiles_and_diff(trace, vs, top)
    if as_json:
        print(json.dumps(_json_doc(profiles, diag), indent=2))
        return
    console = Console(highlight=False)
    for path, p in profiles.items():
        _render_one(console, path, p, top)
        console.print()
    if diag is not None:
        _render_diff(console, trace, vs, profiles[str(trace)], diag)


def _profiles_and_diff(trace: Path, vs: Path | None, top: int) -> tuple[dict[str, Any], Any]:
    paths = [str(trace)] + ([str(vs)] if vs is not None else [])
    if len(set(paths)) < len(paths):
        raise UserError(f"--vs {vs}: the same file as TRACE; expected a second trace to compare")
    profiles = {path: profiling.profile_trace(path, top=top) for path in paths}
    if vs is None:
        return profiles, None
    a, b = profiles[str(trace)], profiles[str(vs)]
    if _kind(a) != _kind(b):
        print(f"warning: {trace} has {_kind(a)}, {vs} has {_kind(b)}: the delta compares unlike "
              "figures", file=sys.stderr)
    stepped = a.per_step and b.per_step  # the wall per step is only comparable then
    return profiles, compare(a.buckets_ms, b.buckets_ms, wall_a_ms=a.wall_ms if stepped else None,
                             wall_b_ms=b.wall_ms if stepped else None)


def _json_doc(profiles: dict[str, Any], diag: Any) -> dict[str, Any]:
    return {"traces": {path: _trace_json(p) for path, p in profiles.items()},
            "delta_ms": diag.delta_ms if diag else {},
            "verdict": diag.verdict if diag else None,
            "wall_per_step_ms": [diag.wall_a_ms, diag.wall_b_ms] if diag else None,
            "wall_rose_while_kernels_fell": diag.wall_rose if diag else None}


def _render_diff(console: Console, trace: Path, vs: Path, a: profiling.BucketProfile,
                 diag: Any) -> None:
    table = Table(title=escape(f"{trace.name} -> {vs.name} ({_unit(a)})"), show_edge=False, pad_edge=False)
    for col in ("bucket", "before", "after", "delta", "delta %"):
        table.add_column(col, justify="left" if col == "bucket" else "right")
    for d in diag.deltas.values():
        if d.a_ms == 0 and d.b_ms == 0:
            continue
        colour = "green" if d.delta_ms < 0 else "red" if d.delta_ms > 0 else ""
        pct = f"{d.delta_pct:+.0f}%" if d.delta_pct is not None else "new"
        delta = f"[{colour}]{fmt_ms(d.delta_ms)}[/{colour}]" if colour else fmt_ms(d.delta_ms)
        table.add_row(d.bucket, fmt_ms(d.a_ms, sign=False), fmt_ms(d.b_ms, sign=False), delta, pct)
    table.add_row("total", fmt_ms(diag.total_a_ms, sign=False), fmt_ms(diag.total_b_ms, sign=False),
                  fmt_ms(diag.net_ms), f"{diag.net_pct:+.1f}%" if diag.net_pct is not None else "")
    console.print(table)
    console.print(f"[bold]verdict:[/bold] {escape(diag.verdict)}")
