"""One configuration measured inside the worker: the correctness guard, then timed decode steps per
concurrency, then an optional profile. Returns a Measurement document (autoopt.measurement).

How it is timed (warm-up, samples, stop rules, MBU) is autoopt.targets.builtin.measure's docstring.
"""
from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from typing import Any, Protocol

from autoopt.measurement import Measurement, Throughput, throughput_from_step_times
from autoopt.targets.builtin.measure import PeakMemory, StepClock, device_bandwidth, synchronize, time_steps

COST_KEYS = ("restart", "build", "compile", "warmup", "measure", "guard", "profile", "total")
WARMUP_MIN_S = 0.5  # seconds of warm-up at least (module docstring: clocks ramp up from idle)


class SessionSource(Protocol):
    """What measuring needs from the worker (autoopt.targets.builtin.worker.WorkerState)."""

    device: str
    bandwidth: dict[str, Any] | None  # measured once per worker
    env: dict[str, Any] | None  # fingerprint, computed once per worker
    profiles: int  # torch.profiler sessions run in this worker so far

    def session_for(self, config: Any, batch: int) -> tuple[Any, str, float]:
        """(dsv4 DecodeSession, how it was applied, seconds it took)."""


@dataclass(frozen=True)
class MeasureRequest:
    """A worker `measure` request, read once from its JSON (the parent's EvalRequest on the wire)."""

    preset: str = "tiny"
    shape: dict[str, int] = field(default_factory=dict)
    config: dict[str, Any] = field(default_factory=dict)  # knob -> value + "layer_overrides"
    concurrency: tuple[int, ...] = (1,)
    min_samples: int = 10
    max_samples: int = 40
    warmup_steps: int = 3
    warmup_min_s: float = WARMUP_MIN_S
    time_limit_s: float = 300.0
    target_rel_ci: float = 0.02
    abort_below: dict[str, float] = field(default_factory=dict)  # "C" -> tok/s of the incumbent
    guard: bool = True
    measure_if_wrong: bool = True
    profile: bool = False
    profile_concurrency: int | None = None
    profile_steps: int = 3

    @classmethod
    def from_json(cls, req: dict[str, Any]) -> "MeasureRequest":
        return cls(preset=str(req.get("preset", "tiny")), shape=dict(req.get("shape") or {}),
                   config=dict(req.get("config") or {}),
                   concurrency=tuple(int(c) for c in req.get("concurrency") or (1,)),
                   min_samples=int(req.get("min_samples", 10)), max_samples=int(req.get("max_samples", 40)),
                   warmup_steps=max(int(req.get("warmup_steps", 3)), 1),
                   warmup_min_s=max(float(req.get("warmup_min_s", WARMUP_MIN_S)), 0.0),
                   time_limit_s=float(req.get("time_limit_s", 300.0)),
                   target_rel_ci=float(req.get("target_rel_ci", 0.02)),
                   abort_below={str(k): float(v) for k, v in (req.get("abort_below") or {}).items()},
                   guard=bool(req.get("guard", True)), measure_if_wrong=bool(req.get("measure_if_wrong", True)),
                   profile=bool(req.get("profile")),
                   profile_concurrency=int(req["profile_concurrency"]) if req.get("profile_concurrency") else None,
                   profile_steps=int(req.get("profile_steps", 3)))

    def decode_config(self) -> Any:
        """DecodeConfig: preset + shape overrides + knob values + layer overrides. The values are the
        parent's, already parsed and checked (BuiltinTarget.normalize); JSON keeps their types, and
        DecodeConfig refuses any value its knob does not have (ValueError naming it)."""
        from dsv4.config import KNOB_BY_NAME, preset

        cfg = dict(self.config)
        overrides = tuple((int(layer), k, v) for layer, k, v in cfg.pop("layer_overrides", None) or ())
        unknown = [name for name in cfg if name not in KNOB_BY_NAME]
        if unknown:
            raise ValueError(f"unknown knob {unknown[0]!r}")
        return preset(self.preset, **self.shape, **cfg, layer_overrides=overrides)


def build_config(req: dict[str, Any]) -> Any:
    """The DecodeConfig a JSON `measure` request asks for."""
    return MeasureRequest.from_json(req).decode_config()


