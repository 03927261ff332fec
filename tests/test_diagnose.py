"""Bucket diffs and verdicts: the case study's figures, each kind of verdict, and the before/after
pair of real traces (the lead's H200 decode-path traces when committed, else the CPU mHC pair)."""
from __future__ import annotations

from pathlib import Path

import pytest

from autoopt.profile.diff import compare, fmt_ms
from autoopt.profile.trace import profile_trace
from test_profile_trace import case_study_trace

FIX = Path(__file__).parent / "fixtures" / "traces"
H200_PAIR = (FIX / "h200_before.json.gz", FIX / "h200_after.json.gz")
CPU_PAIR = (FIX / "cpu_mhc_fp32.json.gz", FIX / "cpu_mhc_bf16_cast.json.gz")

# The rest of the step, unchanged by the flip, so the totals are realistic (SIMT GEMM ~19%).
REST = {"attention": 900.0, "elementwise": 2000.0, "reduce": 500.0, "norm": 300.0, "moe": 450.0}
BEFORE = {"gemm_simt": 1004.0, "gemm_tensorop": 0.0, "copy_cast": 800.0, **REST}
AFTER = {"gemm_simt": 0.0, "gemm_tensorop": 499.0, "copy_cast": 1110.0, **REST}


def test_case_study_casts_ate_61_percent():
    d = compare(BEFORE, AFTER)
    assert d.kind == "eaten"
    assert d.gain_group == "GEMM" and d.gain_ms == pytest.approx(505.0)
    assert d.eaten_ms == pytest.approx(310.0) and d.eaten_frac == pytest.approx(310 / 505)
    assert d.delta_ms["gemm_simt"] == -1004.0 and d.delta_ms["gemm_tensorop"] == 499.0
    assert d.deltas["gemm_simt"].delta_pct == pytest.approx(-100.0)
    assert d.deltas["gemm_tensorop"].delta_pct is None  # new bucket: no relative change
    assert d.net_ms == pytest.approx(-195.0)
    assert d.verdict == ("GEMM -505 ms (gemm_simt -1004, gemm_tensorop +499), copy_cast +310 ms: "
                         "casts ate 61% of the GEMM gain; net -195 ms (-3.3%)")


def test_case_study_from_synthetic_traces(tmp_path):
    """The same story read from traces, through the parser: 61% again."""
    a = profile_trace(case_study_trace(after=False).write(tmp_path / "before.json.gz"))
    b = profile_trace(case_study_trace(after=True).write(tmp_path / "after.json.gz"))
    d = compare(a.buckets_ms, b.buckets_ms)
    assert d.kind == "eaten" and "casts ate 61% of the GEMM gain" in d.verdict
    assert d.delta_ms["copy_cast"] == pytest.approx(310.0)


def test_small_rises_are_not_eaten():
    after = dict(AFTER, copy_cast=800.0 + 40.0)  # +40 ms against a 505 ms gain: 8%
    d = compare(BEFORE, after, noise_frac=0.005)
    assert d.kind == "kept" and "nothing eaten" in d.verdict and "8% of the GEMM gain" in d.verdict


def test_rises_above_the_gain_ate_all_of_it():
    d = compare(BEFORE, dict(AFTER, copy_cast=1400.0))
    assert d.kind == "eaten" and "ate all of the GEMM gain (119%)" in d.verdict
    assert d.net_ms == pytest.approx(95.0)


def test_several_risers_are_named_together():
    d = compare(BEFORE, dict(AFTER, elementwise=2150.0))
    assert d.verdict.startswith("GEMM -505 ms")
    assert "copy_cast +310 ms, elementwise +150 ms: casts and elementwise ops ate 91%" in d.verdict


def test_many_risers_are_summed_and_the_rest_counted():
    after = dict(AFTER, elementwise=2150.0, attention=1000.0, reduce=580.0, norm=370.0)
    d = compare(BEFORE, after)  # every rise is above the 1% noise floor (~61 ms)
    assert d.eaten_ms == pytest.approx(310.0 + 150.0 + 100.0 + 80.0 + 70.0)
    assert ("copy_cast +310 ms, elementwise +150 ms, attention +100 ms and 2 more: casts, "
            "elementwise ops, attention and others ate all of the GEMM gain (141%)") in d.verdict


def test_plain_gain_plain_regression_unchanged_empty():
    gain = compare(BEFORE, dict(BEFORE, attention=600.0))
    assert gain.kind == "gain" and gain.verdict.startswith("faster: attention -300 ms")
    slower = compare(BEFORE, dict(BEFORE, copy_cast=1100.0))
    assert slower.kind == "regression" and slower.verdict.startswith("slower: copy_cast +300 ms")
    same = compare(BEFORE, dict(BEFORE, norm=301.0))
    assert same.kind == "unchanged" and same.verdict.startswith("unchanged")
    empty = compare({}, {})
    assert empty.kind == "empty" and empty.verdict is None


