"""How fast does `autoopt browse` open the committed H200 study (82 trials)? Each sample is a fresh
Python process that runs the real command line (`autoopt browse --db ... [--study ...]`, through the
typer entry point like the console script) with Textual's headless driver at 80x24. "Opened" is the
first frame Textual composes in which the trials table holds every trial (a hook on App._display,
where a terminal would be written to); the process quits right there. Per sample it records the wall
time from spawning the process to that frame and the CPU time (user + system) the process had used
by then (what it costs without other processes competing for the cores), the whole process's wall
and CPU to its exit, and the 1-minute load average: on a shared machine other processes' load slows
every wall-clock figure. Also records whether torch, triton or SQLAlchemy were imported (a SQLite
study is read through sqlite3 alone). Prints a table and writes
benchmarks/results/browse_startup.json with machine, versions, date.

    python benchmarks/browse_startup.py [--repeats 7]
"""
from __future__ import annotations

import argparse
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

sys.path.insert(0, str(Path(__file__).parent))
from _meta import machine_meta, write_result  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
STUDY_DB = ROOT / "benchmarks" / "results" / "h200_study.sqlite"
EXPECT_ROWS = 82

CHILD = """
import json, os, sys, time
from textual.app import App

argv, expect, press_enter = json.loads(sys.argv[1]), int(sys.argv[2]), sys.argv[3] == "1"
seen = {}
real_display, real_run = App._display, App.run

def display(self, screen, renderable):
    real_display(self, screen, renderable)
    if renderable is None or seen or type(screen).__name__ != "TrialsScreen":
        return
    if screen.query_one("#trials").row_count == expect:
        c = os.times()
        seen.update(painted_at=time.time(), cpu_s=c.user + c.system,
                    **{m: m in sys.modules for m in ("torch", "triton", "sqlalchemy", "optuna")})
        self.exit()

async def open_first_study(pilot):
    if press_enter:                 # the studies list -> the study under the cursor
        await pilot.pause()
        await pilot.press("enter")

App._display = display
App.run = lambda self, **kw: real_run(self, headless=True, size=(80, 24), auto_pilot=open_first_study)
sys.argv = argv
from autoopt.cli import main
try:
    main()
except SystemExit:
    pass
print(json.dumps(seen))
"""

CASES = {"autoopt browse --study flash-h200": ["--study", "flash-h200"],
         "autoopt browse (studies list, enter)": []}


def sample(db: Path, extra: list[str]) -> dict:
    argv = ["autoopt", "browse", "--db", str(db), *extra]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    load = os.getloadavg()[0]
    spawned_at, t0 = time.time(), time.perf_counter()
    out = subprocess.run([sys.executable, "-c", CHILD, json.dumps(argv), str(EXPECT_ROWS), "0" if extra else "1"],
                         capture_output=True, text=True, cwd=ROOT, check=True, timeout=120)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    seen = json.loads(out.stdout.strip().splitlines()[-1])
    if not seen:
        raise RuntimeError(f"the trials table never showed {EXPECT_ROWS} rows: {out.stderr[-2000:]}")
    return {"painted_s": seen["painted_at"] - spawned_at, "painted_cpu_s": seen["cpu_s"], "exit_s": wall,
            "exit_cpu_s": (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime),
            "load_1m": load, **{m: seen[m] for m in ("torch", "triton", "sqlalchemy", "optuna")}}


def spread(values: list[float]) -> dict:
    q = statistics.quantiles(values, n=4) if len(values) > 1 else [values[0]] * 3
    return {"median": statistics.median(values), "q1": q[0], "q3": q[2], "min": min(values), "max": max(values)}


def summarise(samples: list[dict]) -> dict:
    return {"n": len(samples), **{key: spread([s[key] for s in samples]) for key in
                                  ("painted_s", "painted_cpu_s", "exit_s", "exit_cpu_s", "load_1m")},
            "samples": samples,
            "imported": {m: any(s[m] for s in samples) for m in ("torch", "triton", "sqlalchemy", "optuna")}}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--out", default=str(Path(__file__).parent / "results" / "browse_startup.json"))
    args = ap.parse_args()
    rows = {}
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory() as tmp:
        db = Path(tmp) / "h200.sqlite"
        shutil.copy(STUDY_DB, db)  # never the committed file
        sample(db, CASES["autoopt browse --study flash-h200"])  # warm the page cache once
        for label, extra in CASES.items():
            rows[label] = summarise([sample(db, extra) for _ in range(args.repeats)])
    print(f"{'to the first frame with 82 rows':38s} {'wall s (min-max)':>22s} {'CPU s (min-max)':>20s} load  imports")
    for label, r in rows.items():
        w, c = r["painted_s"], r["painted_cpu_s"]
        print(f"{label:38s} {w['median']:6.3f} ({w['min']:.3f}-{w['max']:.3f}) {c['median']:8.3f} "
              f"({c['min']:.2f}-{c['max']:.2f}) {r['load_1m']['median']:5.1f}  "
              + (", ".join(m for m, yes in r["imported"].items() if yes) or "no torch/triton/sqlalchemy/optuna"))
    path = write_result(args.out, {
        "benchmark": "browse_startup", "study": "benchmarks/results/h200_study.sqlite",
        "what": "spawn `autoopt browse` -> first frame with the 82-row trials table at 80x24 (headless); "
                "painted_* to that frame, exit_* to the process's exit",
        "load_average_1m": {"before": load_before[0], "after": os.getloadavg()[0]},
        "machine": machine_meta(), "results": rows})
    print(f"load average (1 min) {load_before[0]:.1f} before, {os.getloadavg()[0]:.1f} after, "
          f"on {os.cpu_count()} CPUs")
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
