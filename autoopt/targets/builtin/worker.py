"""The worker: a child process that builds the decode path and measures it (`python -m autoopt.targets.builtin.worker`).

Why a separate process: a trial may segfault, hang in a kernel, exhaust memory or poison the CUDA
context. Any of those in the search loop's own process would end the run; in a worker they end one
trial (autoopt.targets.builtin.client turns them into a failed Measurement) and the parent starts a new worker.

Protocol: one JSON object per line. Request {"id": n, "op": ..., ...}; response
{"id": n, "ok": true, "result": ...} or {"id": n, "ok": false, "error": {"kind", "reason",
"traceback"}, "fatal": bool}. `fatal` means the worker exits right after answering (its CUDA context
is unusable). The real stdout file descriptor is reserved for the protocol: fd 1 is re-pointed at
stderr so a stray print (ours, torch's, Triton's C code) cannot corrupt a response.

Ops: hello, describe, measure (autoopt.targets.builtin.evaluate), reset, shutdown; and `fault` (segfault / exception /
hang / oom / cuda) only when AUTOOPT_TEST_HOOKS=1, so tests inject real failures.

Lifetime: the worker never outlives its parent. The client starts it as the leader of its own process
group (Triton compilers and any pool it spawns belong to it); at start it asks Linux for SIGTERM when
its parent dies (PR_SET_PDEATHSIG), and a watchdog thread ends the group when the parent's pid
changes or the parent's end of stdin closes: PR_SET_PDEATHSIG follows the parent *thread* that
spawned it, and the parent may be gone before the prctl runs. SIGTERM and SIGHUP end the whole group.

The built DecodeSessions stay alive between requests (one per batch size): switching a knob of restart
class "none" is a Python branch at the next step and must cost nothing.
"""
from __future__ import annotations

import argparse
import ctypes
import faulthandler
import gc
import json
import os
import select
import signal
import sys
import threading
import time
import traceback
from typing import Any, Callable, TextIO

from autoopt.targets.builtin.client import COMPILE_CACHE_ENV
from autoopt.targets.builtin.limits import (DoesNotFit, host_available_bytes, memory_left_by_failure, memory_refusal,
                                            release_cached_memory)

_T0 = time.perf_counter()  # interpreter start (close enough): startup cost includes the torch import

PARENT_PID_ENV = "AUTOOPT_WORKER_PARENT_PID"  # set by the client: the process this worker serves
PARENT_WATCH_S = 0.2  # how often the watchdog looks at the parent
STDIN_CLOSED_GRACE_S = 2.0  # after stdin closes, time for the request loop to end the worker itself
PR_SET_PDEATHSIG = 1  # <linux/prctl.h>

# Sessions kept at once; each holds its own weights and KV cache (a batch size per concurrency).
MAX_SESSIONS = 4


class RestartRequired(Exception):
    """The requested model shape differs from the one built here; the parent must start a new worker."""


class WorkerState:
    """What this worker has built: the device, the live sessions, one-time measurements."""

    def __init__(self, device: str) -> None:
        self.device = device
        self.sessions: dict[int, Any] = {}  # batch -> dsv4 DecodeSession
        self.shape_key: tuple | None = None  # the model shape the sessions were built for
        self.compiled: set[tuple] = set()  # recompile-class knob values JIT'ed in this process
        self.bandwidth: dict[str, Any] | None = None  # measured once (autoopt.targets.builtin.measure)
        self.env: dict[str, Any] | None = None  # fingerprint, computed once
        self.profiles = 0  # torch.profiler sessions run here (what_ran["measure.profiled_before"])
        self.held_bytes: int | None = None  # GPU memory allocated after the last measurement

    def session_for(self, config: Any, batch: int) -> tuple[Any, str, float]:
        """A session for `config` at `batch`: (session, how it was applied, seconds it took).

        How: "build" (new session), or the DecodeSession.reconfigure class: "none" | "recompile" |
        "rebuild". A different model shape raises RestartRequired.
        """
        from dsv4.knobs import KNOB_BY_NAME

        d = config.to_dict()
        shape = tuple(sorted((k, v) for k, v in d.items() if k not in KNOB_BY_NAME
                             and k != "layer_overrides"))
        if self.shape_key is not None and shape != self.shape_key:
            raise RestartRequired(f"model shape changed (worker built {dict(self.shape_key)})")
        self.shape_key = shape
        t0 = time.perf_counter()
        sess = self.sessions.get(batch)
        if sess is None:
            from dsv4.session import DecodeSession

            if len(self.sessions) >= MAX_SESSIONS:  # drop the oldest batch size; it is rebuilt on demand
                self.sessions.pop(next(iter(self.sessions)))
                gc.collect()
            sess = DecodeSession(config, device=self.device, batch=batch)
            self.sessions[batch] = sess
            how = "build"
        else:
            try:
                how = sess.reconfigure(config)
            except ValueError as exc:  # the session's own shape check: same meaning
                raise RestartRequired(str(exc)) from exc
        return sess, how, time.perf_counter() - t0

    def drop_sessions(self) -> None:
        """Forget every session (after an OOM their state is suspect); the next measure rebuilds."""
        self.sessions.clear()
        gc.collect()
        if self.device.startswith("cuda"):
            import torch

            torch.cuda.empty_cache()


