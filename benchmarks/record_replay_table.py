"""Record a replay table for real: measure the FULL grid of a small space on the built-in target
(through `autoopt run --strategy grid`, so every trial is an ordinary recorded trial), then turn the
study into a table `autoopt bench-search` replays:

    python benchmarks/record_replay_table.py --space dsv4_tiny_cpu --out benchmarks/data/tiny_cpu_grid

writes tiny_cpu_grid.csv (knob columns, tok_per_s, noise, measure_s, compile_s, bucket_<b>_ms, error)
and tiny_cpu_grid.restart.yaml (restart_s per knob: the median measured seconds of applying a
change of that knob, from the worker's own build/compile timings; restart_class per knob; the
space's buckets and priors; the machine it was recorded on). `--from-db URL --study NAME` converts
an existing study without measuring again.
"""
from __future__ import annotations

import argparse
import csv
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).parent))
from _meta import machine_meta  # noqa: E402

APPLY_KEYS = ("restart", "build", "compile")  # seconds of applying a configuration (not measuring)


def record(space: str, db: str, study: str, budget: str, extra: list[str]) -> None:
    cmd = ["autoopt", "run", "--space", space, "--strategy", "grid", "--budget", budget, "--study", study,
           "--db", db, "--no-confirm", "--plain", *extra]
    print("+", " ".join(cmd), flush=True)
    subprocess.run(cmd, check=True)


def _changed(a: dict[str, Any], b: dict[str, Any]) -> list[str]:
    return [k for k in b if a.get(k) != b.get(k)]


def build_table(db: str, study: str, space_name: str) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    from autoopt.targets.declared import load_declared
    from autoopt.store import Store

    store = Store.open(db, create=False)
    records = sorted(store.trials(study), key=lambda r: r.number)
    space = load_declared(space_name)
    knobs = [p.name for p in space.params]
    knob_buckets = {k.name: tuple(k.buckets) for k in space.knobs}
    knob_priors = {k.name: k.prior_speedup for k in space.knobs}
    conc = next(iter(space.objective.weights))
    rows, apply_by_knob = [], {k: [] for k in knobs}
    prev: dict[str, Any] | None = None
    for r in records:
        if r.state not in ("ok", "wrong", "failed") or (r.decision is not None and r.decision.source == "confirm"):
            continue
        m = r.measurement
        row: dict[str, Any] = {k: r.params.get(k) for k in knobs}
        costs = m.costs_s if m else {}
        apply_s = sum(costs.get(k, 0.0) for k in APPLY_KEYS)
        if prev is not None:
            changed = _changed(prev, r.params)
            if len(changed) == 1:  # a clean observation of what switching this one knob costs
                apply_by_knob[changed[0]].append(apply_s)
        prev = r.params
        if r.state == "ok" and m is not None:
            tp = m.tok_per_s[str(conc)]
            row["tok_per_s"] = round(tp.median, 3)
            row["noise"] = round(tp.rel_halfwidth / 1.96, 4)  # CI half-width -> relative sd
            row["error"] = ""
        else:
            row["tok_per_s"] = ""
            row["noise"] = ""
            row["error"] = (m.failure.reason if m and m.failure else f"guard verdict {r.state}")[:200]
        row["measure_s"] = round(sum(costs.get(k, 0.0) for k in ("warmup", "measure", "guard")), 3)
        row["compile_s"] = round(costs.get("compile", 0.0), 3)
        for b, ms in (m.buckets_ms if m else {}).items():
            row[f"bucket_{b}_ms"] = round(ms, 4)
        rows.append(row)
    restart_s = {k: round(statistics.median(v), 3) if v else 0.0 for k, v in apply_by_knob.items()}
    meta = {
        "recorded": "for real: the built-in dsv4 target, every point of the space's grid measured",
        "space": space_name, "space_sha256": space.sha256, "study": study,
        "objective": "tok_per_s", "direction": "maximize", "concurrency": conc,
        "measure_s": round(statistics.median(r["measure_s"] for r in rows), 3),
        "baseline": space.baseline_params(),
        "restart_s": restart_s,
        "restart_observations": {k: len(v) for k, v in apply_by_knob.items()},
        "restart_class": {k: space.restart_class_of(k) for k in knobs},
        "buckets": {p.name: list(knob_buckets.get(p.knob, ())) for p in space.params},
        "priors": {p.name: dict(knob_priors.get(p.knob) or {}) for p in space.params
                   if knob_priors.get(p.knob)},
        "machine": machine_meta(),
    }
    return rows, meta


def write_table(rows: list[dict[str, Any]], meta: dict[str, Any], out: Path) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    columns: list[str] = []
    for r in rows:
        columns += [c for c in r if c not in columns]
    with open(out.with_suffix(".csv"), "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=columns, restval="")
        w.writeheader()
        w.writerows(rows)
    with open(out.with_suffix(".restart.yaml"), "w") as f:
        f.write("# Recorded by benchmarks/record_replay_table.py; restart_s are measured medians.\n")
        yaml.safe_dump(meta, f, sort_keys=False)
    print(f"wrote {out.with_suffix('.csv')} ({len(rows)} rows) and {out.with_suffix('.restart.yaml')}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--space", default="dsv4_tiny_cpu")
    ap.add_argument("--out", default=str(REPO / "benchmarks" / "data" / "tiny_cpu_grid"))
    ap.add_argument("--db", default="sqlite:///db/replay_grid.sqlite")
    ap.add_argument("--study", default=None)
    ap.add_argument("--budget", default="60m")
    ap.add_argument("--from-db", action="store_true", help="convert an existing study, measure nothing")
    ap.add_argument("run_args", nargs="*", help="extra `autoopt run` arguments (after --)")
    args = ap.parse_args()
    study = args.study or f"{args.space}-grid"
    if not args.from_db:
        record(args.space, args.db, study, args.budget, args.run_args)
    rows, meta = build_table(args.db, study, args.space)
    write_table(rows, meta, Path(args.out))


if __name__ == "__main__":
    main()
