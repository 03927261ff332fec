"""The case study's cast, measured: the bf16 mHC GEMM fed by casting the fp32 x_flat
(mhc_operand=cast_from_fp32) against a view of the bf16 residual (view_bf16_residual), copy_cast
bucket ms per step and ops per step, through the real worker with profiles, in A B B A rounds.

    python benchmarks/copy_cast_operand.py [--rounds 8] [--device cpu] [--out benchmarks/results/copy_cast_operand.json]

tiny widened to hidden=4096 at C=64, where each cast is a [64, 16384] fp32 -> bf16 copy (9 a step).
On a shared 2-core CPU whole profiles stretch by 2-3x between rounds, so the table gives median and
min/max per operand and the paired per-round differences; the op counts are exact.
"""
from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "kernels"), str(Path(__file__).parent)]

from _meta import machine_meta, write_result  # noqa: E402

OPERANDS = ("cast_from_fp32", "view_bf16_residual")


def one(target, operand: str) -> dict:
    from autoopt.targets.base import EvalRequest

    config = {"mhc_gemm": "bf16", "mhc_operand": operand, "hc_fn_weight": "cached"}
    m = target.evaluate(EvalRequest(config=config, concurrency=(64,), profile=True, min_samples=3,
                                    max_samples=3, time_limit_s=300, extra={"profile_steps": 5}))
    if m.status != "ok" or not m.buckets_ms:
        raise SystemExit(f"{operand}: {m.status} {m.failure}")
    return {"copy_cast_ms": m.buckets_ms["copy_cast"], "ops": m.kernel_count,
            "what_ran": m.what_ran.get("mhc_gemm[c4]")}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=8)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--out", default=str(REPO / "benchmarks" / "results" / "copy_cast_operand.json"))
    args = ap.parse_args()
    from autoopt.targets.builtin.target import BuiltinTarget

    target = BuiltinTarget("tiny", args.device, shape={"hidden": 4096}, guard=False, warmup_steps=1)
    runs: dict[str, list[dict]] = {op: [] for op in OPERANDS}
    try:
        for r in range(args.rounds):  # A B B A: neither operand is always second
            for op in OPERANDS[::1 if r % 2 == 0 else -1]:
                runs[op].append(one(target, op))
    finally:
        target.close()
    summary = {}
    print(f"{'operand':20s} {'copy_cast ms/step median [min, max]':>38s} {'ops/step':>9s}")
    for op in OPERANDS:
        ms = [x["copy_cast_ms"] for x in runs[op]]
        ops = sorted({x["ops"] for x in runs[op]})
        summary[op] = {"median_ms": statistics.median(ms), "min_ms": min(ms), "max_ms": max(ms), "ops": ops}
        print(f"{op:20s} {statistics.median(ms):18.1f} [{min(ms):.1f}, {max(ms):.1f}] {str(ops):>12s}")
    diffs = [c["copy_cast_ms"] - v["copy_cast_ms"] for c, v in zip(runs[OPERANDS[0]], runs[OPERANDS[1]])]
    summary["paired_diff_ms"] = {"median": statistics.median(diffs), "positive": sum(d > 0 for d in diffs),
                                 "rounds": len(diffs)}
    print(f"cast - view, paired per round: median {statistics.median(diffs):+.1f} ms, "
          f"positive in {sum(d > 0 for d in diffs)}/{len(diffs)} rounds")
    path = write_result(args.out, {"benchmark": "copy_cast_operand", "machine": machine_meta(),
                                   "device": args.device, "shape": {"preset": "tiny", "hidden": 4096, "C": 64},
                                   "summary": summary, "runs": runs})
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
