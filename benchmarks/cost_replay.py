"""The cost model replayed over a recorded study: what would it have predicted for each transition?

Walks the study's finished trials in order as the runs saw them (each run starts with nothing built,
a failure leaves nothing built), asks autoopt.search.cost.CostModel for the trial's transition seconds
with the target's facts stored beside the trial (whether the kernels were cached, a known figure),
then teaches it the trial. Prints, per run, the share of the trials that ran whose actual transition
was within 50 % of the prediction (the run summary's rule, autoopt.search.run_types.transition_within)
for the model of this tree and for the prediction the run itself stored; writes JSON beside.

The live H200 study it is meant for (benchmarks/results/h200_live_10m) is development data: a cost
model changed after reading it is not tested by it.

    python benchmarks/cost_replay.py --db benchmarks/results/h200_live_10m/h200.sqlite --study flash-h200
    python benchmarks/cost_replay.py --db benchmarks/results/h*_live_*/h200.sqlite --study flash-h200 \
        --out /tmp/cost_replay.all.json                  # every committed live study, then pooled
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "benchmarks")]

from _meta import machine_meta  # noqa: E402
from autoopt.search.cost import CostModel  # noqa: E402
from autoopt.search.loop import outcome_from_record  # noqa: E402
from autoopt.search.resume import interrupted  # noqa: E402
from autoopt.search.run_types import transition_within  # noqa: E402
from autoopt.store.reading import open_for_reading  # noqa: E402
from autoopt.targets.builtin.target import BuiltinTarget  # noqa: E402
from autoopt.targets.builtin.transitions import transition_facts  # noqa: E402
from autoopt.targets.declared import load_declared  # noqa: E402


WORKER_DIES = ("crash", "hang", "cuda")  # autoopt.targets.builtin.worker.classify: the fatal kinds


def replay(records: list, space, target: BuiltinTarget) -> list[dict]:
    """Each trial's predicted and actual transition seconds. The target's facts are derived again
    from the configurations the trials built, as stored (autoopt.targets.builtin.transitions, as the
    live target reported them with this tree's code), with a worker's caches followed as the runs'
    trials filled them. The stored configuration, not this tree's mapping of the params: the seconds
    were spent on what was built (the mapping changed once, when hc_head began to follow the last
    layer's mHC knobs)."""
    costs = CostModel(space)
    built, built_config, run, rows, alive, caches = None, None, None, [], False, target.new_caches()
    for rec in records:
        t = outcome_from_record(rec)
        if rec.run_id != run:  # a new run starts a fresh worker
            built, run, alive = None, rec.run_id, False
            caches.clear()
        to = target.normalize(rec.config or space.params_to_config(t.params))
        facts = transition_facts(built_config if built else None, to, caches, alive)
        est = costs.estimate(built, t.params, facts)
        stored = t.decision.expected_cost if t.decision is not None else None
        if t.result.state in ("ok", "wrong"):
            rows.append({"number": rec.number, "run": rec.run_id, "actual_s": t.result.transition_s,
                         "predicted_s": est.transition_s, "restart_class": est.restart_class,
                         "redone": list(est.redone), "changed": list(est.changed), "cached": est.cached,
                         "stored_s": stored.transition_s if stored else None, "fresh": built is None})
            caches.remember(to)
        costs.observe(built, t.params, t.result, est)
        built, built_config = (dict(t.params), to) if t.result.ok else (None, None)
        # the builtin target's worker survives a failure of any kind but a crash, hang or CUDA fault
        alive = t.result.state in ("ok", "wrong") or (rec.failure is not None
                                                       and rec.failure.kind not in WORKER_DIES)
        if not alive:
            caches.clear()
    return rows


def study_parser(description: str, out_name: str, many: bool = False) -> argparse.ArgumentParser:
    """The options of a replay over a recorded study (this script's and failure_replay.py's);
    `many`: --db takes several studies, replayed one by one and pooled."""
    ap = argparse.ArgumentParser(description=description)
    ap.add_argument("--db", required=True, nargs="+" if many else None,
                    help="database URL or SQLite path" + (" (several: each replayed, then pooled)" if many else ""))
    ap.add_argument("--study", required=True)
    ap.add_argument("--space", default="dsv4_flash_decode")
    ap.add_argument("--out", type=Path, default=REPO / "benchmarks" / "results" / out_name)
    return ap


def finished_records(db: str, study: str) -> list:
    """The study's trials that finished (ok, wrong or failed), in order, interrupted ones left out."""
    url = db if "://" in db else f"sqlite:///{db}"
    with open_for_reading(url) as store:
        return [r for r in store.trials(study, ("ok", "wrong", "failed"), with_samples=False)
                if not interrupted(r)]


def run_summary(rows: list[dict], label: str = "") -> dict[str, dict[str, int]]:
    """Per run of one study: trials, and how many this tree / the run itself predicted within 50 %.
    Prints one line per run (`label`: the study's, when several are replayed)."""
    summary = {}
    for run in sorted({r["run"] for r in rows}):
        mine = [r for r in rows if r["run"] == run]
        now = sum(transition_within(r["predicted_s"], r["actual_s"]) for r in mine)
        then = sum(transition_within(r["stored_s"], r["actual_s"]) for r in mine if r["stored_s"] is not None)
        summary[str(run)] = {"trials": len(mine), "within_now": now, "within_stored": then}
        print(f"{label:<28}{run:>4} {len(mine):>7} {now:>12} ({100 * now / len(mine):3.0f} %) {then:>12} "
              f"({100 * then / len(mine):3.0f} %)")
    return summary


def pooled(summaries: list[dict[str, dict[str, int]]]) -> dict[str, dict[str, int]]:
    """Every run of every study summed ("all"), and the first runs alone, the runs from empty ("1")."""
    out = {}
    for key, runs in (("all", None), ("1", "1")):
        picked = [v for s in summaries for run, v in s.items() if runs is None or run == runs]
        out[key] = {f: sum(v[f] for v in picked) for f in ("trials", "within_now", "within_stored")}
    return out


def main() -> None:
    ap = study_parser(__doc__.split("\n\n")[0], "cost_replay.json", many=True)
    ap.add_argument("--preset", default="flash-slice", help="the builtin target's preset the study ran")
    args = ap.parse_args()
    space, target = load_declared(args.space), BuiltinTarget(args.preset, "cuda")
    several = len(args.db) > 1
    print(f"{'study' if several else '':<28}{'run':>4} {'trials':>7} {'this tree within 50%':>22} "
          f"{'as the run predicted':>22}")
    studies = []
    for db in args.db:
        rows = replay(finished_records(db, args.study), space, target)
        label = Path(db.split("///")[-1]).parent.name if several else ""
        studies.append({"db": db, "summary": run_summary(rows, label), "trials": rows})
    doc = {"benchmark": "cost_replay", "meta": machine_meta(), "study": args.study, "development_data": True}
    if several:
        total = pooled([s["summary"] for s in studies])
        for key, name in (("all", "all runs"), ("1", "runs from empty")):
            t = total[key]
            print(f"{'pooled, ' + name:<32} {t['trials']:>7} {t['within_now']:>12} "
                  f"({100 * t['within_now'] / max(t['trials'], 1):4.1f} %) {t['within_stored']:>12}")
        doc |= {"pooled": total, "studies": studies}
    else:
        doc |= studies[0]
    args.out.write_text(json.dumps(doc, indent=1) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
