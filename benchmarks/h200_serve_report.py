"""The defaults vs the best of a tuned server study, per C: output tok/s with its 95% CI, TTFT, TPOT.

    python benchmarks/h200_serve_report.py DB STUDY OUT.json

Reads the study through autoopt's reading commands (`best --json`, `show N --json`): the baseline is
the defaults, the best is the rule's choice (`autoopt best`), measured again by the run's final
confirmation when there is one (its figures are reported, the search trial's beside them). Prints a
Markdown table for the README and writes OUT.json with the machine, the date and every figure.
"""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "benchmarks"))


def _cli(*args: str) -> dict[str, Any]:
    res = subprocess.run([sys.executable, "-m", "autoopt.cli", *args, "--json"], capture_output=True, text=True,
                         cwd=REPO, timeout=120)
    if res.returncode != 0:
        raise SystemExit(f"autoopt {' '.join(args)}: {res.stderr.strip()}")
    return json.loads(res.stdout)


def figures(db: str, study: str, number: int) -> dict[str, Any]:
    t = _cli("show", str(number), "--db", db, "--study", study)["trial"]
    per_c = {}
    for c, tp in sorted(t["tok_per_s"].items(), key=lambda kv: int(kv[0])):
        s = t.get("serving", {}).get(c, {})
        per_c[c] = {"output_tok_per_s": tp["median"], "ci": [tp["ci_low"], tp["ci_high"]], "n": tp["n"],
                    "median_ttft_ms": (s.get("median_ttft_ms") or {}).get("median"),
                    "median_tpot_ms": (s.get("median_tpot_ms") or {}).get("median"),
                    "p99_ttft_ms": (s.get("p99_ttft_ms") or {}).get("median")}
    return {"trial": number, "params": t["params"], "source": t["source"], "per_c": per_c,
            "server": t["what_ran"].get("server"), "costs_s": t["costs_s"]}


def main() -> None:
    from _meta import machine_meta

    db, study, out = sys.argv[1], sys.argv[2], Path(sys.argv[3])
    best = _cli("best", "--db", db, "--study", study)
    history = _cli("history", "--db", db, "--study", study)["trials"]
    base_no = best["baseline"]["number"]
    best_no = best["trial"]["number"]
    confirm = next((t["number"] for t in history if t["source"] == "confirm"
                    and t["params"] == best["trial"]["params"] and t["state"] == "ok"), None)
    doc = {"benchmark": "h200_serve", "meta": _trials_machine(db, study), "report_meta": machine_meta(),
           "study": study,
           "trials": len(history), "failed": sum(t["state"] != "ok" for t in history),
           "tuning_s": _span_s(history),
           "defaults": figures(db, study, base_no), "best": figures(db, study, best_no),
           "best_confirmation": figures(db, study, confirm) if confirm is not None else None,
           "speedup": best["speedup"]}
    out.write_text(json.dumps(doc, indent=1) + "\n")
    changed = {k: v for k, v in doc["best"]["params"].items() if doc["defaults"]["params"].get(k) != v}
    print(f"{doc['trials']} trials ({doc['failed']} failed) in {doc['tuning_s'] / 60:.1f} min; best #{best_no}: "
          f"{', '.join(f'{k}={v}' for k, v in changed.items()) or 'the defaults'}")
    print("| C | defaults tok/s [95% CI] | best tok/s [95% CI] | TTFT ms (def / best) | TPOT ms (def / best) |")
    print("|---|---|---|---|---|")
    shown = doc["best_confirmation"] or doc["best"]
    for c, d in doc["defaults"]["per_c"].items():
        b = shown["per_c"].get(c)
        if b is None:
            continue
        print(f"| {c} | {d['output_tok_per_s']:.1f} [{d['ci'][0]:.1f}, {d['ci'][1]:.1f}] | "
              f"{b['output_tok_per_s']:.1f} [{b['ci'][0]:.1f}, {b['ci'][1]:.1f}] | "
              f"{_ms(d['median_ttft_ms'])} / {_ms(b['median_ttft_ms'])} | "
              f"{_ms(d['median_tpot_ms'])} / {_ms(b['median_tpot_ms'])} |")
    print(f"wrote {out}")


def _trials_machine(db: str, study: str) -> dict[str, Any]:
    """The machine the trials ran on, as the store recorded it with them (the report may be written
    elsewhere, from the study's database: report_meta says where)."""
    import sqlite3

    with sqlite3.connect(f"file:{db}?mode=ro", uri=True) as con:
        row = con.execute("SELECT e.fingerprint, r.started_at FROM autoopt_environments e, autoopt_runs r "
                          "WHERE r.study_name = ? ORDER BY e.id, r.id LIMIT 1", (study,)).fetchone()
    if row is None:
        return {}
    env = json.loads(row[0])
    env.pop("server_command", None)
    return {"date": row[1], **env}


def _span_s(history: list[dict[str, Any]]) -> float:
    """Wall seconds from the first trial's start to the last one's end."""
    from datetime import datetime

    def at(text: str) -> float:
        return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()

    done = [t for t in history if t.get("started_at") and t.get("finished_at")]
    return max(at(t["finished_at"]) for t in done) - min(at(t["started_at"]) for t in done) if done else 0.0


def _ms(v: float | None) -> str:
    return "-" if v is None else f"{v:.1f}"


if __name__ == "__main__":
    main()
