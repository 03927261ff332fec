"""The server target (`target: server` in a space file, or `--target server:FILE.yaml`).

One evaluation: split the configuration into the knobs a start reads (flags, environment, config
file) and the hot ones (request fields). When the start-time part differs from the running server's
(or nothing runs), restart in timed phases, all in Measurement.costs_s:
  launch   stop the running server (its process group) + spawn the new one
  ready    spawn -> the health URL answers 200
  warm     calibration + one warm-up round at the largest concurrency (never measured)
  restart  launch + ready + warm
then measure the concurrency sweep with the hot knobs in every request (`measure`), and profile when
asked and the server can (`profile`, a separate short run). A configuration that changes only hot
knobs reuses the running server: its costs_s has restart 0.

A failed start or measurement is a failed Measurement with its reason and the log's tail: the
process ended (crash; "out of memory" in the log: oom), no answer in time (hang), HTTP errors
(exception), the port taken by another process or a value the space does not list (excluded).
"""
from __future__ import annotations

import json
import os
import tempfile
import time
from pathlib import Path
from typing import Any

from autoopt.measurement import Measurement, Throughput
from autoopt.stats import median_ci
from autoopt.targets.base import EvalRequest, KnobSpec, Transition
from autoopt.targets.server import launch, loadgen, readiness
from autoopt.targets.server.metrics import maximized, run_metrics
from autoopt.targets.server.results import from_autoopt, serving_field
from autoopt.targets.server.spec import ServerSpec


class TrialFailed(Exception):
    def __init__(self, kind: str, reason: str, tail: str = "") -> None:
        super().__init__(reason)
        self.kind, self.reason, self.tail = kind, reason, tail


