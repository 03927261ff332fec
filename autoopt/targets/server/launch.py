"""How a configuration becomes a server process: knobs rendered into argv, environment, a config file
or per-request fields, and the process started and stopped as one process group.

Rendering (one `Render` per knob, from the space file's `server.knobs`):
  flag     `snake_case` -> `--snake-case VALUE`; booleans `--x` / `--no-x` (or `--x true|false` with
           bool_style: value); dicts and lists as JSON; values listed in `omit` render nothing (the
           server's own default)
  env      an environment variable (booleans 1/0, dicts as JSON)
  config   a key of the config file written for each trial (YAML or JSON; dotted keys nest)
  request  a field of every request body: a "hot" knob, no restart, measured inside a running server
The launch command is an argv list; knob values are only ever appended as whole arguments, never
substituted into a string a shell would read. The template may name {host}, {port}, {model},
{config_file} and {trial_dir} as whole arguments or inside one.

The process: started through guard.py (the leader of a new session and process group), stopped by
signalling the group (SIGTERM, then SIGKILL after a grace period), never by name; the guard kills the
group when autoopt dies. stdout and stderr go to the trial's log file.
"""
from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

KINDS = ("flag", "env", "config", "request")
PLACEHOLDERS = ("host", "port", "model", "config_file", "trial_dir")
GUARD = Path(__file__).resolve().with_name("guard.py")


@dataclass(frozen=True)
class Render:
    """How one knob reaches the server."""

    kind: str  # flag | env | config | request
    name: str  # --flag, ENV_VAR, config.key or request_field
    bool_style: str = "negate"  # negate: --x / --no-x; value: --x true|false
    omit: tuple[Any, ...] = ()  # values that render nothing (the server's default)

    @property
    def hot(self) -> bool:
        return self.kind == "request"


def default_flag(knob: str) -> str:
    return "--" + knob.replace("_", "-")


def _text(value: Any) -> str:
    if isinstance(value, (dict, list)):
        return json.dumps(value, sort_keys=True, separators=(",", ":"))
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def omitted(render: Render, value: Any) -> bool:
    """True when `value` is one the server is left to default (1 and True are different values)."""
    return any(o == value and type(o) is type(value) for o in render.omit)


def render_flag(render: Render, value: Any) -> list[str]:
    if isinstance(value, bool) and render.bool_style == "negate":
        if value:
            return [render.name]
        return ["--no-" + render.name.lstrip("-")]
    return [render.name, _text(value)]


def _env_text(value: Any) -> str:
    if isinstance(value, bool):
        return "1" if value else "0"
    return _text(value)


def _set_dotted(doc: dict[str, Any], dotted: str, value: Any) -> None:
    *parents, last = dotted.split(".")
    for key in parents:
        doc = doc.setdefault(key, {})
    doc[last] = value


@dataclass
class LaunchPlan:
    """What one server start is made of (the restart-requiring part of a configuration)."""

    argv: list[str]
    env: dict[str, str] = field(default_factory=dict)
    config: dict[str, Any] | None = None  # written to config_file before the start
    config_file: Path | None = None
    request_fields: dict[str, Any] = field(default_factory=dict)

    def command_line(self) -> str:
        """The argv as one line a person can paste (each argument quoted where needed)."""
        import shlex

        env = " ".join(f"{k}={shlex.quote(v)}" for k, v in sorted(self.env.items()))
        return (env + " " if env else "") + " ".join(shlex.quote(a) for a in self.argv)


def substitute(template: list[str], values: dict[str, str]) -> list[str]:
    out = []
    for arg in template:
        for name in PLACEHOLDERS:
            if name in values:
                arg = arg.replace("{" + name + "}", values[name])
        out.append(arg)
    return out


def plan(template: list[str], renders: dict[str, Render], config: dict[str, Any],
         placeholders: dict[str, str], base_env: dict[str, str] | None = None,
         config_format: str = "yaml", config_flag: str | None = None,
         config_base: dict[str, Any] | None = None) -> LaunchPlan:
    """The launch plan of `config` (knob -> value); knobs without a Render are ignored here."""
    argv = substitute(template, placeholders)
    env = dict(base_env or {})
    file_doc: dict[str, Any] = json.loads(json.dumps(config_base or {}))
    uses_file = bool(config_base) or any(r.kind == "config" for r in renders.values())
    fields: dict[str, Any] = {}
    for knob, value in config.items():
        r = renders.get(knob)
        if r is None or omitted(r, value):
            continue
        if r.kind == "flag":
            argv += render_flag(r, value)
        elif r.kind == "env":
            env[r.name] = _env_text(value)
        elif r.kind == "config":
            _set_dotted(file_doc, r.name, value)
        else:
            fields[r.name] = value
    path = None
    if uses_file:
        path = Path(placeholders["trial_dir"]) / f"server_config.{config_format}"
        argv = substitute(argv, {"config_file": str(path)})
        if config_flag:
            argv += [config_flag, str(path)]
    return LaunchPlan(argv=argv, env=env, config=file_doc if uses_file else None,
                      config_file=path, request_fields=fields)


