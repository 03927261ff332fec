"""Every knob value runs its own code path on `tiny` and passes the correctness guard. CPU values
here; CUDA-only values (Triton attention tiles, fp8 indexer, CUDA graphs, flash-slice) in the tests
marked gpu, run on an H200 by the lead."""
from __future__ import annotations

import pytest
import torch

import dsv4
from dsv4.guard import check
from dsv4.knobs import KNOBS
from dsv4.session import DecodeSession

HAS_CUDA = torch.cuda.is_available()
needs_cuda = pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA GPU")
GPU = "cuda"


pytestmark = pytest.mark.usefixtures("one_torch_thread")  # conftest: one torch thread


def _cpu_values():
    """(knob, value) for every value runnable on a CPU; tile knobs are inert there (one value)."""
    out = []
    for knob in KNOBS:
        for value in knob.values:
            if knob.requires.get(value) or knob.name == "glue" and value == "compile":
                continue
            if knob.name == "step_compile" and value != "off":  # tests/test_step_compile.py:
                continue  # it refuses the baseline's expert loop, and one compile is ~1.5 min here
            out.append((knob.name, value))
    return out


@pytest.mark.parametrize("knob,value", _cpu_values())
def test_each_cpu_value_passes_guard(knob, value):
    cfg = dsv4.preset("tiny", **{knob: value})
    r = check(cfg, batch=2, steps=3)
    assert r["verdict"] == "ok", r
    assert r["steps"] == 3 and 0 <= r["token_agreement"] <= 1


def test_all_bf16_knobs_together_pass_guard():
    cfg = dsv4.preset("tiny", mhc_gemm="bf16", mhc_operand="view_bf16_residual",
                      hc_fn_weight="cached", indexer_gemm="bf16", attention="mma",
                      moe_experts="grouped")
    r = check(cfg, batch=4, steps=5)  # 5 steps: crosses a c4 compression boundary
    assert r["verdict"] == "ok", r
    assert r["tolerance"]["class"] == "bf16"


def test_per_layer_overrides_pass_guard():
    cfg = dsv4.preset("tiny", layer_overrides=((2, "attention", "mma"), (3, "mhc_gemm", "bf16"),
                                               (1, "moe_experts", "grouped")))
    r = check(cfg, batch=2, steps=3)
    assert r["verdict"] == "ok", r
    assert r["tolerance"]["class"] == "bf16"
    assert "L2" in r["what_ran"]["attention[c4]"] or "mma" in r["what_ran"]["attention[c4]"]


@pytest.mark.slow
def test_glue_compile_passes_guard_and_says_so():
    cfg = dsv4.preset("tiny", glue="compile")
    r = check(cfg, batch=2, steps=3)
    assert r["verdict"] == "ok", r
    assert "torch.compile" in r["what_ran"]["glue"]


@pytest.mark.slow
def test_glue_compile_reconfigure_is_recompile_once():
    sess = DecodeSession(dsv4.preset("tiny"), batch=2)
    assert sess.reconfigure(dsv4.preset("tiny", glue="compile")) == "recompile"
    assert sess.reconfigure(dsv4.preset("tiny")) == "none"
    assert sess.reconfigure(dsv4.preset("tiny", glue="compile")) == "none"  # already compiled


# ---- GPU (run on an H200) ----

def _gpu_values():
    out = []
    for knob in KNOBS:
        for value in knob.values:
            if knob.name == "cuda_graphs" and value == "on":
                continue  # needs moe grouped: its own test
            out.append((knob.name, value))
    return out


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize("knob,value", _gpu_values())
def test_each_gpu_value_passes_guard(knob, value):
    from dsv4.device import capabilities
    if knob == "indexer_gemm" and value == "fp8" and not capabilities(GPU)["fp8"]:
        pytest.skip("needs FP8 tensor cores (sm_89+)")
    cfg = dsv4.preset("tiny", **{knob: value})
    if knob.startswith("attn_"):
        cfg = cfg.with_knobs(attention="mma")
    if knob == "step_compile" and value != "off":  # the loop's host-read counts cannot be compiled
        cfg = cfg.with_knobs(moe_experts="grouped")
    r = check(cfg, device=GPU, batch=2, steps=3)
    assert r["verdict"] == "ok", r
    if knob.startswith("attn_"):
        assert f"{knob.removeprefix('attn_')}={value}" in r["what_ran"]["attention[c4]"]
    if knob == "step_compile":
        assert r["what_ran"]["step_compile"].startswith(value if value == "off" else "torch.compile")


@pytest.mark.gpu
@needs_cuda
def test_cuda_graphs_on_matches_eager_and_replays():
    cfg = dsv4.preset("tiny", moe_experts="grouped")
    eager = DecodeSession(cfg, device=GPU, batch=4)
    graph = DecodeSession(cfg.with_knobs(cuda_graphs="on"), device=GPU, batch=4)
    assert "on" in graph.what_ran()["cuda_graphs"]
    for _ in range(6):
        te, tg = eager.step(), graph.step()
        assert torch.equal(te, tg)
        torch.testing.assert_close(graph.last_logits, eager.last_logits, atol=1e-3, rtol=1e-3)
    assert int(graph.cache.pos) == cfg.context_len + 6  # the graph advanced the device position
    graph.reset()
    eager.reset()
    assert torch.equal(graph.step(), eager.step())
    r = check(cfg.with_knobs(cuda_graphs="on"), device=GPU, batch=2, steps=3)
    assert r["verdict"] == "ok", r


@pytest.mark.gpu
@needs_cuda
def test_cuda_graphs_with_loop_moe_says_why():
    with pytest.raises(RuntimeError, match="moe_experts=loop"):
        DecodeSession(dsv4.preset("tiny", cuda_graphs="on"), device=GPU)


@pytest.mark.gpu
@needs_cuda
def test_cuda_reconfigure_classes():
    sess = DecodeSession(dsv4.preset("tiny", moe_experts="grouped"), device=GPU, batch=2)
    assert sess.reconfigure(dsv4.preset("tiny", moe_experts="grouped", attention="mma")) == "recompile"
    assert sess.reconfigure(dsv4.preset("tiny", moe_experts="grouped")) == "none"  # JIT cached
    assert sess.reconfigure(dsv4.preset("tiny", moe_experts="grouped",
                                        cuda_graphs="on")) == "rebuild"


@pytest.mark.gpu
@needs_cuda
def test_flash_slice_all_fast_variants_pass_guard():
    knobs = dict(mhc_gemm="bf16", mhc_operand="view_bf16_residual", hc_fn_weight="cached",
                 indexer_gemm="bf16", attention="mma", moe_experts="grouped", cuda_graphs="on")
    cfg = dsv4.preset("flash-slice", context_len=1024, **knobs)
    r = check(cfg, device=GPU, batch=4, steps=3)
    assert r["verdict"] == "ok", r
    assert "triton mma" in r["what_ran"]["attention[c4]"]
    assert "_grouped_mm" in r["what_ran"]["moe[c4]"]


@pytest.mark.gpu
@needs_cuda
def test_flash_slice_fp8_indexer_passes_guard():
    from dsv4.device import capabilities
    if not capabilities(GPU)["fp8"]:
        pytest.skip("needs FP8 tensor cores (sm_89+)")
    cfg = dsv4.preset("flash-slice", context_len=4096, indexer_gemm="fp8", attention="mma",
                      moe_experts="grouped")
    r = check(cfg, device=GPU, batch=2, steps=3)
    assert r["verdict"] == "ok", r
    assert "_scaled_mm" in r["what_ran"]["indexer[c4]"]
