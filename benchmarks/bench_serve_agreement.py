"""Does `autoopt bench-serve` agree with a second load generator (AIPerf) on output tok/s? (issue 11)

One `transformers serve` of the tiny random Llama (tests/tiny_serving_model.py: no end-of-sequence
token, so every request generates exactly --output-tokens) is started once and warmed up. Then, per
concurrency, both generators run the same workload (prompt tokens, output tokens, request count, no
warm-up of their own) --repeats times each, interleaved A B B A ... so drift of the machine falls on
both. Per run the script keeps each tool's own output tok/s, and beside it the tokens and seconds it
divided, so a disagreement can be traced to its definition:

  autoopt (vLLM's definition): total output tokens / duration, the duration from the first request
    sent to the last response's end;
  AIPerf: output_token_throughput = total output tokens / benchmark_duration of its profiling phase,
    which its per-request records (profile_export.jsonl) show to be the same span: the first
    request_start_ns to the last request_end_ns (kept per run as first_start_to_last_end_s).

Prints a table (median and spread per C) and writes benchmarks/results/bench_serve_agreement.json
(machine, versions, date, every run). Agreement: the medians within 10 %.

    python benchmarks/bench_serve_agreement.py --aiperf /tmp/aiperf/bin/aiperf --concurrency 1,4

On a GPU, against the server h200_serve.sh tuned (benchmarks/h200_agreement.sh does this on the H200):

    python benchmarks/bench_serve_agreement.py --model DIR --server-arg=--device --server-arg=cuda ...
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "tests"), str(REPO / "benchmarks")]

from _meta import machine_meta  # noqa: E402
from autoopt.targets.server import launch, loadgen, readiness  # noqa: E402
from autoopt.targets.server.metrics import run_metrics  # noqa: E402
from autoopt.targets.server.results import read_result  # noqa: E402

AGREE_WITHIN = 0.10
OUT = REPO / "benchmarks" / "results" / "bench_serve_agreement.json"


def start_server(model: Path, home: Path, log: Path, cpus: str | None,
                 extra: list[str]) -> tuple[launch.ServerProcess, str]:
    import tiny_serving_model

    port = launch.free_port("127.0.0.1")
    pin = ["taskset", "-c", cpus] if cpus else []  # the server on its own cores: see --server-cpus
    # this interpreter's transformers (a venv's python may run without the venv on PATH)
    serve = [sys.executable, "-m", "transformers.cli.transformers", "serve", str(model)]
    plan = launch.plan(pin + serve + ["--host", "127.0.0.1", "--port", str(port)] + extra,
                       {}, {}, {}, base_env=tiny_serving_model.serving_env(home))
    proc = launch.ServerProcess(plan, log)
    url = f"http://127.0.0.1:{port}"
    readiness.wait_ready(url, proc, 600)  # a GPU model with CUDA graphs takes a while
    return proc, url


def autoopt_run(gen: loadgen.LoadGenerator, c: int, index: int, warmup: int) -> dict[str, Any]:
    if warmup:
        asyncio.run(gen.run(c, warmup, index_base=index * 100_000 + 50_000))
    cpu0 = time.process_time()
    results, duration_s = asyncio.run(gen.run(c, index_base=index * 100_000))
    cpu_s = time.process_time() - cpu0
    m = run_metrics(results, duration_s, {})
    if m["failed"]:
        raise RuntimeError(f"autoopt: {m['failed']} requests failed: {next(e for e in m['errors'] if e)}")
    return {"output_tok_per_s": m["output_throughput"], "output_tokens": m["total_output_tokens"],
            "duration_s": duration_s, "requests": m["completed"], "generator_cpu_s": cpu_s,
            "server_s_per_request": statistics.median(r.latency_s for r in results if r.ok)}


def aiperf_run(aiperf: str, url: str, model: Path, c: int, args: argparse.Namespace, out: Path) -> dict[str, Any]:
    cmd = [aiperf, "profile", "--model", str(model), "--tokenizer", str(model), "--url", url,
           "--endpoint-type", "completions", "--streaming", "--use-server-token-count",
           "--synthetic-input-tokens-mean", str(args.prompt_tokens), "--synthetic-input-tokens-stddev", "0",
           "--output-tokens-mean", str(args.output_tokens), "--output-tokens-stddev", "0",
           "--concurrency", str(c), "--request-count", str(args.requests),
           "--random-seed", "0", "--artifact-dir", str(out), "--ui-type", "none", "--no-gpu-telemetry",
           "--no-server-metrics"] + (["--warmup-request-count", str(args.generator_warmup)]
                                     if args.generator_warmup else [])
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    # AIPerf 0.13 in HF offline mode looks a tokenizer up only in the hub cache, where a local folder
    # is not (HFValidationError); online, a folder loads from disk with no network call
    env = {k: v for k, v in os.environ.items() if k not in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")}
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=env)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu_s = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)  # its whole tree
    export = out / "profile_export_aiperf.json"
    if res.returncode != 0 or not export.is_file():
        raise RuntimeError(f"aiperf exited {res.returncode}: {(res.stderr or res.stdout)[-2000:]}")
    doc = json.loads(export.read_text())
    parsed = read_result(export)
    records = [json.loads(line)["metadata"] for line in (out / "profile_export.jsonl").read_text().splitlines() if line]
    span_s = (max(r["request_end_ns"] for r in records) - min(r["request_start_ns"] for r in records)) / 1e9
    return {"output_tok_per_s": parsed.value("output_throughput", c),
            "output_tokens": (doc.get("total_output_tokens") or {}).get("avg"),
            "duration_s": parsed.duration_s, "requests": (doc.get("request_count") or {}).get("avg"),
            "first_start_to_last_end_s": span_s,  # from its per-request records: the definition check
            "generator_cpu_s": cpu_s,  # start-up included: the CPU it took from a 2-core machine
            "server_s_per_request": statistics.median((r["request_end_ns"] - r["request_start_ns"]) / 1e9
                                                      for r in records),
            "aiperf_version": doc.get("aiperf_version")}


def _cpu_list(text: str) -> set[int]:
    """taskset's list syntax, "0" or "0,2-3", as a set of CPU numbers."""
    cpus: set[int] = set()
    for part in text.split(","):
        lo, _, hi = part.partition("-")
        cpus.update(range(int(lo), int(hi or lo) + 1))
    return cpus


