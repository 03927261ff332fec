"""The guard between autoopt and a server: `python guard.py PIDFILE -- ARGV...` (stdlib only).

It runs as the leader of the server's process group (autoopt starts it with start_new_session) and
starts the server inside that group, so one signal to the group reaches the server and every process it
spawns (engine workers, a wrapper script's children). Its job is that no server outlives autoopt:
  - it polls its parent pid twice a second: when autoopt dies, however (kill -9 included), the guard
    is re-parented and notices within half a second. (Not PR_SET_PDEATHSIG: that fires when the
    *thread* that started the guard ends, which would kill a server a later trial still uses.)
  - when the parent is gone it signals the whole group: SIGTERM, then SIGKILL after a grace period.
It exits with the server's status (128 + N when the server died of signal N; 127 when the command
is not found), and writes the server's pid to PIDFILE so autoopt can report (and tests can kill) it.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

GRACE_S = 10.0


def _end_group(server: subprocess.Popen) -> None:
    group = os.getpgid(0)
    try:
        os.killpg(group, signal.SIGTERM)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + GRACE_S
    while server.poll() is None and time.monotonic() < deadline:
        time.sleep(0.1)
    os.killpg(group, signal.SIGKILL)  # the guard goes too: nothing of the group stays behind


def main(argv: list[str]) -> int:
    if len(argv) < 3 or argv[1] != "--":
        print("usage: guard.py PIDFILE -- COMMAND [ARGS...]", file=sys.stderr)
        return 2
    pid_file, command = argv[0], argv[2:]
    parent = os.getppid()
    # SIGTERM to the group (autoopt stopping the server) reaches the guard too: it waits for the
    # server to exit and returns its status
    signal.signal(signal.SIGTERM, lambda *_: None)
    try:
        server = subprocess.Popen(command)
    except FileNotFoundError:
        print(f"autoopt guard: command not found: {command[0]}", file=sys.stderr, flush=True)
        return 127
    except PermissionError:
        print(f"autoopt guard: permission denied: {command[0]}", file=sys.stderr, flush=True)
        return 126
    with open(pid_file, "w") as fh:
        fh.write(str(server.pid))
    while True:
        try:
            server.wait(timeout=0.5)
            break
        except subprocess.TimeoutExpired:
            pass
        if os.getppid() != parent:
            _end_group(server)
    code = server.returncode
    try:  # what the server left behind in the group (workers it spawned) ends with it
        os.killpg(os.getpgid(0), signal.SIGTERM)
    except ProcessLookupError:
        pass
    return 128 - code if code < 0 else code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