def measure_request(state: SessionSource, raw: dict[str, Any]) -> dict[str, Any]:
    """Serve a worker `measure` request; returns Measurement.to_dict(). Exceptions propagate to the
    worker loop, which reports them as a failure of the right kind."""
    req = MeasureRequest.from_json(raw)
    config = req.decode_config()
    costs = dict.fromkeys(COST_KEYS, 0.0)
    what_ran: dict[str, str] = {}
    bw, costs["restart"] = _bandwidth(state)
    env = _environment(state, bw)
    correctness = _guard(req, config, state.device, costs, what_ran)
    wrong = correctness.get("verdict") not in (None, "ok")
    config_doc = {**config.knobs(), "layer_overrides": [list(t) for t in config.layer_overrides]}
    if wrong and not req.measure_if_wrong:
        return Measurement(status="wrong", config=config_doc, correctness=correctness,
                           costs_s=_total(costs), what_ran=what_ran, environment=env).to_dict()
    peak = PeakMemory(state.device)
    peak.start()
    tok_per_s, mbu, sessions, notes = {}, {}, {}, {"applied": [], "stops": [], "mbu": ""}
    for c in req.concurrency:
        sessions[c], tok_per_s[str(c)] = _time_concurrency(state, req, config, c, costs, notes)
        roof, notes["mbu"] = _roofline_bytes(config, c)
        if roof is not None:  # c / tok_per_s = median step seconds
            mbu[str(c)] = roof / (c / tok_per_s[str(c)].median) / bw["bytes_per_s"]
    what_ran.update(_what_ran(sessions, req, state.device, bw, notes, peak.method))
    what_ran["measure.profiled_before"] = profiled_before(state.profiles)
    m = Measurement(status="wrong" if wrong else "ok", config=config_doc, tok_per_s=tok_per_s, mbu=mbu,
                    correctness=correctness, peak_memory_bytes=peak.peak_bytes(), what_ran=what_ran,
                    environment=env)
    if req.profile:
        pc = req.profile_concurrency or max(req.concurrency)
        sess = sessions.get(pc) or state.session_for(config, pc)[0]
        t0 = time.perf_counter()
        sess.reset()  # the profile sees the same context length as the timed steps
        state.profiles += 1
        _profile_into(m, sess, pc, state.device, req.profile_steps)
        costs["profile"] = time.perf_counter() - t0
    m.costs_s = _total(costs)
    return m.to_dict()


def profiled_before(profiles: int) -> str:
    """What may have slowed this worker's timing: a profile leaves CUPTI's callbacks on every later
    launch unless Kineto tears CUPTI down (autoopt.targets.builtin.client sets TEARDOWN_CUPTI=1)."""
    teardown = os.environ.get("TEARDOWN_CUPTI", "unset")
    return f"{profiles} torch.profiler session(s) earlier in this worker; TEARDOWN_CUPTI={teardown}"


def _environment(state: SessionSource, bw: dict[str, Any]) -> dict[str, Any]:
    if not state.env:
        from autoopt.environment import fingerprint

        state.env = fingerprint(state.device)
    return {**state.env, "mem_bandwidth_bytes_per_s": bw["bytes_per_s"], "mem_bandwidth_method": bw["method"],
            "torch_threads": _threads()}


def _guard(req: MeasureRequest, config: Any, device: str, costs: dict[str, float],
           what_ran: dict[str, str]) -> dict[str, Any]:
    if not req.guard:
        what_ran["guard"] = "skipped (request said guard=false)"
        return {}
    from dsv4.guard import check

    t0 = time.perf_counter()
    correctness = dict(check(config, device=device, batch=2, steps=3))
    costs["guard"] = time.perf_counter() - t0
    return correctness


def _time_concurrency(state: SessionSource, req: MeasureRequest, config: Any, c: int,
                      costs: dict[str, float], notes: dict[str, Any]) -> tuple[Any, Throughput]:
    """Apply `config` at batch `c`, warm it up, time its steps -> (session, throughput)."""
    device = state.device
    sess, how, apply_s = state.session_for(config, c)
    notes["applied"].append(f"C={c}: {how}")
    costs["compile" if how == "recompile" else "build"] += apply_s
    sess.reset()  # every config is timed from the same KV-cache length
    t0 = time.perf_counter()
    sess.step()
    synchronize(device)
    costs["warmup" if how == "none" else "compile"] += time.perf_counter() - t0  # first step: JIT
    costs["warmup"] += _warm_up(sess, device, req)
    t0 = time.perf_counter()
    budget_s = req.time_limit_s * 0.5 / len(req.concurrency)
    samples, why = time_steps(sess.step, device, min_samples=req.min_samples, max_samples=req.max_samples,
                              budget_s=budget_s, concurrency=c, target_rel_ci=req.target_rel_ci,
                              abort_below_tok_s=req.abort_below.get(str(c)),
                              before_step=lambda s=sess: _reset_if_full(s, device))
    costs["measure"] += time.perf_counter() - t0
    notes["stops"].append(f"C={c}: {len(samples)} ({why})")
    return sess, throughput_from_step_times(samples, c)