def model_meta(folder: str | None) -> dict[str, Any] | None:
    """What h200_serve_model.py recorded of the model it built (architecture, size), if it did."""
    meta = Path(folder) / "autoopt_model.json" if folder else None
    return json.loads(meta.read_text()) if meta and meta.is_file() else None


def summary(values: list[float]) -> dict[str, float]:
    return {"median": statistics.median(values), "min": min(values), "max": max(values), "n": len(values)}


def paired_ratios(rows: list[dict[str, Any]], c: int) -> dict[str, Any]:
    """autoopt / AIPerf within each repeat (the two runs of one A B or B A pair, seconds apart): the
    server's slow drifts cancel in it, which they do not in a ratio of medians over the session."""
    by_rep: dict[int, dict[str, float]] = {}
    for r in rows:
        if r["concurrency"] == c:
            by_rep.setdefault(r["repeat"], {})[r["tool"]] = r["output_tok_per_s"]
    ratios = [v["autoopt"] / v["aiperf"] for _, v in sorted(by_rep.items()) if len(v) == 2]
    return {"per_repeat": ratios, **summary(ratios)} if ratios else {}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--aiperf", default=shutil.which("aiperf") or "/tmp/aiperf/bin/aiperf")
    ap.add_argument("--concurrency", default="1,4")
    ap.add_argument("--repeats", type=int, default=4)
    ap.add_argument("--requests", type=int, default=24)
    ap.add_argument("--prompt-tokens", type=int, default=16)
    ap.add_argument("--output-tokens", type=int, default=32)
    ap.add_argument("--out", type=Path, default=OUT)
    ap.add_argument("--generator-warmup", type=int, default=0,
                    help="requests each generator sends before each timed run (AIPerf: --warmup-request-count): "
                         "AIPerf's start-up (~10 s of CPU for its processes) then falls outside its timing")
    ap.add_argument("--server-cpus", help="CPUs for the server (taskset list, e.g. 1): with --generator-cpus, "
                    "neither generator's own CPU use (AIPerf's process tree: 11-15 s a run) slows the server")
    ap.add_argument("--model", help="a model folder to serve instead of the tiny random Llama (e.g. one "
                    "benchmarks/h200_serve_model.py built: no end-of-sequence token, so every request "
                    "generates exactly --output-tokens)")
    ap.add_argument("--server-arg", action="append", default=[],
                    help="an extra argument for `transformers serve` (repeatable), e.g. --server-arg=--device "
                         "--server-arg=cuda --server-arg=--continuous-batching")
    ap.add_argument("--generator-cpus", help="CPUs for this script and the AIPerf processes it starts (e.g. 0)")
    args = ap.parse_args()
    load_before = os.getloadavg()
    import tiny_serving_model

    work = Path(tempfile.mkdtemp(prefix="bench-serve-agreement-"))
    model = Path(args.model) if args.model else tiny_serving_model.build(work / "model")
    proc, url = start_server(model, work / "home", work / "server.log", args.server_cpus, args.server_arg)
    if args.generator_cpus:  # after the server's start: AIPerf, started from here, inherits it
        os.sched_setaffinity(0, _cpu_list(args.generator_cpus))
    import transformers

    meta = {"machine": machine_meta(), "transformers": transformers.__version__}  # once, not per run
    rows: list[dict[str, Any]] = []
    try:
        w = loadgen.Workload(model=str(model), prompt_tokens=args.prompt_tokens, output_tokens=args.output_tokens,
                             requests=args.requests, repeats=1)
        gen = loadgen.LoadGenerator(url, w)
        asyncio.run(gen.calibrate())
        cs = [int(x) for x in args.concurrency.split(",")]
        asyncio.run(gen.run(max(cs), max(cs) * 2, index_base=90_000_000))  # the server's warm-up
        for c in cs:
            for rep in range(args.repeats):
                for tool in (("autoopt", "aiperf") if rep % 2 == 0 else ("aiperf", "autoopt")):
                    t0 = time.time()
                    row = (autoopt_run(gen, c, c * 1000 + rep, args.generator_warmup) if tool == "autoopt" else
                           aiperf_run(args.aiperf, url, model, c, args, work / f"aiperf_c{c}_r{rep}"))
                    rows.append({"tool": tool, "concurrency": c, "repeat": rep, "started": t0} | row)
                    print(f"C={c} repeat {rep} {tool:8s} {row['output_tok_per_s']:8.1f} tok/s "
                          f"({row['output_tokens']} tokens / {row['duration_s']:.2f} s)", flush=True)
                    write_result(rows, args, cs, meta, load_before)
    finally:
        proc.stop(10)
    print_table(write_result(rows, args, cs, meta, load_before))
    print(f"wrote {args.out}")


