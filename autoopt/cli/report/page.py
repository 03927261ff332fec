"""The report's HTML page: one file, styles, plots (inline SVG) and script inside, nothing fetched at
view time. User data is escaped; the only script sorts the trials table when a header is clicked."""
from __future__ import annotations

from html import escape
from typing import Any

from autoopt.cli.render_history import objective_text, objective_unit, params_text, secs, value_label, value_text

STYLE = """
body { font-family: sans-serif; margin: 24px auto; max-width: 960px; color: #222; }
h1 { font-size: 22px; } h2 { font-size: 17px; margin-top: 28px; border-bottom: 1px solid #ddd; }
.facts td { padding: 2px 12px 2px 0; } .note { color: #666; font-size: 13px; }
table.trials { border-collapse: collapse; font-size: 12px; width: 100%; }
table.trials th { cursor: pointer; background: #f0f0f0; text-align: left; position: sticky; top: 0; }
table.trials td, table.trials th { padding: 2px 6px; border-bottom: 1px solid #eee; vertical-align: top; }
table.trials td:nth-child(-n+5) { white-space: nowrap; }
tr.best td { background: #fff6d5; } tr.baseline td { background: #e8f1fb; }
.ok { color: #2e7d32; } .failed, .wrong { color: #c62828; } .interrupted { color: #e69f00; }
figure { margin: 8px 0; } figcaption { font-size: 13px; color: #555; }
"""

# Sorts the trials table by the clicked column (numbers by value, text alphabetically); a second
# click on the same column reverses it. body[data-sortable=ready] says the script ran to its end.
SCRIPT = """
document.querySelectorAll("table.trials th").forEach(function (th, col) {
  th.addEventListener("click", function () {
    var body = th.closest("table").tBodies[0];
    var rows = Array.prototype.slice.call(body.rows);
    var down = th.dataset.dir !== "up";
    th.dataset.dir = down ? "up" : "down";
    rows.sort(function (a, b) {
      var x = a.cells[col].dataset.v, y = b.cells[col].dataset.v;
      var nx = parseFloat(x), ny = parseFloat(y);
      var c = (isNaN(nx) || isNaN(ny)) ? String(x).localeCompare(String(y)) : nx - ny;
      return down ? c : -c;
    });
    rows.forEach(function (r) { body.appendChild(r); });
  });
});
document.body.dataset.sortable = "ready";
"""


def _cell(text: str, sort_value: Any = None, cls: str = "") -> str:
    v = text if sort_value is None else sort_value
    return f'<td data-v="{escape(str(v))}"{f" class={chr(34)}{cls}{chr(34)}" if cls else ""}>{escape(text)}</td>'


def trials_table(rows: list[dict[str, Any]], best: int | None, unit: dict[str, Any]) -> str:
    heads = ["#", "state", f"{value_label(unit)} [95% CI]", "speed-up over its run's baseline [CI]", "cost", "source",
             "what changed / failure"]
    out = ['<table class="trials"><thead><tr>' + "".join(f"<th>{escape(h)}</th>" for h in heads)
           + "</tr></thead><tbody>"]
    for r in sorted(rows, key=lambda r: r["number"]):
        sp = r["speedup"]
        cls = "baseline" if r["baseline"] else "best" if r["number"] == best else ""
        mark = " (baseline)" if r["baseline"] else " ★ best" if r["number"] == best else ""
        changed = (f"{r['failure']['kind']}: {r['failure']['reason']}" if r["failure"] else
                   params_text(r["changes"]) if r["changes"] else "= baseline" if r["changes"] == {} else
                   params_text(r["params"] or {}))
        sp_text = (f"x{sp['median']:.3f} [{sp['ci_low']:.3f}, {sp['ci_high']:.3f}]" + (" *" if r["significant"] else "")
                   if sp else "-")
        cells = [_cell(f"{r['number']}{mark}", r["number"]), _cell(r["state"], cls=r["state"]),
                 _cell(value_text(r.get("objective_value"), unit), r["objective"]["median"] if r["objective"] else -1),
                 _cell(sp_text, sp["median"] if sp else -1), _cell(secs(r["cost_s"]), r["cost_s"] or 0),
                 _cell(r["source"] or "-"), _cell(changed)]
        out.append(f'<tr class="{cls}">' + "".join(cells) + "</tr>")
    return "\n".join(out + ["</tbody></table>"])


def figure(svg: str | None, caption: str, png: str | None) -> str:
    if svg is None:
        return f'<p class="note">{escape(caption)}: nothing to plot in this study.</p>'
    link = f' (<a href="{escape(png)}">PNG</a>)' if png else ""
    return f"<figure>{svg}<figcaption>{escape(caption)}{link}</figcaption></figure>"


def facts(head: dict[str, Any], rows: list[dict[str, Any]], best: int | None) -> str:
    by_number, unit = {r["number"]: r for r in rows}, objective_unit(head)
    counts = ", ".join(f"{n} {s}" for s, n in sorted((head.get("counts") or {}).items()))
    value = lambda n: value_text(by_number[n].get("objective_value"), unit)  # noqa: E731
    baselines = [n for n in head.get("baselines") or [] if n in by_number]
    items = [("database", head.get("db")), ("trials", f"{len(rows)} ({counts})"),
             ("objective", objective_text(head)),
             ("baselines (each trial against its own run's)" if len(baselines) > 1 else "baseline",
              "; ".join(f"#{n}: {value(n)}" for n in baselines) or "-")]
    if best is not None and best in by_number and not by_number[best]["baseline"]:
        b = by_number[best]
        sp = b["speedup"]
        items.append(("best (autoopt best's rule)", f"#{best}: {value(best)}"
                      + (f", x{sp['median']:.3f} [{sp['ci_low']:.3f}, {sp['ci_high']:.3f}]" if sp else "")))
        items.append(("best's knobs vs baseline", params_text(b["changes"] or {}) or "-"))
    return '<table class="facts">' + "".join(f"<tr><td><b>{escape(k)}</b></td><td>{escape(str(v))}</td></tr>"
                                             for k, v in items) + "</table>"


def page(study: str, head: dict[str, Any], rows: list[dict[str, Any]], best: int | None,
         sections: list[tuple[str, str]], generated: str) -> str:
    body = "\n".join(f"<h2>{escape(title)}</h2>\n{html}" for title, html in sections)
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>autoopt report: {escape(study)}</title>
<style>{STYLE}</style></head>
<body>
<h1>autoopt study <code>{escape(study)}</code></h1>
<p class="note">generated {escape(generated)} by autoopt report; every figure is read from the trial database.
Speed-ups are over the baseline of each trial's own run, with the conservative interval [T.lo/B.hi, T.hi/B.lo];
* = outside the noise.</p>
{facts(head, rows, best)}
{body}
<h2>trials</h2>
<p class="note">click a column header to sort.</p>
{trials_table(rows, best, objective_unit(head))}
<script>{SCRIPT}</script>
</body></html>
"""
