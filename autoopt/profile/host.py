"""Where a profiled step's wall time goes besides its buckets: device busy time, host time, launches.

- device busy: on a GPU trace the union of the step's GPU activity intervals (kernels, copies,
  memsets, "other" included; overlapping streams counted once); on a CPU-only trace the ATen ops'
  self time (the CPU is the device there: the tensor work itself).
- host time = step wall - device busy, clamped at 0. On a GPU it is the time the device waited for
  the host (Python, the dispatcher, launch calls, synchronisation); an eager decode step on the H200
  is mostly this (the committed start trace: 219 of 234 ms). On a CPU trace it is the Python,
  dispatcher and framework time between the ops; the dsv4:: code sections' share of it is already in
  their buckets (autoopt.profile.trace), so the "host" bucket is only what no bucket holds.
- launches: host calls that put work on the device. GPU: distinct correlation ids among the step's
  GPU activities (one per cudaLaunchKernel / cuLaunchKernel / cudaMemcpyAsync ..., and one per
  cudaGraphLaunch however many kernels the graph replays); an activity without a correlation id
  counts as its own launch. CPU trace: the ATen ops dispatched (every cpu_op event, nested ones too).
- the step wall: by default the ProfilerStep# spans (or, without step marks, the first-to-last
  counted event); a run that times its own profiled steps replaces it (BucketProfile.timed) and
  says with which clock.
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Any, Sequence

WALL_FROM_STEPS = "ProfilerStep# spans of the trace"
WALL_FROM_SPAN = "first to last counted event of the trace (no ProfilerStep marks)"


@dataclass(frozen=True)
class StepSplit:
    """Per step (trace totals without step marks)."""

    device_busy_ms: float
    launches: float
    kernels_by_bucket: dict[str, float]


def step_split(items: Sequence[tuple[Any, ...]], source: str, n_steps: int) -> StepSplit:
    """`items` are autoopt.profile.trace items (name, bucket, start_us, counted_us, anchor_us,
    launch key) of the counted device work: GPU activities or CPU ops, never code sections."""
    n = max(n_steps, 1)
    if source == "gpu":
        busy_us = union_length([(it[2], it[2] + it[3]) for it in items])
    else:  # CPU self times partition the ops' time (threads are summed)
        busy_us = sum(it[3] for it in items)
    keyed = {it[5] for it in items if it[5] is not None}
    unkeyed = sum(1 for it in items if it[5] is None)
    kernels = Counter(it[1] for it in items)
    return StepSplit(device_busy_ms=busy_us / 1e3 / n, launches=(len(keyed) + unkeyed) / n,
                     kernels_by_bucket={b: c / n for b, c in sorted(kernels.items())})


def host_ms(step_wall_ms: float, device_busy_ms: float) -> float:
    return max(0.0, step_wall_ms - device_busy_ms)


def host_line(step_wall_ms: float, device_busy_ms: float, launches: float, clock: str,
              source: str, unit: str = "ms/step") -> str:
    """'host 218.71 ms/step = 93% of the 234.02 ms wall (device busy 15.31 ms), 6299 launches'."""
    host = host_ms(step_wall_ms, device_busy_ms)
    share = host / step_wall_ms if step_wall_ms > 0 else 0.0
    busy = "device busy" if source == "gpu" else "ATen op time"
    calls = "launches" if source == "gpu" else "ops dispatched"
    return (f"host {host:.2f} {unit} = {share:.0%} of the {step_wall_ms:.2f} ms wall ({busy} "
            f"{device_busy_ms:.2f} ms), {launches:g} {calls}; wall: {clock}")


def union_length(intervals: list[tuple[float, float]]) -> float:
    """Total length covered by the intervals (overlaps counted once)."""
    total, cur_start, cur_end = 0.0, None, None
    for start, end in sorted(intervals):
        if cur_end is None or start > cur_end:
            if cur_end is not None:
                total += cur_end - cur_start
            cur_start, cur_end = start, end
        else:
            cur_end = max(cur_end, end)
    if cur_end is not None:
        total += cur_end - cur_start
    return total
