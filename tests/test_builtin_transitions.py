"""The builtin target's transition facts (autoopt.targets.builtin.transitions): what a switch in its
live worker redoes. On the live H200, runtime switches under step_compile=inductor took 3.5-16 s
(Dynamo re-traced the step) while the target called them free, and every switch under CUDA graphs
captured the graph again (benchmarks/results/h200_live_10m_run3)."""
from __future__ import annotations

import pytest

from autoopt.targets.builtin.target import BuiltinTarget
from autoopt.targets.builtin.transitions import WorkerCaches, transition_facts


@pytest.fixture(scope="module")
def norm():
    target = BuiltinTarget("flash-slice", "cuda")  # no worker is started: normalize is declarations only
    return lambda **knobs: target.normalize(knobs)


def built_in(caches: WorkerCaches, *configs: dict) -> dict:
    for c in configs:
        caches.remember(c)
    return configs[-1]


def test_an_eager_runtime_switch_redoes_nothing(norm):
    caches = WorkerCaches()
    base = built_in(caches, norm())
    t = transition_facts(base, norm(mhc_gemm="bf16"), caches, alive=True)
    assert t.restart_class == "none" and t.changed_knobs == ("mhc_gemm",) and t.redone == ()


def test_a_runtime_switch_under_the_compiled_step_re_traces_it_unless_traced_before(norm):
    caches = WorkerCaches()
    compiled = norm(step_compile="inductor", moe_experts="grouped")
    bf16 = norm(step_compile="inductor", moe_experts="grouped", mhc_gemm="bf16")
    built = built_in(caches, compiled)
    t = transition_facts(built, bf16, caches, alive=True)
    assert t.redone == ("step_compile",) and t.restart_class == "recompile" and t.changed_knobs == ("mhc_gemm",)
    built = built_in(caches, bf16)
    back = transition_facts(built, compiled, caches, alive=True)  # Dynamo's cache holds that graph
    assert back.redone == () and back.restart_class == "none"
    turned_on = transition_facts(norm(), compiled, WorkerCaches(), alive=True)
    assert "step_compile" in turned_on.changed_knobs and turned_on.redone == ()  # its own cold compile


def test_every_switch_under_cuda_graphs_captures_again(norm):
    caches = WorkerCaches()
    graphs = norm(cuda_graphs="on", moe_experts="grouped")
    t = transition_facts(built_in(caches, graphs), norm(cuda_graphs="on", moe_experts="grouped",
                                                        indexer_gemm="bf16"), caches, alive=True)
    assert t.redone == ("cuda_graphs",) and t.restart_class == "rebuild"
    assert transition_facts(graphs, graphs, caches, alive=True).redone == ()  # nothing changes
    off = transition_facts(graphs, norm(moe_experts="grouped"), caches, alive=True)
    assert off.changed_knobs == ("cuda_graphs",) and off.redone == ()


def test_cached_recompile_and_what_a_new_or_emptied_worker_reports(norm):
    caches = WorkerCaches()
    mma = norm(attention="mma")
    built = built_in(caches, norm(), mma)
    back = transition_facts(built, norm(), caches, alive=True)
    assert back.restart_class == "recompile" and back.cached
    new = transition_facts(built, norm(attention="mma", attn_split_k=2), caches, alive=True)
    assert new.restart_class == "recompile" and not new.cached
    assert transition_facts(None, mma, caches, alive=True).cached  # survived a failure: caches warm
    # ... but not for what it never compiled (a step compile after a failed trial took 2 min 26 s)
    assert not transition_facts(None, norm(attention="mma", step_compile="inductor",
                                           moe_experts="grouped"), caches, alive=True).cached
    assert transition_facts(None, mma, caches, alive=False).restart_class == "restart"
    caches.clear()
    assert not transition_facts(None, mma, caches, alive=True).cached


def test_a_new_combination_of_compiled_kernels_is_cached_but_a_new_tile_tuple_is_not(norm):
    """Triton compiles the attention kernel once per tuple of its tile knobs per layer class, and
    every other recompile knob's kernel per value: on the H200, under step_compile, a combination
    never built whose kernels all were took 0.5-0.8 s, one new tile tuple 8-12 s
    (h200_live_10m_run5, trials 53-73); keying the cache on the whole combination called both cold."""
    target = BuiltinTarget("flash-slice", "cuda")
    caches = target.new_caches()
    a = norm(attention="mma", attn_block_kv=32, glue="triton")
    b = norm(attention="mma", attn_num_warps=8, glue="compile")
    built = built_in(caches, a, b)
    mixed = norm(attention="mma", attn_block_kv=32, glue="compile")  # both pieces were compiled
    assert transition_facts(built, mixed, caches, alive=True).cached
    tiles = norm(attention="mma", attn_block_kv=32, attn_num_warps=8, glue="triton")  # a new tuple
    assert not transition_facts(built, tiles, caches, alive=True).cached
    # a tile tuple compiled on one layer class only is new on another
    window = target._model.layers_of_class("window")
    per_class = dict(a, layer_overrides=[[i, "attn_num_warps", 8] for i in window])
    assert not transition_facts(built, per_class, caches, alive=True).cached