def _warm_up(sess: Any, device: str, req: MeasureRequest) -> float:
    t0 = time.perf_counter()
    n = 1
    while n < req.warmup_steps or time.perf_counter() - t0 < req.warmup_min_s:
        _reset_if_full(sess, device)
        sess.step()
        n += 1
        if n % 8 == 0:
            synchronize(device)  # so the clock above counts GPU work, not queued launches
    synchronize(device)
    sess.reset()
    return time.perf_counter() - t0


def _what_ran(sessions: dict[int, Any], req: MeasureRequest, device: str, bw: dict[str, Any],
              notes: dict[str, Any], peak_method: str) -> dict[str, str]:
    first_c, *other_cs = req.concurrency
    out = dict(sessions[first_c].what_ran())
    first = dict(out)
    for c in other_cs:  # only what differs between batch sizes, keyed op@C=c
        for op, v in sessions[c].what_ran().items():
            if first.get(op) != v:
                out[f"{op}@C={c}"] = v
    out.update({
        "measure.timer": ("CUDA events per step (synchronized)" if device.startswith("cuda")
                          else f"time.perf_counter per step, {_threads()} torch threads"),
        "measure.samples": ", ".join(notes["stops"]), "measure.apply": ", ".join(notes["applied"]),
        "measure.peak_memory": peak_method, "measure.mbu": notes["mbu"],
        "measure.bandwidth": f"{bw['bytes_per_s'] / 1e9:.1f} GB/s ({bw['method']})",
        "model": _model_line(req),
    })
    return out


def _bandwidth(state: SessionSource) -> tuple[dict[str, Any], float]:
    if state.bandwidth is not None:
        return state.bandwidth, 0.0
    t0 = time.perf_counter()
    state.bandwidth = device_bandwidth(state.device)
    return state.bandwidth, time.perf_counter() - t0


def _roofline_bytes(config: Any, batch: int) -> tuple[float | None, str]:
    from dsv4.roofline import bytes_per_step

    return float(bytes_per_step(config, batch)["total"]), "dsv4.roofline.bytes_per_step"


def _reset_if_full(sess: Any, device: str) -> None:
    # The session's KV cache holds max_new_tokens steps past the prefill; long sampling wraps around
    # to the prefilled state (untimed) instead of failing, so every sample sees a similar context.
    limit = getattr(sess, "max_new_tokens", None)
    if limit is not None and getattr(sess, "_steps", 0) >= limit:
        sess.reset()
        synchronize(device)


def _profile_into(m: Measurement, sess: Any, concurrency: int, device: str, steps: int) -> None:
    """Profile `steps` decode steps, each timed by the run itself (StepClock): the host time of the
    measurement is that wall minus the device's busy time in the same steps."""
    from autoopt.profile.host import host_line
    from autoopt.profile.trace import capture

    clock = StepClock(sess.step, device)
    prof = capture(clock, steps, device)
    prof.timed(clock.samples_s[-steps:], clock.clock)  # the last `steps` calls are the profiled ones
    for key, value in prof.measurement_fields().items():
        setattr(m, key, value)
    host = (f"; all buckets: {prof.total_ms - prof.host_ms:.2f} ms op self time + {prof.host_ms:.2f} "
            f"ms host time of dsv4:: code sections" if prof.host_ms else "")
    m.what_ran["profile"] = (f"torch.profiler ({prof.source}), {steps} steps at C={concurrency}: "
                             f"{prof.wall_ms:.2f} ms/step wall under the profiler, {prof.covered_ms:.2f} "
                             f"ms in named buckets (coverage {prof.coverage:.0%}{host})")
    m.what_ran["profile.host"] = host_line(prof.step_wall_ms, prof.device_busy_ms, prof.launches,
                                           prof.step_wall_clock, prof.source)
    if prof.notes:
        m.what_ran["profile.notes"] = "; ".join(prof.notes)


def _threads() -> int:
    import torch

    return torch.get_num_threads()


def _total(costs: dict[str, float]) -> dict[str, float]:
    costs = dict(costs)
    costs["total"] = sum(v for k, v in costs.items() if k != "total")
    return costs


def _model_line(req: MeasureRequest) -> str:
    extra = ", ".join(f"{k}={v}" for k, v in sorted(req.shape.items()))
    return f"preset {req.preset}" + (f" ({extra})" if extra else "")
