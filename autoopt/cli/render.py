"""Shared rich renderers for measurements: tok/s with its CI, MBU, profile buckets as bars, the
correctness verdict, costs and what actually ran. Commands (measure, run, show, diff) reuse these so a
figure looks the same everywhere. Plain rich + autoopt.measurement; no torch.

Every speed is printed with its spread ("1234 tok/s ±1.2 % [1220, 1249]"): a win inside the noise must
look like one.
"""
from __future__ import annotations

from typing import Any, Iterable

from rich.console import Console, Group, RenderableType
from rich.table import Table
from rich.text import Text

from autoopt.store import analysis as an
from autoopt.measurement import Measurement, Throughput

BAR_CHAR = "█"
COST_ORDER = ("restart", "build", "compile", "warmup", "guard", "measure", "profile", "total")


def _tp(tp: Throughput | dict[str, Any]) -> Throughput:
    return tp if isinstance(tp, Throughput) else Throughput(**tp)


def fmt_num(x: float | None, digits: int = 3) -> str:
    """Three significant figures at most, no scientific notation for the sizes tok/s takes."""
    if x is None:
        return "-"
    ax = abs(x)
    if ax >= 100:
        return f"{x:,.0f}"
    if ax >= 10:
        return f"{x:.1f}"
    if ax >= 1:
        return f"{x:.2f}"
    return f"{x:.{digits}g}"


def fmt_tok_s(tp: Throughput | dict[str, Any], unit: bool = True) -> str:
    """'1,234 tok/s ±1.2% [1,220, 1,249]' (median, CI half-width relative to it, 95% CI)."""
    t = _tp(tp)
    rel = t.rel_halfwidth * 100
    rel_txt = f"±{rel:.1f}%" if rel != float("inf") else "±inf"
    return (f"{fmt_num(t.median)}{' tok/s' if unit else ''} {rel_txt} "
            f"[{fmt_num(t.ci_low)}, {fmt_num(t.ci_high)}]")


def fmt_bytes(n: int | float | None) -> str:
    if n is None:
        return "-"
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return str(n)


def fmt_seconds(s: float | None) -> str:
    if s is None:
        return "-"
    if s >= 60:
        return f"{s / 60:.1f} min"
    if s >= 1:
        return f"{s:.1f} s"
    return f"{s * 1e3:.0f} ms"


def status_text(status: str) -> Text:
    style = {"ok": "bold green", "wrong": "bold red", "failed": "bold red"}.get(status, "bold")
    return Text(status, style=style)


def throughput_table(m: Measurement, title: str | None = "tokens/s (median, 95% CI)") -> Table:
    """One row per concurrency: tok/s ± CI, samples, median step time, MBU."""
    table = Table(title=title, title_justify="left", show_edge=False, pad_edge=False)
    table.add_column("C", justify="right")
    table.add_column("tok/s", justify="right", style="bold")
    table.add_column("±", justify="right")
    table.add_column("95% CI", justify="right")
    table.add_column("n", justify="right")
    table.add_column("step", justify="right")
    table.add_column("MBU", justify="right")
    for c in sorted(m.tok_per_s, key=lambda k: int(k)):
        t = _tp(m.tok_per_s[c])
        step_s = int(c) / t.median if t.median > 0 else None
        mbu = m.mbu.get(c)
        table.add_row(c, fmt_num(t.median), f"{t.rel_halfwidth * 100:.1f}%",
                      f"[{fmt_num(t.ci_low)}, {fmt_num(t.ci_high)}]", str(t.n), fmt_seconds(step_s),
                      f"{mbu * 100:.2f}%" if mbu is not None else "-")
    return table


def bucket_bars(buckets_ms: dict[str, float], coverage: float | None = None,
                kernel_count: int | None = None, width: int = 32,
                title: str | None = "profile buckets (ms per decode step)") -> Table:
    """Buckets sorted by time, each a bar scaled to the largest, with its share of the total."""
    total = sum(buckets_ms.values()) or 1.0
    peak = max(buckets_ms.values(), default=0.0) or 1.0
    extra = []
    if coverage is not None:
        extra.append(f"coverage {coverage:.0%}")
    if kernel_count is not None:
        extra.append(f"{kernel_count} kernels/step")
    full_title = f"{title} — {', '.join(extra)}" if title and extra else title
    table = Table(title=full_title, title_justify="left", show_edge=False, pad_edge=False,
                  show_header=False)
    table.add_column("bucket")
    table.add_column("ms", justify="right")
    table.add_column("share", justify="right")
    table.add_column("bar")
    for name, ms in sorted(buckets_ms.items(), key=lambda kv: -kv[1]):
        bar = BAR_CHAR * max(int(round(width * ms / peak)), 1 if ms > 0 else 0)
        table.add_row(Text(name), f"{ms:.3f}", f"{ms / total:.0%}", Text(bar, style="cyan"))
    return table


