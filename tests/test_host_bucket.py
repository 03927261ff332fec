"""Host time as a profile figure: device busy time, host time (step wall - device busy) and launches
per step, checked on committed real traces (H200 and CPU) against figures computed here from the
raw events, on a live capture whose step sleeps on the host, and through a real profiled CPU decode
step into the measurement and a real SQLite store (old rows without the fields stay readable)."""
from __future__ import annotations

import gzip
import json
import time
from pathlib import Path

import pytest

from autoopt.measurement import HOST_BUCKET, Measurement
from autoopt.profile.trace import capture, profile_trace

REPO = Path(__file__).resolve().parents[1]
FIX = REPO / "tests" / "fixtures" / "traces"
H200_START = FIX / "h200_decode_start.json.gz"  # eager flash-slice decode step, slimmed (no CPU events)
H200_MHC = FIX / "h200_mhc_fp32.json.gz"  # 6 steps with their cudaLaunchKernel / cudaMemsetAsync calls
H200_GRAPH = REPO / "benchmarks" / "results" / "traces" / "h200_tuned_step_compile_c1.json.gz"  # CUDA graph
CPU_DECODE = FIX / "cpu_decode_fp32.json.gz"  # the tiny decode step on a CPU, 3 steps
GPU_CATS = ("kernel", "gpu_memcpy", "gpu_memset")
# the CUDA runtime/driver calls that put work on the device (what the profile counts as launches)
LAUNCH_CALLS = ("cudaLaunchKernel", "cudaLaunchKernelExC", "cuLaunchKernel", "cuLaunchKernelEx",
                "cudaGraphLaunch", "cudaMemcpyAsync", "cudaMemsetAsync")


def _events(path: Path) -> list[dict]:
    doc = json.loads(gzip.open(path).read())
    return doc["traceEvents"] if isinstance(doc, dict) else doc


def _steps(events: list[dict]) -> list[tuple[float, float]]:
    return sorted((e["ts"], e["ts"] + e["dur"]) for e in events
                  if e.get("cat") == "user_annotation" and str(e.get("name", "")).startswith("ProfilerStep#"))


def _inside(ts: float, steps: list[tuple[float, float]]) -> bool:
    return any(a <= ts <= b for a, b in steps)


def _covered(intervals: list[tuple[float, float]]) -> float:
    """Length of the union, by sweeping the sorted interval ends (a different walk from the profile's)."""
    marks = sorted([(a, 1) for a, _ in intervals] + [(b, -1) for _, b in intervals], key=lambda m: (m[0], -m[1]))
    depth, start, total = 0, 0.0, 0.0
    for t, step in marks:
        if depth == 0 and step == 1:
            start = t
        depth += step
        if depth == 0:
            total += t - start
    return total


def _expected_gpu(path: Path) -> dict[str, float]:
    """Per step, from the raw events: wall (ProfilerStep spans), busy (the union of the activities
    launched in a step; a slimmed trace without launch calls: those that start in one), launches
    (launch calls in a step; without them, the activities, one launch each) and host = wall - busy."""
    events = _events(path)
    steps = _steps(events)
    calls = {e["args"]["correlation"]: e for e in events
             if e.get("cat") in ("cuda_runtime", "cuda_driver") and e.get("name") in LAUNCH_CALLS}
    gpu = [e for e in events if e.get("cat") in GPU_CATS]
    if calls:
        in_step = [e for e in gpu if _inside(calls[e["args"]["correlation"]]["ts"], steps)]
        launches = sum(1 for c in calls.values() if _inside(c["ts"], steps))
    else:
        in_step = [e for e in gpu if _inside(e["ts"], steps)]
        launches = len(in_step)
    n = len(steps)
    wall = sum(b - a for a, b in steps) / n / 1e3
    busy = _covered([(e["ts"], e["ts"] + e["dur"]) for e in in_step]) / n / 1e3
    return {"wall": wall, "busy": busy, "host": wall - busy, "launches": launches / n}


@pytest.mark.parametrize("path", [H200_START, H200_MHC, H200_GRAPH], ids=lambda p: p.name)
def test_h200_host_time_and_launches_match_the_raw_events(path):
    want = _expected_gpu(path)
    prof = profile_trace(path)
    assert prof.step_wall_ms == pytest.approx(want["wall"], rel=1e-9)
    assert prof.device_busy_ms == pytest.approx(want["busy"], rel=1e-9)
    assert prof.step_host_ms == pytest.approx(want["host"], rel=1e-9)
    assert prof.launches == pytest.approx(want["launches"])
    fields = prof.measurement_fields()
    assert fields["host_ms"] == pytest.approx(want["host"], rel=1e-9)
    assert fields["launches_per_step"] == pytest.approx(want["launches"])
    assert fields["step_wall_clock"] == "ProfilerStep# spans of the trace"
    # the host bucket is the wall no kernel bucket holds: the buckets add up to the step's wall
    assert sum(fields["buckets_ms"].values()) == pytest.approx(want["wall"], rel=1e-6)


def test_h200_eager_start_is_host_bound_and_a_graph_is_one_launch():
    start, graph = profile_trace(H200_START), profile_trace(H200_GRAPH)
    assert start.step_host_ms / start.step_wall_ms > 0.9  # 219 of 234 ms: the GPU waits on the host
    assert start.launches == start.kernel_count == 6299  # eager: one launch per kernel
    assert graph.kernel_count == 533 and graph.launches == 2  # cudaGraphLaunch + one cudaMemcpyAsync
    assert sum(graph.kernels_by_bucket.values()) == pytest.approx(graph.kernel_count)


