"""No worker outlives its parent, and no configuration the device cannot hold is built.

A real parent process (a python script holding a real WorkerClient whose worker is busy in a
request, as during a long measurement) is killed with SIGTERM and with SIGKILL; the worker must be
gone within a few seconds. And `autoopt measure` refuses a concurrency whose estimated memory
(dsv4.roofline.memory_bytes) exceeds the host's, before a worker starts.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import dsv4
from autoopt.targets.builtin.client import WorkerClient, WorkerFailure
from autoopt.targets.builtin.limits import host_available_bytes, memory_refusal
from dsv4.roofline import memory_bytes

ROOT = Path(__file__).resolve().parents[1]
GONE_WITHIN_S = 15.0  # the watchdog looks every 0.2 s; the rest is a loaded 2-core machine

PARENT = """
import os, sys
from autoopt.targets.builtin.client import WorkerClient
client = WorkerClient("cpu", env=dict(os.environ, AUTOOPT_TEST_HOOKS="1"), startup_timeout_s=170)
client.start()
print(client.pid, flush=True)
client.request("fault", kind="hang", timeout_s=600)  # the worker is busy: it reads no stdin
"""


def _alive(pid: int) -> bool:
    """Running or sleeping; a zombie (state Z, waiting for init to reap it) is dead."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state not in ("Z", "X")


def _wait_gone(pid: int, limit_s: float) -> float | None:
    t0 = time.monotonic()
    while time.monotonic() - t0 < limit_s:
        if not _alive(pid):
            return time.monotonic() - t0
        time.sleep(0.1)
    return None


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL])
def test_busy_worker_dies_with_its_parent(sig):
    parent = subprocess.Popen([sys.executable, "-c", PARENT], stdout=subprocess.PIPE, text=True,
                              cwd=ROOT, env=dict(os.environ, PYTHONPATH=str(ROOT)))
    worker_pid = None
    try:
        worker_pid = int(parent.stdout.readline())
        assert _alive(worker_pid)
        time.sleep(0.5)  # the hang request is in flight
        parent.send_signal(sig)
        assert parent.wait(timeout=30) == -sig
        took = _wait_gone(worker_pid, GONE_WITHIN_S)
        assert took is not None, f"worker {worker_pid} outlived its parent's {sig.name}"
    finally:
        parent.kill()
        if worker_pid and _alive(worker_pid):
            os.kill(worker_pid, signal.SIGKILL)  # only the worker this test started


def test_close_ends_the_workers_group_and_a_hung_worker():
    client = WorkerClient("cpu", env=dict(os.environ, AUTOOPT_TEST_HOOKS="1"), startup_timeout_s=170)
    client.start()
    pid = client.pid
    assert os.getpgid(pid) == pid  # its own process group, which kill() ends whole
    with pytest.raises(WorkerFailure) as info:
        client.request("fault", kind="hang", timeout_s=2)
    assert info.value.kind == "hang"
    client.close()
    assert _wait_gone(pid, 5) is not None


# ---------------------------------------------------------------- memory refusal

def test_memory_estimate_counts_weights_caches_and_activations():
    tiny = dsv4.preset("tiny")
    one, many = memory_bytes(tiny, 1), memory_bytes(tiny, 1000)
    assert one["weights"] == many["weights"] > 0
    assert many["kv_cache"] == pytest.approx(1000 * one["kv_cache"])
    assert many["total"] == many["weights"] + many["kv_cache"] + many["activations"]
    # flash-slice weights: ~12.5 GiB of bf16 (the H200 holds them; the roofline reads them per step)
    assert 10 * 2 ** 30 < memory_bytes(dsv4.preset("flash-slice"), 1)["weights"] < 16 * 2 ** 30
    assert memory_refusal(tiny, (1, 4), "cpu", 2 ** 30) is None
    reason = memory_refusal(tiny, (1, 10 ** 6), "cpu", 2 ** 30)
    assert reason.startswith("concurrency 1000000 needs about ") and "KV caches" in reason


def _too_many_for_this_host() -> int:
    per_sequence = memory_bytes(dsv4.preset("tiny"), 1)["kv_cache"]
    return int(2 * host_available_bytes() / per_sequence)


def test_measure_refuses_a_concurrency_the_host_cannot_hold():
    n = _too_many_for_this_host()
    t0 = time.monotonic()
    r = subprocess.run([sys.executable, "-m", "autoopt.cli", "measure", "--concurrency", f"1,{n}"],
                       capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert r.returncode == 2, (r.stdout, r.stderr)
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: concurrency {n} needs about "), r.stderr
    assert "Traceback" not in r.stderr and time.monotonic() - t0 < 60  # no worker was started


def test_the_worker_refuses_it_too_so_a_run_records_a_failed_trial():
    n = _too_many_for_this_host()
    with WorkerClient("cpu", startup_timeout_s=170) as client:
        with pytest.raises(WorkerFailure) as info:
            client.request("measure", timeout_s=120, preset="tiny", config={}, concurrency=[n])
        assert info.value.kind == "excluded" and not info.value.dead
        assert f"concurrency {n} needs about" in info.value.reason
        assert json.dumps(client.request("hello", timeout_s=30))  # still serving