def summarise(rows: list[dict[str, Any]], cs: list[int]) -> dict[str, Any]:
    """Per C with runs of both tools so far: each tool's median and spread, their ratio, the ratio
    within each pair, and beside them what could explain a gap."""
    table = {}
    for c in [c for c in cs if {r["tool"] for r in rows if r["concurrency"] == c} == {"autoopt", "aiperf"}]:
        mine = [r for r in rows if r["concurrency"] == c]
        per = {t: summary([r["output_tok_per_s"] for r in mine if r["tool"] == t]) for t in ("autoopt", "aiperf")}
        ratio = per["autoopt"]["median"] / per["aiperf"]["median"]
        per |= {"ratio_autoopt_over_aiperf": ratio, "agree_within_10pct": abs(ratio - 1) <= AGREE_WITHIN,
                "paired_ratio": paired_ratios(rows, c)}
        for key in ("generator_cpu_s", "server_s_per_request"):  # why they differ, where they do
            per[key] = {t: statistics.median(r[key] for r in mine if r["tool"] == t) for t in ("autoopt", "aiperf")}
        table[str(c)] = per
    return table


def print_table(table: dict[str, Any]) -> None:
    print(f"\n{'C':>3} {'autoopt tok/s':>26} {'AIPerf tok/s':>26} {'ratio':>7}  agree")
    for c, per in table.items():
        cell = {t: f"{per[t]['median']:.1f} [{per[t]['min']:.1f}, {per[t]['max']:.1f}]" for t in ("autoopt", "aiperf")}
        pr, cpu, req = per["paired_ratio"], per["generator_cpu_s"], per["server_s_per_request"]
        print(f"{c:>3} {cell['autoopt']:>26} {cell['aiperf']:>26} {per['ratio_autoopt_over_aiperf']:7.3f}  "
              f"paired {pr['median']:.3f} [{pr['min']:.3f}, {pr['max']:.3f}]  "
              f"{'yes' if per['agree_within_10pct'] else 'NO'}   generator CPU s {cpu['autoopt']:.2f} vs "
              f"{cpu['aiperf']:.2f}; request s {req['autoopt']:.3f} vs {req['aiperf']:.3f}")


def write_result(rows: list[dict[str, Any]], args: argparse.Namespace, cs: list[int], meta: dict[str, Any],
                 load_before: tuple) -> dict[str, Any]:
    """The JSON, rewritten after every run (a call cut short keeps its figures); returns its summary."""
    table = summarise(rows, cs)
    versions = {"transformers": meta["transformers"],
                "aiperf": next((r.get("aiperf_version") for r in rows if r.get("aiperf_version")), None)}
    doc = {"benchmark": "bench_serve_agreement", "meta": meta["machine"] | {"versions": versions},
           "workload": {"prompt_tokens": args.prompt_tokens, "output_tokens": args.output_tokens,
                        "requests": args.requests, "repeats": args.repeats, "order": "A B B A interleaved",
                        "generator_warmup_requests": args.generator_warmup,
                        "cpus": {"server": args.server_cpus, "generators": args.generator_cpus},
                        "server": (f"transformers serve {args.model} {' '.join(args.server_arg)}" if args.model
                                   else "transformers serve, tiny random Llama (tests/tiny_serving_model.py), CPU"),
                        "model": model_meta(args.model)},
           "definitions": {"autoopt": "total output tokens / (first request sent -> last response end)",
                           "aiperf": "output_token_throughput: total output tokens / benchmark_duration"},
           "load_average": {"before": list(load_before), "after": list(os.getloadavg())},
           "summary": table, "runs": rows}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(doc, indent=1) + "\n")
    return table

if __name__ == "__main__":
    main()
