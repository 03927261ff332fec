"""Two recordings of the same design (benchmarks/record_decode_table.py, each in its own process) ->
the replay table, whose noise is the scatter between processes, not only within one.

One process's CI says little about the next process: on the H200 (2026-12-04) the within-process
noise of the 168 rows had a median of 0.5 %, while the second process read the CUDA-graph rows a
median 3.8 % higher (sd of the log ratio 3.1 %) and the host-bound eager rows anywhere from half to
twice (sd 35 %). A replay drawing from the within-process noise alone would let a search trust
differences that a real run cannot see.

    python benchmarks/merge_decode_passes.py PASS1.recording.csv PASS2.recording.csv \
        --side-car PASS1.restart.yaml --out benchmarks/data/h200_flash_decode

Per row: the objective is the geometric mean of both passes; noise (relative sd of one evaluation)
= sqrt(within^2 + between^2), within = the larger of the two passes' own noise, between = the rms
log ratio of the passes over the rows of its group (CUDA graphs on / off: replayed vs host-bound
steps), divided by sqrt(2) (the sd of one pass, the two being independent draws). A row that failed
in either pass stays failed, with that pass's reason. Costs, buckets and the other metrics are the
first pass's (its caches were cold, as a new study's are); the second pass's objective is kept as
metric_tok_per_s_mix_pass2.
"""
from __future__ import annotations

import argparse
import csv
import math
import statistics
import sys
from pathlib import Path
from typing import Any

import yaml

sys.path.insert(0, str(Path(__file__).parent))
from record_decode_table import LEVELS, key_of, read_done  # noqa: E402


def group_of(row: dict[str, Any]) -> str:
    """Rows whose process-to-process scatter is pooled: replayed from a CUDA graph, or host-bound."""
    return "cuda_graphs=on" if row["cuda_graphs"] == "on" else "cuda_graphs=off"


def between_sd(first: dict, second: dict) -> dict[str, float]:
    """Group -> sd of one evaluation between processes (rms log ratio / sqrt 2) over rows ok in both."""
    squares: dict[str, list[float]] = {}
    for key, a in first.items():
        b = second[key]
        if a["error"] or b["error"]:
            continue
        d = math.log(float(b["tok_per_s_mix"]) / float(a["tok_per_s_mix"]))
        squares.setdefault(group_of(a), []).append(d * d)
    return {g: math.sqrt(sum(v) / len(v) / 2) for g, v in squares.items()}


def merge(first_rows: list[dict], second_rows: list[dict]) -> tuple[list[dict], dict[str, Any]]:
    first = {key_of(r): r for r in first_rows}
    second = {key_of(r): r for r in second_rows}
    if set(first) != set(second):
        missing = sorted(set(first) ^ set(second))[:3]
        raise SystemExit(f"the passes hold different rows (e.g. {missing}): record both over the whole design")
    between = between_sd(first, second)
    out = []
    for key, a in first.items():  # the first pass's order: the order its costs were paid in
        b, row = second[key], dict(a)
        row["metric_tok_per_s_mix_pass2"] = b["tok_per_s_mix"]
        if a["error"] or b["error"]:
            row.update(tok_per_s_mix="", noise="", error=a["error"] or f"second pass: {b['error']}")
        else:
            mix = math.sqrt(float(a["tok_per_s_mix"]) * float(b["tok_per_s_mix"]))
            within = max(float(a["noise"] or 0.0), float(b["noise"] or 0.0))
            noise = math.sqrt(within ** 2 + between[group_of(a)] ** 2)
            row.update(tok_per_s_mix=round(mix, 3), noise=round(noise, 4))
        out.append(row)
    return out, {g: round(v, 4) for g, v in between.items()}


def split_first_use(rows: list[dict], knob: str, value: str) -> float:
    """Move the cold compile of `knob=value` out of the first row (in recording order) that paid it,
    into a first-use cost any row with that value pays once (autoopt.targets.replay.target): whichever
    such row a search visits first pays it, as a live worker does (the recording visited one by
    chance). The cold part: that row's apply and guard seconds beyond the median of the other rows
    with the value (the guard compiles the step again, at batch 2). Returns the seconds moved."""
    with_value = [r for r in rows if str(r[knob]) == value]
    first, rest = with_value[0], with_value[1:]
    apply_s = statistics.median(float(r["compile_s"]) for r in rest) if rest else 0.0
    guard_s = statistics.median(float(r["metric_guard_s"]) for r in rest if r["metric_guard"]) if rest else 0.0
    cold = (float(first["compile_s"]) - apply_s) + (float(first["metric_guard_s"]) - guard_s)
    first["compile_s"] = round(apply_s, 3)
    first["measure_s"] = round(float(first["measure_s"]) - float(first["metric_guard_s"]) + guard_s, 3)
    first["metric_guard_s"] = round(guard_s, 3)
    return round(cold, 3)