def test_totals_and_unknown_buckets():
    d = compare({"gemm_simt": 10.0, "custom": 1.0}, {"gemm_tensorop": 4.0, "custom": 3.0},
                total_a_ms=20.0, total_b_ms=16.0)
    assert list(d.deltas) == ["gemm_tensorop", "gemm_simt", "custom"]  # known buckets first
    assert (d.total_a_ms, d.net_ms, d.net_pct) == (20.0, -4.0, -20.0)
    assert "custom +2.00 ms: custom ate 33% of the GEMM gain" in d.verdict


def test_reverse_flip_reads_as_the_gemm_eating_a_copy_gain():
    d = compare(AFTER, BEFORE)
    assert d.gain_group == "copy_cast" and "GEMMs ate all of the copy_cast gain" in d.verdict


def test_fmt_ms():
    assert [fmt_ms(v) for v in (-1004.0, 310.0, 31.04, -3.104, 0.3104)] == \
        ["-1004", "+310", "+31.0", "-3.10", "+0.310"]
    assert fmt_ms(-5.0, sign=False) == "5.00"


def test_h200_mhc_traces_tell_the_case_study():
    """Real H200 captures of the mHC GEMM model: the flip's casts eat about half the GEMM gain;
    reading the bf16 residual instead of round-tripping it leaves far less eaten."""
    fp32, cast, view = (profile_trace(FIX / f"h200_mhc_{v}.json.gz").buckets_ms
                        for v in ("fp32", "bf16_cast", "bf16_view"))
    flip, fix = compare(fp32, cast), compare(fp32, view)
    assert flip.kind == fix.kind == "eaten" and flip.gain_group == fix.gain_group == "GEMM"
    assert 0.3 < flip.eaten_frac < 0.7 and fix.eaten_frac < flip.eaten_frac / 2
    assert "casts ate 49% of the GEMM gain" in flip.verdict


def test_before_after_verdict_on_real_traces():
    """The lead's H200 before/after traces when they are committed; until then the CPU mHC pair.
    Which pair ran is asserted, never silently swapped."""
    if all(p.exists() for p in H200_PAIR):
        pair, source = H200_PAIR, "gpu"
    else:
        assert not any(p.exists() for p in H200_PAIR), "commit both h200_before and h200_after"
        pair, source = CPU_PAIR, "cpu"
    a, b = (profile_trace(p) for p in pair)
    assert a.source == b.source == source
    # The flip: SIMT GEMM time falls, tensor-core GEMM time appears, casts rise to feed it.
    assert b.buckets_ms["gemm_simt"] < a.buckets_ms["gemm_simt"]
    assert b.buckets_ms["gemm_tensorop"] > a.buckets_ms["gemm_tensorop"]
    d = compare(a.buckets_ms, b.buckets_ms)
    assert d.delta_ms["copy_cast"] > 0
    assert d.kind == "eaten" and d.gain_group == "GEMM", d.verdict
    assert "casts" in d.verdict and "of the GEMM gain" in d.verdict


def test_h200_full_decode_step_traces():
    """Real H200 traces of the whole flash-slice decode step (C=16, eager; benchmarks/h200_decode.py
    --traces): the mHC flip to bf16 with the round-trip cast does what the case study saw at kernel
    level (SIMT GEMM time falls, tensor-core GEMM and copy time rise), but on the H200 the mHC GEMM is
    ~2% of the GPU time of the step, so nothing moves by more than 1%: the honest verdict is
    'unchanged'. The eager step is launch-bound (GPU busy ~7% of the wall time)."""
    a, b = (profile_trace(FIX / f"h200_decode_{v}.json.gz")
            for v in ("start", "mhc_bf16_cast"))
    assert a.source == b.source == "gpu"
    assert b.buckets_ms["gemm_simt"] < a.buckets_ms["gemm_simt"]
    assert b.buckets_ms["gemm_tensorop"] > a.buckets_ms["gemm_tensorop"]
    assert b.buckets_ms["copy_cast"] > a.buckets_ms["copy_cast"]
    assert a.coverage < 0.2 and a.kernel_count > 5000
    d = compare(a.buckets_ms, b.buckets_ms)
    assert d.kind == "unchanged", d.verdict


def test_cpu_decode_step_traces_tell_the_case_study():
    """Real CPU traces of the dsv4 decode step (tests/fixtures/traces/make_cpu_decode_traces.py:
    tiny preset at hidden=2048, batch 64): flipping the mHC GEMM to bf16 with the round-trip cast
    makes the SIMT GEMM time fall (AMX-bf16 on the capturing Xeon) while copies grow, and the diff says
    the casts ate part of the gain. In this capture the fp32 path's elementwise ops (aten::mul/add)
    also cost more, so the falling group the verdict names can be elementwise rather than GEMM."""
    a, b = (profile_trace(FIX / f"cpu_decode_{v}.json.gz") for v in ("fp32", "bf16_cast"))
    assert a.source == b.source == "cpu" and a.coverage > 0.8 and b.coverage > 0.8
    assert b.buckets_ms["gemm_simt"] < a.buckets_ms["gemm_simt"]
    d = compare(a.buckets_ms, b.buckets_ms)
    assert d.delta_ms["copy_cast"] > 0
    assert d.kind == "eaten", d.verdict
    assert "casts ate" in d.verdict and "gemm_simt" in d.verdict, d.verdict
