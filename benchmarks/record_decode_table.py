"""Record a replay table of the dsv4 decode step on this machine's GPU: every configuration of a
fixed design over the knobs that matter (CUDA graphs, step_compile, glue, MoE dispatch, attention
kernel and its split, the mHC GEMM dtype and operand, stacked projections), measured in ONE process
through the worker's own measurement code (autoopt.targets.builtin.evaluate), with the correctness
guard, tok/s at each concurrency, one profile (buckets, host time, kernel launches) and the seconds
each configuration took to apply (build / recompile / rebuild), as `bench-search` replays it.

    python benchmarks/record_decode_table.py --out benchmarks/data/h200_flash_decode \
        [--preset flash-slice] [--concurrency 1,16,64] [--limit-s 540] [--device cuda]

Writes OUT.recording.csv (a row per configuration, appended as it goes, so a call cut short keeps its
rows and the next call resumes after them), then OUT.csv (the replay table) and OUT.restart.yaml
(objective, constraints of the design, restart classes, apply seconds per knob measured here, buckets,
the machine). The guard runs on every Nth row; the others carry its median seconds in OUT.csv. Rows are visited in an order
that changes few knobs at a time, as a person (or the agent) would; caches of kernels compiled for
earlier rows are reused, as in a long-running server, and each row records what it paid.
`--device cpu --preset tiny` checks the script itself in seconds.
"""
from __future__ import annotations

import argparse
import csv
import itertools
import json
import math
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "kernels"), str(Path(__file__).parent)]

from _meta import machine_meta  # noqa: E402

# The design. A row per combination that satisfies CONSTRAINTS (the same expressions the replay
# space reads, so an absent row is a forbidden one, never a silent hole).
LEVELS: dict[str, tuple[Any, ...]] = {
    "cuda_graphs": ("off", "on"),
    "step_compile": ("off", "inductor"),
    "moe_experts": ("loop", "grouped", "triton_grouped"),
    "glue": ("eager", "triton"),
    "attention": ("per_head", "mma"),
    "attn_split_k": (1, 4),
    "attn_heads_per_tile": (16, 32, 64),
    "mhc_gemm": ("fp32", "bf16"),
    "mhc_operand": ("cast_from_fp32", "view_bf16_residual"),
    "proj_gemms": ("separate", "stacked"),
}
CONSTRAINTS = [
    "mhc_operand == 'cast_from_fp32' or mhc_gemm == 'bf16'",  # the space's own rule
    "moe_experts != 'loop' or (cuda_graphs == 'off' and step_compile == 'off')",  # host-read counts
    # split-K and heads per tile are tiles of the mma kernel (the space's own rule)
    "attention == 'mma' or (attn_split_k == 1 and attn_heads_per_tile == 16)",
    "proj_gemms == 'separate' or mhc_gemm == 'bf16'",  # stacked projections on the bf16 mHC path
    # The host-bound eager step (GPU busy ~13 % of its wall; an eager row costs several graph rows):
    # its launch-count knobs in full, the kernel-side knobs at their two ends only.
    "cuda_graphs == 'on' or step_compile != 'off' or (attn_split_k == 1 and attn_heads_per_tile == 16 "
    "and proj_gemms == 'separate' and (mhc_gemm == 'fp32' or mhc_operand == 'view_bf16_residual'))",
    # step_compile is recorded on the fused path only: each such row costs two Inductor compiles
    "step_compile == 'off' or (glue == 'triton' and mhc_operand == 'view_bf16_residual' and "
    "proj_gemms == 'stacked' and attention == 'mma' and attn_split_k == 1 and attn_heads_per_tile == 16)",
]
WEIGHTS = {1: 0.2, 16: 0.3, 64: 0.5}  # dsv4_flash_decode's objective: weighted geometric mean
APPLY_KEYS = ("build", "compile", "restart")
COST_PHASES = ("restart", "build", "compile", "warmup", "measure", "guard", "profile")


def allowed(cfg: dict[str, Any]) -> bool:
    from autoopt.space.constraints import parse_constraint  # the space's own parser (ast, no eval)

    return all(parse_constraint(expr, set(LEVELS)).holds(cfg) for expr in CONSTRAINTS)


def design() -> list[dict[str, Any]]:
    """Every allowed combination, in Gray-code-like order: consecutive rows differ in few knobs. The
    step_compile rows come last: they are the dearest (two Inductor compiles), and a recording cut
    short before them is still a whole table once `step_compile == 'off'` is added to CONSTRAINTS."""
    names = list(LEVELS)
    rows = [dict(zip(names, combo)) for combo in itertools.product(*LEVELS.values())]
    rows = [r for r in rows if allowed(r)]
    ordered: list[dict[str, Any]] = []
    for block in ([r for r in rows if r["step_compile"] == "off"], [r for r in rows if r["step_compile"] != "off"]):
        left = list(block)
        while left:  # greedy nearest neighbour: the next row changes the fewest knobs
            prev = ordered[-1] if ordered else left[0]
            nxt = min(left, key=lambda r: sum(r[k] != prev[k] for k in names))
            ordered.append(nxt)
            left.remove(nxt)
    return ordered


