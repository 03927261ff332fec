"""Is a profile at one concurrency enough for an objective mixed over several? An offline check on the
H200 decode table (benchmarks/data/h200_flash_decode.csv: tok/s at C = 1, 16, 64 per configuration,
one profile at C = 64 with its step wall, device-busy and host milliseconds).

The agent's Amdahl estimate reads one profile, at the largest concurrency, and applies the relative
change of that step to the whole objective (the weighted geometric mean of tok/s over C). For every
ordered pair of valid rows (a reference r, a configuration x) this script compares the true change
of the objective, log mix(x) - log mix(r), with three predictions made from r's and x's figures:

  profile at C=64      -log(step wall(x) / step wall(r)), both from the C = 64 profiles: today's rule
                       with perfect bucket deltas
  host fixed over C    per concurrency, r's step wall from its measured tok/s, split into the C = 64
                       profile's host milliseconds (held fixed over C: a launch costs the same at any
                       batch) and the rest, which scales with the device time: what profiling at every
                       concurrency would buy, in its cheapest form
  true C=64 tok/s      -log(tok/s ratio at C = 64) for every C: the best any one-concurrency
                       predictor can do

    python benchmarks/concurrency_split.py [--table CSV] [--out JSON]
"""
from __future__ import annotations

import argparse
import csv
import math
import statistics
import sys
from pathlib import Path

import yaml

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from _meta import machine_meta, write_result  # noqa: E402

SPACE = HERE.parent / "autoopt" / "data" / "dsv4_flash_decode.yaml"  # the space the table was recorded for
WEIGHTS = {int(c): float(w) for c, w in yaml.safe_load(SPACE.read_text())["objective"]["weights"].items()}
NEEDED = ["metric_step_wall_ms", "metric_host_ms", "metric_device_busy_ms"] + [
    f"metric_tok_per_s_{c}" for c in WEIGHTS]


def valid_rows(path: Path) -> list[dict[str, float]]:
    """Rows that ran (no error) with every figure the predictions need, as floats."""
    out = []
    for row in csv.DictReader(path.open()):
        try:
            figures = {k: float(row[k]) for k in NEEDED}
        except (KeyError, ValueError):
            continue
        if not row.get("error") and all(v > 0 for k, v in figures.items() if k != "metric_host_ms"):
            out.append(figures)
    return out


def log_mix(r: dict[str, float]) -> float:
    return sum(w * math.log(r[f"metric_tok_per_s_{c}"]) for c, w in WEIGHTS.items())


def profile_at_64(r: dict[str, float], x: dict[str, float]) -> float:
    return -math.log(x["metric_step_wall_ms"] / r["metric_step_wall_ms"])


def host_fixed(r: dict[str, float], x: dict[str, float]) -> float:
    gain = 0.0
    for c, w in WEIGHTS.items():
        wall = c / r[f"metric_tok_per_s_{c}"] * 1000.0  # ms per step at C = c
        host = min(r["metric_host_ms"], 0.95 * wall)  # a step is never all host
        device = wall - host
        host_x = host * (x["metric_host_ms"] / r["metric_host_ms"] if r["metric_host_ms"] > 0 else 1.0)
        device_x = device * x["metric_device_busy_ms"] / r["metric_device_busy_ms"]
        gain += w * -math.log((host_x + device_x) / wall)
    return gain


def true_64(r: dict[str, float], x: dict[str, float]) -> float:
    return math.log(x["metric_tok_per_s_64"] / r["metric_tok_per_s_64"])


PREDICTORS = {"profile at C=64": profile_at_64, "host fixed over C": host_fixed, "true C=64 tok/s": true_64}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--table", type=Path, default=HERE / "data" / "h200_flash_decode.csv")
    ap.add_argument("--out", default=str(HERE / "results" / "concurrency_split.json"))
    args = ap.parse_args()
    rows = valid_rows(args.table)
    errors: dict[str, list[float]] = {name: [] for name in PREDICTORS}
    for r in rows:
        for x in rows:
            if x is r:
                continue
            truth = log_mix(x) - log_mix(r)
            for name, predict in PREDICTORS.items():
                errors[name].append(abs(predict(r, x) - truth))
    pairs = len(errors["profile at C=64"])
    summary = {name: {"median_abs_log_error": statistics.median(e),
                      "p90_abs_log_error": statistics.quantiles(e, n=10)[-1],
                      "better_than_today_share": sum(a < b for a, b in zip(e, errors["profile at C=64"])) / pairs}
               for name, e in errors.items()}
    print(f"{args.table.name}: {len(rows)} valid rows, {pairs} ordered pairs; |log error| of the objective's change")
    print(f"{'predictor':<20} {'median':>8} {'p90':>8} {'better than today':>18}")
    for name, s in summary.items():
        print(f"{name:<20} {s['median_abs_log_error']:>8.3f} {s['p90_abs_log_error']:>8.3f} "
              f"{100 * s['better_than_today_share']:>17.0f}%")
    payload = {"benchmark": "concurrency_split", "machine": machine_meta(), "table": str(args.table),
               "weights": WEIGHTS, "rows": len(rows), "pairs": pairs, "summary": summary,
               "development_data": False}
    print(f"wrote {write_result(args.out, payload)}")


if __name__ == "__main__":
    main()
