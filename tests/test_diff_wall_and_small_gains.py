"""The verdict reads the step's wall time and names an eaten gain in a small bucket (issue 12, 9)."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from autoopt.profile.diff import compare

ROOT = Path(__file__).resolve().parents[1]
TRACES = ROOT / "tests" / "fixtures" / "traces"


def test_wall_rising_while_kernels_fall_opens_the_verdict():
    d = compare({"gemm_simt": 0.19, "copy_cast": 0.09}, {"gemm_tensorop": 0.03, "copy_cast": 0.16},
                wall_a_ms=0.649, wall_b_ms=0.893)
    assert d.net_ms < 0 and d.wall_rose
    assert d.verdict.startswith("slower at the wall: the step rose +0.244 ms while its kernels fell")
    assert "wall per step 0.649 -> 0.893 ms (+38%)" in d.verdict


def test_wall_falling_with_the_kernels_is_stated_not_flagged():
    d = compare({"gemm_simt": 1.0}, {"gemm_tensorop": 0.5}, wall_a_ms=2.0, wall_b_ms=1.5)
    assert not d.wall_rose and d.kind == "gain"
    assert d.verdict.endswith("wall per step 2.00 -> 1.50 ms (-25%)")
    assert compare({"gemm_simt": 1.0}, {"gemm_tensorop": 0.5}).wall_a_ms is None


def test_small_gemm_gain_eaten_by_copies_is_named_however_small_the_net():
    # GEMM 1.0 -> 0.63 (-37 %), copies +40 % of that gain, in a 100 ms trace: net -0.22 %
    a = {"gemm_simt": 1.0, "copy_cast": 0.5, "attention": 98.5}
    b = {"gemm_tensorop": 0.63, "copy_cast": 0.5 + 0.4 * 0.37, "attention": 98.5}
    d = compare(a, b)
    assert abs(d.net_pct) < 1
    assert d.kind == "eaten" and d.gain_group == "GEMM", d.verdict
    assert "casts ate 40% of the GEMM gain" in d.verdict


def test_below_the_thresholds_it_stays_unchanged():
    a = {"gemm_simt": 1.0, "copy_cast": 0.5, "attention": 98.5}
    small_fall = {"gemm_simt": 0.85, "copy_cast": 0.5 + 0.4 * 0.15, "attention": 98.5}  # -15 %
    assert compare(a, small_fall).kind == "unchanged"
    few_copies = {"gemm_simt": 0.63, "copy_cast": 0.5 + 0.1 * 0.37, "attention": 98.5}  # 10 %
    assert compare(a, few_copies).kind == "gain"


def test_profile_cli_on_the_h200_fixtures_reports_the_wall():
    r = subprocess.run([sys.executable, "-m", "autoopt.cli", "profile",
                        str(TRACES / "h200_mhc_fp32.json.gz"), "--vs",
                        str(TRACES / "h200_mhc_bf16_cast.json.gz"), "--json"],
                       capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["wall_rose_while_kernels_fell"] is True
    a, b = doc["wall_per_step_ms"]
    assert round(a, 3) == 0.649 and round(b, 3) == 0.893
    assert doc["verdict"].startswith("slower at the wall") and "casts ate" in doc["verdict"]
