"""Documents -> rich renderables for the browser. Every string from the database goes in as a Text
(never parsed as markup: a reason like "[red]x" shows as typed); only our own labels carry style.
"""
from __future__ import annotations

import json
from typing import Any, Iterable

from rich.console import Group
from rich.table import Table
from rich.text import Text

from autoopt.cli.render_history import (STATE_STYLE, TOK_PER_S_UNIT, bar, gain, objective_unit, params_text, pct,
                                        ratio, secs, value_label, value_text)

STDERR_LINES = 20


def txt(value: Any, style: str = "") -> Text:
    return Text("-" if value is None else str(value), style=style)


def heading(title: str) -> Text:
    return Text(f"\n{title}", style="bold underline")


def table(*columns: tuple[str, str]) -> Table:
    t = Table(show_edge=False, pad_edge=False, box=None, header_style="bold", expand=False)
    for name, justify in columns:
        t.add_column(name, justify=justify, overflow="fold")  # type: ignore[arg-type]
    return t


def kv(items: Iterable[tuple[str, Any]]) -> Table:
    t = table(("", "left"), ("", "left"))
    t.show_header = False
    for k, v in items:
        t.add_row(txt(k, "bold"), v if isinstance(v, Text) else
                  txt(json.dumps(v, default=str) if isinstance(v, (dict, list)) else v))
    return t


def state_text(state: str) -> Text:
    return Text(state, style=STATE_STYLE.get(state, ""))


# ---- the trials table -------------------------------------------------------------------------
def number_cell(row: dict[str, Any], best: int | None, marked: bool) -> Text:
    t = Text("●" if marked else " ", style="bold magenta")
    t.append(str(row["number"]))
    if row["number"] == best and not row["baseline"]:
        t.append("★", style="bold yellow")
    if row["baseline"]:
        t.append("b", style="bold cyan")
    return t


def speedup_cell(row: dict[str, Any]) -> Text:
    sp = row["speedup"]
    if not sp:
        return Text("-")
    t = Text(f"{sp['median']:.3f}x", style="bold green" if row["significant"] else "")
    return t + Text(" *" if row["significant"] else "  ")


def changed_cell(row: dict[str, Any]) -> Text:
    if row["failure"]:
        return Text(f"{row['failure']['kind']}: {row['failure']['reason']}", style="red")
    if row["changes"] is None:
        return Text(params_text(row["params"] or {}))
    return Text(params_text(row["changes"]) if row["changes"] else "= baseline")


def row_cells(row: dict[str, Any], best: int | None, marked: bool,
              unit: dict[str, Any] = TOK_PER_S_UNIT) -> list[Text]:
    return [number_cell(row, best, marked), state_text(row["state"]),
            Text(value_text(row.get("objective_value", row["objective"]), unit)),
            speedup_cell(row), Text(secs(row["cost_s"])), txt(row["source"]), changed_cell(row)]


# ---- one trial --------------------------------------------------------------------------------
def configuration(config: dict[str, Any]) -> Table:
    """Global knobs, then each layer's overrides (config["layer_overrides"]: [layer, knob, value])."""
    t = table(("layer", "left"), ("knobs", "left"))
    glob = {k: v for k, v in config.items() if k != "layer_overrides"}
    t.add_row(Text("all", style="bold"), Text(params_text(glob)))
    layers: dict[Any, list[str]] = {}
    for item in config.get("layer_overrides") or []:
        if isinstance(item, (list, tuple)) and len(item) == 3:
            layers.setdefault(item[0], []).append(f"{item[1]}={item[2]}")
    for layer, knobs in sorted(layers.items(), key=lambda kv_: str(kv_[0])):
        t.add_row(Text(str(layer), style="bold"), Text(", ".join(knobs)))
    return t


