"""Constraint repair in the agent's candidates: in the shipped dsv4_flash_decode space CUDA graphs and
step_compile are only legal once every `moe_experts@...` has left the expert loop, so from the eager
baseline no one- or two-knob move can turn them on. The proposer completes such a move with the
fewest changes of the knobs its constraints read, and on the H200's host-bound start profile the
agent's first move after the baseline is one of those completions."""
from __future__ import annotations

import numpy as np
import pytest
from test_agent_host import H200_START, _first_move
from test_agent_model import code as _move

from autoopt.measurement import Measurement, throughput_from_step_times
from autoopt.profile.trace import profile_trace

from autoopt.search.agent.repair import constraint_repairs
from autoopt.search.agent.view import SpaceView
from autoopt.space.space import SearchSpace
from autoopt.targets.builtin.declared import builtin_info


@pytest.fixture(scope="module")
def flash() -> SearchSpace:
    return SearchSpace.load("dsv4_flash_decode", builtin_info("flash-slice", "cuda"))


def test_a_broken_move_is_completed_by_the_knobs_its_constraint_reads(flash):
    view = SpaceView(flash)
    graphs = _move(view, cuda_graphs="on")
    assert not view.feasible(graphs)
    repairs = constraint_repairs(view, graphs, view.base_code, np.random.default_rng(0))
    moe = [i for i, p in enumerate(view.params) if p.knob == "moe_experts"]
    assert repairs and len(moe) >= 2
    for code in repairs:
        assert view.feasible(code) and code[view.names.index("cuda_graphs")] == graphs[view.names.index("cuda_graphs")]
        changed = set(np.nonzero(code != graphs)[0])
        assert changed == set(moe)  # every MoE parameter, nothing else
    assert len({tuple(c) for c in repairs}) == len(repairs)


def test_a_feasible_move_needs_no_repair_and_only_the_constraints_knobs_move(flash):
    view = SpaceView(flash)
    gemm = _move(view, **{next(n for n in view.names if n.startswith("mhc_gemm")): "bf16"})
    assert view.feasible(gemm)
    assert constraint_repairs(view, gemm, view.base_code, np.random.default_rng(0)) == []
    # the bf16 residual view needs a bf16 GEMM on its layer: the repair sets that, nothing else
    name = next(n for n in view.names if n.startswith("mhc_operand"))
    view_move = _move(view, **{name: "view_bf16_residual"})
    repairs = constraint_repairs(view, view_move, view.base_code, np.random.default_rng(0))
    assert repairs and all(view.feasible(c) for c in repairs)
    for code in repairs:
        assert {view.params[i].knob for i in np.nonzero(code != view_move)[0]} <= {"mhc_gemm", "hc_fn_weight"}


def test_on_the_host_bound_h200_start_the_first_move_turns_a_host_cut_on(flash):
    move = _first_move(flash, _at_every_concurrency(H200_START, flash.concurrency))
    assert move["cuda_graphs"] == "on" or move["step_compile"] == "inductor", move
    assert all(v != "loop" for k, v in move.items() if k.startswith("moe_experts"))


def _at_every_concurrency(path, concurrency) -> Measurement:
    """The trace's buckets (host included) with tok/s at every C of the space's objective, from the
    trace's step wall (the batch of C requests per step)."""
    fields = profile_trace(path).measurement_fields()
    wall_s = fields["step_wall_ms"] / 1e3
    tok = {str(c): throughput_from_step_times([wall_s * (1 + 1e-3 * i) for i in range(10)], c)
           for c in concurrency}
    return Measurement(status="ok", config={}, tok_per_s=tok, **fields)
