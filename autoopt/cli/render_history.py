"""Rich rendering of the history / show / diff / best documents (autoopt.store.reports).

Tables fit the terminal: long cells (params, reasons) do not wrap and end in an ellipsis.
Nothing here computes a figure: every number comes from the document.
"""
from __future__ import annotations

import json
from typing import Any

from rich.console import Console
from rich.table import Table
from rich.text import Text

STATE_STYLE = {"ok": "green", "wrong": "magenta", "failed": "red", "interrupted": "yellow",
               "running": "cyan"}
BAR_WIDTH = 24


def console(stderr: bool = False) -> Console:
    return Console(stderr=stderr, soft_wrap=False, highlight=False)


def print_json(doc: Any) -> None:
    print(json.dumps(doc, indent=2, sort_keys=False, default=str))


def warn(lines: list[str]) -> None:
    """One stderr line per warning, never cut (stdout stays clean for --json)."""
    err = console(stderr=True)
    for text in lines:
        line(err, Text(f"warning: {text}", style="yellow"))


def tps(iv: dict[str, float] | None) -> str:
    if not iv:
        return "-"
    return f"{iv['median']:.1f} [{iv['ci_low']:.1f}, {iv['ci_high']:.1f}]"


def ratio(iv: dict[str, float] | None) -> str:
    if not iv:
        return "-"
    return f"{iv['median']:.3f}x [{iv['ci_low']:.3f}, {iv['ci_high']:.3f}]"


def gain(iv: dict[str, float] | None) -> str:
    """A ratio as a signed percentage with its interval: +1.8% [+0.5, +3.0]."""
    if not iv:
        return "-"
    return (f"{(iv['median'] - 1) * 100:+.1f}% [{(iv['ci_low'] - 1) * 100:+.1f}, "
            f"{(iv['ci_high'] - 1) * 100:+.1f}]")


def pct(x: float | None, signed: bool = True) -> str:
    return "-" if x is None else (f"{x:+.1f}%" if signed else f"{x:.1f}%")


def secs(x: float | None) -> str:
    return "-" if x is None else (f"{x:.1f}s" if x < 600 else f"{x / 60:.1f}m")


def params_text(params: dict[str, Any]) -> str:
    return ", ".join(f"{k}={v}" for k, v in params.items()) or "-"


def bar(value: float, max_value: float, width: int = BAR_WIDTH) -> str:
    if max_value <= 0 or value <= 0:
        return ""
    eighths = int(round(value / max_value * width * 8))
    full, part = divmod(eighths, 8)
    return "█" * full + ("▏▎▍▌▋▊▉"[part - 1] if part else "")


def _table(title: str | None = None) -> Table:
    return Table(title=title, title_justify="left", show_edge=False, pad_edge=False, expand=False,
                 header_style="bold")


def fitted(columns: list[tuple[Any, ...]], rows: list[list[Any]], title: str | None = None,
           width: int | None = None) -> Table:
    """A table that fits `width` (default: the terminal): fixed columns keep their full width; the
    flexible ones (flag True) share what is left and end in an ellipsis. columns: (header, justify,
    flexible[, cap: the most a flexible column takes while the terminal is too narrow])."""
    width = width or console().width
    want = []
    for i, col in enumerate(columns):
        cells = [col[0]] + [c.plain if isinstance(c, Text) else str(c) for c in (r[i] for r in rows)]
        want.append(max(len(x) for x in cells))
    flex = [i for i, c in enumerate(columns) if c[2]]
    avail = width - sum(w for i, w in enumerate(want) if i not in flex) - 3 * (len(columns) - 1)
    widths = list(want)
    if flex and sum(want[i] for i in flex) > avail:  # water-fill: narrow columns keep their width
        for i in flex:
            if len(columns[i]) > 3:
                want[i] = min(want[i], columns[i][3])
        left, todo = max(avail, 4 * len(flex)), sorted(flex, key=lambda i: want[i])
        while todo:
            share = left // len(todo)
            i = todo.pop(0)
            widths[i] = min(want[i], max(share, 4))
            left -= widths[i]
    t = _table(title)
    for i, (header, justify, flexible, *_) in enumerate(columns):
        t.add_column(header, justify=justify, no_wrap=True, width=widths[i],
                     overflow="ellipsis" if flexible else "fold")
    for r in rows:
        t.add_row(*r)
    return t


def line(con: Console, text: Any, style: str = "") -> None:
    """One logical line: never cut, never broken by us (the terminal wraps it if it must)."""
    con.print(text if isinstance(text, Text) else Text.from_markup(str(text)), style=style,
              soft_wrap=True)


