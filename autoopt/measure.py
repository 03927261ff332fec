"""Measuring one configuration, inside the worker: guard, then timed decode steps per concurrency,
then an optional profile. Returns a Measurement document (autoopt.results).

Timing: warm-up steps are discarded (the first after a build/recompile is JIT and counted as compile
cost), at least `warmup_steps` of them and for at least `warmup_min_s` (default 0.5 s): clocks ramp
up from idle (nvidia-smi shows the H200's SM clock at 345 MHz between calls; one trace of a fresh
CPU worker here ran its first 0.3 s of tiny steps at 30 ms against 17 ms after, so three warm-up
steps could time the ramp). It does not remove this 2-core VM's own scatter: back-to-back fresh
workers still read 120-260 tok/s for one config. The session is then reset, so every config is
timed from the same KV-cache length. Then each timed step is bracketed by CUDA events on a GPU (synchronized per step, so samples are
independent) or by time.perf_counter on a CPU. Sampling stops once the 95% CI of the median step time
is within `target_rel_ci`, at `max_samples`, when the time budget is spent, or early when the config
is a clear loser against `abort_below` (its CI top is under the incumbent's figure).

MBU = roofline bytes per step / median step time / the device's bandwidth, measured once per worker
with a large copy (bytes read + written, the STREAM convention), recorded beside the figure.
"""
from __future__ import annotations

import resource
import time
from typing import Any, Callable

from autoopt.results import Measurement, throughput_from_step_times

COST_KEYS = ("restart", "build", "compile", "warmup", "measure", "guard", "profile", "total")
WARMUP_MIN_S = 0.5  # seconds of warm-up at least (module docstring: clocks ramp up from idle)


# ---------------------------------------------------------------- device primitives

def synchronize(device: str) -> None:
    if device.startswith("cuda"):
        import torch

        torch.cuda.synchronize(device)


def device_bandwidth(device: str, nbytes: int | None = None, reps: int = 5) -> dict[str, Any]:
    """Achievable memory bandwidth of `device`: best of `reps` copies of a large buffer.

    GPU: a 1 GiB device-to-device copy timed with CUDA events. CPU: a 128 MiB memcpy (torch copy_)
    timed with perf_counter. Bytes counted = read + written.
    """
    import torch

    gpu = device.startswith("cuda")
    nbytes = nbytes or ((1 << 30) if gpu else (128 << 20))
    src = torch.empty(nbytes, dtype=torch.uint8, device=device).fill_(1)
    dst = torch.empty_like(src)
    dst.copy_(src)  # first touch: page faults / lazy allocation are not bandwidth
    best = float("inf")
    for _ in range(reps):
        if gpu:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            dst.copy_(src)
            end.record()
            end.synchronize()
            best = min(best, start.elapsed_time(end) / 1e3)
        else:
            t0 = time.perf_counter()
            dst.copy_(src)
            best = min(best, time.perf_counter() - t0)
    del src, dst
    method = (f"device-to-device copy of {nbytes >> 20} MiB, CUDA events" if gpu
              else f"memcpy of {nbytes >> 20} MiB (torch copy_, {torch.get_num_threads()} threads)")
    return {"bytes_per_s": 2 * nbytes / best, "method": method + ", best of "
            f"{reps}, read+write bytes", "bytes": nbytes}