def classify(exc: BaseException) -> tuple[str, bool]:
    """(failure kind, fatal) for an exception raised while serving a request.

    Kinds follow autoopt.measurement.FAILURE_KINDS. CUDA errors are fatal: after a device-side fault the
    context is unusable and every later call would fail too, so the worker exits and is replaced.
    """
    if isinstance(exc, RestartRequired):
        return "restart_required", False
    if isinstance(exc, DoesNotFit):
        return "excluded", False
    if isinstance(exc, MemoryError):
        return "oom", False
    name = type(exc).__name__
    msg = str(exc)
    if name == "OutOfMemoryError" or "out of memory" in msg.lower() or "can't allocate memory" in msg:
        return "oom", False
    if ("CUDA error" in msg or "device-side assert" in msg or "illegal memory access" in msg
            or name == "AcceleratorError"):
        return "cuda", True
    mod = type(exc).__module__
    if name == "CompilationError" or mod.startswith(("triton.compiler", "torch._dynamo", "torch._inductor")):
        return "compile", False
    return "exception", False


# ---------------------------------------------------------------- test-only fault injection

def _fault(state: WorkerState, kind: str) -> dict[str, Any]:
    """Cause a real failure of `kind`. Only reachable when AUTOOPT_TEST_HOOKS=1."""
    if kind == "segfault":
        import signal

        os.kill(os.getpid(), signal.SIGSEGV)  # a real signal death; faulthandler prints the stack
        time.sleep(10)  # not reached
    if kind == "exception":
        raise RuntimeError("injected fault: an exception inside the worker")
    if kind == "hang":
        while True:  # a kernel that never returns, as far as the parent can tell
            time.sleep(1)
    if kind == "oom":
        return _oom(state)
    if kind == "stdout_noise":  # stray output on fd 1 (C code, a print) must not reach the protocol
        print("noise from print()")
        os.write(1, b"noise written to fd 1\n")
        return {"applicable": True}
    if kind == "cuda":
        if not state.device.startswith("cuda"):
            return {"applicable": False, "reason": f"no CUDA device in this worker (device {state.device})"}
        import torch

        x = torch.zeros(4, device=state.device)
        idx = torch.tensor([1 << 20], device=state.device)
        y = x[idx]  # out-of-bounds gather: a device-side assert, raised at the next synchronize
        torch.cuda.synchronize()
        return {"applicable": True, "unexpected": float(y.sum())}
    raise ValueError(f"unknown fault kind {kind!r} (expected segfault, exception, hang, oom, cuda, "
                     "stdout_noise)")


def _oom(state: WorkerState) -> dict[str, Any]:
    """Exhaust memory with real torch allocations. On CPU a small address-space limit makes it quick
    and keeps the machine safe; on GPU the device itself is the limit."""
    import torch

    if state.device.startswith("cuda"):
        free, _total = torch.cuda.mem_get_info()
        torch.empty(int(free) * 2, dtype=torch.uint8, device=state.device)  # raises OutOfMemoryError
        return {"applicable": True, "unexpected": "allocation succeeded"}
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    with open("/proc/self/status") as f:
        vm_kib = next(int(line.split()[1]) for line in f if line.startswith("VmSize:"))
    resource.setrlimit(resource.RLIMIT_AS, ((vm_kib << 10) + (256 << 20), hard))
    chunks = []
    try:
        while True:
            chunks.append(torch.ones(16 << 20, dtype=torch.uint8))  # touched, so really resident
    finally:
        chunks.clear()
        resource.setrlimit(resource.RLIMIT_AS, (soft, hard))


