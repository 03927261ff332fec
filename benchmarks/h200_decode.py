"""The decode path on one GPU, side by side: the case study's starting point, each single-knob change
from it, the best configuration `autoopt run` found (an exported config.yaml), and
torch.compile(mode="max-autotune") of the starting point — tok/s with CI, MBU and profile buckets at
each concurrency. Builds, checks (correctness guard) and times everything in ONE process, through the
same measurement code the worker uses (autoopt.targets.builtin.measure.measure_request).

    python benchmarks/h200_decode.py --preset flash-slice --concurrency 1,16,64 \
        [--best config.yaml] [--only start,attention=mma] [--no-compile] [--traces DIR] \
        [--out benchmarks/results/h200_decode.json]

The JSON result is rewritten after every configuration, so a run cut short still leaves its figures.
The table is printed last.

--passes N measures the rows N times in one process, every other pass in reverse order (A B, B A,
...): rows measured later in a process read slower (the live check's re-measure of 2026-12-02 put one
configuration at 385.7 tok/s at C=1 as a second row and at 446.7 as a first), so a comparison of two
rows needs both orders. The cause found since: the first row's profile left CUPTI attached, and every
later launch paid for it; the script now sets TEARDOWN_CUPTI=1 before torch is imported (recorded as
"teardown_cupti" in the JSON; benchmarks/profiler_aftereffect.py measures the effect). It prints each row's weighted mix (--weights, the flash space's objective by
default) per pass, their median, and that median over the first row's.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import time
import traceback
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "kernels"), str(Path(__file__).parent)]

from _meta import machine_meta, write_result  # noqa: E402

STEADY_STEPS = 5  # torch.compile row: steps without a new Dynamo graph before timing starts

# (label, knob changes from the starting point). Pairs where one knob is inert alone (the bf16 operand
# only matters once the mHC GEMM is bf16) are given as the pair, as an engineer would flip them.
# What an engineer would assemble by hand from the kernel benchmark (benchmarks/attention_kernels.py).
FAST = {"attention": "mma", "attn_split_k": 4, "indexer_kernel": "triton_fused", "indexer_gemm": "bf16",
        "mhc_kernel": "triton_splitk", "mhc_gemm": "bf16", "mhc_operand": "view_bf16_residual",
        "hc_fn_weight": "cached", "mhc_fuse_post_pre": "on", "moe_experts": "triton_grouped"}

SINGLE_CHANGES: list[tuple[str, dict[str, Any]]] = [
    ("start", {}),
    ("mhc_gemm=bf16 (cast_from_fp32)", {"mhc_gemm": "bf16"}),
    ("mhc_gemm=bf16 + view_bf16_residual", {"mhc_gemm": "bf16", "mhc_operand": "view_bf16_residual"}),
    ("mhc bf16 + view + hc_fn cached", {"mhc_gemm": "bf16", "mhc_operand": "view_bf16_residual",
                                        "hc_fn_weight": "cached"}),
    ("indexer_gemm=bf16", {"indexer_gemm": "bf16"}),
    ("indexer_gemm=fp8", {"indexer_gemm": "fp8"}),
    ("attention=mma", {"attention": "mma"}),
    ("moe_experts=grouped", {"moe_experts": "grouped"}),
    ("glue=compile", {"glue": "compile"}),
    ("cuda_graphs=on (+ moe grouped)", {"cuda_graphs": "on", "moe_experts": "grouped"}),
    ("indexer_kernel=triton_fused (bf16)", {"indexer_kernel": "triton_fused", "indexer_gemm": "bf16"}),
    ("mhc_kernel=triton_splitk (bf16 view)", {"mhc_kernel": "triton_splitk", "mhc_gemm": "bf16",
                                             "mhc_operand": "view_bf16_residual"}),
    ("mhc_fuse_post_pre=on", {"mhc_fuse_post_pre": "on"}),
    ("moe_experts=triton_grouped", {"moe_experts": "triton_grouped"}),
    ("hand-tuned: all Triton (eager)", dict(FAST)),
    ("hand-tuned: all Triton + cuda_graphs", {**FAST, "cuda_graphs": "on"}),
    ("glue=triton", {"glue": "triton"}),
    ("hand-tuned + glue=compile + cuda_graphs", {**FAST, "glue": "compile", "cuda_graphs": "on"}),
    ("hand-tuned + glue=triton + cuda_graphs", {**FAST, "glue": "triton", "cuda_graphs": "on"}),
    ("step_compile=inductor (+ moe grouped)", {"step_compile": "inductor", "moe_experts": "grouped"}),
    ("hand-tuned + step_compile + cuda_graphs", {**FAST, "step_compile": "inductor", "cuda_graphs": "on"}),
    ("hand-tuned + glue=triton + step_compile + cuda_graphs", {**FAST, "glue": "triton",
                                                              "step_compile": "inductor",
                                                              "cuda_graphs": "on"}),
    ("proj_gemms=stacked", {"proj_gemms": "stacked"}),
    ("hand-tuned + glue=triton + step_compile + stacked proj + cuda_graphs",
     {**FAST, "glue": "triton", "step_compile": "inductor", "proj_gemms": "stacked", "cuda_graphs": "on"}),
    # the copy_cast target's like-for-like pair: the tuned step with the fp32 mHC path instead
    ("hand-tuned + glue=triton + cuda_graphs + mhc_gemm=fp32", {**FAST, "glue": "triton", "cuda_graphs": "on",
                                                              "mhc_gemm": "fp32"}),
]


# The before/after pair of the case study, kept as profiler traces (test fixtures for `autoopt profile`).
TRACE_LABELS = {"start": "before", "mhc_gemm=bf16 (cast_from_fp32)": "after",
                "hand-tuned: all Triton + cuda_graphs": "tuned",
                "hand-tuned + glue=triton + cuda_graphs": "tuned_triton_glue",
                "hand-tuned + glue=triton + step_compile + cuda_graphs": "tuned_step_compile",
                "hand-tuned + glue=triton + step_compile + stacked proj + cuda_graphs": "tuned_stacked"}
# (where the kernels of a tuned step go; saved at the profile concurrency and at C=1)


def _save_trace(state: Any, batch: int, path: Path, device: str) -> None:
    """One decode step of the session just measured, as a Chrome trace (gzipped)."""
    from autoopt.profile.trace import capture

    sess = state.sessions.get(batch)
    if sess is None:
        return
    sess.reset()
    path.parent.mkdir(parents=True, exist_ok=True)
    prof = capture(sess.step, steps=1, device=device, trace_path=path)
    top = sorted(prof.buckets_ms.items(), key=lambda kv: -kv[1])[:4]
    print(f"   trace {path.name}: {prof.kernel_count} kernels, {prof.total_ms:.3f} ms of kernels, "
          f"coverage {prof.coverage:.0%}; " + ", ".join(f"{b} {ms:.3f}" for b, ms in top), flush=True)


def _measure(state: Any, preset: str, shape: dict[str, Any], knobs: dict[str, Any],
             layer_overrides: list, conc: list[int], profile_c: int, samples: int) -> dict[str, Any]:
    from autoopt.targets.builtin.evaluate import measure_request
    from autoopt.measurement import Measurement
    from autoopt.targets.builtin.worker import classify

    req = {"preset": preset, "shape": shape, "config": {**knobs, "layer_overrides": layer_overrides},
           "concurrency": conc, "profile": True, "profile_concurrency": profile_c, "profile_steps": 3,
           "min_samples": samples, "max_samples": samples * 2, "time_limit_s": 240,
           "target_rel_ci": 0.01}
    try:
        return measure_request(state, req)
    except BaseException as exc:  # a variant that fails is data: reported, the benchmark goes on
        if isinstance(exc, KeyboardInterrupt):
            raise
        kind, _ = classify(exc)
        state.drop_sessions()
        return Measurement.failed({**knobs}, kind, f"{type(exc).__name__}: {exc}",
                                  traceback.format_exc()[-2000:]).to_dict()


def _compile_start(preset: str, shape: dict[str, Any], conc: list[int], samples: int,
                   mode: str, device: str, warm_s: float) -> dict[str, Any]:
    """What a PyTorch user would try instead: torch.compile(mode=max-autotune) of the whole step.

    The start's expert loop reads its counts on the host, so Dynamo specialises that loop on them
    and recompiles it at (nearly) every step until it reaches its recompile limit, after which the
    loop frame runs eagerly. Timing starts only once compiling has stopped: no new Dynamo graph for
    STEADY_STEPS steps (or warm_s spent warming up, which is then reported)."""
    import torch
    from torch._dynamo.utils import counters

    from autoopt.targets.builtin.measure import device_bandwidth, synchronize, time_steps
    from autoopt.measurement import Measurement, throughput_from_step_times
    from dsv4.config import preset as make_preset
    from dsv4.model import decode_forward
    from dsv4.roofline import bytes_per_step
    from dsv4.session import DecodeSession

    cfg = make_preset(preset, **shape)
    bw = device_bandwidth(device)["bytes_per_s"]
    compiled = torch.compile(decode_forward, mode=mode)
    out = Measurement(status="ok", config={"torch.compile": mode})
    costs = {"compile": 0.0, "measure": 0.0}
    warm_notes = {}
    for c in conc:
        sess = DecodeSession(cfg, device=device, batch=c)

        def step(s=sess):
            if s._steps >= s.max_new_tokens:
                s.reset()
            logits, _ = compiled(s.state, s.tokens)
            s.tokens.copy_(logits.argmax(dim=-1))
            s._steps += 1

        t0, steady, n = time.perf_counter(), 0, 0
        while steady < STEADY_STEPS and time.perf_counter() - t0 < warm_s:
            graphs = counters["stats"]["unique_graphs"]
            ts = time.perf_counter()
            step()
            synchronize(device)
            n += 1
            new = counters["stats"]["unique_graphs"] - graphs
            steady = steady + 1 if new == 0 else 0
            print(f"   [compile C={c}] warm-up step {n}: {time.perf_counter() - ts:7.2f} s, "
                  f"{new} new graph(s), {time.perf_counter() - t0:6.0f} s so far", flush=True)
        costs["compile"] += time.perf_counter() - t0
        warm_notes[str(c)] = {"warmup_steps": n, "warmup_s": round(time.perf_counter() - t0, 1),
                              "steady": steady >= STEADY_STEPS,
                              "dynamo_graphs": counters["stats"]["unique_graphs"]}
        t0 = time.perf_counter()
        xs, _ = time_steps(step, device, min_samples=samples, max_samples=samples * 2, concurrency=c)
        costs["measure"] += time.perf_counter() - t0
        tp = throughput_from_step_times(xs, c)
        out.tok_per_s[str(c)] = tp
        out.mbu[str(c)] = bytes_per_step(cfg, c)["total"] / (c / tp.median) / bw  # c/tok_s = step s
        del sess
        if device.startswith("cuda"):
            torch.cuda.empty_cache()
    out.costs_s = costs
    limit = getattr(torch._dynamo.config, "recompile_limit", None)
    out.what_ran = {"step": f"torch.compile(decode_forward, mode={mode!r}) over the starting point",
                    "warmup": json.dumps(warm_notes),
                    "dynamo": f"recompile_limit={limit}; graph breaks: "
                              f"{sum(counters['graph_break'].values())}"}
    return out.to_dict()


def _row(label: str, doc: dict[str, Any], base: dict[str, Any] | None, conc: list[int]) -> str:
    cells = [f"{label[:38]:38s}", f"{doc['status']:6s}"]
    for c in conc:
        tp = (doc.get("tok_per_s") or {}).get(str(c))
        if not tp:
            cells.append(f"{'-':>26s}")
            continue
        sp = ""
        b = ((base or {}).get("tok_per_s") or {}).get(str(c))
        if b:
            sp = f" {tp['median'] / b['median']:4.2f}x"
        mbu = (doc.get("mbu") or {}).get(str(c))
        cells.append(f"{tp['median']:8.1f}±{(tp['ci_high'] - tp['ci_low']) / 2:5.1f}{sp} "
                     f"{(mbu or 0) * 100:3.0f}%")
    return " ".join(cells)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--preset", default="flash-slice")
    ap.add_argument("--device", default="cuda", help="cuda (the point), or cpu with --preset tiny to "
                    "check the script itself")
    ap.add_argument("--context", type=int, default=None, help="context_len override")
    ap.add_argument("--concurrency", default="1,16,64")
    ap.add_argument("--samples", type=int, default=15)
    ap.add_argument("--best", action="append", default=[],
                    help="config.yaml exported by `autoopt best --export` (repeatable: each is a row)")
    ap.add_argument("--only", default=None, help="comma-separated labels of SINGLE_CHANGES to run")
    ap.add_argument("--no-compile", action="store_true", help="skip torch.compile(max-autotune)")
    ap.add_argument("--compile-mode", default="max-autotune")
    ap.add_argument("--compile-warmup-s", type=float, default=400.0,
                    help="torch.compile row: most seconds of warm-up (compiling) per concurrency")
    ap.add_argument("--traces", default=None, help="directory: save the profiler traces per config")
    ap.add_argument("--passes", type=int, default=1, help="measure the rows this many times, "
                    "alternating their order (see above)")
    ap.add_argument("--weights", default="1:0.2,16:0.3,64:0.5",
                    help="C:weight,... of the weighted geometric mix the passes summary reports")
    ap.add_argument("--out", default=str(REPO / "benchmarks" / "results" / "h200_decode.json"))
    args = ap.parse_args()
    # Before torch: Kineto reads it. Without it CUPTI stays attached after the first row's profile
    # and every later row reads slower (benchmarks/profiler_aftereffect.py); a value set is kept.
    os.environ.setdefault("TEARDOWN_CUPTI", "1")

    import torch

    from autoopt.targets.builtin.worker import WorkerState

    if args.device.startswith("cuda") and not torch.cuda.is_available():
        sys.exit("h200_decode.py: no CUDA GPU here (use --device cpu --preset tiny to check the script)")
    conc = [int(c) for c in args.concurrency.split(",")]
    profile_c = 16 if 16 in conc else conc[-1]
    shape = {"context_len": args.context} if args.context else {}
    todo = SINGLE_CHANGES
    if args.only is not None:
        wanted = set(filter(None, args.only.split(",")))
        unknown = wanted - {lbl for lbl, _ in SINGLE_CHANGES}
        if unknown:  # a typo would silently measure nothing in a call of scarce device time
            sys.exit(f"h200_decode.py: --only: unknown label(s) {sorted(unknown)}; known: "
                     f"{[lbl for lbl, _ in SINGLE_CHANGES]}")
        todo = [(lbl, k) for lbl, k in SINGLE_CHANGES if lbl in wanted]
    if args.best:
        from autoopt.targets.builtin.config_file import load_config_file

        for path in args.best:
            loaded = load_config_file(path)
            # the folder too: two runs' config2.yaml must not share a row (they did once, 2026-12-05)
            named = f"{Path(path).parent.name}/{Path(path).name}" if Path(path).parent.name else Path(path).name
            todo = todo + [(f"best (autoopt run: {named})", dict(loaded.knobs),
                            loaded.layer_overrides)]
    state = WorkerState(args.device)
    result = {"benchmark": "h200_decode", "machine": machine_meta(), "preset": args.preset,
              "shape_overrides": shape, "concurrency": conc, "profile_concurrency": profile_c,
              "teardown_cupti": os.environ.get("TEARDOWN_CUPTI"), "configs": {}}
    base = None
    for n in range(args.passes):
        for item in (todo if n % 2 == 0 else todo[::-1]):
            base = _measure_row(state, item, args, shape, conc, profile_c, result, base, n)
    if not args.no_compile:
        label = f"torch.compile({args.compile_mode}) of start"
        print(f"[h200_decode] {label} ...", flush=True)
        state.drop_sessions()
        t0 = time.perf_counter()
        try:
            doc = _compile_start(args.preset, shape, conc, args.samples, args.compile_mode, args.device,
                                 args.compile_warmup_s)
        except Exception as exc:  # recorded as a failed row, with its reason
            from autoopt.measurement import Measurement

            doc = Measurement.failed({"torch.compile": args.compile_mode}, "compile",
                                     f"{type(exc).__name__}: {exc}",
                                     traceback.format_exc()[-2000:]).to_dict()
        doc["label"], doc["bench_wall_s"] = label, time.perf_counter() - t0
        result["configs"][label] = doc
        write_result(args.out, result)

    hdr = " ".join([f"{'configuration':38s}", f"{'status':6s}"] +
                   [f"{'C=' + str(c) + ' tok/s ±CI  x  MBU':>26s}" for c in conc])
    print("\n" + hdr)
    for label, doc in result["configs"].items():
        print(_row(label, doc, base, conc))
    if result.get("passes"):  # one pass too: the mix is the figure the live check compares
        _print_passes(result, _weights(args.weights))
        write_result(args.out, result)
    print(f"\nwrote {args.out}")


def _measure_row(state: Any, item: tuple, args: Any, shape: dict[str, Any], conc: list[int],
                 profile_c: int, result: dict[str, Any], base: dict[str, Any] | None,
                 n_pass: int) -> dict[str, Any] | None:
    """Measure one row (its first pass is the row of the table, every pass is kept under
    result["passes"]); returns the start row once measured."""
    label, knobs = item[0], item[1]
    overrides = list(item[2]) if len(item) > 2 else []
    t0 = time.perf_counter()
    print(f"[h200_decode] {label} (pass {n_pass + 1}) ...", flush=True)
    doc = _measure(state, args.preset, shape, knobs, overrides, conc, profile_c, args.samples)
    doc["label"] = label
    doc["bench_wall_s"] = time.perf_counter() - t0
    result.setdefault("passes", {}).setdefault(label, []).append(
        {"pass": n_pass + 1, "status": doc.get("status"), "bench_wall_s": doc["bench_wall_s"],
         "tok_per_s": {c: tp.get("median") for c, tp in (doc.get("tok_per_s") or {}).items()}})
    if n_pass == 0:
        result["configs"][label] = doc
        if label == "start":
            base = doc
        if args.traces and label in TRACE_LABELS and doc.get("status") != "failed":
            for c in sorted({profile_c, 1} & set(conc)):
                _save_trace(state, c, Path(args.traces) / f"h200_{TRACE_LABELS[label]}_c{c}.json.gz",
                            args.device)
    print("   " + _row(label, doc, base, conc), flush=True)
    write_result(args.out, result)
    return base


def _weights(spec: str) -> dict[str, float]:
    return {c.strip(): float(w) for c, w in (part.split(":") for part in spec.split(",") if part.strip())}


def _mix(tok_per_s: dict[str, float | None], weights: dict[str, float]) -> float | None:
    """Weighted geometric mean of tok/s over the weighted concurrencies (None if one is missing)."""
    if any(not tok_per_s.get(c) for c in weights):
        return None
    total = sum(weights.values())
    return math.exp(sum(w * math.log(tok_per_s[c]) for c, w in weights.items()) / total)


def _print_passes(result: dict[str, Any], weights: dict[str, float]) -> None:
    """Each row's mix per pass, the median, and the median over the first row's."""
    first = None
    print(f"\n{'configuration':38s} mix per pass (tok/s)            median   / first row")
    for label, passes in result["passes"].items():
        mixes = [_mix(p["tok_per_s"], weights) for p in passes]
        ok = [m for m in mixes if m is not None]
        med = statistics.median(ok) if ok else None
        first = med if first is None else first
        ratio = f"{med / first:6.3f}" if med and first else "     -"
        cells = " ".join(f"{m:7.1f}" if m else "      -" for m in mixes)
        result.setdefault("passes_summary", {})[label] = {"mix": mixes, "median_mix": med,
                                                          "over_first_row": med / first if med and first else None}
        print(f"{label[:38]:38s} {cells:32s} {med or 0:7.1f}   {ratio}")


if __name__ == "__main__":
    main()