class PeakMemory:
    """Peak memory over a span of work. GPU: torch.cuda.max_memory_allocated (tensors only). CPU: the
    kernel's VmHWM (peak resident set) after resetting it through /proc/self/clear_refs, which covers the
    whole worker process including the torch runtime; where the reset is refused, ru_maxrss, the
    process-lifetime peak. `method` says which one the figure is."""

    def __init__(self, device: str) -> None:
        self.device = device
        self.method = ""

    def start(self) -> None:
        if self.device.startswith("cuda"):
            import torch

            torch.cuda.reset_peak_memory_stats(self.device)
            self.method = "torch.cuda.max_memory_allocated (tensor bytes on the GPU)"
            return
        try:
            with open("/proc/self/clear_refs", "w") as f:
                f.write("5")  # 5 = reset the peak RSS to the current RSS
            self.method = "VmHWM (worker peak RSS during this measurement, incl. runtime)"
        except OSError:
            self.method = "ru_maxrss (worker process-lifetime peak RSS, incl. runtime)"

    def peak_bytes(self) -> int:
        if self.device.startswith("cuda"):
            import torch

            return int(torch.cuda.max_memory_allocated(self.device))
        if self.method.startswith("VmHWM"):
            with open("/proc/self/status") as f:
                for line in f:
                    if line.startswith("VmHWM:"):
                        return int(line.split()[1]) << 10
        return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) << 10  # KiB on Linux


# ---------------------------------------------------------------- timing

def time_steps(step_fn: Callable[[], Any], device: str, *, min_samples: int = 10,
               max_samples: int = 40, budget_s: float = 60.0, target_rel_ci: float = 0.02,
               concurrency: int = 1, abort_below_tok_s: float | None = None,
               before_step: Callable[[], Any] | None = None) -> tuple[list[float], str]:
    """Per-step seconds of `step_fn` and why sampling stopped ("converged", "max_samples",
    "budget", "clear_loser"). At least min(min_samples, max_samples) samples unless the budget ends
    first (then at least 3, so a median exists). `before_step` runs untimed before each step (e.g. a
    KV-cache reset when the session's cache is full)."""
    gpu = device.startswith("cuda")
    if gpu:
        import torch

        start_ev = torch.cuda.Event(enable_timing=True)
        end_ev = torch.cuda.Event(enable_timing=True)
    samples: list[float] = []
    t_begin = time.perf_counter()
    min_samples = min(min_samples, max_samples)
    while True:
        if before_step is not None:
            before_step()
        if gpu:
            start_ev.record()
            step_fn()
            end_ev.record()
            end_ev.synchronize()
            samples.append(start_ev.elapsed_time(end_ev) / 1e3)
        else:
            t0 = time.perf_counter()
            step_fn()
            samples.append(time.perf_counter() - t0)
        n = len(samples)
        if n >= max_samples:
            return samples, "max_samples"
        if time.perf_counter() - t_begin > budget_s and n >= min(3, min_samples):
            return samples, "budget"
        if n < max(min_samples, 6):  # 6: fewest samples with a 95% CI narrower than the range
            continue
        tp = throughput_from_step_times(samples, concurrency)
        if abort_below_tok_s is not None and tp.ci_high < abort_below_tok_s:
            return samples, "clear_loser"
        if tp.rel_halfwidth <= target_rel_ci:
            return samples, "converged"


# ---------------------------------------------------------------- one configuration

def build_config(req: dict[str, Any]) -> Any:
    """DecodeConfig from a request: preset + shape overrides + knob values + layer overrides."""
    from dsv4.config import preset
    from dsv4.knobs import KNOB_BY_NAME, coerce_value

    cfg = dict(req.get("config") or {})
    overrides = [tuple(t) for t in cfg.pop("layer_overrides", None) or ()]
    knobs = {}
    for name, value in cfg.items():
        if name not in KNOB_BY_NAME:
            raise ValueError(f"unknown knob {name!r}")
        knobs[name] = coerce_value(KNOB_BY_NAME[name], value)
    overrides = tuple((int(layer), k, coerce_value(KNOB_BY_NAME[k], v)) if k in KNOB_BY_NAME
                      else (int(layer), k, v) for layer, k, v in overrides)
    return preset(req.get("preset", "tiny"), **(req.get("shape") or {}), **knobs,
                  layer_overrides=overrides)


def _bandwidth(state: Any) -> tuple[dict[str, Any], float]:
    if state.bandwidth is not None:
        return state.bandwidth, 0.0
    t0 = time.perf_counter()
    state.bandwidth = device_bandwidth(state.device)
    return state.bandwidth, time.perf_counter() - t0