def compile_cache_text() -> str:
    """Where this worker's Inductor and Triton keep their compiled kernels (the client sets them per
    study: autoopt.targets.builtin.client.with_compile_cache)."""
    return "; ".join(f"{name} {os.environ[var]}" if os.environ.get(var) else f"{name}: {var} unset (its default)"
                     for name, var in COMPILE_CACHE_ENV.items())


# ---------------------------------------------------------------- request loop

def _handle(state: WorkerState, req: dict[str, Any]) -> Any:
    op = req.get("op")
    if op == "hello":
        import torch

        return {"pid": os.getpid(), "device": state.device, "startup_s": time.perf_counter() - _T0,
                "torch_threads": torch.get_num_threads(),
                "python": sys.version.split()[0], "test_hooks": os.environ.get("AUTOOPT_TEST_HOOKS") == "1",
                "compile_cache": {name: os.environ.get(var) for name, var in COMPILE_CACHE_ENV.items()}}
    if op == "describe":
        return describe(state)
    if op == "measure":
        from autoopt.targets.builtin.evaluate import measure_request

        if req.get("fault"):  # test hook: a trial that fails, end to end through a target
            _require_hooks()
            _fault(state, str(req["fault"]))

        _refuse_if_too_large(state, req)
        doc = measure_request(state, req)
        doc.setdefault("what_ran", {})["compile_cache"] = compile_cache_text()
        memory = release_cached_memory(state.device)
        if memory:
            doc["what_ran"]["gpu_memory"], state.held_bytes = memory, memory["allocated_bytes"]
        return doc
    if op == "reset":
        state.drop_sessions()
        state.shape_key = None
        return {"sessions": 0}
    if op == "fault":
        _require_hooks()
        return _fault(state, str(req.get("kind")))
    raise ValueError(f"unknown op {op!r}")


def _refuse_if_too_large(state: WorkerState, req: dict[str, Any]) -> None:
    """Raise DoesNotFit before a session is built when the estimate exceeds the device."""
    from autoopt.targets.builtin.evaluate import build_config

    if state.device.startswith("cuda"):
        import torch

        device_bytes = torch.cuda.mem_get_info(state.device)[1]
    else:
        device_bytes = host_available_bytes()
    reason = memory_refusal(build_config(req), req.get("concurrency") or (), state.device,
                            device_bytes)
    if reason is not None:
        raise DoesNotFit(reason)


def _require_hooks() -> None:
    if os.environ.get("AUTOOPT_TEST_HOOKS") != "1":
        raise PermissionError("fault injection is a test hook: set AUTOOPT_TEST_HOOKS=1 in the worker")


def describe(state: WorkerState) -> dict[str, Any]:
    """Fingerprint, capabilities and device details, from where the measurements happen."""
    from autoopt.environment import fingerprint

    if state.env is None:
        state.env = fingerprint(state.device)
    out: dict[str, Any] = {"environment": state.env, "device": state.device}
    from dsv4 import device as dsv4_device  # packaged with autoopt (kernels/ is a source root)

    out["capabilities"] = dsv4_device.capabilities(state.device)
    out["device_info"] = dsv4_device.device_info(state.device)
    return out


def resolve_device(device: str) -> str:
    if device != "auto":
        return device
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def serve(inp: TextIO, out: TextIO, state: WorkerState,
          on_fatal: Callable[[], None] = lambda: os._exit(3)) -> None:
    """Answer requests from `inp` until shutdown or EOF (the parent went away)."""
    for line in inp:
        if not line.strip():
            continue
        try:
            req = json.loads(line)
        except json.JSONDecodeError as exc:
            out.write(json.dumps({"id": None, "ok": False, "fatal": False,
                                  "error": {"kind": "exception", "reason": f"bad request: {exc}",
                                            "traceback": ""}}) + "\n")
            out.flush()
            continue
        rid = req.get("id")
        if req.get("op") == "shutdown":
            out.write(json.dumps({"id": rid, "ok": True, "result": {"bye": True}}) + "\n")
            out.flush()
            return
        try:
            resp = {"id": rid, "ok": True, "result": _handle(state, req)}
            fatal = False
        except BaseException as exc:  # noqa: BLE001 - every failure goes back to the parent as data
            if isinstance(exc, (KeyboardInterrupt, SystemExit)):
                raise
            kind, fatal = classify(exc)
            tb = traceback.format_exc()
            print(tb, file=sys.stderr, flush=True)  # the parent keeps the stderr tail
            reason = f"{type(exc).__name__}: {exc}"[:2000]
            traceback.clear_frames(exc.__traceback__)  # the failed frames' tensors are no leak
            left = None if fatal or kind == "oom" else memory_left_by_failure(state.device, state.held_bytes)
            if kind == "oom" or left:  # after an OOM, or a failure that kept memory, the sessions are suspect
                state.drop_sessions()
                reason += f" (the worker dropped its sessions: {left})" if left else ""
            resp = {"id": rid, "ok": False, "fatal": fatal,
                    "error": {"kind": kind, "reason": reason, "traceback": tb[-4000:]}}
        out.write(json.dumps(resp, default=_json_default) + "\n")
        out.flush()
        if fatal:
            on_fatal()


