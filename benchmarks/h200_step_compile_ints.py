"""Does step_compile=inductor survive per-layer knob ints? (the live H200 run's failures, issue 14)

The resumed 10-minute run on the H200 (benchmarks/results/h200_live_10m) lost 24 trials to
`InternalTorchDynamoError: 'SymNodeVariable' object has no attribute 'value'` at the Triton attention
launch and 3 to "hc_fn_weight=cached but no cached bf16 hc_fn was built for this layer", each after a
change of a per-layer int knob (attention tiles) under step_compile=inductor. The suspected cause:
Dynamo's automatic dynamic turns an int that differs between calls of one frame into a SymInt (a
tile size per layer class, a layer index), which a Triton constexpr cannot take and a dict of cached
weights keyed by (layer, prefix) cannot match. dsv4.session.step_function therefore pins ints
(dsv4.glue.specialize_int_inputs). This script replays that kind of sequence in ONE worker-like
process, through the worker's own measure_request (guard included), once as committed ("pinned")
and once with the pin undone ("unpinned"), each arm in its own process and compile cache:

    python benchmarks/h200_step_compile_ints.py [--preset tiny] [--out DIR]

It prints a table (arm x configuration: verdict, seconds, first line of the failure) and writes
DIR/step_compile_ints.json with the machine, versions and date.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "kernels"), str(REPO / "benchmarks")]

FAST = {"attention": "mma", "moe_experts": "triton_grouped", "glue": "compile", "mhc_gemm": "bf16",
        "mhc_operand": "view_bf16_residual", "indexer_gemm": "bf16", "proj_gemms": "stacked",
        "step_compile": "inductor", "cuda_graphs": "on"}
TILES = [(1, "attn_block_kv", 16), (2, "attn_block_kv", 128), (1, "attn_num_warps", 8),
         (3, "attn_block_kv", 32)]
SEQUENCE = [  # (label, knobs, layer overrides): each switch is one the live run failed on
    ("fast, default tiles", FAST, []),
    ("tiles differ per layer", FAST, TILES),
    ("+ hc_fn_weight=cached", FAST | {"hc_fn_weight": "cached"}, TILES),
    ("+ glue=triton", FAST | {"hc_fn_weight": "cached", "glue": "triton"}, TILES),
    ("other tiles", FAST | {"glue": "triton"}, [(0, "attn_block_kv", 32), (2, "attn_num_warps", 2)]),
]


def arm(name: str, preset: str) -> list[dict]:
    """Run SEQUENCE in this process like a worker does; one row per configuration."""
    import dsv4.session
    from autoopt.targets.builtin.evaluate import measure_request
    from autoopt.targets.builtin.worker import WorkerState, classify

    if name == "unpinned":  # what the live run had: Dynamo's default for int inputs
        dsv4.session.specialize_int_inputs = lambda: None
    state = WorkerState("cuda")
    rows = []
    for label, knobs, overrides in SEQUENCE:
        req = {"preset": preset, "config": dict(knobs) | {"layer_overrides": [list(o) for o in overrides]},
               "concurrency": [1, 4], "min_samples": 3, "max_samples": 5, "warmup_steps": 2,
               "warmup_min_s": 0.0, "guard": True}
        t0 = time.perf_counter()
        try:
            m = measure_request(state, req)
            row = {"status": m["status"], "why": "",
                   "logits_rel_err": (m.get("correctness") or {}).get("logits_rel_err")}
        except Exception as exc:  # the worker reports these as a failed trial of this kind
            kind, _ = classify(exc)
            row = {"status": f"failed ({kind})", "why": f"{type(exc).__name__}: {exc}".splitlines()[0][:200],
                   "traceback": traceback.format_exc()[-3000:]}
        rows.append({"arm": name, "config": label, "seconds": time.perf_counter() - t0} | row)
        print(json.dumps(rows[-1])[:400], flush=True)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--preset", default="tiny")
    ap.add_argument("--out", default=str(REPO / "benchmarks" / "results"))
    ap.add_argument("--arm", help=argparse.SUPPRESS)  # internal: run one arm here, rows on stdout
    args = ap.parse_args()
    if args.arm:
        rows = arm(args.arm, args.preset)
        print("ROWS " + json.dumps(rows))
        return
    procs = {}
    for name in ("pinned", "unpinned"):  # in parallel: one GPU, separate processes and caches
        env = os.environ | {"TORCHINDUCTOR_CACHE_DIR": tempfile.mkdtemp(prefix=f"inductor-{name}-"),
                            "TRITON_CACHE_DIR": tempfile.mkdtemp(prefix=f"triton-{name}-"),
                            "TORCHDYNAMO_VERBOSE": "1"}
        procs[name] = subprocess.Popen([sys.executable, __file__, "--arm", name, "--preset", args.preset],
                                       env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    rows, logs = [], {}
    for name, p in procs.items():
        out, _ = p.communicate(timeout=540)
        logs[name] = out[-4000:]
        rows += next((json.loads(line[5:]) for line in out.splitlines() if line.startswith("ROWS ")), [])
    print(f"\n{'arm':9s} {'configuration':26s} {'verdict':18s} {'s':>6s}  why")
    for r in rows:
        print(f"{r['arm']:9s} {r['config']:26s} {r['status']:18s} {r['seconds']:6.1f}  {r['why'][:90]}")
    from _meta import machine_meta

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    doc = {"benchmark": "h200_step_compile_ints", "meta": machine_meta(), "preset": args.preset,
           "sequence": [{"label": lbl, "knobs": k, "layer_overrides": o} for lbl, k, o in SEQUENCE],
           "rows": rows, "logs_tail": {k: v for k, v in logs.items() if not any(r["arm"] == k for r in rows)}}
    (out / "step_compile_ints.json").write_text(json.dumps(doc, indent=1) + "\n")
    print(f"wrote {out / 'step_compile_ints.json'}")


if __name__ == "__main__":
    main()