def weighted_mix(tok_per_s: dict[str, dict[str, float]], conc: list[int]) -> tuple[float, float]:
    """(weighted geometric mean of the per-C medians, its relative sd from the per-C CIs)."""
    w = {c: WEIGHTS.get(c, 1.0) for c in conc}
    total = sum(w.values())
    log_mix = sum(w[c] * math.log(tok_per_s[str(c)]["median"]) for c in conc) / total
    # relative sd of each median ~ CI half-width / 1.96; the mix's, the weighted root sum of squares
    rel = [((tok_per_s[str(c)]["ci_high"] - tok_per_s[str(c)]["ci_low"]) / 2 / 1.96
            / tok_per_s[str(c)]["median"]) for c in conc]
    sd = math.sqrt(sum((w[c] / total * r) ** 2 for c, r in zip(conc, rel)))
    return math.exp(log_mix), sd


def table_row(cfg: dict[str, Any], doc: dict[str, Any], conc: list[int], wall_s: float) -> dict[str, Any]:
    costs = doc.get("costs_s") or {}
    row: dict[str, Any] = dict(cfg)
    verdict = (doc.get("correctness") or {}).get("verdict")
    ok = doc.get("status") == "ok"
    if ok:
        mix, sd = weighted_mix(doc["tok_per_s"], conc)
        row.update(tok_per_s_mix=round(mix, 3), noise=round(sd, 4), error="")
    else:
        failure = doc.get("failure") or {}
        why = failure.get("reason") or f"guard verdict {doc.get('status')}: {doc.get('correctness')}"
        row.update(tok_per_s_mix="", noise="", error=f"{failure.get('kind', 'exception')}: {why}"[:300])
    # measure_s: what a trial pays to measure; the profile is the side-car's profile_s, paid in
    # replay only when the search asks for one (as on the GPU)
    row["measure_s"] = round(sum(costs.get(k, 0.0) for k in ("warmup", "measure", "guard")), 3)
    row["metric_guard"] = f"{verdict} {(doc.get('correctness') or {}).get('logits_rel_err', 0):.4f}" if verdict else ""
    row["metric_guard_s"] = round(costs.get("guard", 0.0), 3)
    row["compile_s"] = round(sum(costs.get(k, 0.0) for k in APPLY_KEYS), 3)
    for phase in COST_PHASES:  # where the row's seconds went (issue 14, item 6: the split per trial)
        row[f"metric_{phase}_s"] = round(costs.get(phase, 0.0), 3)
    for c in conc:
        tp = (doc.get("tok_per_s") or {}).get(str(c))
        row[f"metric_tok_per_s_{c}"] = round(tp["median"], 2) if tp else ""
        mbu = (doc.get("mbu") or {}).get(str(c))
        row[f"metric_mbu_{c}"] = round(mbu, 4) if mbu is not None else ""
    for b, ms in sorted((doc.get("buckets_ms") or {}).items()):
        row[f"bucket_{b}_ms"] = round(ms, 4)
    for key in ("step_wall_ms", "device_busy_ms", "host_ms", "launches_per_step"):
        value = doc.get(key)
        row[f"metric_{key}"] = round(value, 3) if isinstance(value, (int, float)) else ""
    row["metric_kernel_count"] = doc.get("kernel_count", "")
    row["metric_bucket_coverage"] = round(doc.get("bucket_coverage") or 0.0, 4)
    row["metric_apply"] = (doc.get("what_ran") or {}).get("measure.apply", "")
    row["metric_wall_s"] = round(wall_s, 2)
    return row


