"""`autoopt measure` end to end: the real CLI in a subprocess (worker start and torch import included),
its JSON document, its rich output, and its exit codes (0 ok, 1 wrong/failed, 2 bad input)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest
from typer.testing import CliRunner

from autoopt.cli import app

REQUIRED_KEYS = {"status", "tok_per_s", "buckets_ms", "bucket_coverage", "kernel_count", "correctness",
                 "costs_s", "mbu", "peak_memory_bytes", "what_ran", "environment", "config", "failure"}


def _autoopt(*args: str, env: dict | None = None, timeout: float = 240) -> subprocess.CompletedProcess:
    code = "import sys; from autoopt.cli import main; sys.argv = ['autoopt'] + sys.argv[1:]; main()"
    return subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True,
                          timeout=timeout, env=env)


@pytest.fixture(scope="module")
def tiny_profiled() -> tuple[float, subprocess.CompletedProcess]:
    """One `autoopt measure --preset tiny --json --profile`, timed from the outside."""
    t0 = time.monotonic()
    out = _autoopt("measure", "--preset", "tiny", "--json", "--profile")
    return time.monotonic() - t0, out


def test_measure_tiny_json_profile_is_fast_and_correct(tiny_profiled):
    """The done-when figure: on a 2-core CPU, under 60 s wall including worker start and torch import,
    verdict ok, every documented key present."""
    wall_s, out = tiny_profiled
    assert out.returncode == 0, out.stderr[-3000:]
    doc = json.loads(out.stdout)  # exactly one JSON document on stdout
    assert REQUIRED_KEYS <= set(doc)
    assert wall_s < 60, f"measure --preset tiny --json --profile took {wall_s:.1f} s"
    assert doc["status"] == "ok" and doc["failure"] is None
    assert doc["correctness"]["verdict"] == "ok"
    assert doc["kernel_count"] > 0 and 0 < doc["bucket_coverage"] <= 1
    assert doc["buckets_ms"]["copy_cast"] > 0 and doc["buckets_ms"]["gemm_simt"] > 0
    conc = ["1", "16", "64"] if doc["environment"]["device"] == "cuda" else ["1", "4"]
    assert sorted(doc["tok_per_s"], key=int) == conc
    for c in conc:
        tp = doc["tok_per_s"][c]
        assert tp["ci_low"] <= tp["median"] <= tp["ci_high"] and tp["n"] == len(tp["samples_step_s"])
        assert doc["mbu"][c] > 0
    assert doc["costs_s"]["restart"] > 0 and doc["costs_s"]["profile"] > 0
    assert doc["environment"]["torch"] and doc["what_ran"]["measure.timer"]
    print(f"\nmeasure --preset tiny --json --profile: {wall_s:.1f} s wall, coverage "
          f"{doc['bucket_coverage']:.2f}, tok/s " +
          ", ".join(f"C={c}: {doc['tok_per_s'][c]['median']:.1f}" for c in conc))


def test_measure_tiny_profile_coverage_reaches_done_when(tiny_profiled):
    """Done-when: coverage >= 0.8 on a CPU. The tiny step is ~9.4k eager ops and ~40% of its
    profiled wall is host time between ops (Python, dispatcher, profiler); the decode step's
    dsv4:: code sections (dsv4.sections) let the profile attribute that time to the part of the step
    that spent it (profile_rules.SECTION_RULES), and the profile says how much of it is host time.
    What stays uncovered: metadata ops (view, empty, as_strided: `other`, ~12% of the wall) and the
    step's own orchestration between sections (~1-2%).

    Measured at C=4, 1 worker thread, on this 2-core CPU: 0.863-0.868 in 8 runs on a quiet machine
    (before the sections: 0.49-0.63). Under load 3-5 from other processes, 0.84-0.92 in 9 of 10
    runs and once 0.78: a long deschedule inside metadata ops doubled `other` in that 3-step
    profile. So one low figure is re-measured once (a second, independent profile); a second one
    below 0.8 is a failure."""
    _wall_s, out = tiny_profiled
    assert out.returncode == 0, out.stderr[-3000:]
    doc = json.loads(out.stdout)
    figures = [doc["bucket_coverage"]]
    if figures[0] < 0.8:
        out = _autoopt("measure", "--preset", "tiny", "--json", "--profile")
        assert out.returncode == 0, out.stderr[-3000:]
        doc = json.loads(out.stdout)
        figures.append(doc["bucket_coverage"])
    profile_line = doc["what_ran"].get("profile", "")
    assert figures[-1] >= 0.8, (figures, profile_line)
    assert "host time of dsv4:: code sections" in profile_line  # the split is stated, not hidden
    assert "not kernel time" in doc["what_ran"].get("profile.notes", "")


def test_rich_output_shows_figures_verdict_costs_and_what_ran(tmp_path):
    cfg = tmp_path / "c.yaml"
    cfg.write_text("preset: tiny\nknobs: {mhc_gemm: bf16}\nlayers: {2: {mhc_operand: view_bf16_residual}}\n")
    out = _autoopt("measure", "--config", str(cfg), "--set", "mhc_operand=view_bf16_residual",
                   "--concurrency", "1", "--steps", "6")
    assert out.returncode == 0, out.stderr[-3000:]
    for fragment in ("status: ok", "tok/s", "95% CI", "MBU", "correctness: ok", "costs:",
                     "what actually ran", "peak memory", "mhc_gemm[c4]", "via view_bf16_residual"):
        assert fragment in out.stdout, (fragment, out.stdout)


def test_json_config_reflects_file_then_set_overrides(tmp_path):
    cfg = tmp_path / "c.yaml"
    cfg.write_text("preset: tiny\nknobs: {mhc_gemm: bf16, moe_experts: grouped}\n")
    out = _autoopt("measure", "--config", str(cfg), "--set", "moe_experts=loop", "--set",
                   "mhc_operand@c4=view_bf16_residual", "--concurrency", "1", "--steps", "6", "--json")
    assert out.returncode == 0, out.stderr[-3000:]
    doc = json.loads(out.stdout)
    assert doc["config"]["mhc_gemm"] == "bf16" and doc["config"]["moe_experts"] == "loop"
    assert [2, "mhc_operand", "view_bf16_residual"] in doc["config"]["layer_overrides"]


def test_wrong_configuration_prints_figures_and_exits_1():
    env = dict(os.environ, DSV4_TEST_BREAK="attention")
    out = _autoopt("measure", "--concurrency", "1", "--steps", "6", "--json", env=env)
    assert out.returncode == 1, out.stderr[-3000:]
    doc = json.loads(out.stdout)
    assert doc["status"] == "wrong" and doc["correctness"]["verdict"] == "wrong"
    assert doc["tok_per_s"]["1"]["median"] > 0


def test_excluded_value_is_a_failed_measurement_exit_1():
    out = _autoopt("measure", "--set", "cuda_graphs=on", "--device", "cpu", "--json")
    assert out.returncode == 1, out.stderr[-3000:]
    doc = json.loads(out.stdout)
    assert doc["status"] == "failed" and doc["failure"]["kind"] == "excluded"
    assert "CUDA" in doc["failure"]["reason"]


runner = CliRunner()


@pytest.mark.parametrize("args, must_say", [
    (["--set", "no_such_knob=1"], "unknown knob 'no_such_knob'"),
    (["--set", "mhc_gemm=fp64"], "expected one of: fp32, bf16"),
    (["--set", "mhc_gemm"], "expected KNOB=VALUE or KNOB@LAYER=VALUE"),
    (["--set", "glue@2=compile"], "allows scopes global"),
    (["--set", "mhc_gemm@17=bf16"], "expected an index 0..3"),
    (["--concurrency", "1,x"], "positive integers"),
    (["--concurrency", "0"], "positive integers"),
    (["--concurrency", "1,,4"], "--concurrency '1,,4': expected positive integers"),
    (["--shape", "hidden=-5"], "--shape: shape field 'hidden' needs an integer >= 1, got '-5'"),
    (["--shape", "hidden=0"], "--shape: shape field 'hidden' needs an integer >= 1, got '0'"),
    (["--timeout", "0"], "--timeout 0: expected a positive number of seconds"),
    (["--device", "tpu"], "expected cpu, cuda, cuda:N or auto"),
    (["--preset", "huge"], "expected one of tiny"),
    (["--shape", "widthh=3"], "unknown shape field 'widthh'"),
    (["--shape", "hidden"], "expected KEY=VALUE"),
    (["--config", "/nonexistent/c.yaml"], "cannot read config file"),
])
def test_bad_input_is_one_line_and_exit_2(args, must_say):
    result = runner.invoke(app, ["measure", *args])
    assert result.exit_code == 2, (result.exit_code, result.output)
    err = result.stderr if hasattr(result, "stderr") else result.output
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    assert must_say in lines[0], lines[0]


def test_help_documents_exit_codes_and_options():
    result = runner.invoke(app, ["measure", "--help"], env={"COLUMNS": "200"})
    assert result.exit_code == 0
    text = " ".join(result.output.split())
    for fragment in ("Exit codes", "0 = measured and correct", "1 = the configuration is wrong",
                     "2 = bad input", "--set", "--shape", "--profile", "--json", "--concurrency"):
        assert fragment in text, fragment