def _state(state: str) -> Text:
    return Text(state, style=STATE_STYLE.get(state, ""))


def render_history(doc: dict[str, Any]) -> None:
    con = console()
    obj = doc["objective"] or "objective"
    counts = ", ".join(f"{n} {s}" for s, n in sorted(doc["counts"].items()))
    base = doc["baseline_number"]
    line(con, f"study [bold]{doc['study']}[/]  ({doc['total']} trials: {counts})  objective {obj}  "
              f"baseline #{base if base is not None else '-'}")
    rows = []
    for r in doc["trials"]:
        sp = r["speedup"]
        sp_text = Text(f"{sp['median']:.3f}x" if sp else "-",
                       style="bold green" if r["significant"] else "")
        if r["significant"]:
            sp_text.append(" *")
        if r["failure"]:
            detail = f"{r['failure']['kind']}: {r['failure']['reason']}"
        elif r["changes"] is None:
            detail = params_text(r["params"])
        else:
            detail = params_text(r["changes"]) if r["changes"] else "= baseline"
        rows.append([f"{r['number']}{'b' if r['baseline'] else ''}", _state(r["state"]),
                     tps(r["objective"]), sp_text, secs(r["cost_s"]), r["source"] or "-", detail])
    t = fitted([("#", "right", False), ("state", "left", False), (f"{obj.replace('tok_per_s', 'tok/s')} [95% CI]", "right", False),
                ("speedup", "right", False), ("cost", "right", False), ("source", "left", True, 10),
                ("vs baseline / failure", "left", True)], rows)
    con.print(t)
    line(con, "[dim]* = faster than the baseline outside the noise (CI low > baseline CI high); "
              "b = baseline[/]")


def _kv_table(title: str, items: dict[str, Any]) -> Table:
    rows = [[str(k), json.dumps(v, default=str) if isinstance(v, (dict, list)) else str(v)]
            for k, v in items.items()]
    return fitted([("key", "left", False), ("value", "left", True)], rows, title)


def render_show(doc: dict[str, Any]) -> None:
    con = console()
    tr = doc["trial"]
    line(con, Text.assemble(f"trial {tr['number']}  ", _state(tr["state"]),
                            f"  study {doc['study']}  id {tr['trial_id']}  run {tr['run_id']}  "
                            f"{'(baseline)' if tr['baseline'] else ''}"))
    con.print(_kv_table("config", tr["config"]))
    if tr["tok_per_s"]:
        rows = [[c, tps(f), str(f["n"]), "-" if f["mbu"] is None else f"{f['mbu']:.0%}", ratio(f["speedup"])]
                for c, f in tr["tok_per_s"].items()]
        con.print(fitted([("C", "right", False), ("tok/s [95% CI]", "right", False), ("n", "right", False),
                          ("MBU", "right", False), ("speedup vs baseline", "right", False)], rows, "tok/s"))
    if tr["buckets_ms"]:
        total = sum(tr["buckets_ms"].values())
        cov = tr["bucket_coverage"]
        top = max(tr["buckets_ms"].values())
        rows = [[b, f"{ms:.2f}", pct(ms / total * 100 if total else None, signed=False), bar(ms, top)]
                for b, ms in sorted(tr["buckets_ms"].items(), key=lambda kv: -kv[1])]
        title = f"buckets: {total:.1f} ms/step" + (f", {cov:.0%} covered" if cov is not None else "")
        con.print(fitted([("bucket", "left", True), ("ms", "right", False), ("%", "right", False),
                          ("", "left", True)], rows, title))
    costs = dict(tr["costs_s"])
    if tr["transition_s"] is not None:
        costs.setdefault("transition", tr["transition_s"])
    if costs:
        con.print(_kv_table("costs (s)", {k: f"{v:.2f}" for k, v in costs.items()}))
    d = tr["decision"]
    why = {"source": d.get("source") or "-"}
    if tr["predicted_gain"] is not None:
        sd = tr["predicted_gain_sd"]
        why["predicted gain"] = f"{tr['predicted_gain']:+.1%}" + (f" ± {sd:.1%}" if sd is not None else "")
    if tr["actual_gain"] is not None:
        why["actual gain"] = f"{tr['actual_gain']:+.1%}"
    if tr["gain_vs_baseline"] is not None:
        why["gain vs baseline"] = f"{tr['gain_vs_baseline']:+.1%}"
    if d.get("expected_cost_s") is not None:
        why["expected cost"] = secs(d["expected_cost_s"])
    con.print(_kv_table("why chosen", why))
    line(con, Text(f"why chosen: {d.get('reason') or '-'}"))  # in full: the one line a table would cut
    for diag in tr["diagnoses"]:
        line(con, Text(f"diagnosis: {diag['verdict']}", style="bold"))
    if tr["failure"]:
        f = tr["failure"]
        line(con, Text(f"failure: {f['kind']}: {f['reason']}", style="red"))
        if f["stderr_tail"]:
            con.print("[bold]stderr (tail):[/]")
            for text in f["stderr_tail"].splitlines()[-20:]:
                line(con, Text(text, style="dim"))
    for title in ("correctness", "what_ran", "environment"):
        if tr[title]:
            con.print(_kv_table(title.replace("_", " "), tr[title]))


