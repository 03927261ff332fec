"""The builtin target: dsv4's DeepSeek-V4 decode step, built and measured in a worker process.

The parent (this object) imports no torch: capabilities and the environment fingerprint come from
the worker, where the measurements happen. A worker failure (crash, hang, OOM, CUDA error) becomes a
failed Measurement and the next evaluate starts a fresh worker, its start time recorded as the
restart cost of that trial.

Transitions (autoopt.targets.builtin.transitions): switching knobs of restart class "none" is free
in a live worker but for what it redoes (a re-trace of a compiled step, a CUDA graph capture);
"recompile" is cheap when that combination of recompile-class values was compiled before in this
worker (`cached`); a change of model shape (preset / shape overrides) needs a new worker. The target
reports these facts only: what a switch will take in seconds is the cost model's estimate (autoopt.search.cost), learned
from the phases each measurement reports (restart / build / compile).
"""
from __future__ import annotations

import dataclasses
import os
import time
from typing import Any

from autoopt.errors import UserError
from autoopt.measurement import Measurement
from autoopt.targets.base import EvalRequest, KnobSpec, Transition
from autoopt.trial import RestartClass
from autoopt.targets.builtin import declared, processes as two
from autoopt.targets.builtin.client import WorkerClient, WorkerFailure
from autoopt.targets.builtin.transitions import WorkerCaches, transition_facts


_MAY_BE_ZERO = ("n_window_layers", "n_shared_experts", "n_hash_layers", "seed")  # counts that may be none


def shape_fields() -> tuple[str, ...]:
    """DecodeConfig fields that are model shape (not knobs, not the preset name)."""
    from dsv4.config import DecodeConfig
    from dsv4.knobs import KNOB_BY_NAME

    return tuple(f.name for f in dataclasses.fields(DecodeConfig)
                 if f.name not in KNOB_BY_NAME and f.name not in ("preset", "layer_overrides"))


def parse_shape(overrides: dict[str, Any]) -> dict[str, int]:
    """Validate shape overrides (KEY=VALUE from the CLI or a file): known field, integer value."""
    allowed = shape_fields()
    out = {}
    for key, value in overrides.items():
        if key not in allowed:
            raise UserError(f"unknown shape field {key!r} (expected one of: {', '.join(allowed)})")
        try:
            out[key] = int(value)
        except (TypeError, ValueError):
            raise UserError(f"shape field {key!r} needs an integer, got {value!r}") from None
        least = 0 if key in _MAY_BE_ZERO else 1  # a size of 0 builds nothing (or divides by it)
        if out[key] < least:
            raise UserError(f"shape field {key!r} needs an integer >= {least}, got {value!r}")
    return out