def _roofline_bytes(config: Any, batch: int) -> tuple[float | None, str]:
    try:
        from dsv4.roofline import bytes_per_step
    except ImportError as exc:
        return None, f"unavailable: {exc}"
    return float(bytes_per_step(config, batch)["total"]), "dsv4.roofline.bytes_per_step"


def measure_request(state: Any, req: dict[str, Any]) -> dict[str, Any]:
    """Serve a worker `measure` request; returns Measurement.to_dict(). Exceptions propagate to the
    worker loop, which reports them as a failure of the right kind."""
    device = state.device
    config = build_config(req)
    concurrency = [int(c) for c in req.get("concurrency") or (1,)]
    min_samples = int(req.get("min_samples", 10))
    max_samples = int(req.get("max_samples", 40))
    warmup_steps = max(int(req.get("warmup_steps", 3)), 1)
    warmup_min_s = max(float(req.get("warmup_min_s", WARMUP_MIN_S)), 0.0)
    budget_s = float(req.get("time_limit_s", 300.0)) * 0.5 / len(concurrency)
    abort_below = {str(k): float(v) for k, v in (req.get("abort_below") or {}).items()}
    costs = dict.fromkeys(COST_KEYS, 0.0)
    what_ran: dict[str, str] = {}
    bw, costs["restart"] = _bandwidth(state)
    env = dict(state.env or {})
    if not env:
        from autoopt.environment import fingerprint

        env = state.env = fingerprint(device)
    env = {**env, "mem_bandwidth_bytes_per_s": bw["bytes_per_s"], "mem_bandwidth_method": bw["method"],
           "torch_threads": _threads()}

    correctness: dict[str, Any] = {}
    if req.get("guard", True):
        from dsv4.guard import check

        t0 = time.perf_counter()
        correctness = dict(check(config, device=device, batch=2, steps=3))
        costs["guard"] = time.perf_counter() - t0
    else:
        what_ran["guard"] = "skipped (request said guard=false)"
    wrong = correctness.get("verdict") not in (None, "ok")
    config_doc = {**config.knobs(), "layer_overrides": [list(t) for t in config.layer_overrides]}
    if wrong and not req.get("measure_if_wrong", True):
        return Measurement(status="wrong", config=config_doc, correctness=correctness,
                           costs_s=_total(costs), what_ran=what_ran, environment=env).to_dict()

    peak = PeakMemory(device)
    peak.start()
    tok_per_s, mbu, applied, stops = {}, {}, [], []
    sessions: dict[int, Any] = {}
    for c in concurrency:
        sess, how, apply_s = state.session_for(config, c)
        sessions[c] = sess
        applied.append(f"C={c}: {how}")
        costs["compile" if how == "recompile" else "build"] += apply_s
        sess.reset()  # every config is timed from the same KV-cache length
        t0 = time.perf_counter()
        sess.step()
        synchronize(device)
        first_s = time.perf_counter() - t0
        costs["warmup" if how == "none" else "compile"] += first_s  # first step after a change: JIT
        t0 = time.perf_counter()
        n = 1
        while n < warmup_steps or time.perf_counter() - t0 < warmup_min_s:
            _reset_if_full(sess, device)
            sess.step()
            n += 1
            if n % 8 == 0:
                synchronize(device)  # so the clock above counts GPU work, not queued launches
        synchronize(device)
        sess.reset()
        costs["warmup"] += time.perf_counter() - t0
        t0 = time.perf_counter()
        samples, why = time_steps(sess.step, device, min_samples=min_samples, max_samples=max_samples,
                                  budget_s=budget_s, concurrency=c,
                                  target_rel_ci=float(req.get("target_rel_ci", 0.02)),
                                  abort_below_tok_s=abort_below.get(str(c)),
                                  before_step=lambda s=sess: _reset_if_full(s, device))
        costs["measure"] += time.perf_counter() - t0
        stops.append(f"C={c}: {len(samples)} ({why})")
        tp = throughput_from_step_times(samples, c)
        tok_per_s[str(c)] = tp
        roof, roof_how = _roofline_bytes(config, c)
        if roof is not None:
            mbu[str(c)] = roof / (c / tp.median) / bw["bytes_per_s"]  # c / tok_per_s = median step s
    peak_bytes = peak.peak_bytes()

    first = sessions[concurrency[0]].what_ran()
    what_ran.update(first)
    for c in concurrency[1:]:  # only what differs between batch sizes, keyed op@C=c
        for op, v in sessions[c].what_ran().items():
            if first.get(op) != v:
                what_ran[f"{op}@C={c}"] = v
    what_ran.update({
        "measure.timer": ("CUDA events per step (synchronized)" if device.startswith("cuda")
                          else f"time.perf_counter per step, {_threads()} torch threads"),
        "measure.samples": ", ".join(stops), "measure.apply": ", ".join(applied),
        "measure.peak_memory": peak.method, "measure.mbu": roof_how,
        "measure.bandwidth": f"{bw['bytes_per_s'] / 1e9:.1f} GB/s ({bw['method']})",
        "model": _model_line(req),
    })

    m = Measurement(status="wrong" if wrong else "ok", config=config_doc, tok_per_s=tok_per_s, mbu=mbu,
                    correctness=correctness, peak_memory_bytes=peak_bytes, what_ran=what_ran,
                    environment=env)
    if req.get("profile"):
        pc = int(req.get("profile_concurrency") or max(concurrency))
        sess = sessions.get(pc) or state.session_for(config, pc)[0]
        t0 = time.perf_counter()
        sess.reset()  # the profile sees the same context length as the timed steps
        _profile_into(m, sess, pc, device, int(req.get("profile_steps", 3)))
        costs["profile"] = time.perf_counter() - t0
    m.costs_s = _total(costs)
    return m.to_dict()


