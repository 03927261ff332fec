"""Ctrl-C outside a command's own handling (here: while `autoopt profile` reads a large trace) exits
130, as the README says, without a traceback (not click's "Aborted!" and exit 1)."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time


def test_ctrl_c_while_reading_a_trace_exits_130(tmp_path):
    trace = tmp_path / "big.json"
    events = [{"ph": "X", "cat": "kernel", "name": f"kernel_{i % 50}", "ts": i, "dur": 1.0, "pid": 0, "tid": 0}
              for i in range(800_000)]  # ~6 s of reading on a 2-core CPU
    trace.write_text(json.dumps({"traceEvents": events}))
    proc = subprocess.Popen([sys.executable, "-m", "autoopt.cli", "profile", str(trace)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    _wait_until_it_reads(proc.pid, trace)  # inside the read, however slow the imports were
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err[-2000:]
    assert "Traceback" not in err and "Aborted" not in err


def _wait_until_it_reads(pid: int, path, timeout_s: float = 60.0) -> None:
    """Until the process holds the file open (its /proc fd table), so the signal lands in the read."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if any(os.readlink(f"/proc/{pid}/fd/{fd}") == str(path) for fd in os.listdir(f"/proc/{pid}/fd")):
                return
        except (FileNotFoundError, ProcessLookupError):
            pass  # an fd closed between listdir and readlink
        time.sleep(0.02)
    raise AssertionError(f"autoopt profile never opened {path} within {timeout_s:.0f} s")