def measure(state: Any, args: argparse.Namespace, cfg: dict[str, Any], conc: list[int],
            guard: bool) -> dict[str, Any]:
    """One row through the worker's own measurement code; a failure is a row with its reason."""
    from autoopt.targets.builtin.evaluate import measure_request
    from autoopt.targets.builtin.worker import classify

    # the profile at the largest C, as a live run takes it (the objective's heaviest weight)
    req = {"preset": args.preset, "config": {**cfg, "layer_overrides": []}, "concurrency": conc,
           "profile": True, "profile_concurrency": max(conc), "profile_steps": args.profile_steps,
           "min_samples": args.samples, "max_samples": 2 * args.samples, "time_limit_s": 240,
           "target_rel_ci": 0.02, "warmup_min_s": args.warmup_s, "guard": guard}
    from autoopt.targets.builtin.worker import RestartRequired

    for attempt in (1, 2):
        try:
            return measure_request(state, req)
        except RestartRequired as exc:  # the live worker cannot switch to it: a fresh one, once
            state.drop_sessions()
            if attempt == 2:
                return _failed(cfg, "exception", exc)
        except Exception as exc:  # a configuration that fails is a row with its reason
            kind, fatal = classify(exc)
            state.drop_sessions()
            doc = _failed(cfg, kind, exc)
            doc["fatal"] = fatal  # a CUDA fault leaves the context unusable: main() ends the process
            return doc
    raise AssertionError("unreachable")


def _failed(cfg: dict[str, Any], kind: str, exc: BaseException) -> dict[str, Any]:
    import traceback

    from autoopt.measurement import Measurement

    return Measurement.failed(dict(cfg), kind, f"{type(exc).__name__}: {exc}",
                              traceback.format_exc()[-1500:]).to_dict()


def append_what_ran(path: Path, cfg: dict[str, Any], doc: dict[str, Any]) -> None:
    """What actually ran for this row (kernels, back-ends, dtypes, samples, the guard's verdict),
    a JSON line per row beside the table: never a silent fallback."""
    line = {"config": cfg, "status": doc.get("status"), "what_ran": doc.get("what_ran") or {},
            "costs_s": doc.get("costs_s") or {}, "correctness": {k: v for k, v in (doc.get("correctness") or {}).items()
                                                               if k != "what_ran"},
            "failure": doc.get("failure")}
    with open(path, "a") as f:
        f.write(json.dumps(line, default=str) + "\n")


def read_done(csv_path: Path) -> list[dict[str, Any]]:
    if not csv_path.exists():
        return []
    with open(csv_path, newline="") as f:
        return list(csv.DictReader(f))


def key_of(cfg: dict[str, Any]) -> tuple[str, ...]:
    return tuple(str(cfg[k]) for k in LEVELS)


def add_guard_seconds(rows: list[dict[str, Any]]) -> float:
    """Rows measured without the guard get the median guard seconds of those with it (a real trial
    always pays it): returns that median."""
    guarded = [float(r["metric_guard_s"]) for r in rows if r.get("metric_guard")]
    guard_s = statistics.median(guarded) if guarded else 0.0
    for r in rows:
        if not r.get("metric_guard"):
            r["measure_s"] = round(float(r["measure_s"]) + guard_s, 3)
    return guard_s


def write_side_car(out: Path, rows: list[dict[str, Any]], conc: list[int], preset: str, device: str) -> None:
    """Objective, constraints, restart classes and the apply seconds measured per knob here."""
    from dsv4.knobs import KNOB_BY_NAME

    by_knob: dict[str, list[float]] = {k: [] for k in LEVELS}
    for prev, row in zip(rows, rows[1:]):
        changed = [k for k in LEVELS if str(prev[k]) != str(row[k])]
        if len(changed) == 1:  # a clean observation of what switching this one knob costs
            by_knob[changed[0]].append(float(row["compile_s"] or 0.0))
    meta = {
        "recorded": f"for real: dsv4 {preset} on {device}, every row of the design measured "
                    "in one process by benchmarks/record_decode_table.py",
        "objective": "tok_per_s_mix", "direction": "maximize", "objective_concurrency": conc,
        "objective_weights": {c: WEIGHTS.get(c, 1.0) for c in conc},
        "baseline": {k: v[0] for k, v in LEVELS.items()},
        "constraints": CONSTRAINTS,
        "restart_class": {k: KNOB_BY_NAME[k].restart_class for k in LEVELS},
        "restart_s": {k: round(statistics.median(v), 3) if v else 0.0 for k, v in by_knob.items()},
        "restart_observations": {k: len(v) for k, v in by_knob.items()},
        "buckets": {k: list(KNOB_BY_NAME[k].buckets) for k in LEVELS},
        "measure_s": round(statistics.median(float(r["measure_s"]) for r in rows), 3) if rows else 0.0,
        "profile_s": round(statistics.median(float(r.get("metric_profile_s") or 0.0) for r in rows), 3)
        if rows else 0.0,
        "guard": f"run on {sum(1 for r in rows if r.get('metric_guard'))} of {len(rows)} rows (every "
                 "step_compile row and every Nth other); the rest carry its median seconds in measure_s "
                 "(csv: metric_guard empty)",
        "machine": machine_meta(), "teardown_cupti": os.environ.get("TEARDOWN_CUPTI"),
    }
    with open(out.with_suffix(".restart.yaml"), "w") as f:
        f.write("# Recorded by benchmarks/record_decode_table.py (see its docstring); restart_s are "
                "medians of single-knob switches.\n")
        yaml.safe_dump(meta, f, sort_keys=False)


