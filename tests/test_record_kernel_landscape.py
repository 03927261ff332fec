"""benchmarks/record_kernel_landscape.py on the CPU (Triton's interpreter, tiny shapes, fp32): both
phases run as real subprocesses, the file it writes is a Kernel Tuner cache that autoopt's replay
reader loads, and a configuration cut short is never written as an absent (forbidden) row."""
from __future__ import annotations

import gzip
import json
import subprocess
import sys
from pathlib import Path

from autoopt.targets.replay.table import load_table

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "benchmarks" / "record_kernel_landscape.py"


def _record(tmp_path: Path, *extra: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), "--kernel", "moe", "--device", "cpu",
                           "--workers", "2", "--work", str(tmp_path / "work"),
                           "--out", str(tmp_path / "moe.json.gz"), *extra],
                          capture_output=True, text=True, timeout=300)


def test_a_recorded_landscape_is_a_kernel_tuner_cache_the_replay_reads(tmp_path: Path) -> None:
    proc = _record(tmp_path, "--limit", "3")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    doc = json.loads(gzip.decompress((tmp_path / "moe.json.gz").read_bytes()))
    assert doc["tune_params_keys"] == ["block_m", "block_n", "block_k", "num_warps", "num_stages"]
    assert len(doc["cache"]) == 3
    for entry in doc["cache"].values():
        assert entry["relative_error"] <= 1e-4  # checked against dsv4.ref_ops.moe_experts_ref
        assert len(entry["times"]) == 7 and entry["time"] == sum(entry["times"]) / 7
        assert entry["compile_time"] > 0 and entry["benchmark_time"] > 0
    table = load_table(tmp_path / "moe.json.gz")
    assert table.objective == "time" and table.minimize
    assert len(table.valid_rows()) == 3
    assert all(r.compile_s and r.compile_s > 0 for r in table.valid_rows())


def test_a_recording_cut_short_writes_nothing_and_resumes(tmp_path: Path) -> None:
    cut = _record(tmp_path, "--limit", "2", "--limit-s", "0")
    assert cut.returncode == 1 and "incomplete" in cut.stdout
    assert not (tmp_path / "moe.json.gz").exists()
    done = _record(tmp_path, "--limit", "2")
    assert done.returncode == 0, done.stdout + done.stderr
    assert len(json.loads(gzip.decompress((tmp_path / "moe.json.gz").read_bytes()))["cache"]) == 2


def test_a_configuration_crowded_out_of_gpu_memory_is_tried_again_alone(tmp_path: Path) -> None:
    """On the H100, 11 configurations failed with CUDA out-of-memory while 14 processes compiled
    side by side, and all ran alone: such a record is not final. The shard's record says it ran out
    of memory; the recording retries it in one process and the landscape holds its timing."""
    work = tmp_path / "work"
    work.mkdir()
    crowded = {"key": "16,32,32,2,1", "compile_ms": 5.0, "failed": "CompilationFailedConfig",
               "error": "RuntimeError: Triton Error [CUDA]: out of memory"}
    (work / "compile.0.jsonl").write_text(json.dumps(crowded) + "\n")
    (work / "compile.1.jsonl").write_text("")  # the other shard's configuration still to compile
    proc = _record(tmp_path, "--limit", "2")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    alone = [json.loads(line) for line in (work / "compile.alone.jsonl").read_text().splitlines()]
    assert [r["key"] for r in alone] == ["16,32,32,2,1"] and "failed" not in alone[0]
    cache = json.loads(gzip.decompress((tmp_path / "moe.json.gz").read_bytes()))["cache"]
    assert isinstance(cache["16,32,32,2,1"]["time"], float) and "error" not in cache["16,32,32,2,1"]
    assert isinstance(cache["16,32,32,2,2"]["time"], float)
