"""BuiltinTarget: declarations from dsv4, transitions from restart classes and the worker's compile
history, and evaluate() through a real worker, where every kind of trial failure is data."""
from __future__ import annotations

import os

import pytest

import dsv4
from autoopt.errors import UserError
from autoopt.targets.base import EvalRequest
from autoopt.targets.builtin.target import BuiltinTarget, parse_shape
from autoopt.targets.builtin.client import WorkerClient, WorkerFailure
from conftest import HAS_CUDA

DEVICE = "cuda" if HAS_CUDA else "cpu"


def _req(config=None, **kw) -> EvalRequest:
    kw.setdefault("concurrency", (1, 2))
    kw.setdefault("min_samples", 6)
    kw.setdefault("max_samples", 8)
    kw.setdefault("time_limit_s", 240)
    return EvalRequest(config=config or {}, **kw)


@pytest.fixture(scope="module")
def target():
    t = BuiltinTarget("tiny", DEVICE)
    yield t
    t.close()


def test_declarations_come_from_dsv4_knobs():
    t = BuiltinTarget("tiny", "cpu")
    specs = {s.name: s for s in t.knob_specs()}
    assert list(specs) == [k.name for k in dsv4.KNOBS]
    mhc = specs["mhc_operand"]
    assert mhc.values == ("cast_from_fp32", "view_bf16_residual") and mhc.restart_class == "none"
    assert specs["indexer_gemm"].layer_classes == ("c4",)
    assert t.baseline() == dsv4.baseline_knobs()
    assert t.default_concurrency() == (1, 4)
    assert BuiltinTarget("tiny", "cuda").default_concurrency() == (1, 16, 64)


def test_layers_follow_the_preset_and_shape_overrides():
    assert BuiltinTarget("tiny").layers() == [dsv4.preset("tiny").layer_class(i) for i in range(4)]
    six = BuiltinTarget("tiny", shape={"n_layers": 6}).layers()
    assert six == ["window", "c128", "c4", "c128", "c4", "c128"]


def test_bad_inputs_are_user_errors():
    with pytest.raises(UserError, match="unknown preset"):
        BuiltinTarget("enormous")
    with pytest.raises(UserError, match="unknown shape field"):
        parse_shape({"mhc_gemm": "bf16"})  # a knob is not a shape
    t = BuiltinTarget("tiny")
    with pytest.raises(UserError, match="unknown knob"):
        t.normalize({"no_such": 1})
    with pytest.raises(UserError, match="expected one of"):
        t.normalize({"attention": "flash"})
    with pytest.raises(UserError, match="layers 0..3"):
        t.normalize({"layer_overrides": [[9, "mhc_gemm", "bf16"]]})


def test_excluded_values_on_this_device_have_reasons(target):
    ex = target.excluded()
    if HAS_CUDA:
        assert ("attn_block_kv", 32) not in ex
    else:
        assert ex[("attn_block_kv", 32)] == "needs a CUDA GPU"
        assert ("indexer_gemm", "fp8") in ex and ("cuda_graphs", "on") in ex
        m = target.evaluate(_req({"cuda_graphs": "on"}))
        assert m.status == "failed" and m.failure.kind == "excluded" and "CUDA" in m.failure.reason