def write_config_file(p: LaunchPlan) -> None:
    if p.config_file is None or p.config is None:
        return
    p.config_file.parent.mkdir(parents=True, exist_ok=True)
    if p.config_file.suffix == ".json":
        p.config_file.write_text(json.dumps(p.config, indent=1, sort_keys=True) + "\n")
    else:
        p.config_file.write_text(yaml.safe_dump(p.config, sort_keys=True))


def port_in_use(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return True
    return False


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


class ServerProcess:
    """One running server (through its guard), its log, and how it ended."""

    def __init__(self, plan_: LaunchPlan, log_path: Path, cwd: Path | None = None) -> None:
        self.plan = plan_
        self.log_path = log_path
        log_path.parent.mkdir(parents=True, exist_ok=True)
        self.pid_file = log_path.with_suffix(".pid")
        self.pid_file.unlink(missing_ok=True)
        env = {**os.environ, **plan_.env}
        with open(log_path, "ab") as log:
            log.write(f"# autoopt: {plan_.command_line()}\n".encode())
            log.flush()
            self.proc = subprocess.Popen(
                [sys.executable, str(GUARD), str(self.pid_file), "--", *plan_.argv],
                stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, env=env,
                cwd=str(cwd) if cwd else None, start_new_session=True)
        self.started_at = time.monotonic()

    @property
    def pgid(self) -> int:
        return self.proc.pid  # the guard leads the group (start_new_session)

    def server_pid(self) -> int | None:
        try:
            return int(self.pid_file.read_text().strip())
        except (OSError, ValueError):
            return None

    def alive(self) -> bool:
        return self.proc.poll() is None

    def settle(self, timeout_s: float = 5.0) -> bool:
        """After a failed request: when the server process itself is gone, wait for its guard to end
        (so exit_description() says how the server ended); True when everything has ended."""
        pid = self.server_pid()
        if pid is not None and self.alive():
            deadline = time.monotonic() + 1.0  # a server just killed may be a zombie for a moment
            while _pid_exists(pid):
                if time.monotonic() > deadline:
                    return False  # the server runs: the failure was its answer, not its death
                time.sleep(0.05)
            try:
                self.proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                return False
        return not self.alive()

    def exit_description(self) -> str:
        code = self.proc.poll()
        if code is None:
            return "running"
        if code == 127:
            return f"command not found: {self.plan.argv[0]}"
        if code == 126:
            return f"command not executable: {self.plan.argv[0]}"
        if code > 128:
            try:
                name = signal.Signals(code - 128).name
            except ValueError:
                name = f"signal {code - 128}"
            return f"the server was killed by {name} (signal {code - 128})"
        if code < 0:
            return f"the server's guard was killed by signal {-code}"
        return f"the server exited with status {code}"

    def log_tail(self, chars: int = 3000) -> str:
        try:
            with open(self.log_path, "rb") as fh:
                fh.seek(0, os.SEEK_END)
                size = fh.tell()
                fh.seek(max(0, size - chars))
                return fh.read().decode("utf-8", "replace")
        except OSError:
            return ""

    def stop(self, grace_s: float = 10.0) -> float:
        """Signal the group: SIGTERM, SIGKILL after `grace_s`; returns the seconds it took."""
        start = time.monotonic()
        for sig, wait_s in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 5.0)):
            try:
                os.killpg(self.pgid, sig)
            except ProcessLookupError:
                break
            try:
                self.proc.wait(timeout=wait_s)
                if not _group_alive(self.pgid):
                    break
            except subprocess.TimeoutExpired:
                continue
        if self.proc.poll() is None:
            self.proc.wait(timeout=5.0)
        return time.monotonic() - start


def _answers_signals(send: Any, target_id: int) -> bool:
    """Signal 0 (nothing sent) to a process (os.kill) or group (os.killpg): does it exist?"""
    try:
        send(target_id, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # exists, owned by someone else
    return True


def _pid_exists(pid: int) -> bool:
    return _answers_signals(os.kill, pid)


def _group_alive(pgid: int) -> bool:
    return _answers_signals(os.killpg, pgid)