def declarations(space_file: Path, knobs: list[str], baseline: dict[str, Any]) -> dict[str, Any]:
    """The space file's own declarations of the table's knobs (buckets, cuts, prior speed-ups), so a
    replay poses the search the problem a live run on that space has: what the target claims before
    anything is measured, written before this table existed, not fitted to it."""
    doc = yaml.safe_load(space_file.read_text())["knobs"]
    out: dict[str, dict[str, Any]] = {"buckets": {}, "cuts": {}, "priors": {}}
    for k in knobs:
        body = doc.get(k) or {}
        if body.get("buckets"):
            out["buckets"][k] = list(body["buckets"])
        if body.get("cuts"):
            out["cuts"][k] = body["cuts"]
        speedup = (body.get("prior") or {}).get("speedup")
        if isinstance(speedup, (int, float)):  # one figure for every value but the baseline
            speedup = {str(v): speedup for v in LEVELS[k] if str(v) != str(baseline[k])}
        if speedup:
            out["priors"][k] = {str(v): float(x) for v, x in speedup.items()}
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("first", type=Path, help="the first pass's OUT.recording.csv")
    ap.add_argument("second", type=Path, help="the second pass's, recorded in another process")
    ap.add_argument("--side-car", type=Path, required=True, help="the first pass's OUT.restart.yaml")
    ap.add_argument("--out", type=Path, required=True, help="writes OUT.csv and OUT.restart.yaml")
    ap.add_argument("--space", type=Path, default=Path(__file__).parents[1] / "autoopt/data/dsv4_flash_decode.yaml",
                    help="the space file whose knob declarations (buckets, cuts, priors) the side-car carries")
    ap.add_argument("--first-use", action="append", default=["step_compile=inductor"], metavar="KNOB=VALUE",
                    help="a value whose first compile every later row shares (split_first_use; repeatable)")
    ap.add_argument("--budget-s", type=float, default=900.0,
                    help="bench-search's default budget on the table (issue 14: 15 simulated minutes)")
    args = ap.parse_args()
    rows, between = merge(read_done(args.first), read_done(args.second))
    meta = yaml.safe_load(args.side_car.read_text())
    meta["recorded"] = (f"{meta['recorded']}; twice, in two processes ({args.first.name}, {args.second.name}), "
                        "merged by benchmarks/merge_decode_passes.py")
    meta["noise"] = {"method": "sqrt(within^2 + between^2) per row; between = rms log ratio of the two "
                               "passes over the row's group / sqrt(2)", "between_sd": between}
    meta["budget_s"] = args.budget_s
    first_use: dict[str, dict[str, float]] = {}
    for item in dict.fromkeys(args.first_use):
        knob, value = item.split("=", 1)
        first_use.setdefault(knob, {})[value] = split_first_use(rows, knob, value)
    meta["first_use_s"] = first_use
    meta.update(declarations(args.space, list(LEVELS), meta["baseline"]))
    meta["declarations"] = f"buckets, cuts and priors: the knobs' entries in {args.space.name}"
    out = args.out
    out.parent.mkdir(parents=True, exist_ok=True)
    with open(out.with_suffix(".csv"), "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]), restval="")
        w.writeheader()
        w.writerows(rows)
    with open(out.with_suffix(".restart.yaml"), "w") as f:
        f.write("# Recorded by benchmarks/record_decode_table.py (twice), merged by "
                "benchmarks/merge_decode_passes.py; restart_s are medians of single-knob switches.\n")
        yaml.safe_dump(meta, f, sort_keys=False)
    failed = sum(1 for r in rows if r["error"])
    print(f"{len(rows)} rows ({failed} failed) over {len(LEVELS)} knobs -> {out.with_suffix('.csv')}; "
          f"between-process sd: " + ", ".join(f"{g} {100 * v:.1f}%" for g, v in between.items()))


if __name__ == "__main__":
    main()