def _reset_if_full(sess: Any, device: str) -> None:
    # The session's KV cache holds max_new_tokens steps past the prefill; long sampling wraps around
    # to the prefilled state (untimed) instead of failing, so every sample sees a similar context.
    limit = getattr(sess, "max_new_tokens", None)
    if limit is not None and getattr(sess, "_steps", 0) >= limit:
        sess.reset()
        synchronize(device)


def _profile_into(m: Measurement, sess: Any, concurrency: int, device: str, steps: int) -> None:
    try:
        from autoopt.profile import capture
    except ImportError as exc:  # recorded, never silently skipped
        m.what_ran["profile"] = f"unavailable: {exc}"
        return
    prof = capture(sess.step, steps, device)
    m.buckets_ms = {k: float(v) for k, v in prof.buckets_ms.items()}
    m.bucket_coverage = float(prof.coverage)
    m.kernel_count = int(prof.kernel_count)
    host = (f"; all buckets: {prof.total_ms - prof.host_ms:.2f} ms op self time + {prof.host_ms:.2f} "
            f"ms host time of dsv4:: code sections" if prof.host_ms else "")
    m.what_ran["profile"] = (f"torch.profiler ({prof.source}), {steps} steps at C={concurrency}: "
                             f"{prof.wall_ms:.2f} ms/step wall under the profiler, {prof.covered_ms:.2f} "
                             f"ms in named buckets (coverage {prof.coverage:.0%}{host})")
    if prof.notes:
        m.what_ran["profile.notes"] = "; ".join(prof.notes)


def _threads() -> int:
    import torch

    return torch.get_num_threads()


def _total(costs: dict[str, float]) -> dict[str, float]:
    costs = dict(costs)
    costs["total"] = sum(v for k, v in costs.items() if k != "total")
    return costs


def _model_line(req: dict[str, Any]) -> str:
    shape = req.get("shape") or {}
    extra = ", ".join(f"{k}={v}" for k, v in sorted(shape.items()))
    return f"preset {req.get('preset', 'tiny')}" + (f" ({extra})" if extra else "")