def render_diff(doc: dict[str, Any]) -> None:
    con = console()
    a, b = doc["a"], doc["b"]
    line(con, f"study [bold]{doc['study']}[/]: A = trial {a['number']} ({a['state']})  "
              f"B = trial {b['number']} ({b['state']})")
    t = _table("knobs that differ")
    t.add_column("knob", no_wrap=True, style="bold")
    t.add_column("A", no_wrap=True, overflow="ellipsis")
    t.add_column("B", no_wrap=True, overflow="ellipsis")
    for k in doc["knobs"]:
        t.add_row(k["name"], str(k["a"]), str(k["b"]))
    con.print(t if doc["knobs"] else "no knob differs")
    if doc["tok_per_s"]:
        rows = [[str(r["concurrency"]), tps(r["a"]), tps(r["b"]), gain(r["ratio"]), r["significant"] or "-"]
                for r in doc["tok_per_s"]]
        con.print(fitted([("C", "right", False), ("A tok/s [95% CI]", "right", False),
                          ("B tok/s [95% CI]", "right", False), ("B vs A [CI]", "right", False),
                          ("verdict", "left", True)], rows, "tok/s per concurrency"))
    if doc["buckets"]:
        top = max(abs(r["delta_ms"]) for r in doc["buckets"]) or 1.0
        rows = []
        for r in doc["buckets"]:
            style = "green" if r["delta_ms"] < 0 else "red" if r["delta_ms"] > 0 else ""
            rows.append([r["bucket"], f"{r['a_ms']:.2f}", f"{r['b_ms']:.2f}",
                         Text(f"{r['delta_ms']:+.2f}", style=style), pct(r["delta_pct"]),
                         Text(bar(abs(r["delta_ms"]), top, 16), style=style)])
        tot = doc["total_ms"]
        if tot:
            rows.append([Text("total", style="bold"), f"{tot['a']:.2f}", f"{tot['b']:.2f}",
                         f"{tot['delta']:+.2f}", pct(tot["delta"] / tot["a"] * 100 if tot["a"] else None), ""])
        con.print(fitted([("bucket", "left", True), ("A ms", "right", False), ("B ms", "right", False),
                          ("Δ ms", "right", False), ("Δ%", "right", False), ("", "left", True)],
                         rows, "buckets (ms per decode step)"))
    if doc["verdict"]:
        line(con, Text(f"verdict: {doc['verdict']}", style="bold"))
    elif doc["verdict_note"]:
        line(con, Text(doc["verdict_note"], style="dim"))


def render_best(doc: dict[str, Any]) -> None:
    con = console()
    tr, base = doc["trial"], doc["baseline"]
    head = (f"best in study [bold]{doc['study']}[/] by {doc['objective']}: trial {tr['number']}"
            if doc["significant"] else
            f"study [bold]{doc['study']}[/]: trial {tr['number']} (no gain outside the noise)")
    line(con, head)
    t = _table()
    base_label = f"baseline #{base['number']} tok/s" if base else "baseline"
    for col in ("C", f"trial {tr['number']} tok/s [95% CI]", base_label, "speedup [CI]"):
        t.add_column(col, justify="right", no_wrap=True)
    for c, iv in doc["tok_per_s"].items():
        t.add_row(c, tps(iv), tps(doc["baseline_tok_per_s"].get(c)), ratio(doc["speedup"].get(c)))
    con.print(t)
    con.print(_kv_table("params", tr["params"]))
    line(con, Text(f"rule: {doc['rule']}", style="dim"))
    if doc["export"]:
        line(con, Text(f"exported to {doc['export']['path']} (writer: {doc['export']['writer']})"))
