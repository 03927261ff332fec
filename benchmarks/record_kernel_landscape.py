"""Record a brute-forced tuning landscape of one of the decode path's Triton kernels on this GPU, in
Kernel Tuner's cache format, so `bench-search --landscapes DIR` reads it like the six in
../shared/landscapes. It is a landscape no search strategy here was developed on: keep it held out.

    python benchmarks/record_kernel_landscape.py --kernel attention \
        --out benchmarks/data/landscapes/sparse_mqa_decode_H100.json.gz [--workers 14] [--limit-s 500]
    python benchmarks/record_kernel_landscape.py --kernel moe --device cpu --limit 4 --out /tmp/x.json.gz

Every configuration of the kernel's design (benchmarks/kernel_landscapes.py) in two phases, so that
a recording fits one device call:
 1. compile: WORKERS processes (this script with --shard I/N), sharing one TRITON_CACHE_DIR, each run
    its share of the configurations once; the first call's wall milliseconds (compile, load, first
    launch) are `compile_time`. WORKERS compile side by side on the host's cores, so a figure is
    what a compile costs on a busy host, not an idle one (the file says how many ran at once). A
    configuration that ran out of GPU memory beside the others is tried again alone at the end;
 2. time: one process loads each compiled configuration from that cache, checks its output against
    dsv4.ref_ops (`verification_time`), and times it as one CUDA graph of CALLS calls replayed 7
    times: `times` are milliseconds per call, `time` their mean (Kernel Tuner's objective).
Failures carry Kernel Tuner's strings in `time`, and `error` says what happened:
CompilationFailedConfig (Triton raised while compiling), RuntimeFailedConfig (out of resources at
launch, a CUDA error, an output outside the tolerance).
Work files live in --work (default /tmp/autoopt-landscape-KERNEL): a call cut short by --limit-s or a
crash resumes after what it recorded. `--device cpu` runs both phases under TRITON_INTERPRET=1 on tiny
shapes and times wall clock: a check of this script, not a landscape.
"""
from __future__ import annotations

import argparse
import gzip
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "kernels"), str(Path(__file__).parent)]

REPLAYS = 7
CUDA_ERROR_EXIT = 3  # a CUDA error poisons the context: the process ends, the parent starts another


def _read_lines(path: Path) -> dict[str, dict[str, Any]]:
    if not path.exists():
        return {}
    return {rec["key"]: rec for rec in map(json.loads, path.read_text().splitlines()) if rec}


def _append(path: Path, rec: dict[str, Any]) -> None:
    with path.open("a") as f:
        f.write(json.dumps(rec) + "\n")


def compiled_records(work: Path, workers: int) -> dict[str, dict[str, Any]]:
    """The compile phase's record per configuration: the shards', then the retries run alone."""
    records = {k: v for i in range(workers) for k, v in _read_lines(work / f"compile.{i}.jsonl").items()}
    records.update(_read_lines(work / "compile.alone.jsonl"))
    return records


def _crowded_out(rec: dict[str, Any]) -> bool:
    """A configuration that failed for GPU memory while WORKERS processes shared the GPU (spilled
    registers take local memory per resident thread, in every process at once): the 11 of them on
    the first H100 recording all ran alone, so each is tried again alone before it is a failure."""
    return "out of memory" in rec.get("error", "")


def _failure(exc: BaseException) -> tuple[str, str, bool]:
    """(Kernel Tuner's failure string, the reason, whether the CUDA context is poisoned)."""
    text = f"{type(exc).__name__}: {exc}".splitlines()[0][:300]
    if type(exc).__name__ == "OutOfResources":
        return "RuntimeFailedConfig", text, False
    if "CUDA error" in text or "AcceleratorError" in type(exc).__name__:
        return "RuntimeFailedConfig", text, True
    return "CompilationFailedConfig", text, False


# ---- phase 1, one worker: run each configuration of its shard once ----

def compile_shard(args: argparse.Namespace, shard: int | None, shards: int) -> int:
    """Shard `shard` of `shards`; None: alone, the configurations the shards lost to crowding."""
    import torch
    from kernel_landscapes import KERNELS, config_key
    spec = KERNELS[args.kernel]
    work = Path(args.work)
    out = work / (f"compile.{shard}.jsonl" if shard is not None else "compile.alone.jsonl")
    done = _read_lines(out)
    inputs = spec.make_inputs(args.device, args.device == "cpu")
    if shard is None:
        crowded = {k for k, rec in compiled_records(work, shards).items() if _crowded_out(rec)}
        configs = [c for c in _design(spec, args) if config_key(spec, c) in crowded]
    else:
        configs = _design(spec, args)[shard::shards]
    for config in configs:
        key = config_key(spec, config)
        if key in done:
            continue
        t0 = time.perf_counter()
        try:
            spec.call(inputs, config)
            if args.device == "cuda":
                torch.cuda.synchronize()
            _append(out, {"key": key, "compile_ms": (time.perf_counter() - t0) * 1e3})
        except Exception as exc:  # a failed configuration is data
            kind, reason, poisoned = _failure(exc)
            _append(out, {"key": key, "compile_ms": (time.perf_counter() - t0) * 1e3,
                          "failed": kind, "error": reason})
            if poisoned:
                return CUDA_ERROR_EXIT
    return 0