def throughput(doc: dict[str, Any], unit: dict[str, Any]) -> Table:
    t = table(("C", "right"), (f"{value_label(unit)} [95% CI]", "right"), ("n", "right"), ("MBU", "right"),
              ("speed-up [CI]", "right"))
    for c, f in doc["tok_per_s"].items():
        t.add_row(Text(c), Text(value_text(f.get("value", f), unit)), Text(str(f["n"])),
                  Text("-" if f["mbu"] is None else f"{f['mbu']:.0%}"), Text(ratio(f["speedup"])))
    return t


def bars(values: dict[str, float], unit: str, width: int = 24) -> Table:
    t = table(("", "left"), (unit, "right"), ("%", "right"), ("", "left"))
    t.show_header = False
    total = sum(values.values()) or 1.0
    top = max(values.values(), default=0.0)
    for name, v in sorted(values.items(), key=lambda kv_: -kv_[1]):
        t.add_row(txt(name), Text(f"{v:.2f} {unit}"), Text(pct(v / total * 100, signed=False)),
                  Text(bar(v, top, width), style="cyan"))
    return t


def why_chosen(doc: dict[str, Any]) -> list[Any]:
    d = doc["decision"] or {}
    items: list[tuple[str, Any]] = [("source", d.get("source")), ("reason", d.get("reason"))]
    if doc["predicted_gain"] is not None:
        sd = doc["predicted_gain_sd"]
        items.append(("predicted", f"{doc['predicted_gain']:+.1%}" + (f" ± {sd:.1%}" if sd is not None else "")
                      + " over the incumbent"))
    if doc["actual_gain"] is not None:
        items.append(("measured", f"{doc['actual_gain']:+.1%} over the same incumbent"))
    if doc["gain_vs_baseline"] is not None:
        items.append(("vs baseline", f"{doc['gain_vs_baseline']:+.1%}"))
    if d.get("expected_cost_s") is not None:
        items.append(("expected cost", secs(d["expected_cost_s"])))
    out: list[Any] = [heading("why chosen, predicted vs measured"), kv(items)]
    for diag in doc["diagnoses"] or []:
        out.append(Text.assemble(("diagnosis: ", "bold"), str(diag["verdict"])))
    return out


def failure(doc: dict[str, Any]) -> list[Any]:
    f = doc["failure"]
    if not f:
        return []
    out: list[Any] = [heading("failure"), Text.assemble((f"{f['kind']}: ", "bold red"), str(f["reason"]))]
    if f.get("stderr_tail"):
        out.append(Text(f"worker stderr (last {STDERR_LINES} lines):", style="bold"))
        out.extend(Text(line, style="dim") for line in f["stderr_tail"].splitlines()[-STDERR_LINES:])
    return out


def detail(doc: dict[str, Any], best: int | None, unit: dict[str, Any] = TOK_PER_S_UNIT) -> Group:
    """The detail pane: everything `autoopt show N` prints, failure first when there is one; speed-ups
    over the baseline of the trial's own run (doc["baseline_of"])."""
    marks = " (baseline)" if doc["baseline"] else " ★ best" if doc["number"] == best else ""
    head = Text.assemble((f"trial {doc['number']}", "bold"), "  ", state_text(doc["state"]),
                         (marks, "bold yellow"), f"  run {doc['run_id']}  id {doc['trial_id']}  ",
                         f"started {doc['started_at'] or '-'}  cost {secs(doc['cost_s'])}  vs baseline "
                         f"#{doc['baseline_of'] if doc.get('baseline_of') is not None else '-'}")
    changed = "" if doc["baseline"] else changed_cell(doc).plain
    parts: list[Any] = [head, Text.assemble(("changed: ", "bold"), changed)] if changed else [head]
    parts += failure(doc)
    if doc["tok_per_s"]:
        parts += [heading(f"{value_label(unit)} per concurrency ({unit['text']})"), throughput(doc, unit)]
    if doc["buckets_ms"]:
        cov, kernels = doc["bucket_coverage"], doc["kernel_count"]
        parts += [heading(f"buckets: {sum(doc['buckets_ms'].values()):.2f} ms/step"
                          + (f", {cov:.0%} of the step covered" if cov is not None else "")
                          + (f", {kernels} kernels" if kernels is not None else "")),
                  bars(doc["buckets_ms"], "ms")]
    costs = {k: v for k, v in (doc["costs_s"] or {}).items() if k != "total"}
    if doc["transition_s"] is not None:
        costs.setdefault("transition", doc["transition_s"])
    if costs:
        total = (doc["costs_s"] or {}).get("total")
        parts += [heading("cost by phase" + (f": {secs(total)}" if total is not None else "")), bars(costs, "s")]
    parts += why_chosen(doc)
    if doc["what_ran"]:
        parts += [heading("what ran"), kv(doc["what_ran"].items())]
    if doc["correctness"]:
        c = doc["correctness"]
        parts += [heading("correctness"), kv((k, v) for k, v in c.items() if k not in ("what_ran",))]
    parts += [heading("configuration by layer"), configuration(doc["config"] or {})]
    return Group(*parts)