def test_under_step_compile_a_value_built_only_eager_is_not_cached(norm):
    """Inductor generates kernels for the torch ops each knob's value chooses: a value built eager
    has none of them (a switch back to one took 10.5 s under step_compile: run5, trial 58), while a
    re-trace of values all compiled before reuses them (0.5-0.8 s there)."""
    caches = WorkerCaches()
    sc = dict(attention="mma", step_compile="inductor")
    built = built_in(caches, norm(mhc_operand="view_bf16_residual", attention="mma"),  # eager only
                     norm(mhc_gemm="bf16", **sc), norm(moe_experts="grouped", **sc))
    both = transition_facts(built, norm(mhc_gemm="bf16", moe_experts="grouped", **sc), caches, alive=True)
    # a new combination of parts each traced before, kernels cached: no re-trace (0.55-1.06 s for 14 of
    # 16 such switches on the H200, runs 5-8)
    assert both.redone == ()
    eager_value = norm(mhc_operand="view_bf16_residual", moe_experts="grouped", **sc)
    t = transition_facts(built, eager_value, caches, alive=True)
    assert t.redone == ("step_compile",) and not t.cached


def test_without_the_layers_a_tile_moved_to_another_layer_is_a_new_specialisation(norm):
    """Caches that do not know the preset's layer classes key the attention knobs' whole assignment:
    the same tile on another layer is not called cached (reading one layer's value would call it so)."""
    caches = WorkerCaches()
    on_layer_1 = dict(norm(attention="mma"), layer_overrides=[[1, "attn_block_kv", 32]])
    on_layer_2 = dict(norm(attention="mma"), layer_overrides=[[2, "attn_block_kv", 32]])
    built_in(caches, norm(attention="mma"), on_layer_1)
    assert caches.warm_for(on_layer_1) and not caches.warm_for(on_layer_2)


def test_a_surviving_worker_that_compiled_a_step_names_the_re_trace_for_a_new_kernel(norm):
    """After a failed trial its worker lives on with nothing trusted in it. A configuration with a kernel
    new to it re-traces a step Dynamo compiled before (the redo the cost model prices), not the first
    step compile of a fresh worker (such relaunches took 5-36 s on the H200 and were priced as a fresh
    start's 120-151 s: h200_live_10m run 2, h200_live_10m_run3 run 2)."""
    caches = WorkerCaches()
    sc = dict(moe_experts="grouped", step_compile="inductor")
    built_in(caches, norm(**sc))
    new_kernel = norm(attention="mma", attn_split_k=2, **sc)
    t = transition_facts(None, new_kernel, caches, alive=True)
    assert t.restart_class == "rebuild" and not t.cached and t.redone == ("step_compile",)
    assert transition_facts(None, norm(**sc), caches, alive=True).redone == ()  # warm for it: no redo
    eager = WorkerCaches()  # a worker that never step-compiled has no re-trace to name
    built_in(eager, norm(moe_experts="grouped"))
    assert transition_facts(None, new_kernel, eager, alive=True).redone == ()


def test_a_dtype_switch_under_a_triton_kernel_that_reads_it_recompiles_that_kernel(norm):
    """mhc_gemm picks the mHC GEMM's operand dtype: a Python branch in eager code, but under
    mhc_kernel=triton_splitk a new dtype is a new specialisation of that kernel, compiled on first use
    (on the H100 and H200 such first switches took 2.6-3.7 s where switches that compile nothing took
    0.4-1.5 s). The switch names the kernel's knob as redone, once: back to a dtype compiled here it
    redoes nothing. Without the layers the specialisations are unknown and nothing is claimed."""
    layers = tuple(BuiltinTarget("flash-slice", "cuda").layers())
    caches = WorkerCaches(layers)
    split = norm(mhc_kernel="triton_splitk")
    built = built_in(caches, split)
    bf16 = norm(mhc_kernel="triton_splitk", mhc_gemm="bf16")
    t = transition_facts(built, bf16, caches, alive=True)
    assert t.changed_knobs == ("mhc_gemm",) and t.redone == ("mhc_kernel",) and not t.cached
    built = built_in(caches, bf16)
    assert transition_facts(built, split, caches, alive=True).redone == ()  # fp32 compiled before
    eager = WorkerCaches(layers)  # the eager torch.mm path compiles nothing for a dtype
    assert transition_facts(built_in(eager, norm()), norm(mhc_gemm="bf16"), eager, alive=True).redone == ()
    unknown = WorkerCaches()
    assert transition_facts(built_in(unknown, split), bf16, unknown, alive=True).redone == ()


def test_the_parent_predicts_the_specialisations_the_worker_compiles():
    """The parent's facts and the worker's JIT keys come from one function (dsv4.specialisations):
    for a configuration with per-layer dtypes under the fused kernels, the (kernel, operand) keys the
    parent derives from the normalized config are the worker's, from its layer plans."""
    from dsv4.config import preset
    from dsv4.model import make_plans
    from dsv4.specialisations import model_triton_keys

    target = BuiltinTarget("flash-slice", "cuda")
    config = target.normalize({"mhc_kernel": "triton_splitk", "mhc_fuse_post_pre": "on",
                               "indexer_kernel": "triton_fused", "moe_experts": "triton_grouped",
                               "layer_overrides": [[0, "mhc_gemm", "bf16"], [1, "indexer_gemm", "bf16"]]})
    caches = WorkerCaches(tuple(target.layers()))
    parent = caches.triton_keys(config)
    knobs = {k: v for k, v in config.items() if k != "layer_overrides"}
    cfg = preset("flash-slice", **knobs, layer_overrides=tuple(tuple(o) for o in config["layer_overrides"]))
    worker = model_triton_keys([(p.cls, p.knobs) for p in make_plans(cfg)], cfg.knobs())
    assert parent == worker
    assert ("mhc_prenorm", "bf16") in parent and ("mhc_prenorm", "fp32") in parent