def _design(spec: Any, args: argparse.Namespace) -> list[dict[str, Any]]:
    configs = spec.configs()
    return configs[:args.limit] if args.limit else configs


def run_compile_phase(args: argparse.Namespace, deadline: float) -> None:
    """WORKERS shards side by side, then one process alone for what failed for memory beside the
    others."""
    env = dict(os.environ, TRITON_CACHE_DIR=str(Path(args.work) / "triton-cache"))
    base = [sys.executable, __file__, "--kernel", args.kernel, "--device", args.device,
            "--work", args.work, "--limit", str(args.limit or 0)]
    _run_side_by_side([base + ["--shard", f"{i}/{args.workers}"] for i in range(args.workers)], env, deadline)
    if any(map(_crowded_out, compiled_records(Path(args.work), args.workers).values())):
        _run_side_by_side([base + ["--shard", f"alone/{args.workers}"]], env, deadline)


def _run_side_by_side(commands: list[list[str]], env: dict[str, str], deadline: float) -> None:
    """Each command in its own process until the deadline; one that died of a CUDA error starts
    again after its last line (up to 5 times). Every child dies with this process."""
    tries = {i: 5 for i in range(len(commands))}
    procs: dict[int, subprocess.Popen] = {}
    try:
        while (tries or procs) and time.time() < deadline:
            for i in [i for i in tries if i not in procs]:
                procs[i] = subprocess.Popen(commands[i], env=env)
                tries[i] -= 1
            time.sleep(0.5)
            for i, p in list(procs.items()):
                if p.poll() is None:
                    continue
                del procs[i]
                if p.returncode != CUDA_ERROR_EXIT or tries[i] == 0:
                    del tries[i]
    finally:
        for p in procs.values():
            p.kill()
            p.wait()


# ---- phase 2, one process: check and time what compiled ----

def _time_ms(spec: Any, inputs: dict[str, Any], config: dict[str, Any], calls: int,
             device: str) -> list[float]:
    """Milliseconds per call of REPLAYS replays of a CUDA graph of `calls` calls; on a CPU (the
    script's check) wall milliseconds of REPLAYS calls."""
    if device == "cpu":
        times = []
        for _ in range(REPLAYS):
            t0 = time.perf_counter()
            spec.call(inputs, config)
            times.append((time.perf_counter() - t0) * 1e3)
        return times
    from attention_kernels import graph_replays_us
    return [us / 1e3 for us in graph_replays_us([lambda: spec.call(inputs, config)] * calls, REPLAYS)]


def time_phase(args: argparse.Namespace, deadline: float) -> int:
    import torch
    from kernel_landscapes import KERNELS, config_key, relative_error, tolerance
    spec = KERNELS[args.kernel]
    work = Path(args.work)
    compiled = compiled_records(work, args.workers)
    out = work / "timed.jsonl"
    done = _read_lines(out)
    inputs = spec.make_inputs(args.device, args.device == "cpu")
    reference = spec.reference(inputs)
    tol = tolerance(inputs)
    for config in _design(spec, args):
        key = config_key(spec, config)
        if key in done or key not in compiled or "failed" in compiled[key] or time.time() > deadline:
            continue
        rec: dict[str, Any] = {"key": key}
        t0 = time.perf_counter()
        try:
            err = relative_error(spec.call(inputs, config), reference)
            rec["verification_ms"] = (time.perf_counter() - t0) * 1e3
            rec["relative_error"] = err
            if not err <= tol:  # NaN fails too
                rec.update(failed="RuntimeFailedConfig", error=f"output off by {err:.3g} (tolerance {tol:g})")
            else:
                t1 = time.perf_counter()
                rec["times"] = _time_ms(spec, inputs, config, args.calls, args.device)
                rec["benchmark_ms"] = (time.perf_counter() - t1) * 1e3
        except Exception as exc:  # a failed configuration is data
            kind, reason, poisoned = _failure(exc)
            rec.update(failed=kind, error=reason)
            _append(out, rec)
            if poisoned:
                return CUDA_ERROR_EXIT
            continue
        _append(out, rec)
        if args.device == "cuda":
            torch.cuda.empty_cache()  # graphs' pools: one configuration's memory at a time
    return 0