def test_cpu_trace_host_is_wall_minus_the_ops_time():
    """On a CPU trace the device is the CPU: busy = the ATen ops' time (the union of each thread's
    op intervals, computed here), host = the rest of the wall; its dsv4:: sections' share is already
    in their buckets, so the host bucket is what no bucket holds."""
    events = _events(CPU_DECODE)
    steps = _steps(events)
    ops = [e for e in events if e.get("cat") == "cpu_op" and _inside(e["ts"], steps)]
    threads = {(e["pid"], e["tid"]) for e in ops}
    busy_us = sum(_covered([(e["ts"], e["ts"] + e["dur"]) for e in ops if (e["pid"], e["tid"]) == t])
                  for t in threads)
    n = len(steps)
    wall, busy = sum(b - a for a, b in steps) / n / 1e3, busy_us / n / 1e3
    prof = profile_trace(CPU_DECODE)
    assert prof.device_busy_ms == pytest.approx(busy, rel=1e-3)
    assert prof.step_host_ms == pytest.approx(wall - busy, rel=1e-2)
    assert prof.launches == pytest.approx(len(ops) / n)  # every ATen op dispatched
    fields = prof.measurement_fields()
    assert fields["buckets_ms"][HOST_BUCKET] == pytest.approx(max(0.0, wall - prof.total_ms), abs=1e-6)
    assert fields["buckets_ms"][HOST_BUCKET] < prof.step_host_ms - prof.host_ms + 1e-6


def test_trace_without_step_marks_has_no_host_figures(tmp_path):
    events = [e for e in _events(H200_MHC) if not str(e.get("name", "")).startswith("ProfilerStep#")]
    path = tmp_path / "nosteps.json"
    path.write_text(json.dumps({"traceEvents": events}))
    fields = profile_trace(path).measurement_fields()
    assert HOST_BUCKET not in fields["buckets_ms"] and "host_ms" not in fields


def test_a_step_that_sleeps_on_the_host_is_timed_and_split():
    """A live capture whose step sleeps 20 ms besides one small matmul: the run's own clock times
    the profiled steps, and the sleep lands in host time, not in device busy time."""
    import torch

    from autoopt.targets.builtin.measure import StepClock

    a = torch.randn(64, 64)

    def step():
        time.sleep(0.02)
        return a @ a

    clock = StepClock(step, "cpu")
    prof = capture(clock, steps=3, device="cpu")
    prof.timed(clock.samples_s[-3:], clock.clock)
    assert len(clock.samples_s) == 4  # one warm-up call, three profiled
    assert prof.step_wall_ms >= 20.0 and "perf_counter" in prof.step_wall_clock
    assert prof.step_host_ms >= 19.0 and prof.device_busy_ms < prof.step_wall_ms - 19.0
    assert prof.step_host_ms == pytest.approx(prof.step_wall_ms - prof.device_busy_ms)


@pytest.fixture(scope="module")
def cpu_profiled() -> Measurement:
    """One real profiled measurement of the tiny decode step on this CPU (the worker's own code)."""
    from autoopt.targets.builtin.evaluate import measure_request
    from autoopt.targets.builtin.worker import WorkerState

    state = WorkerState("cpu")
    try:
        doc = measure_request(state, {"preset": "tiny", "config": {}, "concurrency": [1], "guard": False,
                                      "min_samples": 3, "max_samples": 3, "warmup_steps": 1,
                                      "warmup_min_s": 0.0, "profile": True, "profile_steps": 2})
    finally:
        state.drop_sessions()
    return Measurement.from_dict(doc)


def test_a_profiled_cpu_decode_step_carries_its_host_split(cpu_profiled):
    m = cpu_profiled
    assert m.status == "ok", m.failure
    assert "perf_counter" in m.step_wall_clock and "profiled step" in m.step_wall_clock
    assert 0 < m.device_busy_ms < m.step_wall_ms
    assert m.host_ms == pytest.approx(m.step_wall_ms - m.device_busy_ms)
    kernels = sum(v for b, v in m.buckets_ms.items() if b != HOST_BUCKET)
    assert m.buckets_ms[HOST_BUCKET] == pytest.approx(max(0.0, m.step_wall_ms - kernels), abs=1e-6)
    assert m.launches_per_step == pytest.approx(sum(m.kernels_by_bucket.values()))
    assert abs(m.launches_per_step - m.kernel_count) <= 1  # CPU: every op is a dispatch
    assert "host" in m.what_ran["profile.host"] and m.step_wall_clock in m.what_ran["profile.host"]


def test_the_store_keeps_the_host_split_and_reads_old_rows(tmp_path, cpu_profiled):
    from autoopt.store import Store
    from autoopt.trial import TrialResult

    old = Measurement.from_dict({k: v for k, v in cpu_profiled.to_dict().items()
                                 if k not in ("step_wall_ms", "step_wall_clock", "device_busy_ms", "host_ms",
                                              "launches_per_step", "kernels_by_bucket")})
    with Store.open(str(tmp_path / "t.sqlite")) as store:
        for number, m in enumerate((cpu_profiled, old)):
            handle = store.begin_trial(None, "host", {"n": number}, {}, None)
            tp = m.tok_per_s["1"]
            store.finish_trial(handle, m, TrialResult("ok", tp.median, (tp.ci_low, tp.ci_high)))
    with Store.open(str(tmp_path / "t.sqlite")) as store:
        new_back, old_back = (store.trial("host", n).measurement for n in (0, 1))
    for key in ("step_wall_ms", "step_wall_clock", "device_busy_ms", "host_ms", "launches_per_step",
                "kernels_by_bucket", "buckets_ms"):
        assert getattr(new_back, key) == pytest.approx(getattr(cpu_profiled, key)), key
    assert old_back.host_ms is None and old_back.step_wall_ms is None and old_back.kernels_by_bucket == {}