def _json_default(obj: Any) -> Any:
    # numpy / torch scalars that slipped into a result: plain numbers, never a pickle
    if hasattr(obj, "item"):
        return obj.item()
    if isinstance(obj, (set, tuple)):
        return list(obj)
    return str(obj)


def _end_group(why: str) -> None:
    """Kill this worker and everything it started (its process group, when it leads one)."""
    try:
        sys.stderr.write(f"worker {os.getpid()}: {why}; ending its process group\n")
        sys.stderr.flush()
    except (OSError, ValueError):
        pass
    if os.getpgrp() == os.getpid():  # never the group of a shell that ran the worker by hand
        os.killpg(os.getpid(), signal.SIGKILL)
    os._exit(1)


def _watch_parent(parent_pid: int, stdin_fd: int) -> None:
    poller = select.poll()
    poller.register(stdin_fd, 0)  # no events asked: poll still reports POLLHUP / POLLERR / POLLNVAL
    while True:
        closed = any(ev & (select.POLLHUP | select.POLLERR | select.POLLNVAL)
                     for _fd, ev in poller.poll(PARENT_WATCH_S * 1000))
        if os.getppid() != parent_pid:
            _end_group(f"parent {parent_pid} is gone")
        if closed:  # an idle worker reads the EOF and exits cleanly (code 0) well within this
            time.sleep(STDIN_CLOSED_GRACE_S)
            _end_group("the parent closed stdin")


def die_with_parent() -> None:
    """Arrange for this process and its group to end when the parent does (see the docstring)."""
    parent_pid = int(os.environ.get(PARENT_PID_ENV) or os.getppid())
    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, lambda signum, _frame: _end_group(f"{signal.Signals(signum).name}"))
    if sys.platform.startswith("linux"):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, int(signal.SIGTERM), 0, 0, 0)
    if os.getppid() != parent_pid:  # the parent died before the prctl took effect
        _end_group(f"parent {parent_pid} is gone")
    threading.Thread(target=_watch_parent, args=(parent_pid, sys.stdin.fileno()), daemon=True,
                     name="parent-watch").start()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m autoopt.targets.builtin.worker")
    parser.add_argument("--device", default="cpu", help="cpu | cuda | cuda:N | auto")
    args = parser.parse_args(argv)
    die_with_parent()
    proto = os.fdopen(os.dup(1), "w", buffering=1)  # the protocol channel
    os.dup2(2, 1)  # anything else written to fd 1 lands in stderr
    sys.stdout = sys.stderr
    faulthandler.enable(sys.stderr)  # a segfault leaves a Python stack in the stderr tail
    import torch  # paid at startup so the restart cost is measured as one figure

    state = WorkerState(resolve_device(args.device))
    threads = os.environ.get("AUTOOPT_WORKER_THREADS")
    if threads:
        torch.set_num_threads(int(threads))
    elif state.device == "cpu":
        # One intra-op thread by default on a CPU: a decode step there is thousands of small ops that
        # gain nothing from a second thread, and on a shared machine OpenMP threads spin-waiting on a
        # descheduled partner inflate step times tenfold (tiny, C=4, 2 cores at load 5: median 20 ms
        # with 1 thread, 181 ms with 2). The figure is recorded in what_ran (measure.timer).
        torch.set_num_threads(1)
    serve(sys.stdin, proto, state)


if __name__ == "__main__":
    main()
