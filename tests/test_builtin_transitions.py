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
