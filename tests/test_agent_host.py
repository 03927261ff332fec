"""Host time in the agent's Amdahl estimate: a knob that declares it cuts host time (CUDA graphs) is
valued on the host bucket's share of the step, so on a host-bound step (the committed H200 eager
start trace: 93 % host) it ranks far above a GEMM dtype change, and on a device-bound one (the
committed profile of the tiny CPU decode step) it does not. Also the
`cuts` declaration of a space file: what it expands to and its file:line errors."""
from __future__ import annotations

from pathlib import Path

import pytest
from test_host_bucket import CPU_DECODE, H200_START

from autoopt.errors import SpaceError
from autoopt.measurement import HOST_BUCKET, Measurement, throughput_from_step_times
from autoopt.profile.trace import profile_trace
from autoopt.search.agent.buckets import BucketModel
from autoopt.search.agent.strategy import AgentStrategy
from autoopt.search.agent.view import SpaceView
from autoopt.search.cost import CostModel
from autoopt.search.strategy import SearchContext, TrialOutcome
from autoopt.space.space import SearchSpace
from autoopt.targets.builtin.declared import HOST_CUTS, builtin_info
from autoopt.trial import TrialResult

# Two knobs of the builtin target with the priors of the shipped dsv4_flash_decode space; their cuts
# come from the target's declaration (cuda_graphs=on cuts host time and launches).
TWO_KNOBS = """\
name: host_vs_gemm
target: builtin
preset: flash-slice
device: cuda
concurrency: [1]
objective: {concurrency: 1}
priors:
  apply_cost_s: {none: 0, recompile: 20, rebuild: 60, restart: 240}
knobs:
  mhc_gemm:
    values: [fp32, bf16]
    restart_class: none
    buckets: [gemm_simt, gemm_tensorop, copy_cast]
    prior: {speedup: {bf16: 2.0}}
  cuda_graphs:
    values: ['off', 'on']
    restart_class: rebuild
    buckets: [other]
    prior: {speedup: {'on': 3.0}}
"""


def _from_trace(path: Path, concurrency: int = 1, host: bool = True) -> Measurement:
    """The measurement a profiled trial with this trace would store (record.py's path), its tok/s
    from the trace's step wall; host=False: what the agent saw before host time was a bucket."""
    fields = profile_trace(path).measurement_fields()
    if not host:
        fields["buckets_ms"].pop(HOST_BUCKET)
    wall_s = fields["step_wall_ms"] / 1e3
    tok = throughput_from_step_times([wall_s * (1 + 1e-3 * i) for i in range(10)], concurrency)
    return Measurement(status="ok", config={}, tok_per_s={str(concurrency): tok}, **fields)


def _amdahl(space: SearchSpace, m: Measurement) -> dict[str, float]:
    """Expected gain of every one-value move from the baseline, by the bucket model alone."""
    view = SpaceView(space)
    model = BucketModel(view)
    model.add(view.base_code, m.buckets_ms, True, m.bucket_coverage, m.kernels_by_bucket)
    return {f"{p.name}={p.choices[v]}": model.amdahl(view.base_code, m.buckets_ms, i, v)[0]
            for i, p in enumerate(view.params) for v in range(len(p.choices)) if v != p.base}


@pytest.fixture(scope="module")
def flash() -> SearchSpace:
    return SearchSpace.load("dsv4_flash_decode", builtin_info("flash-slice", "cuda"))


def test_on_a_host_bound_step_cuda_graphs_is_worth_most_of_the_wall(flash):
    m = _from_trace(H200_START)
    gains = _amdahl(flash, m)
    gemm = max(g for k, g in gains.items() if k.startswith("mhc_gemm@"))
    # the prior by hand: 'on' cuts (1 - 1/3) of the host and of the "other" bucket it declares
    saved = (1 - 1 / 3.0) * (m.buckets_ms[HOST_BUCKET] + m.buckets_ms["other"])
    wall = sum(m.buckets_ms.values())
    assert gains["cuda_graphs=on"] == pytest.approx(wall / (wall - saved) - 1, rel=1e-6)
    assert gains["cuda_graphs=on"] > 1.0 and gains["cuda_graphs=on"] > 20 * gemm
    old = _amdahl(flash, _from_trace(H200_START, host=False))
    assert old["cuda_graphs=on"] < 0.01  # without the host bucket: worth almost nothing


def test_on_a_device_bound_step_the_gemm_is_worth_more(flash):
    gains = _amdahl(flash, _from_trace(CPU_DECODE))
    assert max(g for k, g in gains.items() if k.startswith("mhc_gemm@")) > gains["cuda_graphs=on"]


def test_launch_cuts_share_the_launches_they_claim(flash):
    """A launch goes away once: the knobs that cut launches in the same buckets split them, so
    their shares add up to at most the launches of the step."""
    m = _from_trace(H200_START)
    view = SpaceView(flash)
    model = BucketModel(view)
    model.add(view.base_code, m.buckets_ms, True, m.bucket_coverage, m.kernels_by_bucket)
    cutters: dict[str, int] = {}  # knob -> its first parameter
    for i, p in enumerate(view.params):
        if any("launches" in kinds and "host" not in kinds for kinds in _knob(flash, p.knob).cuts.values()):
            cutters.setdefault(p.knob, i)
    assert {"glue", "mhc_kernel", "indexer_kernel", "mhc_fuse_post_pre", "proj_gemms", "moe_experts"} <= set(cutters)
    shares = {knob: model.launch_share(i) for knob, i in cutters.items()}
    assert 0 < sum(shares.values()) <= 1 + 1e-9
    assert all(0 < s < 1 for s in shares.values())


