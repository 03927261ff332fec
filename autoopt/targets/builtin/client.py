"""Parent side of the worker: spawn `python -m autoopt.targets.builtin.worker`, send requests, and turn every way a
worker can fail into a structured WorkerFailure (kind, reason, the child's stderr tail).

Failure kinds (autoopt.measurement.FAILURE_KINDS): "crash" (died: a signal or an exit), "hang" (no answer
within the timeout: the process group is killed), "oom", "cuda", "compile", "exception" (raised inside
the worker and reported by it). The parent never dies with its worker: callers catch WorkerFailure
and record it (BuiltinTarget makes it a failed Measurement), then start a fresh worker.

Nor does the worker outlive the parent: it leads its own process group, which `close` and `kill`
end whole (whatever the worker spawned goes with it), and at exit this process kills the groups of
the clients still open; when the parent dies without running any of that (SIGKILL, a crash), the
worker ends its group itself (autoopt.targets.builtin.worker.die_with_parent, told the parent's pid).
A worker started from a thread other than the main one dies when that thread exits (Linux's
PR_SET_PDEATHSIG follows the thread): start workers from a thread that lives as long as they do.

This module imports no torch: the parent (the CLI, the search loop) stays light.
"""
from __future__ import annotations

import atexit
import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
import weakref
from collections import deque
from pathlib import Path
from typing import Any

STDERR_TAIL_LINES = 200
STDERR_TAIL_CHARS = 4000
PARENT_PID_ENV = "AUTOOPT_WORKER_PARENT_PID"  # read by autoopt.targets.builtin.worker

COMPILE_CACHE_ENV = {"inductor": "TORCHINDUCTOR_CACHE_DIR", "triton": "TRITON_CACHE_DIR"}

_OPEN_CLIENTS: "weakref.WeakSet[WorkerClient]" = weakref.WeakSet()


CUPTI_TEARDOWN_ENV = "TEARDOWN_CUPTI"  # read by Kineto (torch.profiler's back-end)


def with_compile_cache(env: dict[str, str] | None, directory: Path) -> dict[str, str]:
    """`env` (None: this process's) with Inductor's and Triton's on-disk caches under `directory`
    (made here), so the workers started with it reuse what earlier ones compiled there. A cache
    directory already set in the environment is kept: the user chose it. The worker reports which it
    used (what_ran["compile_cache"])."""
    out = dict(os.environ if env is None else env)
    for name, var in COMPILE_CACHE_ENV.items():
        if not out.get(var):
            out[var] = str(directory / name)
        Path(out[var]).mkdir(parents=True, exist_ok=True)
    return out


@atexit.register
def _kill_open_workers() -> None:
    for client in list(_OPEN_CLIENTS):
        client.kill()


class WorkerFailure(Exception):
    """A request did not produce a result. `dead` is true when the worker process is gone."""

    def __init__(self, kind: str, reason: str, stderr_tail: str = "", dead: bool = False) -> None:
        super().__init__(f"{kind}: {reason}")
        self.kind = kind
        self.reason = reason
        self.stderr_tail = stderr_tail
        self.dead = dead


def _signal_name(returncode: int) -> str:
    try:
        return signal.Signals(-returncode).name
    except ValueError:
        return f"signal {-returncode}"


