"""How fast does `autoopt --help` answer? (The CLI must not import torch.) Prints a table and writes
benchmarks/results/cli_startup.json with machine, versions, date.

    python benchmarks/cli_startup.py [--repeats 15]
"""
from __future__ import annotations

import argparse
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from _meta import machine_meta, write_result  # noqa: E402

COMMANDS = {
    "autoopt --help": ["autoopt", "--help"],
    "autoopt history --help": ["autoopt", "history", "--help"],
    "python -c 'import torch' (for scale)": [sys.executable, "-c", "import torch"],
}


def time_command(argv: list[str], repeats: int) -> list[float]:
    samples = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        subprocess.run(argv, check=True, capture_output=True)
        samples.append(time.perf_counter() - t0)
    return samples


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--repeats", type=int, default=15)
    ap.add_argument("--out", default=str(Path(__file__).parent / "results" / "cli_startup.json"))
    args = ap.parse_args()
    if shutil.which("autoopt") is None:
        sys.exit("autoopt is not on PATH: pip install -e . first")
    rows = {}
    for label, argv in COMMANDS.items():
        s = time_command(argv, args.repeats)
        q = statistics.quantiles(s, n=4)
        rows[label] = {"median_s": statistics.median(s), "q1_s": q[0], "q3_s": q[2], "n": len(s)}
    print(f"{'command':45s} {'median s':>9s} {'IQR s':>15s}")
    for label, r in rows.items():
        print(f"{label:45s} {r['median_s']:9.3f} {r['q1_s']:7.3f}-{r['q3_s']:.3f}")
    path = write_result(args.out, {"benchmark": "cli_startup", "machine": machine_meta(), "results": rows})
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
