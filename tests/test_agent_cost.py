"""The cost model: which knobs change, the dearest restart class, learned apply seconds, cached
kernels, the target's estimate corrected by experience, fresh starts."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from autoopt.agent.cost import CostModel
from autoopt.agent.view import SpaceView
from autoopt.targets.base import Transition
from autoopt.targets.replay import ReplayTarget, replay_space

CASE = Path(__file__).resolve().parent / "fixtures" / "replay" / "casestudy.csv"


@pytest.fixture(scope="module")
def view():
    return SpaceView(replay_space(ReplayTarget(CASE)))


def code(view, **changes):
    c = view.base_code.copy()
    for name, value in changes.items():
        i = view.names.index(name)
        c[i] = list(view.params[i].choices).index(value)
    return c


def test_priors_from_the_space_and_the_dearest_class(view):
    cm = CostModel(view, default_measure_s=120)
    base = view.base_code
    e = cm.estimate(base, code(view, moe_experts="grouped"))
    assert e.transition_s == 0 and e.restart_class == "none" and e.total_s == 120
    e = cm.estimate(base, code(view, moe_experts="grouped", attention="mma", cuda_graphs="on"))
    assert e.restart_class == "restart" and e.transition_s == 300  # the space prior of cuda_graphs
    assert set(e.changed) == {"moe_experts", "attention", "cuda_graphs"}
    assert "restart 5.0 min + measure 2.0 min" in e.text()
    assert cm.estimate(None, base).restart_class == "restart"  # nothing running: a fresh start
    assert cm.fresh_start_s() == 300


def test_learns_apply_seconds_per_knob_and_measurement_seconds(view):
    cm = CostModel(view)
    base = view.base_code
    glue = code(view, glue="compile")
    cm.observe(base, glue, transition_s=150.0, measure_s=100.0, target_estimate_s=None, cached=False)
    cm.observe(glue, base, transition_s=170.0, measure_s=140.0, target_estimate_s=None, cached=False)
    assert cm.measure_s() == pytest.approx(120.0)
    e = cm.estimate(base, glue)
    assert e.transition_s == pytest.approx(160.0)  # learned median beats the 60 s prior
    # a change of two knobs is attributed to the dearer one
    both = code(view, glue="compile", cuda_graphs="on")
    cm.observe(base, both, transition_s=400.0, measure_s=120.0, target_estimate_s=None, cached=True)
    assert cm.estimate(base, code(view, cuda_graphs="on")).transition_s == pytest.approx(400.0)


def test_target_estimate_is_scaled_by_how_wrong_it_was(view):
    cm = CostModel(view)
    base, att = view.base_code, code(view, attention="mma")
    declared = Transition("recompile", ("attention",), expected_s=40.0)
    assert cm.estimate(base, att, declared).transition_s == pytest.approx(40.0)
    cm.observe(base, att, transition_s=80.0, measure_s=60.0, target_estimate_s=40.0, cached=False)
    # the target under-estimated recompiles by 2x: its next recompile estimate is doubled
    blk = code(view, attn_block_kv=128)
    assert cm.estimate(base, blk, Transition("recompile", ("attn_block_kv",), 30.0)).transition_s == \
        pytest.approx(60.0)


def test_cached_kernels_cost_nothing_and_no_change_is_free(view):
    cm = CostModel(view)
    att = code(view, attention="mma")
    cached = Transition("none", (), expected_s=0.0, cached=True)
    assert cm.estimate(att, att, cached).transition_s == 0.0
    assert cm.estimate(view.base_code, att, cached).cached


def test_view_encodes_and_groups_builds(view):
    c = code(view, attention="mma", moe_experts="grouped")
    params = view.decode(c)
    assert params["attention"] == "mma" and np.array_equal(view.encode(params), c)
    assert view.encode({**params, "attention": "nope"}) is None
    # a runtime switch stays in the same build; a recompile knob does not
    assert view.build_key(c) == view.build_key(code(view, attention="mma"))
    assert view.build_key(c) != view.build_key(view.base_code)
    assert view.describe(c) == "attention=mma, moe_experts=grouped"
