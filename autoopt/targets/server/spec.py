"""The `server:` block of a space file (`target: server`): how to launch the server, how each knob
reaches it, and the workload it is measured with. Errors name file:line: key and what was expected.

    server:
      command: [vllm, serve, "{model}", --host, "{host}", --port, "{port}"]   # argv, never a shell string
      model: meta-llama/Llama-3.1-8B-Instruct   # {model}; also the requests' "model" unless request_model
      host: 127.0.0.1
      port: auto                                 # or a number (checked free before every start)
      env: {VLLM_USE_V1: "1"}
      health: [/health, /v1/models]
      ready_timeout_s: 900
      stop_grace_s: 15
      config_file: {format: yaml, flag: --config}   # only when a knob renders as `config`
      workload: {api: completions, prompt_tokens: 512, output_tokens: 256, requests: 64, repeats: 3}
      objective_metric: output_throughput        # or request_goodput, p99_tpot_ms, ... (metrics.OBJECTIVES)
      slo: "ttft_ms<=500,tpot_ms<=50"
      profile: {start: /start_profile, stop: /stop_profile, trace_dir: "{trial_dir}/trace",
                trace_dir_env: VLLM_TORCH_PROFILER_DIR, requests: 8}
      knobs:                                     # only where the default (a --kebab-case flag) is wrong
        max_num_seqs: {flag: --max-num-seqs}
        enforce_eager: {flag: --enforce-eager, omit: [false]}
        temperature: {request: temperature}      # a hot knob: no restart
        VLLM_ATTENTION_BACKEND: {env: VLLM_ATTENTION_BACKEND}

The knobs' values and priors stay in the file's `knobs:` section (the same as for every target); a
knob rendered as `request` has restart class none, every other restart (a space may say more, never
less).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from autoopt.errors import SpaceError, UserError
from autoopt.space.document import LineMap, SpaceDocument, line_of
from autoopt.targets.server.launch import KINDS, PLACEHOLDERS, Render, default_flag
from autoopt.targets.server.metrics import OBJECTIVES, parse_slos

_SERVER_KEYS = ("command", "model", "request_model", "host", "port", "env", "health", "ready_timeout_s",
                "stop_grace_s", "config_file", "workload", "objective_metric", "slo", "profile", "knobs",
                "baseline")
_WORKLOAD_KEYS = ("api", "prompt_tokens", "output_tokens", "requests", "repeats", "fixed_length",
                  "request_timeout_s", "extra_body")
_PROFILE_KEYS = ("start", "stop", "trace_dir", "trace_dir_env", "requests", "timeout_s")
_RENDER_KEYS = KINDS + ("bool_style", "omit")


@dataclass
class ServerSpec:
    path: Path
    command: list[str]
    model: str
    request_model: str
    host: str = "127.0.0.1"
    port: int | None = None  # None: a free port per start
    env: dict[str, str] = field(default_factory=dict)
    health: tuple[str, ...] = ("/health", "/v1/models")
    ready_timeout_s: float = 600.0
    stop_grace_s: float = 10.0
    config_format: str = "yaml"
    config_flag: str | None = None
    config_base: dict[str, Any] = field(default_factory=dict)
    workload: dict[str, Any] = field(default_factory=dict)
    objective_metric: str = "output_throughput"
    slos: dict[str, float] = field(default_factory=dict)
    profile: dict[str, Any] | None = None
    renders: dict[str, Render] = field(default_factory=dict)
    values: dict[str, tuple[Any, ...]] = field(default_factory=dict)  # from the `knobs:` section
    restart_classes: dict[str, str] = field(default_factory=dict)
    baseline: dict[str, Any] = field(default_factory=dict)
    concurrency: tuple[int, ...] = (1,)
    device: str = "auto"
    name: str = "server"


class _Reader:
    """file:line: key errors for one document."""

    def __init__(self, doc: SpaceDocument) -> None:
        self.doc = doc

    def fail(self, container: Any, key: Any, key_path: str, expected: str) -> SpaceError:
        return SpaceError(f"{self.doc.display_path}:{line_of(container, key)}: {key_path}: {expected}")

    def mapping(self, parent: Any, key: str, at: str, allowed: tuple[str, ...]) -> LineMap:
        raw = parent.get(key) if isinstance(parent, dict) else None
        if raw is None:
            return LineMap()
        if not isinstance(raw, dict):
            raise self.fail(parent, key, at, f"expected a mapping; got {raw!r}")
        for k in raw:
            if k not in allowed:
                raise self.fail(raw, k, f"{at}.{k}", f"unknown key (expected one of: {', '.join(allowed)})")
        return raw

    def number(self, m: Any, key: str, at: str, default: float, integer: bool = False) -> Any:
        v = m.get(key, default)
        ok = isinstance(v, (int, float)) and not isinstance(v, bool) and v > 0
        if not ok or (integer and not isinstance(v, int)):
            kind = "a positive integer" if integer else "a positive number"
            raise self.fail(m, key, f"{at}.{key}", f"expected {kind}; got {v!r}")
        return v


def read(path_or_doc: str | Path | SpaceDocument) -> ServerSpec:
    doc = path_or_doc if isinstance(path_or_doc, SpaceDocument) else SpaceDocument.read(path_or_doc)
    r, d = _Reader(doc), doc.data
    if str(d.get("target", "")) != "server":
        raise r.fail(d, "target", "target", f"expected `server` for a server space; got {d.get('target')!r}")
    if not isinstance(d.get("server"), dict):
        raise r.fail(d, "server", "server", "expected a mapping with command, model, ... (a server space)")
    s = r.mapping(d, "server", "server", _SERVER_KEYS)
    spec = ServerSpec(path=doc.path, command=_command(r, s), model=_text(r, s, "model", "server"),
                      request_model="", name=str(d.get("name") or doc.path.stem),
                      device=str(d.get("device", "auto")))
    spec.request_model = str(s.get("request_model") or spec.model)
    spec.host = str(s.get("host", "127.0.0.1"))
    port = s.get("port", "auto")
    if port != "auto" and not (isinstance(port, int) and not isinstance(port, bool) and 0 < port < 65536):
        raise r.fail(s, "port", "server.port", f"expected auto or a port number 1-65535; got {port!r}")
    spec.port = None if port == "auto" else port
    env = r.mapping(s, "env", "server.env", tuple(s.get("env") or ()))
    spec.env = {str(k): str(v).lower() if isinstance(v, bool) else str(v) for k, v in env.items()}
    spec.health = _health(r, s)
    spec.ready_timeout_s = float(r.number(s, "ready_timeout_s", "server", 600.0))
    spec.stop_grace_s = float(r.number(s, "stop_grace_s", "server", 10.0))
    _config_file(r, s, spec)
    spec.workload = _workload(r, s)
    spec.objective_metric = str(s.get("objective_metric", "output_throughput"))
    if spec.objective_metric not in OBJECTIVES:
        raise r.fail(s, "objective_metric", "server.objective_metric",
                     f"expected one of {', '.join(OBJECTIVES)}; got {spec.objective_metric!r}")
    try:
        spec.slos = parse_slos(s.get("slo"), where=f"{doc.display_path}:{line_of(s, 'slo')}: server.slo")
    except UserError as exc:  # a bad SLO in a space file is a space error
        raise SpaceError(str(exc)) from None
    spec.profile = _profile(r, s)
    _knobs(r, d, s, spec)
    spec.concurrency = _concurrency(d)
    return spec


def _text(r: _Reader, m: Any, key: str, at: str) -> str:
    v = m.get(key)
    if not isinstance(v, (str, int, float)) or isinstance(v, bool) or not str(v).strip():
        raise r.fail(m, key, f"{at}.{key}", f"expected a non-empty string; got {v!r}")
    return str(v)


def _command(r: _Reader, s: LineMap) -> list[str]:
    cmd = s.get("command")
    if isinstance(cmd, str):
        raise r.fail(s, "command", "server.command", "expected an argv list ([vllm, serve, \"{model}\", ...]), "
                     "not a shell string: knob values are appended as whole arguments")
    if not isinstance(cmd, list) or not cmd or not all(isinstance(a, (str, int, float)) for a in cmd):
        raise r.fail(s, "command", "server.command", f"expected a non-empty list of arguments; got {cmd!r}")
    for i, arg in enumerate(map(str, cmd)):
        for piece in arg.split("{")[1:]:
            name = piece.split("}")[0]
            if name not in PLACEHOLDERS:
                raise r.fail(cmd, i, f"server.command[{i}]", f"unknown placeholder {{{name}}} "
                             f"(expected {', '.join('{' + p + '}' for p in PLACEHOLDERS)})")
    return [str(a) for a in cmd]


def _health(r: _Reader, s: LineMap) -> tuple[str, ...]:
    raw = s.get("health", ["/health", "/v1/models"])
    raw = [raw] if isinstance(raw, str) else raw
    if not isinstance(raw, list) or not raw or not all(isinstance(p, str) and p.startswith("/") for p in raw):
        raise r.fail(s, "health", "server.health", f"expected a path or a list of paths starting with /; got {raw!r}")
    return tuple(raw)


def _config_file(r: _Reader, s: LineMap, spec: ServerSpec) -> None:
    m = r.mapping(s, "config_file", "server.config_file", ("format", "flag", "base"))
    spec.config_format = str(m.get("format", "yaml"))
    if spec.config_format not in ("yaml", "json"):
        raise r.fail(m, "format", "server.config_file.format", f"expected yaml or json; got {spec.config_format!r}")
    spec.config_flag = str(m["flag"]) if m.get("flag") else None
    base = m.get("base") or {}
    if not isinstance(base, dict):
        raise r.fail(m, "base", "server.config_file.base", f"expected a mapping; got {base!r}")
    spec.config_base = _plain(base)


def _workload(r: _Reader, s: LineMap) -> dict[str, Any]:
    m = r.mapping(s, "workload", "server.workload", _WORKLOAD_KEYS)
    out: dict[str, Any] = {"api": str(m.get("api", "completions"))}
    if out["api"] not in ("completions", "chat"):
        raise r.fail(m, "api", "server.workload.api", f"expected completions or chat; got {out['api']!r}")
    for key, default in (("prompt_tokens", 128), ("output_tokens", 128), ("requests", 16), ("repeats", 3)):
        out[key] = r.number(m, key, "server.workload", default, integer=True)
    out["request_timeout_s"] = float(r.number(m, "request_timeout_s", "server.workload", 600.0))
    out["fixed_length"] = str(m.get("fixed_length", "auto"))
    if out["fixed_length"] not in ("auto", "on", "off"):
        raise r.fail(m, "fixed_length", "server.workload.fixed_length",
                     f"expected auto, on or off; got {out['fixed_length']!r}")
    extra = m.get("extra_body") or {}
    if not isinstance(extra, dict):
        raise r.fail(m, "extra_body", "server.workload.extra_body", f"expected a mapping; got {extra!r}")
    out["extra_body"] = _plain(extra)
    return out


def _profile(r: _Reader, s: LineMap) -> dict[str, Any] | None:
    if s.get("profile") in (None, False):
        return None
    m = r.mapping(s, "profile", "server.profile", _PROFILE_KEYS)
    out = {"start": str(m.get("start", "/start_profile")), "stop": str(m.get("stop", "/stop_profile")),
           "trace_dir": str(m.get("trace_dir", "{trial_dir}/trace")),
           "trace_dir_env": str(m["trace_dir_env"]) if m.get("trace_dir_env") else None,
           "requests": r.number(m, "requests", "server.profile", 4, integer=True),
           "timeout_s": float(r.number(m, "timeout_s", "server.profile", 120.0))}
    return out


def _knobs(r: _Reader, d: LineMap, s: LineMap, spec: ServerSpec) -> None:
    knobs = d.get("knobs")
    if not isinstance(knobs, dict) or not knobs:
        raise r.fail(d, "knobs", "knobs", "expected a mapping of knob name -> settings")
    renders = r.mapping(s, "knobs", "server.knobs", tuple(knobs))
    baseline = r.mapping(s, "baseline", "server.baseline", tuple(knobs))
    for name, body in knobs.items():
        body = body if isinstance(body, dict) else {}
        values = body.get("values")
        if not isinstance(values, list) or not values:
            raise r.fail(knobs, name, f"knobs.{name}.values", "expected a non-empty list (a server knob "
                         "declares its values in the space file)")
        render = _render(r, renders, name)
        spec.renders[name] = render
        spec.values[name] = tuple(_plain(v) for v in values)
        needed = "none" if render.hot else "restart"
        declared = str(body.get("restart_class", needed))
        if needed == "restart" and declared != "restart":
            raise r.fail(body, "restart_class", f"knobs.{name}.restart_class",
                         f"expected restart: it reaches the server as a {render.kind} (read at start)")
        spec.restart_classes[name] = declared
        base = _plain(baseline.get(name, values[0]))
        if base not in spec.values[name]:
            raise r.fail(baseline, name, f"server.baseline.{name}", f"expected one of {list(values)}; got {base!r}")
        spec.baseline[name] = base


def _render(r: _Reader, renders: LineMap, name: str) -> Render:
    raw = renders.get(name)
    if raw is None:
        return Render("flag", default_flag(name))
    at = f"server.knobs.{name}"
    m = r.mapping(renders, name, at, _RENDER_KEYS)
    kinds = [k for k in KINDS if k in m]
    if len(kinds) != 1:
        raise r.fail(renders, name, at, f"expected exactly one of {', '.join(KINDS)}; got {kinds or 'none'}")
    kind = kinds[0]
    target = str(m[kind])
    if kind == "flag" and not target.startswith("-"):
        raise r.fail(m, kind, f"{at}.flag", f"expected a flag starting with -; got {target!r}")
    style = str(m.get("bool_style", "negate"))
    if style not in ("negate", "value"):
        raise r.fail(m, "bool_style", f"{at}.bool_style", f"expected negate or value; got {style!r}")
    omit = m.get("omit", [])
    omit = omit if isinstance(omit, list) else [omit]
    return Render(kind, target, style, tuple(_plain(v) for v in omit))


def _concurrency(d: LineMap) -> tuple[int, ...]:
    raw = d.get("concurrency", [1])
    raw = [raw] if isinstance(raw, int) else raw
    return tuple(int(c) for c in raw if isinstance(c, int) and not isinstance(c, bool) and c > 0) or (1,)


def _plain(v: Any) -> Any:
    """LineMap/LineSeq -> dict/list (JSON-able, hashable scalars kept)."""
    if isinstance(v, dict):
        return {str(k): _plain(x) for k, x in v.items()}
    if isinstance(v, list):
        return [_plain(x) for x in v]
    return v


def check_launchable(spec: ServerSpec) -> None:
    """Before anything is recorded: the command exists and a fixed port is free (UserError)."""
    import os
    import shutil

    from autoopt.targets.server.launch import port_in_use

    exe = spec.command[0]
    found = shutil.which(exe) if os.sep not in exe else (exe if os.access(exe, os.X_OK) else None)
    if found is None:
        raise UserError(f"{spec.path}: server.command[0]: {exe!r} is not found on PATH (or not executable); "
                        f"install the server or give its full path")
    if spec.port is not None and port_in_use(spec.host, spec.port):
        raise UserError(f"{spec.path}: server.port: port {spec.port} on {spec.host} is in use by another "
                        f"process; stop it, choose another port or use port: auto")