def _first_move(space: SearchSpace, m: Measurement) -> dict:
    """What the agent proposes after a baseline trial that measured `m`."""
    agent = AgentStrategy(space, seed=0)
    costs = CostModel(space)
    first = agent.propose(SearchContext(space, None, [], 3600.0, 0.0, None, costs))
    result = TrialResult("ok", space.objective.value(m), space.objective.ci(m), cost_s=30.0)
    history = [TrialOutcome(0, first.params, m, result, first)]
    decision = agent.propose(SearchContext(space, None, history, 3600.0, 0.0, first.params, costs))
    return dict(decision.params)


@pytest.fixture(scope="module")
def two_knobs(tmp_path_factory) -> SearchSpace:
    path = tmp_path_factory.mktemp("space") / "host_vs_gemm.yaml"
    path.write_text(TWO_KNOBS)
    return SearchSpace.load(path, builtin_info("flash-slice", "cuda"))


def test_a_declared_cut_without_a_speedup_still_points_down(tmp_path):
    """No speed-up in the space file: the declared cut alone says the host bucket falls, by half
    (of unknown size between none and all), where an undeclared bucket would stay put."""
    path = tmp_path / "no_prior.yaml"
    path.write_text(TWO_KNOBS.replace("    prior: {speedup: {'on': 3.0}}\n", ""))
    space = SearchSpace.load(path, builtin_info("flash-slice", "cuda"))
    m = _from_trace(H200_START)
    wall = sum(m.buckets_ms.values())
    expected = wall / (wall - 0.5 * m.buckets_ms[HOST_BUCKET]) - 1
    assert _amdahl(space, m)["cuda_graphs=on"] == pytest.approx(expected, rel=1e-6)


def test_agent_turns_cuda_graphs_on_first_on_a_host_bound_step(two_knobs):
    assert _first_move(two_knobs, _from_trace(H200_START))["cuda_graphs"] == "on"
    # the same profile without the host bucket (the agent before it): the GEMM goes first
    old = _first_move(two_knobs, _from_trace(H200_START, host=False))
    assert old["cuda_graphs"] == "off" and old["mhc_gemm"] == "bf16"


def test_agent_takes_the_gemm_first_on_a_device_bound_step(two_knobs):
    # the committed trace, not a live profile: a live one's host share follows the machine's load
    # (12 % of the step on a loaded 2-core CI machine, enough to put CUDA graphs first)
    move = _first_move(two_knobs, _from_trace(CPU_DECODE))
    assert move["mhc_gemm"] == "bf16" and move["cuda_graphs"] == "off"


# ---- the declaration ------------------------------------------------------------------------------
def _space(tmp_path: Path, cuts_line: str) -> SearchSpace:
    path = tmp_path / "cuts.yaml"
    path.write_text(TWO_KNOBS + (f"    {cuts_line}\n" if cuts_line else ""))
    return SearchSpace.load(path, builtin_info("flash-slice", "cuda"))


def _knob(space: SearchSpace, name: str):
    return next(k for k in space.knobs if k.name == name)


def test_cuts_come_from_the_target_and_move_the_host_bucket(tmp_path):
    graphs = _knob(_space(tmp_path, ""), "cuda_graphs")
    assert graphs.cuts == {"on": ("host", "launches")} and graphs.buckets == ("other", HOST_BUCKET)
    assert _knob(_space(tmp_path, ""), "mhc_gemm").cuts == {}
    assert _knob(_space(tmp_path, "cuts: [launches]"), "cuda_graphs").cuts == {"on": ("launches",)}
    dropped = _knob(_space(tmp_path, "cuts: []"), "cuda_graphs")
    assert dropped.cuts == {} and HOST_BUCKET not in dropped.buckets


@pytest.mark.parametrize("line, expected", [
    ("cuts: [host, gpu]", "knobs.cuda_graphs.cuts[1]: expected one of: host, launches; got 'gpu'"),
    ("cuts: host", "knobs.cuda_graphs.cuts: expected a list of host / launches"),
    ("cuts: {'off': [host]}", "knobs.cuda_graphs.cuts.off: the baseline value"),
    ("cuts: {maybe: [host]}", "knobs.cuda_graphs.cuts.maybe: unknown value 'maybe'"),
    ("cuts: {'on': host}", "knobs.cuda_graphs.cuts.on: expected a list of: host, launches"),
])
def test_a_bad_cuts_value_names_file_line_and_key(tmp_path, line, expected):
    with pytest.raises(SpaceError) as err:
        _space(tmp_path, line)
    cuts_line = TWO_KNOBS.count("\n") + 1  # the line _space appends
    assert f"cuts.yaml:{cuts_line}: {expected}" in str(err.value)


def test_declared_cuts_name_real_knobs_and_values():
    import dsv4

    knobs = {k.name: k for k in dsv4.KNOBS}
    assert {"cuda_graphs", "step_compile", "glue"} <= set(HOST_CUTS)
    for name, by_value in HOST_CUTS.items():
        for value, kinds in by_value.items():
            assert value in knobs[name].values and value != knobs[name].baseline, (name, value)
            assert kinds and set(kinds) <= {"host", "launches"}, (name, value)