class ServerTarget:
    name = "server"

    def __init__(self, spec: ServerSpec, run_dir: str | Path | None = None) -> None:
        self.spec = spec
        self._run_dir = Path(run_dir) if run_dir else None  # trial folders: logs, config files, bench.json
        self.evaluations = 0
        self._proc: launch.ServerProcess | None = None
        self._running: tuple[Any, ...] | None = None  # start-time knob values of the running server
        self._base_url = ""
        self._lengths: loadgen.LengthPlan | None = None
        self._trace_dir: Path | None = None
        self._env: dict[str, Any] | None = None
        self.last_result: dict[str, Any] | None = None  # the latest load-generator document

    def run_dir(self) -> Path:
        """Where trial folders go (a new temporary folder unless one was given; kept after close:
        the store's what_ran points at the logs in it)."""
        if self._run_dir is None:
            self._run_dir = Path(tempfile.mkdtemp(prefix="autoopt-server-"))
        self._run_dir.mkdir(parents=True, exist_ok=True)
        return self._run_dir

    # ---- the Target protocol -------------------------------------------------------------------
    def knob_specs(self) -> list[KnobSpec]:
        return [KnobSpec(name=k, values=v, restart_class=self.spec.restart_classes[k])
                for k, v in self.spec.values.items()]

    def excluded(self) -> dict[tuple[str, Any], str]:
        return {}

    def baseline(self) -> dict[str, Any]:
        return dict(self.spec.baseline)

    def default_concurrency(self) -> tuple[int, ...]:
        return self.spec.concurrency

    def environment(self) -> dict[str, Any]:
        if self._env is None:
            from autoopt.environment import fingerprint

            env = fingerprint("cuda" if self.spec.device == "cuda" else "cpu")
            self._env = env | {"target": "server", "server_command": list(self.spec.command),
                               "server_model": self.spec.model, "space": str(self.spec.path)}
        return self._env

    def now(self) -> float:
        return time.monotonic()

    def transition(self, to_config: dict[str, Any]) -> Transition:
        cold = [k for k in self.spec.values if not self.spec.renders[k].hot]
        hot = tuple(k for k in self.spec.values if self.spec.renders[k].hot
                    and to_config.get(k) != self.spec.baseline.get(k))
        if self._proc is None or not self._proc.alive() or self._running is None:
            return Transition("restart", tuple(cold) + hot)
        wanted = self._cold_key({k: to_config.get(k) for k in self.spec.values})
        changed = tuple(k for k, now, new in zip(cold, self._running, wanted) if now != new)
        return Transition("restart" if changed else "none", changed + hot)

    def evaluate(self, request: EvalRequest) -> Measurement:
        self.evaluations += 1
        config = dict(request.config)
        if not config.get("layer_overrides", True):
            del config["layer_overrides"]  # the space's empty list: a server has no per-layer knobs
        trial_dir = self.run_dir() / f"trial_{self.evaluations:04d}"
        trial_dir.mkdir(parents=True, exist_ok=True)
        costs = {"restart": 0.0, "launch": 0.0, "ready": 0.0, "warm": 0.0, "measure": 0.0, "profile": 0.0}
        what_ran: dict[str, str] = {}
        start = time.monotonic()
        try:
            self._check(config)
            hot = self._ensure_server(config, trial_dir, costs, what_ran)
            t0 = time.monotonic()
            doc = self._measure(request, hot, trial_dir)
            costs["measure"] = time.monotonic() - t0
            buckets = self._maybe_profile(request, hot, trial_dir, costs, what_ran)
        except TrialFailed as exc:
            costs["total"] = time.monotonic() - start
            if exc.kind not in ("excluded",):
                self._stop()
            return Measurement.failed(request.config, exc.kind, exc.reason, exc.tail[-3000:], costs_s=costs,
                                      what_ran=what_ran, environment=self.environment())
        costs["total"] = time.monotonic() - start
        what_ran["bench_result"] = str(trial_dir / "bench.json")
        return self._measurement(request, doc, costs, what_ran, buckets)

    def close(self) -> None:
        self._stop()

    def launch_recipe(self, config: dict[str, Any], port: int | None = None,
                      config_dir: str | Path = ".") -> dict[str, Any]:
        """How to start the server with `config` outside autoopt (what `best --export` writes): argv,
        the one-line command, the environment autoopt adds, the config file's contents (None when no
        knob renders into one; written to `config_dir` as server_config.<format>, the path the argv
        names) and the fields every request must carry (the hot knobs)."""
        s = self.spec
        chosen = port or s.port or 8000
        p = launch.plan(s.command, dict(s.renders), config,
                        {"host": s.host, "port": str(chosen), "model": s.model, "trial_dir": str(config_dir)},
                        base_env=s.env, config_format=s.config_format, config_flag=s.config_flag,
                        config_base=s.config_base)
        return {"argv": p.argv, "command_line": p.command_line(), "env": p.env, "config_file": p.config,
                "config_path": str(p.config_file) if p.config_file is not None else None,
                "config_format": s.config_format, "request_fields": p.request_fields,
                "base_url": f"http://{s.host}:{chosen}", "model": s.request_model}

    # ---- starting ------------------------------------------------------------------------------
    def _check(self, config: dict[str, Any]) -> None:
        if config.get("layer_overrides"):
            raise TrialFailed("excluded", "a server has no per-layer knobs (layer_overrides given)")
        unknown = sorted(set(config) - set(self.spec.values))
        if unknown:
            raise TrialFailed("excluded", f"knob(s) {unknown} are not knobs of this server space "
                                          f"(known: {', '.join(self.spec.values)})")
        for k, values in self.spec.values.items():
            if k not in config:
                raise TrialFailed("excluded", f"knob {k!r} missing from the configuration")
            if config[k] not in values or type(config[k]) is not type(values[values.index(config[k])]):
                raise TrialFailed("excluded", f"{k}={config[k]!r} is not one of the space's values {list(values)}")

    def _cold_key(self, config: dict[str, Any]) -> tuple[Any, ...]:
        return tuple(json.dumps(config[k], sort_keys=True) for k in self.spec.values
                     if not self.spec.renders[k].hot)

    def _ensure_server(self, config: dict[str, Any], trial_dir: Path, costs: dict[str, float],
                       what_ran: dict[str, str]) -> dict[str, Any]:
        """Restart when the start-time knobs changed (or nothing runs); returns the hot fields."""
        hot_plan = launch.plan([], {k: r for k, r in self.spec.renders.items() if r.hot}, config, {})
        key = self._cold_key(config)
        if self._proc is not None and self._proc.alive() and self._running == key:
            what_ran |= {"server": self._proc.plan.command_line(), "server_log": str(self._proc.log_path),
                         "restart": "none (only per-request knobs changed)"}
            return hot_plan.request_fields
        t0 = time.monotonic()
        self._stop()
        port = self.spec.port if self.spec.port is not None else launch.free_port(self.spec.host)
        if launch.port_in_use(self.spec.host, port):
            costs["launch"] = costs["restart"] = time.monotonic() - t0
            raise TrialFailed("exception", f"port {port} on {self.spec.host} is in use by another process "
                                           f"(server.port in {self.spec.path}); stop it or use port: auto")
        plan = self._plan(config, trial_dir, port)
        proc = launch.ServerProcess(plan, trial_dir / "server.log")
        self._proc, self._running = proc, None
        what_ran |= {"server": plan.command_line(), "server_log": str(proc.log_path)}
        if plan.config_file is not None:
            what_ran["server_config_file"] = str(plan.config_file)
        t1 = time.monotonic()
        costs["launch"] = t1 - t0
        try:
            readiness.wait_ready(self._base_url, proc, self.spec.ready_timeout_s, self.spec.health)
        except readiness.NotReady as exc:
            costs["ready"] = time.monotonic() - t1
            costs["restart"] = time.monotonic() - t0
            raise TrialFailed(_oom_or(exc.kind, exc.log_tail), exc.reason, exc.log_tail) from None
        t2 = time.monotonic()
        costs["ready"] = t2 - t1
        self._warm(hot_plan.request_fields)
        costs["warm"] = time.monotonic() - t2
        costs["restart"] = time.monotonic() - t0
        self._running = key
        return hot_plan.request_fields

    def _plan(self, config: dict[str, Any], trial_dir: Path, port: int) -> launch.LaunchPlan:
        s = self.spec
        self._base_url = f"http://{s.host}:{port}"
        cold = {k: r for k, r in s.renders.items() if not r.hot}
        p = launch.plan(s.command, cold, config,
                        {"host": s.host, "port": str(port), "model": s.model, "trial_dir": str(trial_dir)},
                        base_env=s.env, config_format=s.config_format, config_flag=s.config_flag,
                        config_base=s.config_base)
        if s.profile is not None:
            self._trace_dir = Path(launch.substitute([s.profile["trace_dir"]], {"trial_dir": str(trial_dir)})[0])
            self._trace_dir.mkdir(parents=True, exist_ok=True)
            if s.profile["trace_dir_env"]:
                p.env[s.profile["trace_dir_env"]] = str(self._trace_dir)
        launch.write_config_file(p)
        return p

    def _workload(self, hot: dict[str, Any]) -> loadgen.Workload:
        w = dict(self.spec.workload)
        w["extra_body"] = {**w.get("extra_body", {}), **hot}
        return loadgen.Workload(model=self.spec.request_model, slos=dict(self.spec.slos), **w)

    def _warm(self, hot: dict[str, Any]) -> None:
        gen = loadgen.LoadGenerator(self._base_url, self._workload(hot))
        c = max(self.spec.concurrency)
        try:
            self._lengths = _run(gen.calibrate(), self.spec.workload["request_timeout_s"] * 2)
            results, _ = _run(gen.run(c, c, index_base=10_000_000), self.spec.workload["request_timeout_s"])
        except (ConnectionError, TimeoutError, OSError) as exc:
            raise self._request_failure(f"warm-up: {exc}") from None
        errors = [r.error for r in results if not r.ok]
        if errors:
            raise self._request_failure(f"warm-up: {len(errors)} of {len(results)} requests failed: {errors[0]}")

    def _request_failure(self, reason: str) -> TrialFailed:
        """A request failed: the server died (crash/oom), or it answered with an error (exception)."""
        proc = self._proc
        if proc is not None and proc.settle():
            tail = proc.log_tail()
            return TrialFailed(_oom_or("crash", tail), f"{proc.exit_description()} ({reason})", tail)
        return TrialFailed("exception", reason, proc.log_tail() if proc else "")

    def _stop(self) -> None:
        if self._proc is not None:
            self._proc.stop(self.spec.stop_grace_s)
        self._proc, self._running = None, None

    # ---- measuring -----------------------------------------------------------------------------
    def _measure(self, request: EvalRequest, hot: dict[str, Any], trial_dir: Path) -> dict[str, Any]:
        gen = loadgen.LoadGenerator(self._base_url, self._workload(hot))
        if self._lengths is not None:
            gen.lengths = self._lengths
        conc = tuple(request.concurrency) or self.spec.concurrency
        runs: dict[int, list[dict[str, Any]]] = {c: [] for c in conc}
        started = time.time()
        deadline = time.monotonic() + request.time_limit_s
        for rep in range(int(self.spec.workload["repeats"])):
            for c in conc:
                left = deadline - time.monotonic()
                try:
                    results, dur = _run(gen.run(c, index_base=(rep * 1000 + c) * 100_000), max(left, 0.01))
                except TimeoutError:
                    raise TrialFailed("hang", f"the measurement did not finish within {request.time_limit_s:g} s "
                                              f"(C={c}, repeat {rep + 1})",
                                      self._proc.log_tail() if self._proc else "") from None
                errors = [r.error for r in results if not r.ok]
                if errors:
                    raise self._request_failure(f"C={c}, repeat {rep + 1}: {len(errors)} of {len(results)} "
                                                f"requests failed: {errors[0]}")
                m = run_metrics(results, dur, gen.workload.slos)
                runs[c].append(m | {"max_concurrency": c, "num_prompts": len(results), "repeat": rep})
        doc = loadgen.result_document(gen, gen.lengths, runs, started)
        (trial_dir / "bench.json").write_text(json.dumps(doc, indent=1))
        self.last_result = doc
        return doc

    def _maybe_profile(self, request: EvalRequest, hot: dict[str, Any], trial_dir: Path,
                       costs: dict[str, float], what_ran: dict[str, str]) -> Any:
        if not request.profile:
            return None
        if self.spec.profile is None:
            what_ran["profile"] = ("none: this server space has no profiler (server.profile); "
                                   "measured without buckets")
            return None
        from autoopt.targets.server import profiler

        t0 = time.monotonic()
        try:
            prof = profiler.capture(self._base_url, self.spec.profile, self._workload(hot), self._lengths,
                                    self._trace_dir or trial_dir / "trace", max(self.spec.concurrency))
        except profiler.ProfileUnavailable as exc:
            what_ran["profile"] = f"none: {exc}; measured without buckets"
            prof = None
        costs["profile"] = time.monotonic() - t0
        if prof is not None:
            what_ran["profile"] = f"{prof.path} ({prof.source} trace, {prof.kernel_count} events)"
        return prof

    def _measurement(self, request: EvalRequest, doc: dict[str, Any], costs: dict[str, float],
                     what_ran: dict[str, str], prof: Any) -> Measurement:
        metric = self.spec.objective_metric
        tok_per_s = {str(r["max_concurrency"]): _throughput(r["runs"], metric, r["max_concurrency"])
                     for r in doc["results"]}
        what_ran |= {"objective": metric if maximized(metric) else f"1000 / {metric} (a rate: higher is better)",
                     "load_generator": f"autoopt {doc['backend']} {doc['endpoint']}, ignore_eos/min_tokens "
                                       f"{'sent' if doc['fixed_length']['sent'] else 'not sent'}, "
                                       f"prompt tokens by {doc['prompt_tokens_source']}"}
        extra = prof.measurement_fields() if prof is not None else {}
        extra["serving"] = serving_field(from_autoopt(doc))
        return Measurement(status="ok", config=request.config, tok_per_s=tok_per_s, costs_s=costs,
                           what_ran=what_ran, environment=self.environment(),
                           correctness={"verdict": "ok", "source": "not checked: a server's outputs are "
                                        "not compared to a reference"}, **extra)