# ---- the parent: both phases, then the cache file ----

def run_time_phase(args: argparse.Namespace, deadline: float) -> None:
    """The timing process, started again after a CUDA error; it starts no configuration after the
    deadline, and is given a minute past it to finish the one it has begun."""
    env = dict(os.environ, TRITON_CACHE_DIR=str(Path(args.work) / "triton-cache"))
    cmd = [sys.executable, __file__, "--kernel", args.kernel, "--device", args.device, "--work",
           args.work, "--limit", str(args.limit or 0), "--workers", str(args.workers),
           "--calls", str(args.calls), "--phase", "time", "--deadline", str(deadline)]
    _run_side_by_side([cmd], env, deadline + 60)


def landscape(args: argparse.Namespace) -> dict[str, Any] | None:
    """The Kernel Tuner cache of what the two phases recorded; None while a configuration lacks a
    record (an absent configuration would read as a forbidden one)."""
    from _meta import machine_meta
    from kernel_landscapes import KERNELS, config_key
    spec = KERNELS[args.kernel]
    work = Path(args.work)
    compiled = compiled_records(work, args.workers)
    timed = _read_lines(work / "timed.jsonl")
    cache, missing = {}, 0
    for config in _design(spec, args):
        key = config_key(spec, config)
        c, t = compiled.get(key), timed.get(key)
        if c is None or ("failed" not in c and t is None):
            missing += 1
            continue
        entry: dict[str, Any] = dict(config, compile_time=c["compile_ms"])
        outcome = c if "failed" in c else t
        if "failed" in outcome:
            entry.update(time=outcome["failed"], error=outcome["error"])
        else:
            entry.update(time=sum(t["times"]) / len(t["times"]), times=t["times"],
                         benchmark_time=t["benchmark_ms"])
        if t is not None and "verification_ms" in t:
            entry.update(verification_time=t["verification_ms"], relative_error=t["relative_error"])
        cache[key] = entry
    print(f"[landscape] {len(cache)} configurations recorded, {missing} missing")
    if missing:
        return None
    meta = machine_meta()
    return {"version": "1.0.0", "device_name": meta.get("gpu") or meta["processor"],
            "kernel_name": spec.name, "problem_size": spec.problem(args.device == "cpu"),
            "tune_params_keys": list(spec.params), "tune_params": {k: list(v) for k, v in spec.params.items()},
            "objective": "time", "objective_higher_is_better": False,
            "recorded_by": {"script": "benchmarks/record_kernel_landscape.py", "compile_workers": args.workers,
                            "calls_per_graph": args.calls, "replays": REPLAYS, "device": args.device,
                            "machine": meta},
            "cache": cache}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--kernel", required=True, choices=("attention", "moe"))
    ap.add_argument("--out", help="the landscape, .json.gz (written once every configuration has a record)")
    ap.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    ap.add_argument("--workers", type=int, default=max(1, min(14, (os.cpu_count() or 2) - 2)))
    ap.add_argument("--calls", type=int, default=20, help="calls per CUDA graph (timed per call)")
    ap.add_argument("--limit", type=int, default=0, help="only the first N configurations (a check)")
    ap.add_argument("--limit-s", type=float, default=540, help="start nothing new after this long")
    ap.add_argument("--work", help="work files (default /tmp/autoopt-landscape-KERNEL)")
    ap.add_argument("--shard", help=argparse.SUPPRESS)
    ap.add_argument("--phase", help=argparse.SUPPRESS)
    ap.add_argument("--deadline", type=float, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    args.work = args.work or f"/tmp/autoopt-landscape-{args.kernel}"
    if args.device == "cpu":
        os.environ["TRITON_INTERPRET"] = "1"
    if args.shard:
        shard, shards = args.shard.split("/")
        return compile_shard(args, None if shard == "alone" else int(shard), int(shards))
    if args.phase == "time":
        return time_phase(args, args.deadline)
    if not args.out:
        ap.error("--out is required")
    Path(args.work).mkdir(parents=True, exist_ok=True)
    t0 = time.time()
    deadline = t0 + args.limit_s
    run_compile_phase(args, deadline)
    print(f"[landscape] compile phase done at {time.time() - t0:.0f} s", flush=True)
    run_time_phase(args, deadline)
    print(f"[landscape] time phase done at {time.time() - t0:.0f} s", flush=True)
    doc = landscape(args)
    if doc is None:
        print(f"[landscape] incomplete: run the same command again to resume ({args.work})")
        return 1
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    with gzip.open(args.out, "wt") as f:
        json.dump(doc, f)
    print(f"[landscape] wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