def test_evaluate_baseline_and_transitions(target):
    # nothing built yet: a fresh worker (describe() started it for excluded()) still has to build
    assert target.transition(target.baseline()).restart_class in ("restart", "rebuild")
    assert BuiltinTarget("tiny", DEVICE).transition({}).restart_class == "restart"  # no worker at all
    m = target.evaluate(_req(target.baseline()))
    assert m.status == "ok", (m.failure, m.correctness)
    assert set(m.tok_per_s) == {"1", "2"}
    for tp in m.tok_per_s.values():
        assert tp.ci_low <= tp.median <= tp.ci_high and 6 <= tp.n <= 8
    assert m.correctness["verdict"] == "ok"
    assert m.environment["hostname"] and m.environment["mem_bandwidth_bytes_per_s"] > 0
    assert set(m.mbu) == {"1", "2"} and all(0 < v < 1.5 for v in m.mbu.values())
    assert m.peak_memory_bytes and m.peak_memory_bytes > 0
    for key in ("restart", "build", "compile", "warmup", "measure", "guard", "total"):
        assert key in m.costs_s
    assert m.costs_s["total"] >= m.costs_s["measure"] > 0
    assert m.what_ran["measure.peak_memory"] and m.what_ran["model"] == "preset tiny"

    # now the transitions are relative to the live worker
    same = target.transition(target.baseline())
    assert same.restart_class == "none" and same.changed_knobs == () and same.known_s is None
    none_switch = target.transition({"mhc_gemm": "bf16", "mhc_operand": "view_bf16_residual"})
    assert none_switch.restart_class == "none" and set(none_switch.changed_knobs) == {"mhc_gemm", "mhc_operand"}
    recompile = target.transition({"attention": "mma"})
    assert recompile.restart_class == "recompile" and not recompile.cached
    rebuild = target.transition({"hc_fn_weight": "cached", "attention": "mma"})
    assert rebuild.restart_class == "rebuild"
    per_layer = target.transition({"layer_overrides": [[2, "indexer_gemm", "bf16"]]})
    assert per_layer.restart_class == "none" and per_layer.changed_knobs == ("indexer_gemm",)

    started = target.workers_started
    m2 = target.evaluate(_req({"attention": "mma"}))
    assert m2.status == "ok", (m2.failure, m2.correctness)
    # what the session actually did: a Triton JIT on a GPU; on a CPU the mma variant is batched torch,
    # nothing to compile, and the worker reports that rather than the knob's nominal class
    assert m2.what_ran["measure.apply"] == ("C=1: recompile, C=2: recompile" if HAS_CUDA
                                            else "C=1: none, C=2: none")
    assert "mma" in m2.what_ran["attention[c4]"]
    assert target.workers_started == started  # same worker, reconfigured in place
    back = target.transition(target.baseline())
    assert back.restart_class == "recompile" and back.cached and back.known_s is None


def test_model_shape_change_needs_a_new_worker():
    with WorkerClient("cpu") as w:
        base = {"preset": "tiny", "config": {}, "concurrency": [1], "min_samples": 6, "max_samples": 6,
                "guard": False}
        doc = w.request("measure", timeout_s=240, **base)
        assert doc["status"] == "ok" and doc["what_ran"]["guard"].startswith("skipped")
        with pytest.raises(WorkerFailure) as info:
            w.request("measure", timeout_s=240, **base, shape={"hidden": 128})
        assert info.value.kind == "restart_required" and w.alive


def _hooked_target(**kw) -> BuiltinTarget:
    return BuiltinTarget("tiny", DEVICE, worker_env=dict(os.environ, AUTOOPT_TEST_HOOKS="1"), **kw)


@pytest.mark.parametrize("fault, kind", [("segfault", "crash"), ("exception", "exception"),
                                         ("oom", "oom")])
def test_trial_failures_are_measurements_and_the_next_trial_runs(fault, kind):
    t = _hooked_target()
    try:
        m = t.evaluate(_req(extra={"fault": fault}))
        assert m.status == "failed" and m.failure.kind == kind, m.failure
        assert m.failure.stderr_tail  # the child's own words
        assert m.config["attention"] == "per_head"  # the normalized config is kept with the failure
        if kind != "crash":  # the worker lives on, but what it holds is no longer trusted
            tr = t.transition(t.baseline())
            assert tr.restart_class == "rebuild" and not tr.cached  # it never built: caches cold
        ok = t.evaluate(_req(concurrency=(1,)))
        assert ok.status == "ok", ok.failure
        if kind != "crash":  # after a build, a survived failure leaves warm caches behind
            assert t.evaluate(_req(extra={"fault": fault})).status == "failed"
            assert t.transition(t.baseline()).cached
        if kind == "crash":
            assert t.workers_started == 2 and ok.costs_s["restart"] > 0
        else:
            assert t.workers_started == 1  # the worker survived and was reused
    finally:
        t.close()


def test_hang_becomes_a_failed_trial_within_the_time_limit():
    t = _hooked_target()
    try:
        m = t.evaluate(_req(extra={"fault": "hang"}, time_limit_s=3))
        assert m.status == "failed" and m.failure.kind == "hang"
        assert m.costs_s["total"] < 60
        assert t.transition(t.baseline()).restart_class == "restart"  # the hung worker is gone
    finally:
        t.close()


def test_wrong_numerics_are_status_wrong_with_figures():
    t = BuiltinTarget("tiny", DEVICE, worker_env=dict(os.environ, DSV4_TEST_BREAK="attention"))
    try:
        m = t.evaluate(_req(concurrency=(1,)))
    finally:
        t.close()
    assert m.status == "wrong" and m.correctness["verdict"] == "wrong"
    assert m.tok_per_s["1"].median > 0  # figures are still there to look at