# ---- two trials -------------------------------------------------------------------------------
def diff(doc: dict[str, Any]) -> Group:
    a, b, unit = doc["a"], doc["b"], objective_unit(doc)
    parts: list[Any] = [Text.assemble(("A", "bold"), f" = trial {a['number']} ", state_text(a["state"]),
                                      "   ", ("B", "bold"), f" = trial {b['number']} ", state_text(b["state"]))]
    if doc["verdict"]:
        parts.append(Text.assemble(("verdict: ", "bold"), str(doc["verdict"])))
    elif doc["verdict_note"]:
        parts.append(Text(str(doc["verdict_note"]), style="dim"))
    parts.append(heading("knobs that differ"))
    if doc["knobs"]:
        t = table(("knob", "left"), ("A", "left"), ("B", "left"))
        for k in doc["knobs"]:
            t.add_row(txt(k["name"], "bold"), txt(k["a"]), txt(k["b"]))
        parts.append(t)
    else:
        parts.append(Text("no knob differs"))
    if doc["tok_per_s"]:
        label = value_label(unit)
        t = table(("C", "right"), (f"A {label} [CI]", "right"), (f"B {label} [CI]", "right"),
                  ("B speed-up vs A", "right"), ("", "left"))
        for r in doc["tok_per_s"]:
            style = {"faster": "green", "slower": "red"}.get(r["significant"] or "", "")
            t.add_row(Text(str(r["concurrency"])), Text(value_text(r.get("a_value", r["a"]), unit)),
                      Text(value_text(r.get("b_value", r["b"]), unit)), Text(gain(r["ratio"]), style=style),
                      txt(r["significant"], style))
        parts += [heading(f"{label} per concurrency ({unit['text']})"), t]
    if doc["buckets"]:
        parts += [heading("buckets (ms per decode step)"), bucket_deltas(doc)]
    return Group(*parts)


def bucket_deltas(doc: dict[str, Any]) -> Table:
    t = table(("bucket", "left"), ("A ms", "right"), ("B ms", "right"), ("Δ ms", "right"), ("Δ%", "right"),
              ("", "left"))
    top = max(abs(r["delta_ms"]) for r in doc["buckets"]) or 1.0
    for r in doc["buckets"]:
        style = "green" if r["delta_ms"] < 0 else "red" if r["delta_ms"] > 0 else ""
        t.add_row(txt(r["bucket"]), Text(f"{r['a_ms']:.2f}"), Text(f"{r['b_ms']:.2f}"),
                  Text(f"{r['delta_ms']:+.2f}", style=style), Text(pct(r["delta_pct"])),
                  Text(bar(abs(r["delta_ms"]), top, 16), style=style))
    tot = doc["total_ms"]
    if tot:
        t.add_row(Text("total", style="bold"), Text(f"{tot['a']:.2f}"), Text(f"{tot['b']:.2f}"),
                  Text(f"{tot['delta']:+.2f}"), Text(pct(tot["delta"] / tot["a"] * 100 if tot["a"] else None)),
                  Text(""))
    return t
