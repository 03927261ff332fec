"""Rich rendering of the history / show / diff / best documents (autoopt.store.reports).

Tables fit the terminal: long cells (params, reasons) wrap inside their column (`history`) or end in
an ellipsis (the key/value tables, where the full value is printed below or in --json); `history
--wide` prints every row on one line at its natural width. Every cell is data, never rich markup
(a knob key like `mhc_gemm[c4]` would otherwise vanish as a style tag): str cells become Text and
user data inside a markup line is escaped.
Nothing here computes a figure: every number comes from the document.
"""
from __future__ import annotations

import json
from typing import Any

from rich.console import Console
from rich.markup import escape
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


TOK_PER_S_UNIT = {"quantity": "tok_per_s", "unit": "tok/s", "direction": "maximize", "text": "tok/s, higher is better"}


def objective_unit(doc: dict[str, Any]) -> dict[str, Any]:
    """What the document's objective measures (analysis.ObjectiveUnit.to_json); tok/s when absent."""
    return doc.get("objective_unit") or TOK_PER_S_UNIT


def value_label(unit: dict[str, Any]) -> str:
    """The column heading of the objective's values: "tok/s", "time ms"."""
    if unit["quantity"] == "tok_per_s":
        return "tok/s"
    return f"{unit['quantity']} {unit['unit'] or '(unit not recorded)'}"


def value_text(iv: dict[str, float] | None, unit: dict[str, Any]) -> str:
    """An interval in the objective's own unit: tok/s with one decimal, anything else (ms of a
    replayed kernel can be 0.0123) with four significant digits."""
    if not iv or unit["quantity"] == "tok_per_s":
        return tps(iv)
    return f"{iv['median']:.4g} [{iv['ci_low']:.4g}, {iv['ci_high']:.4g}]"


def objective_text(doc: dict[str, Any]) -> str:
    """"tok_per_s@64 (tok/s, higher is better)", "tok_per_s@mix of C=1:0.2 C=64:0.8 (tok/s, ...)" (the
    weighted geometric mean), or for a replayed minimised column "tok_per_s@1 = 1/time (time in ms,
    lower is better)": the stored name, what it is, which way is up."""
    unit, obj = objective_unit(doc), doc.get("objective") or "-"
    stored = f" = {unit['stored_as']}" if unit.get("stored_as", unit["quantity"]) != unit["quantity"] else ""
    if doc.get("objective_mix"):  # the weighted geometric mean the run ranked by: say what it weighs
        stored = " of " + " ".join(f"C={c}:{w:g}" for c, w in doc["objective_mix"].items())
    return f"{obj}{stored} ({unit['text']})"


def objective_heading(doc: dict[str, Any]) -> str:
    """The history's objective column: "tok/s@64", or a replayed table's "time ms"."""
    unit, obj = objective_unit(doc), doc.get("objective") or "objective"
    return obj.replace("tok_per_s", "tok/s") if unit["quantity"] == "tok_per_s" else value_label(unit)


def baselines_text(doc: dict[str, Any]) -> str:
    """"baseline #0", or "baselines #0, #41 (each trial against its own run's)"."""
    numbers = doc.get("baselines") or ([doc["baseline_number"]] if doc.get("baseline_number") is not None else [])
    if len(numbers) > 1:
        return f"baselines {', '.join(f'#{n}' for n in numbers)} (each trial against its own run's)"
    return f"baseline #{numbers[0]}" if numbers else "baseline #-"


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
           width: int | None = None, wrap: bool = False) -> Table:
    """A table that fits `width` (default: the terminal): fixed columns keep their full width; the
    flexible ones (flag True) share what is left and end in an ellipsis, or with `wrap` continue
    on the next lines of their column. columns: (header, justify, flexible[, cap: the most a
    flexible column takes while the terminal is too narrow])."""
    width = width or console().width
    rows = [[c if isinstance(c, Text) else Text(str(c)) for c in r] for r in rows]
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
        t.add_column(header, justify=justify, no_wrap=not (wrap and flexible), width=widths[i],
                     overflow="fold" if wrap or not flexible else "ellipsis")
    for r in rows:
        t.add_row(*r)
    return t


def line(con: Console, text: Any, style: str = "") -> None:
    """One logical line: never cut, never broken by us (the terminal wraps it if it must)."""
    con.print(text if isinstance(text, Text) else Text.from_markup(str(text)), style=style,
              soft_wrap=True)


