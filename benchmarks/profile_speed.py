"""How fast does `autoopt profile` bucket a large GPU trace? Generates a Chrome trace of about
`--events` events shaped like a torch.profiler capture of an H200 decode (per kernel: its cpu_op, the
cudaLaunchKernel with its correlation id, the ac2g flow pair, the kernel itself; ProfilerStep#N
annotations on the CPU and their GPU mirror), with the real kernel names of
tests/fixtures/traces/h200_kernel_names.tsv. Times `profile_trace` in a fresh process per repeat
(the median and the spread of `--repeats`, wall and CPU seconds, with each run's peak RSS;
interpreter start and imports included), prints a table and writes
benchmarks/results/profile_speed.json with machine, versions, date.

    python benchmarks/profile_speed.py [--events 1000000] [--repeats 3]
"""
from __future__ import annotations

import argparse
import gzip
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))
from _meta import machine_meta, write_result  # noqa: E402

NAMES_TSV = ROOT / "tests" / "fixtures" / "traces" / "h200_kernel_names.tsv"
EVENTS_PER_KERNEL = 5  # cpu_op, cuda_runtime launch, flow start, flow end, kernel
KERNELS_PER_STEP = 200
CPU_OPS = ("aten::mm", "aten::to", "aten::copy_", "aten::add", "aten::mul", "aten::softmax",
           "aten::index_select", "aten::sum")
TIMER = """
import json, resource, sys, time
t0 = time.perf_counter()
from autoopt.profile.trace import profile_trace
p = profile_trace(sys.argv[1])
s = time.perf_counter() - t0
r = resource.getrusage(resource.RUSAGE_SELF)
print(json.dumps({"s": s, "cpu_s": r.ru_utime + r.ru_stime, "peak_rss_mb": r.ru_maxrss / 1024,
                  "kernels_per_step": p.kernel_count, "steps": p.steps}))
"""


def kernel_names() -> list[str]:
    return [line.split("\t", 1)[1].rstrip("\n") for line in NAMES_TSV.read_text().splitlines()
            if line and not line.startswith("#")]


def _kernel_events(rng: random.Random, names: list[str], ts: float, ext: int,
                   corr: int, gpu_ts: float) -> tuple[list[dict], float]:
    """The five events of one launched kernel; returns them and the GPU time it ends."""
    op = rng.choice(CPU_OPS)
    dur = rng.uniform(1.5, 40.0)
    kind = "gpu_memset" if rng.random() < 0.02 else "kernel"
    args = {"External id": ext, "correlation": corr}
    return [
        {"ph": "X", "cat": "cpu_op", "name": op, "pid": 1, "tid": 1, "ts": ts, "dur": 12.0,
         "args": {"External id": ext, "Input type": ["c10::BFloat16", "float"],
                  "Input Dims": [[256, 28672], [24, 28672]]}},
        {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 1,
         "ts": ts + 4.0, "dur": 5.0, "args": {"External id": ext, "cbid": 211, "correlation": corr}},
        {"ph": "s", "cat": "ac2g", "name": "ac2g", "id": corr, "pid": 1, "tid": 1, "ts": ts + 4.0},
        {"ph": "f", "cat": "ac2g", "name": "ac2g", "id": corr, "pid": 0, "tid": 7, "ts": gpu_ts,
         "bp": "e"},
        {"ph": "X", "cat": kind, "name": rng.choice(names), "pid": 0, "tid": 7, "ts": gpu_ts,
         "dur": dur, "args": {**args, "stream": 7, "grid": [132, 1, 1], "block": [128, 1, 1]}},
    ], gpu_ts + dur + 0.8


def make_trace(path: Path, n_events: int, seed: int = 0) -> int:
    """Write a gzip Chrome trace of about n_events events; returns the exact count."""
    rng, names = random.Random(seed), kernel_names()
    events: list[dict] = []
    ts = gpu_ts = 1_000_000.0
    ext = corr = 0
    step = 0
    while len(events) < n_events:
        step_start, first_gpu = ts, gpu_ts
        for _ in range(KERNELS_PER_STEP):
            ext, corr = ext + 1, corr + 1
            batch, gpu_ts = _kernel_events(rng, names, ts, ext, corr, max(gpu_ts, ts + 10.0))
            events += batch
            ts += 14.0
        ts = max(ts, gpu_ts) + 5.0  # the step ends with a synchronize
        for cat, pid, start in (("user_annotation", 1, step_start), ("gpu_user_annotation", 0, first_gpu)):
            events.append({"ph": "X", "cat": cat, "name": f"ProfilerStep#{step}", "pid": pid,
                           "tid": 1 if pid else 7, "ts": start, "dur": ts - start,
                           "args": {"External id": 0}})
        step += 1
    with gzip.open(path, "wt", compresslevel=1) as f:
        json.dump({"schemaVersion": 1, "traceEvents": events}, f)
    return len(events)


def time_profile(path: Path, repeats: int) -> list[dict]:
    runs = []
    for _ in range(repeats):
        out = subprocess.run([sys.executable, "-c", TIMER, str(path)], capture_output=True, text=True,
                             check=True, cwd=ROOT)
        runs.append(json.loads(out.stdout))
    return runs


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--events", type=int, default=1_000_000)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out", default=str(HERE / "results" / "profile_speed.json"))
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="autoopt-profile-speed-") as tmp:
        trace = Path(tmp) / "trace.json.gz"
        n = make_trace(trace, args.events)
        size_mb = trace.stat().st_size / 2 ** 20
        runs = time_profile(trace, args.repeats)
    secs, cpu = [r["s"] for r in runs], [r["cpu_s"] for r in runs]
    row = {"events": n, "trace_gz_mb": round(size_mb, 1), "median_s": statistics.median(secs),
           "min_s": min(secs), "max_s": max(secs), "runs_s": secs,
           "median_cpu_s": statistics.median(cpu), "runs_cpu_s": cpu,
           # a shared machine: wall above CPU time is time this process waited for a core
           "load_average_1m_after": os.getloadavg()[0],
           "peak_rss_mb": max(r["peak_rss_mb"] for r in runs),
           "kernels_per_step": runs[0]["kernels_per_step"], "steps": runs[0]["steps"]}
    print(f"{'events':>9} {'trace.gz':>9} {'median s':>9} {'spread s':>13} {'CPU s':>6} "
          f"{'peak RSS':>9} {'load':>5}")
    print(f"{n:>9} {size_mb:>7.1f}MB {row['median_s']:>9.2f} {row['min_s']:>6.2f}-{row['max_s']:<6.2f}"
          f" {row['median_cpu_s']:>6.2f} {row['peak_rss_mb']:>7.0f}MB "
          f"{row['load_average_1m_after']:>5.1f}")
    write_result(args.out, {"benchmark": "profile_speed", "machine": machine_meta(),
                            "command": "profile_trace(<generated trace>) in a fresh process",
                            "repeats": args.repeats, "result": row})
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
