"""Does a torch.profiler session slow the timing that follows it in the same worker?

Why: in the live H200 runs (benchmarks/results/h200_live_10m_run5..7) each trial is measured in two
worker processes, and the first, the one that runs the profiles, read 8-20 % below its twin on every
trial (C=1: 426 against 488-524 tok/s for one configuration), the gap that made the trials' 95 %
intervals +-5-9 %. Kineto leaves CUPTI's callbacks attached after a profile unless it is told to tear
CUPTI down (the TEARDOWN_CUPTI variable), and a decode step of hundreds of launches pays them on every
launch. The worker client now sets TEARDOWN_CUPTI=1 (autoopt.targets.builtin.client).

What it does, per setting of TEARDOWN_CUPTI ("unset": Kineto's own default, as the runs had it), in a
fresh worker of its own through the builtin target's own evaluate(): one configuration measured
twice, then once with a profile after its timing, then three more times. The figures before the
profile against those after it are the after-effect; a measurement that fails is reported as such
(CUPTI teardown once crashed beside CUDA graphs on older CUDA).

    python benchmarks/profiler_aftereffect.py [--device cuda] [--preset flash-slice] [--settings unset,1]
        [--out benchmarks/results/profiler_aftereffect.json]

It prints a table (setting x measurement: tok/s per concurrency) and the ratio after / before per
concurrency, and writes the JSON with the machine, versions and date. On a CPU (`--device cpu
--preset tiny`) it runs the same sequence; CUPTI is not involved there.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "kernels"), str(Path(__file__).parent)]

from _meta import machine_meta, write_result  # noqa: E402

# The hand-tuned decode path with CUDA graphs and without step_compile (no Inductor compile: the
# build takes seconds): benchmarks/h200_decode.py's FAST row + glue=triton + cuda_graphs.
GRAPHS_CONFIG = {"attention": "mma", "attn_split_k": 4, "indexer_kernel": "triton_fused", "indexer_gemm": "bf16",
                 "mhc_kernel": "triton_splitk", "mhc_gemm": "bf16", "mhc_operand": "view_bf16_residual",
                 "hc_fn_weight": "cached", "mhc_fuse_post_pre": "on", "moe_experts": "triton_grouped",
                 "glue": "triton", "cuda_graphs": "on"}
SEQUENCE = (("before", False), ("before", False), ("profiled", True),
            ("after", False), ("after", False), ("after", False))


def run_setting(setting: str, args: argparse.Namespace, config: dict[str, Any]) -> dict[str, Any]:
    """The sequence in one fresh worker with TEARDOWN_CUPTI as `setting` ("unset": empty value)."""
    from autoopt.targets.base import EvalRequest
    from autoopt.targets.builtin.target import BuiltinTarget

    env = dict(os.environ, TEARDOWN_CUPTI="" if setting == "unset" else setting)
    target = BuiltinTarget(args.preset, args.device, guard=False, worker_env=env)  # the guard is not what is measured
    concurrency = tuple(args.concurrency) or target.default_concurrency()
    rows = []
    try:
        for label, profile in SEQUENCE:
            t0 = time.perf_counter()
            m = target.evaluate(EvalRequest(config=config, concurrency=concurrency, profile=profile,
                                            min_samples=args.samples, max_samples=2 * args.samples,
                                            time_limit_s=120.0))
            rows.append({"label": label, "profile": profile, "status": m.status,
                         "seconds": round(time.perf_counter() - t0, 2),
                         "tok_per_s": {c: t.median for c, t in m.tok_per_s.items()},
                         "profiled_before": m.what_ran.get("measure.profiled_before"),
                         "failure": (f"{m.failure.kind}: {m.failure.reason.splitlines()[0][:300]}"
                                     if m.failure else None)})
            print(f"  {setting:>6} {label:>8} {m.status:>6} " + "  ".join(
                f"C={c}: {t.median:9.1f}" for c, t in m.tok_per_s.items()), flush=True)
    finally:
        target.close()
    return {"setting": setting, "rows": rows, "ratio_after_over_before": ratios(rows)}


def ratios(rows: list[dict[str, Any]]) -> dict[str, float | None]:
    """Median tok/s after the profile over the median before it, per concurrency."""
    out: dict[str, float | None] = {}
    for c in rows[0]["tok_per_s"] if rows and rows[0]["tok_per_s"] else []:
        before = [r["tok_per_s"][c] for r in rows if r["label"] == "before" and c in r["tok_per_s"]]
        after = [r["tok_per_s"][c] for r in rows if r["label"] == "after" and c in r["tok_per_s"]]
        out[c] = statistics.median(after) / statistics.median(before) if before and after else None
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--preset", default="flash-slice")
    ap.add_argument("--settings", default="unset,1", help="TEARDOWN_CUPTI values, one worker each")
    ap.add_argument("--concurrency", type=int, nargs="*", default=[1, 64])
    ap.add_argument("--samples", type=int, default=10, help="timed steps at least, per concurrency")
    ap.add_argument("--tiny-cpu-config", action="store_true", help="the baseline configuration (CPU check)")
    ap.add_argument("--out", type=Path, default=REPO / "benchmarks" / "results" / "profiler_aftereffect.json")
    args = ap.parse_args()
    config = {} if args.tiny_cpu_config else GRAPHS_CONFIG
    results = [run_setting(s.strip(), args, config) for s in args.settings.split(",") if s.strip()]
    print(f"\n{'TEARDOWN_CUPTI':>14} | failed | " + " | ".join(f"after/before C={c}" for c in args.concurrency))
    for r in results:
        failed = sum(row["status"] != "ok" for row in r["rows"])
        print(f"{r['setting']:>14} | {failed:>6} | " + " | ".join(
            f"{r['ratio_after_over_before'].get(str(c)) or float('nan'):>17.3f}" for c in args.concurrency))
    path = write_result(args.out, {"meta": machine_meta(), "config": config, "preset": args.preset,
                                   "device": args.device, "sequence": [s[0] for s in SEQUENCE],
                                   "results": results})
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
