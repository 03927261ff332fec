"""Timing primitives inside the worker: device synchronisation, the device's memory bandwidth, peak
memory, and the timed-steps loop with its stop rules (autoopt.targets.builtin.evaluate puts them
together for one configuration).

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

from autoopt.measurement import throughput_from_step_times



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

class StepClock:
    """A step function that times every call of itself: time.perf_counter around the step and a
    device synchronize, so a GPU step's figure is its wall time with its kernels finished (what
    host time = step wall - device busy needs). Used for the profiled steps, whose wall must come
    from the profiled run itself: the timed steps ran without the profiler's overhead."""

    def __init__(self, step_fn: Callable[[], Any], device: str) -> None:
        self.step_fn, self.device = step_fn, device
        self.samples_s: list[float] = []
        sync = ", then torch.cuda.synchronize" if device.startswith("cuda") else ""
        self.clock = f"time.perf_counter around each profiled step{sync}, under torch.profiler"

    def __call__(self) -> Any:
        t0 = time.perf_counter()
        out = self.step_fn()
        synchronize(self.device)
        self.samples_s.append(time.perf_counter() - t0)
        return out


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
