"""The failure odds replayed over a recorded study: what would this tree's agent have given each failure?

Walks the study's finished trials in order, feeding the agent (autoopt.search.agent) the trials before
each one exactly as a run does (one refit per trial, each from the previous fit), and prints for every
trial that failed the odds this tree's model gives its configuration against the odds the run itself
stored when it chose it (`p_fail_raw` in the decision's notes). A failure the model had seen coming
(odds of 50 % or more) is one a run with this model would likely not have paid for again. Writes JSON.

The live H200 studies it is meant for (benchmarks/results/h200_live_10m*) are development data.

    python benchmarks/failure_replay.py --db benchmarks/results/h200_live_10m_run7/h200.sqlite --study flash-h200
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "benchmarks")]

from _meta import machine_meta  # noqa: E402
from cost_replay import finished_records, study_parser  # noqa: E402
from autoopt.search.agent.strategy import AgentStrategy  # noqa: E402
from autoopt.search.resume import outcome_from_record  # noqa: E402
from autoopt.targets.declared import load_declared  # noqa: E402

SEEN_COMING = 0.5


def replay(records: list, space) -> list[dict]:
    """One row per failed trial: this tree's raw odds for it, given every trial before it."""
    agent, rows = AgentStrategy(space, seed=0), []
    outcomes = [outcome_from_record(r) for r in records]
    for i, (rec, t) in enumerate(zip(records, outcomes)):
        agent._sync(outcomes[:i])  # the run's own path: trial by trial, each fit warm-started
        if t.objective is not None:
            continue
        code = agent.view.encode(t.params)
        if code is None:
            continue
        notes = t.decision.notes if t.decision is not None and t.decision.notes else {}
        stored = notes.get("p_fail_raw", notes.get("p_fail"))
        rows.append({"number": t.number, "run": rec.run_id, "failure": t.result.state,
                     "odds_now": float(agent.failures.raw_probs(code[None, :])[0]),
                     "odds_as_run": None if stored is None else float(stored),
                     "failures_before": agent.failures.n_failed})
    return rows


def main() -> None:
    args = study_parser(__doc__.split("\n\n")[0], "failure_replay.json").parse_args()
    records = finished_records(args.db, args.study)
    rows = replay(records, load_declared(args.space))
    print(f"{'trial':>6} {'run':>4} {'odds as run':>12} {'odds now':>9}")
    for r in rows:
        then = "-" if r["odds_as_run"] is None else f"{r['odds_as_run']:.3g}"
        print(f"{r['number']:>6} {r['run']:>4} {then:>12} {r['odds_now']:>9.3g}")
    seen_now = sum(r["odds_now"] >= SEEN_COMING for r in rows)
    seen_then = sum((r["odds_as_run"] or 0.0) >= SEEN_COMING for r in rows)
    print(f"failures seen coming (odds >= {SEEN_COMING:.0%}): {seen_now} of {len(rows)} now, "
          f"{seen_then} as run")
    doc = {"benchmark": "failure_replay", "meta": machine_meta(), "db": args.db, "study": args.study,
           "development_data": True, "seen_coming_now": seen_now, "seen_coming_as_run": seen_then,
           "failures": rows}
    args.out.write_text(json.dumps(doc, indent=1) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
