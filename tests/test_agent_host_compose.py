"""Cuts of the same host time compose as kept shares: once CUDA graphs has taken the eager step's
host time, a launch cut's Amdahl is bounded by the host time that is left. Real profiles: the
committed H200 eager start (93 % host) as the baseline, the tuned CUDA-graph step at C=1
(benchmarks/results/traces) as the reference the next move starts from. In milliseconds (before) a
launch cut removed the baseline's host share again from a step that no longer had it: the live H200
run predicted +266 % for attention@c128=mma + indexer_kernel=triton_fused and measured +1.9 %."""
from __future__ import annotations

import numpy as np
import pytest
from test_agent_host import H200_START, _from_trace
from test_agent_repair import _move
from test_host_bucket import H200_GRAPH

from autoopt.measurement import HOST_BUCKET
from autoopt.search.agent.buckets import BucketModel
from autoopt.search.agent.view import SpaceView
from autoopt.space.space import SearchSpace
from autoopt.targets.builtin.declared import builtin_info


@pytest.fixture(scope="module")
def model_and_refs():
    space = SearchSpace.load("dsv4_flash_decode", builtin_info("flash-slice", "cuda"))
    view = SpaceView(space)
    start = _from_trace(H200_START)
    model = BucketModel(view)
    model.add(view.base_code, start.buckets_ms, True, start.bucket_coverage, start.kernels_by_bucket)
    moe = {n: "triton_grouped" for n in view.names if n.startswith("moe_experts")}
    graphs = _move(view, cuda_graphs="on", **moe)
    return view, model, start, graphs, _from_trace(H200_GRAPH).buckets_ms


def test_after_cuda_graphs_a_launch_cut_is_bounded_by_the_host_time_left(model_and_refs):
    view, model, start, graphs, graph_ms = model_and_refs
    host_share = graph_ms[HOST_BUCKET] / sum(graph_ms.values())
    fused = graphs.copy()
    fused[view.names.index("indexer_kernel")] = list(view.params[view.names.index("indexer_kernel")].choices) \
        .index("triton_fused")
    gain, _ = model.explain(graphs, graph_ms, fused)
    # at most everything the reference still has in the host bucket and in the knob's own buckets
    own = set(view.params[view.names.index("indexer_kernel")].buckets) | {HOST_BUCKET}
    removable = sum(ms for b, ms in graph_ms.items() if b in own) / sum(graph_ms.values())
    assert 0 <= gain <= 1.0 / (1.0 - removable) - 1.0 + 1e-9, (gain, removable)
    # in milliseconds (the model before): the baseline's deltas clamp the tuned buckets to nothing
    i = view.names.index("indexer_kernel")
    r = model._ref(graph_ms)
    in_ms = 1.0 / (np.maximum(0.0, r + model.deltas()[i, fused[i], :]).sum() / r.sum()) - 1.0
    assert in_ms > 1.0 and gain < in_ms / 2, (gain, in_ms)
    # from the eager start the same cut saves most in host time (its launch share of the 93 %)
    eager_gain, top = model.explain(view.base_code, start.buckets_ms, _move(
        view, indexer_kernel="triton_fused"))
    assert top == HOST_BUCKET and eager_gain > 0


def test_two_cuts_never_take_more_host_time_than_there_is(model_and_refs):
    view, model, start, graphs, _ = model_and_refs
    both = graphs.copy()
    both[view.names.index("step_compile")] = list(view.params[view.names.index("step_compile")].choices) \
        .index("inductor")
    after = model._after(np.stack([graphs, both]), view.base_code, model._ref(start.buckets_ms))
    h = model.buckets.index(HOST_BUCKET)
    assert 0 < after[1, h] < after[0, h] < start.buckets_ms[HOST_BUCKET]