def _throughput(runs: list[dict[str, Any]], metric: str, concurrency: int) -> Throughput:
    """The objective metric over repeats as a Throughput; a latency (ms) becomes 1000/ms."""
    values = [float(r[metric]) for r in runs if r.get(metric) is not None]
    rates = values if maximized(metric) else [1000.0 / v for v in values if v > 0]
    if not rates or min(rates) <= 0:
        return Throughput(0.0, 0.0, 0.0, len(rates), [])
    med, lo, hi = median_ci(rates)
    return Throughput(med, lo, hi, len(rates), [concurrency / v for v in rates])


def _oom_or(kind: str, tail: str) -> str:
    low = tail.lower()
    return "oom" if "out of memory" in low or "outofmemoryerror" in low else kind


def _run(coro: Any, timeout_s: float) -> Any:
    import asyncio

    async def bounded() -> Any:
        return await asyncio.wait_for(coro, timeout_s)

    try:
        return asyncio.run(bounded())
    except asyncio.TimeoutError:
        raise TimeoutError(f"no answer within {timeout_s:g} s") from None


def from_spec(path_or_spec: str | Path, run_dir: str | Path | None = None) -> tuple[ServerTarget, list[KnobSpec]]:
    """`server:FILE.yaml`, a path or a space name -> (ServerTarget, its knob specs). SpaceError on a bad
    server block; UserError when the command is not on PATH or a fixed port is taken."""
    from autoopt.targets.server.spec import read, check_launchable

    text = str(path_or_spec)
    spec = read(text[len("server:"):] if text.startswith("server:") else text)
    check_launchable(spec)
    target = ServerTarget(spec, run_dir=run_dir or os.environ.get("AUTOOPT_SERVER_RUN_DIR"))
    return target, target.knob_specs()