class WorkerClient:
    """One worker process. `start()` blocks until it answers `hello` (torch imported); its seconds
    are the restart cost. Requests are serial, like the worker."""

    def __init__(self, device: str = "cpu", env: dict[str, str] | None = None,
                 startup_timeout_s: float = 180.0, python: str = sys.executable) -> None:
        self.device = device
        self.env = env
        self.startup_timeout_s = startup_timeout_s
        self.python = python
        self.proc: subprocess.Popen | None = None
        self.hello: dict[str, Any] = {}
        self.start_s: float | None = None
        self._next_id = 0
        self._out: queue.Queue = queue.Queue()
        self._err: deque[str] = deque(maxlen=STDERR_TAIL_LINES)
        self._threads: list[threading.Thread] = []

    # ------------------------------------------------------------ lifecycle

    def start(self) -> float:
        """Spawn the worker and wait for its hello; returns the seconds it took (the restart cost).
        Raises WorkerFailure when it dies or hangs before answering."""
        env = dict(os.environ if self.env is None else self.env)
        env.setdefault("PYTHONUNBUFFERED", "1")
        # torch.profiler leaves CUPTI attached after a profile unless Kineto is told to finalize it:
        # every later kernel launch in the process pays its callbacks. On the H200 the worker that
        # profiled read 8-20 % slower than its twin on every later trial (h200_live_10m runs 5-7;
        # benchmarks/profiler_aftereffect.py measures it). A value the user set is kept; an empty
        # one leaves the choice to Kineto's own default.
        env.setdefault(CUPTI_TEARDOWN_ENV, "1")
        if not env[CUPTI_TEARDOWN_ENV]:
            del env[CUPTI_TEARDOWN_ENV]
        env[PARENT_PID_ENV] = str(os.getpid())
        t0 = time.perf_counter()
        # A new session: the worker and anything it spawns (Triton compilers) form one process
        # group that a timeout can kill without touching the parent.
        self.proc = subprocess.Popen(
            [self.python, "-m", "autoopt.targets.builtin.worker", "--device", self.device],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            text=True, bufsize=1, env=env, start_new_session=True)
        _OPEN_CLIENTS.add(self)
        self._threads = [
            threading.Thread(target=self._pump, args=(self.proc.stdout, self._out), daemon=True),
            threading.Thread(target=self._pump_err, args=(self.proc.stderr,), daemon=True),
        ]
        for t in self._threads:
            t.start()
        self.hello = self.request("hello", timeout_s=self.startup_timeout_s)
        self.device = self.hello.get("device", self.device)  # "auto" resolved by the worker
        self.start_s = time.perf_counter() - t0
        return self.start_s

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc else None

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def close(self, timeout_s: float = 10.0) -> None:
        """Ask the worker to exit; kill it if it does not within `timeout_s`."""
        if not self.alive:
            self.kill()
            self._reap()
            return
        try:
            self.request("shutdown", timeout_s=timeout_s)
        except WorkerFailure:
            pass  # already killed by request() on timeout, or dead: nothing left to do
        try:
            self.proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            pass
        self.kill()  # the worker has exited (or will now): end what it left in its group
        self._reap()

    def kill(self) -> None:
        """SIGKILL the worker's process group (only processes this client started), also after
        the worker itself exited: its pid stays reserved while its group has members."""
        if self.proc is None:
            return
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass  # the group is empty and gone
        self.proc.wait(timeout=30)
        _OPEN_CLIENTS.discard(self)

    def _reap(self) -> None:
        for t in self._threads:
            t.join(timeout=2)
        for stream in (self.proc.stdin, self.proc.stdout, self.proc.stderr) if self.proc else ():
            try:
                stream.close()
            except OSError:
                pass

    # ------------------------------------------------------------ I/O

    @staticmethod
    def _pump(stream, q: queue.Queue) -> None:
        for line in stream:
            q.put(line)
        q.put(None)  # EOF: the worker is gone (or closed stdout)

    def _pump_err(self, stream) -> None:
        for line in stream:
            self._err.append(line)
            if os.environ.get("AUTOOPT_WORKER_STDERR") == "1":  # live view when debugging
                sys.stderr.write(f"[worker {self.pid}] {line}")

    def stderr_tail(self, chars: int = STDERR_TAIL_CHARS) -> str:
        return "".join(self._err)[-chars:]

    def request(self, op: str, timeout_s: float = 600.0, **payload: Any) -> Any:
        """Send one request and return its result. Raises WorkerFailure on every kind of failure."""
        if self.proc is None:
            raise WorkerFailure("crash", "worker not started", dead=True)
        if self.proc.poll() is not None:
            raise self._death(f"before {op}")
        self._next_id += 1
        rid = self._next_id
        try:
            self.proc.stdin.write(json.dumps({"id": rid, "op": op, **payload}) + "\n")
            self.proc.stdin.flush()
        except (BrokenPipeError, OSError):
            raise self._death(f"while sending {op}") from None
        deadline = time.monotonic() + timeout_s
        while True:
            remaining = deadline - time.monotonic()
            try:
                line = self._out.get(timeout=max(remaining, 0.0)) if remaining > 0 else self._out.get_nowait()
            except queue.Empty:
                self.kill()
                self._settle_stderr()
                raise WorkerFailure("hang", f"no answer to {op!r} within {timeout_s:.0f} s; worker "
                                    f"(pid {self.proc.pid}) killed", self.stderr_tail(), dead=True) from None
            if line is None:
                raise self._death(f"during {op}")
            try:
                resp = json.loads(line)
            except json.JSONDecodeError:
                self._err.append(f"[non-protocol stdout] {line}")  # cannot happen (fd 1 re-pointed)
                continue
            if resp.get("id") != rid:
                continue  # an answer to an earlier request abandoned by a caller; not ours
            if resp.get("ok"):
                return resp.get("result")
            err = resp.get("error") or {}
            dead = bool(resp.get("fatal"))
            if dead:
                try:
                    self.proc.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    self.kill()
            self._settle_stderr()
            tail = self.stderr_tail()
            raise WorkerFailure(err.get("kind", "exception"), err.get("reason", "unknown error"),
                                tail, dead=dead)

    def _settle_stderr(self) -> None:
        # The stderr pump may lag the protocol line; give it a moment so the tail holds the traceback.
        if self.proc is not None and self.proc.poll() is not None:
            self._threads[1].join(timeout=2)
        else:
            time.sleep(0.05)

    def _death(self, when: str) -> WorkerFailure:
        """The failure for a worker that exited without answering."""
        try:
            rc = self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:  # stdout closed but alive: treat as hung and kill it
            self.kill()
            rc = self.proc.returncode
        self._settle_stderr()
        if rc is not None and rc < 0:
            name = _signal_name(rc)
            hint = " (SIGKILL from outside: often the kernel's OOM killer)" if rc == -signal.SIGKILL else ""
            reason = f"worker died of {name} {when}{hint}"
        else:
            reason = f"worker exited with code {rc} {when}"
        return WorkerFailure("crash", reason, self.stderr_tail(), dead=True)

    def __enter__(self) -> "WorkerClient":
        if self.proc is None:
            self.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
