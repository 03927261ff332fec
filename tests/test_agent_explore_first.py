"""A challenger leading inside the noise is re-measured only when settling it is worth more per second
than the best untried candidate: settling is worth at most the lead. On the live H200 the agent spent
ten trials (a third of its budget) settling a +5 % lead while a host-bound step's biggest cut was
untried. Real profiles: the committed H200 eager start trace (host-bound) and the committed profile of
the tiny CPU decode step (device-bound)."""
from __future__ import annotations

from test_agent_host import CPU_DECODE, H200_START, two_knobs  # noqa: F401 (a fixture)

from autoopt.measurement import Measurement, throughput_from_step_times
from autoopt.profile.trace import profile_trace
from autoopt.search.agent.strategy import AgentStrategy
from autoopt.search.cost import CostModel
from autoopt.search.strategy import SearchContext, TrialOutcome
from autoopt.trial import DecisionSource, TrialResult


def _noisy(fields: dict, wall_ms: float, speed: float) -> Measurement:
    """The profile's buckets with ten step times spread +-8 % around wall/speed (C=1)."""
    wall_s = wall_ms / 1e3 / speed
    steps = [wall_s * (1 + 0.08 * ((i * 7) % 10 - 4.5) / 4.5) for i in range(10)]
    return Measurement(status="ok", config={}, tok_per_s={"1": throughput_from_step_times(steps, 1)}, **fields)


def _after_a_close_challenger(space, fields: dict, wall_ms: float, lead: float = 1.04):
    """The agent's proposal after the baseline and a mhc_gemm=bf16 trial measured `lead` faster."""
    agent, costs = AgentStrategy(space, seed=0), CostModel(space)
    history: list[TrialOutcome] = []
    first = agent.propose(SearchContext(space, None, history, 3600.0, 0.0, None, costs))
    for n, (params, speed) in enumerate([(first.params, 1.0), ({**first.params, "mhc_gemm": "bf16"}, lead)]):
        m = _noisy(fields, wall_ms, speed)
        result = TrialResult("ok", space.objective.value(m), space.objective.ci(m), cost_s=30.0)
        history.append(TrialOutcome(n, params, m, result, first if n == 0 else None))
    return agent.propose(SearchContext(space, None, history, 3600.0, 0.0, history[-1].params, costs))


def test_a_big_untried_cut_goes_before_settling_a_small_lead(two_knobs):  # noqa: F811
    fields = profile_trace(H200_START).measurement_fields()
    decision = _after_a_close_challenger(two_knobs, fields, fields["step_wall_ms"])
    assert decision.source != DecisionSource.REPEAT.value and decision.params["cuda_graphs"] == "on", decision.reason


def test_with_nothing_worth_more_the_lead_is_settled(two_knobs):  # noqa: F811
    # the committed CPU profile, not a live one (its host share follows the machine's load)
    fields = profile_trace(CPU_DECODE).measurement_fields()
    # a +8 % lead, still inside the noise, against CUDA graphs' few percent on a device-bound step
    decision = _after_a_close_challenger(two_knobs, fields, fields["step_wall_ms"], lead=1.08)
    assert decision.source == DecisionSource.REPEAT.value, decision.reason
