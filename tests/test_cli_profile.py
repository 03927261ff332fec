"""`autoopt profile`: the real command, in-process (typer's CliRunner) and as the installed console
script in a subprocess (exit codes, one-line errors, the JSON document)."""
from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest
from typer.testing import CliRunner

from autoopt.cli import app
from autoopt.profile.rules import BUCKETS
from test_profile_trace import GpuTraceBuilder, case_study_trace

FIX = Path(__file__).parent / "fixtures" / "traces"
FP32, CAST = FIX / "cpu_mhc_fp32.json.gz", FIX / "cpu_mhc_bf16_cast.json.gz"
runner = CliRunner()


def _console_script() -> str:
    exe = shutil.which("autoopt")
    assert exe, "the `autoopt` console script is not on PATH: pip install -e . first"
    return exe


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([_console_script(), *args], capture_output=True, text=True, timeout=120)


def test_json_single_trace():
    res = runner.invoke(app, ["profile", str(FP32), "--json", "--top", "3"])
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout)
    assert set(doc) == {"traces", "delta_ms", "verdict", "wall_per_step_ms",
                        "wall_rose_while_kernels_fell"}
    assert doc["delta_ms"] == {} and doc["verdict"] is None
    t = doc["traces"][str(FP32)]
    assert {"buckets_ms", "kernel_count", "total_ms", "coverage"} <= set(t)
    assert set(t["buckets_ms"]) == set(BUCKETS)
    assert t["total_ms"] == pytest.approx(sum(t["buckets_ms"].values()))
    assert t["buckets_ms"]["gemm_simt"] > 0 and t["steps"] == 6 and t["per_step"] is True
    assert len(t["top_kernels"]) == 3 and t["top_kernels"][0]["ms"] >= t["top_kernels"][1]["ms"]


def test_table_with_vs_shows_deltas_and_verdict():
    res = runner.invoke(app, ["profile", str(FP32), "--vs", str(CAST), "--top", "2"])
    assert res.exit_code == 0, res.output
    out = res.stdout
    for text in ("gemm_simt", "gemm_tensorop", "copy_cast", "coverage", "top 2 by time", "aten::mm",
                 "delta", "verdict:", "of the GEMM gain"):
        assert text in out, text


def test_help_has_examples():
    res = runner.invoke(app, ["profile", "--help"])
    assert res.exit_code == 0
    assert "autoopt profile before.json.gz --vs after.json.gz" in res.stdout
    assert "--vs" in res.stdout and "--json" in res.stdout and "--top" in res.stdout


def test_console_script_case_study_json(tmp_path):
    """The installed `autoopt` script on the case study's figures: exit 0 and 61% in the verdict."""
    before = case_study_trace(after=False).write(tmp_path / "before.json.gz")
    after = case_study_trace(after=True).write(tmp_path / "after.json")
    proc = _run("profile", str(before), "--vs", str(after), "--json")
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    assert list(doc["traces"]) == [str(before), str(after)]
    assert doc["delta_ms"]["gemm_simt"] == pytest.approx(-1004.0)
    assert doc["delta_ms"]["gemm_tensorop"] == pytest.approx(499.0)
    assert doc["delta_ms"]["copy_cast"] == pytest.approx(310.0)
    assert "casts ate 61% of the GEMM gain" in doc["verdict"]
    assert doc["traces"][str(before)]["kernel_count"] == 14


def test_console_script_table_on_real_fixtures():
    proc = _run("profile", str(FP32), "--vs", str(CAST))
    assert proc.returncode == 0, proc.stderr
    assert "verdict:" in proc.stdout and proc.stderr == ""


@pytest.mark.parametrize("make,expected", [
    (lambda d: d / "missing.json", "no such file"),
    (lambda d: (d / "notes.json").write_text("not json") and d / "notes.json", "not valid JSON"),
    (lambda d: (d / "cfg.json").write_text('{"knob": 1}') and d / "cfg.json", "'traceEvents' list"),
])
def test_console_script_bad_trace_exits_2_with_one_line(tmp_path, make, expected):
    path = make(tmp_path)
    proc = _run("profile", str(FP32), "--vs", str(path))
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: {path}") and expected in lines[0]
    assert proc.stdout == ""


def test_usage_errors_exit_2():
    assert runner.invoke(app, ["profile"]).exit_code == 2  # TRACE is required
    assert runner.invoke(app, ["profile", str(FP32), "--top", "-1"]).exit_code == 2
    proc = _run("profile", str(FP32), "--vs", str(FP32))
    assert proc.returncode == 2 and "second trace" in proc.stderr


def test_per_step_mismatch_warns(tmp_path):
    b = case_study_trace(after=True)
    b.events = [e for e in b.events if not e["name"].startswith("ProfilerStep#")]
    nosteps = b.write(tmp_path / "nosteps.json")
    proc = _run("profile", str(FP32), "--vs", str(nosteps), "--json")
    assert proc.returncode == 0
    assert "warning:" in proc.stderr and "unlike figures" in proc.stderr
    assert json.loads(proc.stdout)["traces"][str(nosteps)]["per_step"] is False


def test_cpu_vs_gpu_trace_warns():
    proc = _run("profile", str(FP32), "--vs", str(FIX / "h200_mhc_fp32.json.gz"), "--json")
    assert proc.returncode == 0
    assert "per-step CPU figures" in proc.stderr and "per-step GPU figures" in proc.stderr


def test_names_with_brackets_are_printed_verbatim(tmp_path):
    b = GpuTraceBuilder()
    b.kernel("fused[bold]kernel[/bold]_x", 100.0, 0.0)
    res = runner.invoke(app, ["profile", str(b.write(tmp_path / "br[a]ckets.json"))])
    assert res.exit_code == 0, res.output
    assert "fused[bold]kernel[/bold]_x" in res.stdout and "br[a]ckets.json" in res.stdout