def _state(state: str) -> Text:
    return Text(state, style=STATE_STYLE.get(state, ""))


def render_history(doc: dict[str, Any], best_number: int | None = None, wide: bool = False) -> None:
    """`best_number`: the trial `autoopt best` would take (marked >); `wide`: one line per row."""
    obj = doc["objective"] or "objective"
    unit = objective_unit(doc)
    counts = ", ".join(f"{n} {s}" for s, n in sorted(doc["counts"].items()))
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
        mark = ">" if r["number"] == best_number else " "
        number = Text(f"{mark}{r['number']}{'b' if r['baseline'] else ''}",
                      style="bold green" if mark == ">" else "")
        rows.append([number, _state(r["state"]), Text(value_text(r.get("objective_value"), unit)), sp_text,
                     Text(secs(r["cost_s"])), Text(r["source"] or "-"), Text(detail)])
    columns = [("#", "right", False), ("state", "left", False),
               (f"{objective_heading(doc)} [95% CI]", "right", False),
               ("speedup", "right", False), ("cost", "right", False), ("source", "left", True, 12),
               ("vs baseline / failure", "left", True)]
    natural = _natural_width(columns, rows)
    con = console() if not wide else Console(width=natural, soft_wrap=False, highlight=False)
    line(con, f"study [bold]{escape(doc['study'])}[/]  ({doc['total']} trials: {escape(counts)})  "
              f"objective {escape(objective_text(doc))}  {escape(baselines_text(doc))}")
    if wide or natural <= con.width:
        con.print(fitted(columns, rows, width=natural))
    else:  # too narrow for one line a trial: the long cell goes on its own line, in full
        _two_line_rows(con, columns, rows)
    legend = "* = faster than the baseline outside the noise (CI low > baseline CI high); b = baseline"
    if best_number is not None:
        legend = f"> = the best (autoopt best: trial {best_number}); " + legend
    line(con, Text(legend, style="dim"))


def _two_line_rows(con: Console, columns: list[tuple[Any, ...]], rows: list[list[Text]]) -> None:
    """Every column but the last as an aligned line, the last (changes / failure) below it,
    indented and wrapped at the terminal's width: nothing is cut."""
    head = [Text(c[0], style="bold") for c in columns[:-1]]
    widths = [max(len(r[i].plain) for r in rows + [head]) for i in range(len(columns) - 1)]

    def aligned(cells: list[Text]) -> Text:
        out = Text()
        for i, (cell, width) in enumerate(zip(cells, widths)):
            pad = " " * (width - len(cell.plain))
            out.append_text(Text(pad) + cell if columns[i][1] == "right" else cell + Text(pad))
            out.append("  ")
        return out

    con.print(aligned(head) + Text("\n      " + columns[-1][0], style="bold"))
    for r in rows:
        con.print(aligned(r[:-1]))
        con.print(Text("      ") + r[-1], overflow="fold")


def _natural_width(columns: list[tuple[Any, ...]], rows: list[list[Any]]) -> int:
    """The width at which no cell of the table is cut or wrapped."""
    cells = [[c.plain if isinstance(c, Text) else str(c) for c in r] for r in rows]
    widths = [max([len(col[0])] + [len(r[i]) for r in cells]) for i, col in enumerate(columns)]
    return sum(widths) + 3 * (len(columns) - 1)


def _kv_table(title: str, items: dict[str, Any]) -> Table:
    rows = [[str(k), json.dumps(v, default=str) if isinstance(v, (dict, list)) else str(v)]
            for k, v in items.items()]
    return fitted([("key", "left", False), ("value", "left", True)], rows, title)


def _per_concurrency(figures: dict[str, dict[str, Any]], unit: dict[str, Any]) -> Table:
    """`show`'s figures per C, in the objective's unit, with MBU and the speed-up."""
    rows = [[c, value_text(f.get("value", f), unit), str(f["n"]), "-" if f["mbu"] is None else f"{f['mbu']:.0%}",
             ratio(f["speedup"])] for c, f in figures.items()]
    label = value_label(unit)
    return fitted([("C", "right", False), (f"{label} [95% CI]", "right", False), ("n", "right", False),
                   ("MBU", "right", False), ("speedup vs baseline", "right", False)], rows, label)


