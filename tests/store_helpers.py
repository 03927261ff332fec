"""Synthetic-but-plausible trial data for the store, history/show/diff/best and export tests.

The study mirrors the case study: an fp32 SIMT GEMM baseline (~62 tok/s at C=16), the bf16 flip whose
casts ate the gain (+1.8 %, inside the noise), the bf16 view fix (+12 %, outside the noise), an OOM
and a trial with wrong numerics. Real Measurement objects built from per-step timings.
"""
from __future__ import annotations

from typing import Any

from autoopt.measurement import Measurement, throughput_from_step_times
from autoopt.trial import CostEstimate, Decision, Diagnosis, TrialResult

STUDY = "dsv4-tiny"
ENV = {"hostname": "gpu-box", "cpu": "Xeon", "cpu_count": 64, "device": "cuda", "gpu_name": "NVIDIA H200",
       "gpu_capability": "9.0", "gpu_arch": "sm_90", "gpu_count": 1, "driver": "570.86", "cuda": "12.8",
       "torch": "2.11.0", "triton": "3.5.0", "python": "3.11.7", "autoopt_version": "0.1.0"}
BASE_BUCKETS = {"gemm_simt": 1004.0, "attention": 420.0, "moe": 610.0, "copy_cast": 190.0,
                "elementwise": 760.0, "reduce": 130.0, "norm": 90.0}
CAST_BUCKETS = {**{k: v for k, v in BASE_BUCKETS.items() if k != "gemm_simt"}, "gemm_tensorop": 499.0,
                "copy_cast": 500.0, "elementwise": 772.0}
VIEW_BUCKETS = {**CAST_BUCKETS, "copy_cast": 205.0, "elementwise": 765.0}


def steps(tok_per_s: float, c: int, n: int = 16, spread: float = 0.01) -> list[float]:
    """n per-step seconds around c / tok_per_s, evenly spread +-spread (deterministic)."""
    mid = c / tok_per_s
    return [mid * (1 + spread * (2 * i / (n - 1) - 1)) for i in range(n)]


def measurement(params: dict[str, Any], tok: dict[int, float], *, spread: float = 0.01,
                buckets: dict[str, float] | None = None, env: dict[str, Any] | None = None,
                status: str = "ok", correctness: dict[str, Any] | None = None) -> Measurement:
    return Measurement(
        status=status, config=dict(params),
        tok_per_s={str(c): throughput_from_step_times(steps(v, c, spread=spread), c) for c, v in tok.items()},
        mbu={str(c): round(0.2 + 0.001 * c, 3) for c in tok},
        buckets_ms=dict(buckets or {}), bucket_coverage=0.97 if buckets else None,
        kernel_count=1843 if buckets else None,
        correctness=correctness or {"verdict": "ok" if status == "ok" else "wrong",
                                    "logits_rel_err": 3e-3, "token_agreement": 1.0, "steps": 32},
        costs_s={"restart": 95.0, "build": 12.0, "compile": 40.0, "warmup": 8.0, "measure": 30.0,
                 "total": 185.0},
        peak_memory_bytes=71_000_000_000,
        what_ran={"mhc_gemm": "cublas/bf16" if params.get("mhc_gemm") == "bf16" else "cutlass_simt/fp32"},
        environment=dict(env or ENV))


def result_at_16(m: Measurement, **fields: Any) -> TrialResult:
    """What the loop makes of `m` for an objective of tok/s at C=16 (the store writes it as given)."""
    tp = m.tok_per_s.get("16") if m.ok else None
    costs = m.costs_s
    return TrialResult(state=m.status, objective=tp.median if tp else None,
                       objective_ci=(tp.ci_low, tp.ci_high) if tp else None,
                       objective_name="tok_per_s@16", objective_text="tok/s at C=16",
                       cost_s=costs.get("total", 0.0),
                       transition_s=sum(costs.get(k, 0.0) for k in ("restart", "build", "compile")),
                       **fields)


def run_trial(store: Any, run_id: int, params: dict[str, Any], m: Measurement, *, source: str,
              reason: str, study: str = STUDY, expected_gain: float | None = None, **fields: Any) -> Any:
    d = Decision(params=dict(params), source=source, reason=reason, expected_gain=expected_gain,
                 expected_gain_sd=0.02 if expected_gain is not None else None,
                 expected_cost=CostEstimate(transition_s=150.0, measure_s=40.0, restart_class="restart"))
    h = store.begin_trial(run_id, study, params, dict(params), d,
                          distributions={"mhc_gemm": ["fp32", "bf16"],
                                         "mhc_operand": ["cast", "view_bf16_residual"]})
    return store.finish_trial(h, m, result_at_16(m, **fields))


def build_case_study(store: Any, study: str = STUDY, *, significant_winner: bool = True) -> int:
    """Trials 0..4 as in the module docstring; returns the run id."""
    run_id = store.start_run(study, "autoopt run --budget 2h", "dsv4-gemm", "ab" * 32, "builtin", "tiny",
                             7, {"objective": "tok_per_s@16", "concurrency": [1, 16, 64], "n_layers": 4,
                                 "per_layer_knobs": ["mhc_operand"]})
    base = {"mhc_gemm": "fp32", "mhc_operand": "cast"}
    cast = {"mhc_gemm": "bf16", "mhc_operand": "cast"}
    view = {"mhc_gemm": "bf16", "mhc_operand": "view_bf16_residual"}
    run_trial(store, run_id, base, measurement(base, {1: 33.0, 16: 61.98, 64: 61.98}, buckets=BASE_BUCKETS),
              source="baseline", reason="trial 0: the starting point")
    run_trial(store, run_id, cast, measurement(cast, {1: 33.4, 16: 63.07, 64: 63.07}, spread=0.03,
                                               buckets=CAST_BUCKETS),
              source="profile:gemm_simt", reason="GEMM is 19% of GPU time", expected_gain=0.15,
              diagnosis=Diagnosis("GEMM -505 ms, casts +310 ms: the casts ate 61% of the gain", against=0,
                                  actual_gain=0.018))
    winner = 69.5 if significant_winner else 62.3
    run_trial(store, run_id, view, measurement(view, {1: 35.0, 16: winner, 64: 70.1}, buckets=VIEW_BUCKETS),
              source="neighbour", reason="use the bf16 view instead of the round trip", expected_gain=0.08)
    oom = dict(view, mhc_operand="cast")
    m = Measurement.failed(oom, "oom", "CUDA out of memory at batch 64",
                           "Traceback (most recent call last):\n  ...\ntorch.OutOfMemoryError: CUDA out of memory",
                           environment=dict(ENV))
    h = store.begin_trial(run_id, study, {"mhc_gemm": "bf16", "mhc_operand": "cast"}, oom,
                          Decision(oom, "sampler:tpe", "explore"))
    store.finish_trial(h, m, result_at_16(m))
    wrong = measurement(base, {16: 80.0}, status="wrong",
                        correctness={"verdict": "wrong", "logits_rel_err": 0.4, "token_agreement": 0.2})
    run_trial(store, run_id, base, wrong, source="sampler:tpe", reason="explore")
    store.finish_run(run_id, "finished", "budget spent")
    return run_id