def what_ran_table(what_ran: dict[str, str], title: str | None = "what actually ran") -> Table:
    table = Table(title=title, title_justify="left", show_edge=False, pad_edge=False, show_header=False)
    table.add_column("op", style="bold")
    table.add_column("ran")
    for op, ran in what_ran.items():
        # Text, not str: keys like "mhc_gemm[c4]" would otherwise be read as rich markup and vanish
        table.add_row(Text(op), Text(str(ran)))
    return table


def costs_line(costs_s: dict[str, float]) -> Text:
    """'restart 1.4 s · build 80 ms · ... · total 9.2 s' in a fixed order."""
    parts = [f"{k} {fmt_seconds(costs_s[k])}" for k in COST_ORDER if costs_s.get(k)]
    parts += [f"{k} {fmt_seconds(v)}" for k, v in costs_s.items() if k not in COST_ORDER and v]
    return Text("costs: " + " · ".join(parts))


NEAR_TOLERANCE = 0.8  # a pass using this share of its error allowance (or agreement slack) is shown as such


def verdict_text(correctness: dict[str, Any]) -> Text:
    """The guard's verdict with each figure against its tolerance: a pass at 97 % of the allowed
    error is not shown as a plain "ok"."""
    verdict = correctness.get("verdict")
    if verdict is None:
        return Text("correctness: not checked", style="yellow")
    tol = correctness.get("tolerance") if isinstance(correctness.get("tolerance"), dict) else {}
    margins = an.guard_margins(correctness)
    details = []
    if "logits_rel_err" in correctness:
        of = (f" / {tol['logits_rel_err']:.2e} allowed = {margins['logits_rel_err']:.0%}"
              if "logits_rel_err" in margins else "")
        details.append(f"logits rel err {correctness['logits_rel_err']:.2e}{of}")
    if "token_agreement" in correctness:
        of = f" (needs >= {tol['token_agreement']:.0%})" if "token_agreement" in margins else ""
        details.append(f"token agreement {correctness['token_agreement']:.0%}{of}")
    if tol and not margins:
        details.append(f"tolerance {tol}")
    near = verdict == "ok" and any(v >= NEAR_TOLERANCE for v in margins.values())
    shown = "ok, near the tolerance" if near else verdict
    style = "yellow" if near else "green" if verdict == "ok" else "bold red"
    return Text(f"correctness: {shown}" + (f" ({', '.join(details)})" if details else ""), style=style)


def failure_text(m: Measurement, tail_lines: int = 15) -> RenderableType:
    f = m.failure
    if f is None:
        return Text("")
    parts: list[RenderableType] = [Text(f"failed ({f.kind}): {f.reason}", style="bold red")]
    if f.stderr_tail:
        tail = "\n".join(f.stderr_tail.rstrip().splitlines()[-tail_lines:])
        parts.append(Text("worker stderr (tail):\n" + tail, style="dim"))
    return Group(*parts)


def measurement_view(m: Measurement, header: str | None = None) -> Group:
    """Everything about one measurement, top to bottom: status, speeds, correctness, buckets, memory,
    costs, what ran, failure."""
    parts: list[RenderableType] = []
    head = Text.assemble(Text(header + "  " if header else ""), ("status: ", "bold"), status_text(m.status))
    parts.append(head)
    if m.tok_per_s:
        parts.append(throughput_table(m))
    if m.correctness or m.status != "failed":
        parts.append(verdict_text(m.correctness))
    if m.buckets_ms:
        parts.append(bucket_bars(m.buckets_ms, m.bucket_coverage, m.kernel_count))
    if m.peak_memory_bytes is not None:
        how = m.what_ran.get("measure.peak_memory", "")
        parts.append(Text(f"peak memory: {fmt_bytes(m.peak_memory_bytes)}" + (f" ({how})" if how else "")))
    if m.costs_s:
        parts.append(costs_line(m.costs_s))
    if m.what_ran:
        parts.append(what_ran_table(m.what_ran))
    if m.failure:
        parts.append(failure_text(m))
    return Group(*_spaced(parts))


def _spaced(parts: Iterable[RenderableType]) -> list[RenderableType]:
    out: list[RenderableType] = []
    for p in parts:
        if out and isinstance(p, Table):
            out.append(Text(""))
        out.append(p)
    return out


def print_measurement(m: Measurement, console: Console | None = None, header: str | None = None) -> None:
    (console or Console()).print(measurement_view(m, header))