def render_show(doc: dict[str, Any]) -> None:
    con = console()
    tr, unit = doc["trial"], objective_unit(doc)
    base = doc.get("baseline_number")
    line(con, Text.assemble(f"trial {tr['number']}  ", _state(tr["state"]),
                            f"  study {doc['study']}  id {tr['trial_id']}  run {tr['run_id']}  "
                            f"{'(baseline)' if tr['baseline'] else ''}"))
    line(con, Text(f"objective {objective_text(doc)}; speed-ups over "
                   f"{'baseline #' + str(base) if base is not None else 'no baseline'} (this trial's run's)"))
    con.print(_kv_table("config", tr["config"]))
    if tr["tok_per_s"]:
        con.print(_per_concurrency(tr["tok_per_s"], unit))
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
    t = tr.get("transition") or {}
    if t.get("predicted_s") is not None:  # the cost model's prediction vs what the switch took
        why["transition predicted"] = (f"{secs(t['predicted_s'])} ({t['predicted_class']}), actual "
                                       f"{secs(t['actual_s'])} ({t['restart_class'] or '-'})")
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
    if tr["correctness"]:  # the verdict against its tolerances (a pass near the limit says so)
        from autoopt.cli.render import verdict_text

        line(con, verdict_text(tr["correctness"]))
    for title in ("correctness", "what_ran", "environment"):
        if tr[title]:
            con.print(_kv_table(title.replace("_", " "), tr[title]))


def render_diff(doc: dict[str, Any]) -> None:
    con = console()
    a, b, unit = doc["a"], doc["b"], objective_unit(doc)
    line(con, f"study [bold]{escape(doc['study'])}[/]: A = trial {a['number']} ({a['state']})  "
              f"B = trial {b['number']} ({b['state']})  objective {escape(objective_text(doc))}")
    t = _table("knobs that differ")
    t.add_column("knob", no_wrap=True, style="bold")
    t.add_column("A", no_wrap=True, overflow="ellipsis")
    t.add_column("B", no_wrap=True, overflow="ellipsis")
    for k in doc["knobs"]:
        t.add_row(Text(str(k["name"])), Text(str(k["a"])), Text(str(k["b"])))
    con.print(t if doc["knobs"] else "no knob differs")
    if doc["tok_per_s"]:
        rows = [[str(r["concurrency"]), value_text(r.get("a_value", r["a"]), unit),
                 value_text(r.get("b_value", r["b"]), unit), gain(r["ratio"]), r["significant"] or "-"]
                for r in doc["tok_per_s"]]
        label = value_label(unit)
        con.print(fitted([("C", "right", False), (f"A {label} [95% CI]", "right", False),
                          (f"B {label} [95% CI]", "right", False), ("B speed-up vs A [CI]", "right", False),
                          ("verdict", "left", True)], rows, f"{label} per concurrency"))
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
    tr, base, unit = doc["trial"], doc["baseline"], objective_unit(doc)
    study = escape(doc["study"])
    head = (f"best in study [bold]{study}[/] by {escape(objective_text(doc))}: trial {tr['number']}"
            if doc["significant"] else
            f"study [bold]{study}[/]: trial {tr['number']} (no gain outside the noise; objective "
            f"{escape(objective_text(doc))})")
    line(con, head)
    t = _table()
    label = value_label(unit)
    base_label = f"baseline #{base['number']} {label}" if base else "baseline"
    for col in ("C", f"trial {tr['number']} {label} [95% CI]", base_label, "speedup [CI]"):
        t.add_column(col, justify="right", no_wrap=True)
    values, base_values = doc.get("values", doc["tok_per_s"]), doc.get("baseline_values", doc["baseline_tok_per_s"])
    for c, iv in values.items():
        t.add_row(Text(str(c)), value_text(iv, unit), value_text(base_values.get(c), unit),
                  ratio(doc["speedup"].get(c)))
    if doc.get("objective_mix") and tr["objective"]:  # the figure the rule ranked by
        mix = {k: tr["objective"][k] for k in ("median", "ci_low", "ci_high")}
        base_mix = ({k: base["objective"][k] for k in ("median", "ci_low", "ci_high")}
                    if base and base.get("objective") else None)
        t.add_row(Text("mix", style="bold"), value_text(mix, unit), value_text(base_mix, unit), ratio(tr["speedup"]))
    con.print(t)
    con.print(_kv_table("params", tr["params"]))
    line(con, Text(f"rule: {doc['rule']}", style="dim"))
    if doc["export"]:
        line(con, Text(f"exported to {doc['export']['path']} (writer: {doc['export']['writer']})"))
