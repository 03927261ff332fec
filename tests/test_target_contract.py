"""The Target contract, run against every target implementation (optuna style: one suite, many
implementations). Add a target by adding a factory to TARGET_FACTORIES: it returns a fresh target;
the suite closes it.

Contract:
  - the baseline evaluates (status ok, a positive objective at the default concurrency);
  - evaluate never raises for an invalid configuration: unknown knob, value outside the knob's
    values, missing knob, per-layer override the target cannot apply: a failed Measurement with a kind
    and a reason (a target whose `fills_missing_knobs` is true documents that a knob left out takes
    its baseline value: there a missing knob measures like the baseline);
  - transition costs are non-negative, before and after evaluations, and after a failure;
  - now() advances with evaluations;
  - environment() is a JSON-serialisable dict;
  - knob_specs match what evaluate accepts: every declared value is accepted (never rejected as an
    unknown value), a value outside them is rejected.
"""
from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any, Callable

import pytest

from autoopt.measurement import FAILURE_KINDS, Measurement
from autoopt.targets.base import EvalRequest, KnobSpec, Transition
from autoopt.trial import RESTART_CLASSES

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "replay"


def _replay_casestudy() -> Any:
    from autoopt.targets.replay.target import ReplayTarget

    return ReplayTarget(FIXTURES / "casestudy.csv", seed=3)


def _replay_kernel_tuner() -> Any:
    from autoopt.targets.replay.target import ReplayTarget

    return ReplayTarget(FIXTURES / "kt_gemm.json", seed=1, measure_s=2.0)


def _builtin_tiny_cpu() -> Any:
    """The dsv4 decode step, tiny preset, in a real worker on the CPU (few samples: a contract, not a
    benchmark; no correctness guard, which tests/test_builtin_target.py covers)."""
    from autoopt.targets.builtin.target import BuiltinTarget

    t = BuiltinTarget("tiny", "cpu", guard=False, warmup_steps=1)
    t.contract_samples = (3, 3)
    return t


TARGET_FACTORIES: dict[str, Callable[[], Any]] = {
    "replay-casestudy": _replay_casestudy,
    "replay-kernel-tuner": _replay_kernel_tuner,
    "builtin-tiny-cpu": _builtin_tiny_cpu,
}


@pytest.fixture(params=sorted(TARGET_FACTORIES))
def target(request: pytest.FixtureRequest) -> Any:
    t = TARGET_FACTORIES[request.param]()
    yield t
    t.close()


def _request(target: Any, config: dict[str, Any]) -> EvalRequest:
    lo, hi = getattr(target, "contract_samples", (6, 12))
    return EvalRequest(config=config, concurrency=tuple(target.default_concurrency())[:1], min_samples=lo,
                       max_samples=hi, time_limit_s=120.0)


def _assert_failed_with_reason(m: Measurement) -> None:
    assert isinstance(m, Measurement)
    assert m.status in ("failed", "wrong")
    assert m.failure is not None and m.failure.kind in FAILURE_KINDS and m.failure.reason.strip()


def test_knob_specs_are_well_formed(target):
    specs = target.knob_specs()
    assert specs and all(isinstance(s, KnobSpec) for s in specs)
    assert len({s.name for s in specs}) == len(specs)
    base = target.baseline()
    for s in specs:
        assert len(s.values) >= 1 and s.restart_class in ("none", "recompile", "rebuild", "restart")
        assert base[s.name] in s.values, f"baseline {s.name}={base[s.name]!r} not among its values"


def test_baseline_evaluates(target):
    m = target.evaluate(_request(target, target.baseline()))
    assert m.status == "ok", m.failure
    c = target.default_concurrency()[0]
    assert m.objective(c) is not None and m.objective(c) > 0
    tp = m.tok_per_s[str(c)]
    assert tp.ci_low <= tp.median <= tp.ci_high
    assert all(v >= 0 for v in m.costs_s.values())
    json.dumps(m.to_dict())  # the document the store records


@pytest.mark.parametrize("breakage", ["unknown_knob", "bad_value", "missing_knob", "layer_override"])
def test_evaluate_never_raises_for_an_invalid_config(target, breakage):
    config = dict(target.baseline())
    spec = target.knob_specs()[0]
    if breakage == "unknown_knob":
        config["no_such_knob"] = 1
    elif breakage == "bad_value":
        config[spec.name] = "no-such-value-%d" % 7
    elif breakage == "missing_knob":
        del config[spec.name]
    else:
        config["layer_overrides"] = [[10_000, spec.name, spec.values[0]]]
    m = target.evaluate(_request(target, config))
    if breakage == "missing_knob" and getattr(target, "fills_missing_knobs", False):
        assert m.status == "ok", m.failure  # documented: the baseline's value
        return
    _assert_failed_with_reason(m)


def test_transition_costs_are_non_negative(target):
    specs = target.knob_specs()
    base = target.baseline()
    candidates = [base] + [{**base, s.name: v} for s in specs for v in s.values[:2]]
    for cfg in candidates:
        tr = target.transition(cfg)
        assert isinstance(tr, Transition) and isinstance(tr.cached, bool)
        assert tr.known_s is None or (tr.known_s >= 0 and math.isfinite(tr.known_s))  # a fact, if known
    target.evaluate(_request(target, base))
    target.evaluate(_request(target, {**base, specs[0].name: "no-such-value"}))  # a failure
    for cfg in candidates:
        tr = target.transition(cfg)
        assert tr.restart_class in RESTART_CLASSES and (tr.known_s is None or tr.known_s >= 0)


def test_now_advances_with_evaluations(target):
    t0 = target.now()
    target.evaluate(_request(target, target.baseline()))
    t1 = target.now()
    assert t1 > t0
    target.evaluate(_request(target, target.baseline()))
    assert target.now() > t1


def test_environment_is_a_json_dict(target):
    env = target.environment()
    assert isinstance(env, dict) and env
    json.dumps(env)


def test_knob_specs_match_what_evaluate_accepts(target):
    """Every declared value is accepted (a failure, if any, is about the configuration, never an
    unknown value); a value outside the declared ones is rejected."""
    base = target.baseline()
    for spec in target.knob_specs():
        for value in spec.values:
            m = target.evaluate(_request(target, {**base, spec.name: value}))
            if m.status != "ok":
                _assert_failed_with_reason(m)
                assert "never appears" not in m.failure.reason and "unknown" not in m.failure.reason.lower()
        outside = _value_outside(spec)
        m = target.evaluate(_request(target, {**base, spec.name: outside}))
        _assert_failed_with_reason(m)


def _value_outside(spec: KnobSpec) -> Any:
    if all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in spec.values):
        return max(spec.values) * 2 + 1
    return "not-a-value-of-" + spec.name