def write_replay_csv(out: Path, rows: list[dict[str, Any]]) -> None:
    """OUT.csv: the replay table (the recording with the guard seconds added where it did not run)."""
    if rows:
        with open(out.with_suffix(".csv"), "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=list(rows[0]), restval="")
            w.writeheader()
            w.writerows(rows)


def append_row(csv_path: Path, row: dict[str, Any], columns: list[str]) -> list[str]:
    """Append one row; a new column rewrites the file with the wider header (rows stay)."""
    new_cols = [c for c in row if c not in columns]
    if new_cols or not csv_path.exists():
        old = read_done(csv_path)
        columns = columns + new_cols
        with open(csv_path, "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=columns, restval="")
            w.writeheader()
            w.writerows(old + [row])
        return columns
    with open(csv_path, "a", newline="") as f:
        csv.DictWriter(f, fieldnames=columns, restval="").writerow(row)
    return columns


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=str(REPO / "benchmarks" / "data" / "h200_flash_decode"))
    ap.add_argument("--preset", default="flash-slice")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--concurrency", default="1,16,64")
    ap.add_argument("--samples", type=int, default=8, help="timed steps per C at least (twice at most)")
    ap.add_argument("--profile-steps", type=int, default=2, help="profiled steps per row (at the largest C)")
    ap.add_argument("--warmup-s", type=float, default=0.3, help="seconds of warm-up per C at least")
    ap.add_argument("--limit-s", type=float, default=540.0, help="stop starting rows after this long")
    ap.add_argument("--max-rows", type=int, default=None)
    ap.add_argument("--deadline", type=float, default=None,
                    help="unix time after which no row is started (across resumed processes)")
    ap.add_argument("--guard-every", type=int, default=4,
                    help="run the correctness guard on every Nth row (and on every step_compile row); the "
                         "others get its median seconds added to measure_s, and the side-car says so")
    args = ap.parse_args()
    # Before torch: without it every row after the first profile reads slower, host-bound rows most
    # (benchmarks/profiler_aftereffect.py). benchmarks/data/h200_flash_decode was recorded without it.
    os.environ.setdefault("TEARDOWN_CUPTI", "1")
    from autoopt.targets.builtin.worker import WorkerState

    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    # the raw recording, appended row by row (resumable); OUT.csv is written from it at the end
    csv_path, conc = out.with_suffix(".recording.csv"), [int(c) for c in args.concurrency.split(",")]
    done = read_done(csv_path)
    seen = {key_of(r) for r in done}
    todo = [c for c in design() if key_of(c) not in seen][: args.max_rows]
    print(f"[record] {len(design())} rows in the design, {len(done)} recorded, {len(todo)} to go", flush=True)
    state, columns, t_start = WorkerState(args.device), list(done[0]) if done else [], time.perf_counter()
    for i, cfg in enumerate(todo):
        if time.perf_counter() - t_start > args.limit_s or (args.deadline and time.time() > args.deadline):
            print(f"[record] --limit-s reached after {i} rows; run again to resume", flush=True)
            break
        t0 = time.perf_counter()
        guard = (len(done) + i) % max(args.guard_every, 1) == 0 or cfg["step_compile"] != "off"
        doc = measure(state, args, cfg, conc, guard)
        row = table_row(cfg, doc, conc, time.perf_counter() - t0)
        columns = append_row(csv_path, row, columns)
        append_what_ran(out.with_suffix(".what_ran.jsonl"), cfg, doc)
        if doc.get("fatal"):  # the row is recorded as failed; the next rows need a fresh process
            print(f"[record] fatal {row['error'][:120]}: exiting with 3, run again to resume", flush=True)
            sys.exit(3)
        print(f"[record] {len(done) + i + 1:4d} {row['tok_per_s_mix'] or row['error'][:60]!s:>10} "
              f"apply {row['compile_s']:6.1f}s wall {row['metric_wall_s']:5.1f}s  "
              + " ".join(f"{k}={v}" for k, v in cfg.items()), flush=True)
    rows = read_done(csv_path)
    print(f"[record] {len(rows)} rows in {csv_path}; guard median {add_guard_seconds(rows):.2f} s added "
          "to the unguarded rows' measure_s in the side-car's copy", flush=True)
    meta = machine_meta()
    write_side_car(out, rows, conc, args.preset, meta.get("gpu") or f"{args.device} ({meta['processor']})")
    write_replay_csv(out, rows)


if __name__ == "__main__":
    main()