class BuiltinTarget:
    name = "builtin"
    fills_missing_knobs = True  # a partial config means "the baseline elsewhere" (autoopt measure --set)

    def __init__(self, preset: str = "tiny", device: str = "cpu", shape: dict[str, Any] | None = None,
                 *, guard: bool = True, warmup_steps: int = 3, warmup_min_s: float | None = None,
                 measure_if_wrong: bool = True,
                 startup_timeout_s: float = 180.0, worker_env: dict[str, str] | None = None,
                 threads: int | None = None, processes: int = 1) -> None:
        from dsv4.config import PRESET_NAMES, preset as make_preset

        if preset not in PRESET_NAMES:
            raise UserError(f"unknown preset {preset!r} (expected one of: {', '.join(PRESET_NAMES)})")
        self.preset = preset
        self.shape = parse_shape(shape or {})
        try:
            self._model = make_preset(preset, **self.shape)
        except ValueError as exc:
            raise UserError(f"preset {preset} with shape {self.shape}: {exc}") from None
        self.device = device
        self.guard = guard
        self.warmup_steps = warmup_steps
        self.warmup_min_s = warmup_min_s  # None: the worker's default (autoopt.targets.builtin.evaluate.WARMUP_MIN_S)
        self.measure_if_wrong = measure_if_wrong
        self.startup_timeout_s = startup_timeout_s
        if threads is not None:  # torch intra-op threads in the worker (default there: 1 on a CPU)
            worker_env = dict(os.environ if worker_env is None else worker_env,
                              AUTOOPT_WORKER_THREADS=str(threads))
        self.worker_env = worker_env
        self._pending_restart_s = 0.0  # a worker start not yet charged to a trial
        self._client: WorkerClient | None = None
        self._described: dict[str, Any] | None = None
        self._built: dict[str, Any] | None = None  # normalized config last applied in the live worker
        self._caches = self.new_caches()  # what the live worker compiled and traced
        self.workers_started = 0
        self.processes = processes  # worker processes each configuration is measured in (evaluate)
        self._twin: BuiltinTarget | None = None  # the second process's target, once asked for
        self._one_worker_why: str | None = None  # why the card holds no second worker, once seen

    # ------------------------------------------------------------ declarations (no worker needed)

    def knob_specs(self) -> list[KnobSpec]:
        return list(declared.knob_specs())

    def baseline(self) -> dict[str, Any]:
        from dsv4.knobs import baseline_knobs

        return baseline_knobs()

    def default_concurrency(self) -> tuple[int, ...]:
        return (1, 16, 64) if self.device.startswith("cuda") else (1, 4)

    def layers(self) -> list[str]:
        """Layer class of every layer of the preset ("window" | "c4" | "c128"), index = layer."""
        return [self._model.layer_class(i) for i in range(self._model.n_layers)]

    def now(self) -> float:
        return time.monotonic()

    # ------------------------------------------------------------ worker-backed

    def _ensure_worker(self) -> float:
        """Start a worker if none is alive; returns the seconds spent starting (0 when reused)."""
        if self._client is not None and self._client.alive:
            return 0.0
        self._forget_worker()
        client = WorkerClient(self.device, env=self.worker_env, startup_timeout_s=self.startup_timeout_s)
        self.workers_started += 1
        t0 = time.perf_counter()
        try:
            start_s = client.start()
        except WorkerFailure:
            self._pending_restart_s += time.perf_counter() - t0  # a failed start still cost its time
            raise
        self._client = client
        self.device = client.device  # "auto" resolved
        self._pending_restart_s += start_s
        return start_s

    def _take_restart_s(self) -> float:
        # A worker started by describe()/excluded() before a trial is that trial's restart cost.
        s, self._pending_restart_s = self._pending_restart_s, 0.0
        return s

    def _forget_worker(self) -> None:
        if self._client is not None:
            self._client.kill()
            self._client._reap()
        self._client = None
        self._built = None
        self._caches = self.new_caches()

    def new_caches(self) -> WorkerCaches:
        """An empty record of a fresh worker's caches, for this preset's layers."""
        return WorkerCaches(tuple(self.layers()))

    def describe(self) -> dict[str, Any]:
        """Capabilities, device info and fingerprint, asked once of a worker."""
        if self._described is None:
            try:
                self._ensure_worker()
                self._described = self._client.request("describe", timeout_s=120)
            except WorkerFailure as exc:
                raise UserError(f"the builtin target's worker failed to start on {self.device}: "
                                f"{exc.reason}\n{exc.stderr_tail[-1500:]}") from None
            if self.device.startswith("cuda") and not (self._described.get("capabilities") or {}).get("cuda"):
                raise UserError(f"device {self.device!r} requested but the worker sees no CUDA GPU")
        return self._described

    def capabilities(self) -> dict[str, bool]:
        return self.describe()["capabilities"]

    def excluded(self) -> dict[tuple[str, Any], str]:
        from dsv4.knobs import excluded_values

        return excluded_values(self.capabilities())

    def why_excluded(self, config: dict[str, Any]) -> str | None:
        """Why this device cannot run `config`, or None. A knob's baseline value is never excluded:
        where every value of a knob needs a GPU (the Triton tile sizes), the baseline is the inert
        default the CPU code path ignores, not a choice."""
        excluded = self.excluded()
        baseline = self.baseline()
        pairs = [(k, v) for k, v in config.items() if k != "layer_overrides"]
        pairs += [(k, v) for _layer, k, v in config.get("layer_overrides", [])]
        for name, value in pairs:
            if (name, value) in excluded and value != baseline[name]:
                return f"{name}={value}: {excluded[(name, value)]} (device {self.device})"
        return None

    def environment(self) -> dict[str, Any]:
        return dict(self.describe().get("environment") or {})

    # ------------------------------------------------------------ configs and transitions

    def normalize(self, config: dict[str, Any]) -> dict[str, Any]:
        """Full knob dict (baseline for what is missing) + sorted layer_overrides; raises UserError for
        unknown knobs or values (the space is validated against knob_specs, so this is a caller bug)."""
        out = self.baseline()
        config = dict(config)
        layer_overrides = config.pop("layer_overrides", None) or []
        for name, value in config.items():
            out[name] = declared.knob_value(name, value, "config")
        lo = []
        for entry in layer_overrides:
            layer, name, value = entry
            if not 0 <= int(layer) < self._model.n_layers:
                raise UserError(f"layer override for layer {layer}: preset has layers 0..{self._model.n_layers - 1}")
            lo.append([int(layer), name, declared.knob_value(name, value, f"layer override {layer}")])
        out["layer_overrides"] = lo
        return out

    def transition(self, to_config: dict[str, Any]) -> Transition:
        alive = self._client is not None and self._client.alive
        return transition_facts(self._built, self.normalize(to_config), self._caches, alive)

    # ------------------------------------------------------------ evaluate

    def evaluate(self, request: EvalRequest) -> Measurement:
        """Never raises for a configuration it cannot run: an unknown knob or value, or a layer
        override outside the preset, comes back as a failed Measurement with the reason, as a crash
        or a hang does. A knob left out takes its baseline value (`fills_missing_knobs`).

        request.extra["processes"] (default: this target's `processes`): 2 measures the configuration
        again in a second worker and widens the CI to cover both (autoopt.targets.builtin.processes
        says why); the guard and the profile run in the first only."""
        n_processes = int(request.extra.get("processes", self.processes))
        request = dataclasses.replace(request, extra={k: v for k, v in request.extra.items() if k != "processes"})
        t0 = time.perf_counter()
        m = self._evaluate_here(request)
        pid = self._client.pid if self._client is not None else None
        if m.status == "failed":
            return m
        if n_processes < 2:
            return two.single(m, pid, "one process asked for")
        abort = request.extra.get("abort_below") or {}
        if any(c in m.tok_per_s and m.tok_per_s[c].ci_high < v for c, v in abort.items()):
            return two.single(m, pid, "a clear loser in the first (its CI top under the incumbent's figure)")
        crowded = self._one_worker_only(m)
        if crowded is not None:
            return two.single(m, pid, crowded)
        if self._twin is None:
            self._twin = BuiltinTarget(self.preset, self.device, self.shape, guard=False,
                                       warmup_steps=self.warmup_steps, warmup_min_s=self.warmup_min_s,
                                       startup_timeout_s=self.startup_timeout_s, worker_env=self.worker_env)
        second = self._twin.evaluate(dataclasses.replace(request, profile=False))
        twin_pid = self._twin._client.pid if self._twin._client is not None else None
        out = two.merged(m, second, (pid, twin_pid))
        out.costs_s["total"] = time.perf_counter() - t0
        return out

    def _one_worker_only(self, m: Measurement) -> str | None:
        """Why the card holds no second worker, once a configuration has shown it (for the rest of the
        run: a smaller configuration must not start a twin that a bigger one then runs out of memory
        beside); a twin already started is closed then, giving its memory back."""
        if self._one_worker_why is None and self.device.startswith("cuda"):
            device_bytes = (self.describe().get("device_info") or {}).get("memory_bytes")
            self._one_worker_why = two.too_crowded(m.peak_memory_bytes, device_bytes)
            if self._one_worker_why is not None and self._twin is not None:
                self._twin.close()
                self._twin = None
        return self._one_worker_why

    def _evaluate_here(self, request: EvalRequest) -> Measurement:
        """The measurement in this target's own worker (evaluate's contract)."""
        t0 = time.perf_counter()
        try:
            config = self.normalize(request.config)
        except UserError as exc:
            return Measurement.failed(dict(request.config), "exception", f"invalid configuration: {exc}",
                                      costs_s={"total": time.perf_counter() - t0})
        reason = self.why_excluded(config)
        if reason is not None:
            return Measurement.failed(config, "excluded", reason,
                                      costs_s={"total": time.perf_counter() - t0})
        payload = {
            "preset": self.preset, "shape": self.shape, "config": config,
            "concurrency": list(request.concurrency), "profile": request.profile,
            "min_samples": request.min_samples, "max_samples": request.max_samples,
            "time_limit_s": request.time_limit_s, "warmup_steps": self.warmup_steps,
            "guard": self.guard, "measure_if_wrong": self.measure_if_wrong, **request.extra,
        }
        if self.warmup_min_s is not None:
            payload["warmup_min_s"] = self.warmup_min_s
        restart_s = 0.0
        for attempt in (1, 2):
            try:
                self._ensure_worker()
                restart_s += self._take_restart_s()
                doc = self._client.request("measure", timeout_s=request.time_limit_s, **payload)
                break
            except WorkerFailure as exc:
                if exc.kind == "restart_required" and attempt == 1:
                    self._forget_worker()  # different model shape: a fresh process, then once more
                    continue
                restart_s += self._take_restart_s()  # a start that failed still cost its time
                if exc.dead or self._client is None or not self._client.alive:
                    self._forget_worker()
                self._built = None  # what the worker holds after a failed trial is not known
                kind = exc.kind if exc.kind != "restart_required" else "exception"
                wall = time.perf_counter() - t0
                return Measurement.failed(config, kind, exc.reason, exc.stderr_tail,
                                          costs_s={"restart": restart_s, "total": wall},
                                          environment=self._described.get("environment", {})
                                          if self._described else {})
        m = Measurement.from_dict(doc)
        m.costs_s["restart"] = m.costs_s.get("restart", 0.0) + restart_s
        m.costs_s["total"] = time.perf_counter() - t0
        self._built = config
        self._caches.remember(config)
        m.what_ran.setdefault("worker", f"pid {self._client.pid} on {self.device} "
                              f"(worker #{self.workers_started} of this target)")
        return m

    def close(self) -> None:
        if self._twin is not None:
            self._twin.close()
            self._twin = None
        if self._client is not None:
            self._client.close()
        self._client = None
        self._built = None
