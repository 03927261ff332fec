"""The replay target (`--target replay:TABLE`): answers from a recorded table on a simulated clock.

Nothing sleeps: every evaluation advances `now()` by what it would have cost on the machine the
table describes:
  transition  the most expensive restart_s among the knobs that change (a failed trial leaves the
              worker in an unknown state: the next evaluation pays a fresh start, the largest
              restart_s); the very first evaluation pays a fresh start too
  compile     the row's compile_s, the first time that configuration is visited ("kernels compiled
              before cost nothing"); plus the side-car's first_use_s {knob: {value: seconds}} the first
              time any configuration with that value is (a compile whose cache every later one shares:
              the first torch.compile of the whole step, say)
  measure     the row's measure_s (or the table's/option's default)
  profile     profile_s when the request asks for a profile
  failure     a configuration that fails (absent from the table, or a recorded error) costs its
              transition and compile plus `fail_s` (default: the table's median compile_s, at least a
              quarter of a typical measurement): trying an invalid configuration is never free

Measurements: per-step samples are drawn (seeded) so that the median of one evaluation has relative
sd `noise`; with noise 0 every sample is the recorded figure and the CI has no width. For a
minimized objective (time) the figure reported as throughput is its reciprocal, so relative gains
stay speed-ups. The table's bucket columns come back as `buckets_ms`. Configurations absent from the
table, failed rows and unknown knobs/values come back as failed measurements with a reason.
"""
from __future__ import annotations

import random
from pathlib import Path
from typing import Any

from autoopt.measurement import Measurement, throughput_from_step_times
from autoopt.targets.base import EvalRequest, KnobSpec, Transition
from autoopt.targets.replay.table import ReplayTable, Row, load_table, match_value, norm_value
from autoopt.trial import RestartClass


def _class_for_seconds(seconds: float) -> str:
    if seconds <= 0:
        return "none"
    return "recompile" if seconds < 30 else "rebuild" if seconds < 120 else "restart"


class ReplayTarget:
    name = "replay"

    def __init__(self, table: ReplayTable | str | Path, *, seed: int = 0, objective: str | None = None,
                 minimize: bool | None = None, measure_s: float | None = None,
                 profile_s: float | None = None, noise: float | None = None,
                 restart_s: dict[str, float] | None = None, concurrency: int | None = None) -> None:
        self.table = table if isinstance(table, ReplayTable) else load_table(table, objective, minimize)
        meta = self.table.meta
        row_measure = sorted(r.measure_s for r in self.table.rows.values() if r.measure_s is not None)
        typical = row_measure[len(row_measure) // 2] if row_measure else 60.0
        self.measure_s = float(measure_s if measure_s is not None else meta.get("measure_s", typical))
        self.profile_s = float(profile_s if profile_s is not None else meta.get("profile_s", 0.0))
        self.noise = noise if noise is not None else meta.get("noise")
        self.restart_s = {k: float((meta.get("restart_s") or {}).get(k, 0.0)) for k in self.table.knobs}
        self.restart_s.update({k: float(v) for k, v in (restart_s or {}).items() if k in self.restart_s})
        classes = meta.get("restart_class") or {}
        self.restart_class = {k: str(classes.get(k) or _class_for_seconds(self.restart_s[k]))
                              for k in self.table.knobs}
        self.concurrency = int(concurrency or meta.get("concurrency") or 1)
        compiles = sorted(r.compile_s for r in self.table.rows.values())
        self.fail_s = float(meta.get("fail_s", max(compiles[len(compiles) // 2], 0.25 * self.measure_s)))
        self._rng = random.Random(seed)
        self._clock_s = 0.0
        self._built: dict[str, Any] | None = None  # None: nothing running (fresh start needed)
        self._visited: set[tuple[str, ...]] = set()
        self.first_use_s = {(k, norm_value(v)): float(sec) for k, by in (meta.get("first_use_s") or {}).items()
                            for v, sec in (by or {}).items()}
        self._used: set[tuple[str, str]] = set()  # (knob, value) whose first use was paid
        self._keys: dict[tuple, tuple[str, ...] | None] = {}  # raw values -> table key (None: invalid)
        self.evaluations = 0

    # ---- the Target protocol -------------------------------------------------------------------
    def knob_specs(self) -> list[KnobSpec]:
        buckets = self.table.meta.get("buckets") or {}
        return [KnobSpec(name=k, values=self.table.values[k], restart_class=self.restart_class[k],
                         scopes=("global",), buckets=tuple(buckets.get(k) or ()))
                for k in self.table.knobs]

    def excluded(self) -> dict[tuple[str, Any], str]:
        return {}

    def baseline(self) -> dict[str, Any]:
        return self.table.baseline()

    def default_concurrency(self) -> tuple[int, ...]:
        return (self.concurrency,)

    def environment(self) -> dict[str, Any]:
        return {"target": "replay", "table": str(self.table.path), "table_sha256": self.table.sha256,
                "rows": len(self.table.rows), "objective": self.table.objective, "unit": self.table.unit,
                "direction": "minimize" if self.table.minimize else "maximize",
                "clock": "simulated", "device": "none (recorded table)"}

    def now(self) -> float:
        return self._clock_s

    def transition(self, to_config: dict[str, Any]) -> Transition:
        """The table records what each switch and each first compile takes: those seconds are facts
        here (`known_s`), not an estimate."""
        changed = self._changed(to_config)
        restart = self._restart_cost(changed)
        key = self._key_or_none(to_config)
        cached = key is not None and key in self._visited
        row = self.table.rows.get(key) if key is not None else None
        compile_s = 0.0 if cached or row is None else row.compile_s + self._first_use(to_config)
        return Transition(restart_class=self._transition_class(changed), changed_knobs=tuple(changed),
                          cached=cached, known_s=restart + compile_s)

    def evaluate(self, request: EvalRequest) -> Measurement:
        self.evaluations += 1
        config = dict(request.config)
        overrides = config.pop("layer_overrides", None)
        problem = self._check(config, overrides)
        changed = self._changed(config) if problem is None else list(self.table.knobs)
        costs = {"restart": 0.0, "build": 0.0, "compile": 0.0, "measure": 0.0, "profile": 0.0}
        transition_s = self._restart_cost(changed)
        slot = {"restart": "restart", "rebuild": "build", "recompile": "compile"}.get(
            self._transition_class(changed), "restart")
        costs[slot] += transition_s
        row = None if problem else self.table.rows.get(self.table.key(config))
        if row is not None and self.table.key(config) not in self._visited:
            costs["compile"] += row.compile_s + self._first_use(config)
            self._visited.add(self.table.key(config))
            self._used |= {(k, norm_value(config[k])) for k in self.table.knobs}
        if problem or row is None or row.value is None:
            self._built = None
            costs["compile"] += self.fail_s
            self._advance(costs)
            reason = problem or (row.error if row is not None else
                                 "configuration absent from the recorded table (invalid)")
            kind = "excluded" if problem or row is None else row.failure_kind
            return Measurement.failed(request.config, kind, reason, costs_s=costs,
                                      environment=self.environment())
        self._built = dict(config)
        costs["measure"] = row.measure_s if row.measure_s is not None else self.measure_s
        costs["profile"] = self.profile_s if request.profile else 0.0
        self._advance(costs)
        return self._measurement(request, row, costs)

    def close(self) -> None:
        return None

    # ---- helpers ---------------------------------------------------------------------------------
    def _measurement(self, request: EvalRequest, row: Row, costs: dict[str, float]) -> Measurement:
        score = self.table.score(row.value)
        noise = float(row.noise if row.noise is not None else (self.noise or 0.0))
        conc = int(request.concurrency[0]) if request.concurrency else self.concurrency
        n = max(6, int(request.min_samples))
        # per-sample sd such that the median of n samples has relative sd `noise` (1.2533 = sqrt(pi/2))
        sample_sd = noise * (n ** 0.5) / 1.2533
        steps = [conc / (score * max(0.05, 1.0 + self._rng.gauss(0.0, sample_sd)))
                 if noise > 0 else conc / score for _ in range(n)]
        tp = throughput_from_step_times(steps, conc)
        shown = f"{self.table.objective}={row.value:g}"
        return Measurement(status="ok", config=request.config, tok_per_s={str(conc): tp},
                           buckets_ms=dict(row.buckets_ms),
                           bucket_coverage=1.0 if row.buckets_ms else None,
                           correctness={"verdict": "ok", "source": "recorded table"},
                           costs_s=costs, what_ran={"replay": shown},
                           environment=self.environment())

    def _advance(self, costs: dict[str, float]) -> None:
        costs["total"] = sum(v for k, v in costs.items() if k != "total")
        self._clock_s += costs["total"]

    def _check(self, config: dict[str, Any], overrides: Any) -> str | None:
        if overrides:
            return "the replay table has no per-layer columns (layer_overrides given)"
        unknown = sorted(set(config) - set(self.table.knobs))
        if unknown:
            return f"knob(s) {unknown} are not columns of the replay table"
        for k in self.table.knobs:
            if k not in config:
                return f"knob {k!r} missing from the configuration"
            v = self.table.value_of(k, config[k])
            if v is None:
                return f"{k}={config[k]!r} never appears in the replay table"
            config[k] = v
        return None

    def _key_or_none(self, config: dict[str, Any]) -> tuple[str, ...] | None:
        """The table key a configuration names, None when invalid (memoised: the agent asks for
        hundreds per trial)."""
        if config.get("layer_overrides"):
            return None
        raw = (tuple(_hashable(config.get(k)) for k in self.table.knobs),
               tuple(sorted(str(k) for k in config if k != "layer_overrides" and k not in self.restart_s)))
        if raw not in self._keys:
            cfg = {k: v for k, v in config.items() if k != "layer_overrides"}
            self._keys[raw] = None if self._check(cfg, None) else self.table.key(cfg)
        return self._keys[raw]

    def _changed(self, config: dict[str, Any]) -> list[str]:
        if self._built is None:
            return list(self.table.knobs)
        return [k for k in self.table.knobs
                if config.get(k) != self._built.get(k) and  # the same value: no lookup needed
                self.table.value_of(k, config.get(k)) != self._built.get(k)]

    def _first_use(self, config: dict[str, Any]) -> float:
        """Seconds of the first_use_s values in `config` not paid yet."""
        if not self.first_use_s:
            return 0.0
        return sum(self.first_use_s.get((k, norm_value(config.get(k))), 0.0) for k in self.table.knobs
                   if (k, norm_value(config.get(k))) not in self._used)

    def _restart_cost(self, changed: list[str]) -> float:
        return max((self.restart_s[k] for k in changed), default=0.0)

    def _transition_class(self, changed: list[str]) -> str:
        if self._built is None:
            return "restart"
        return RestartClass.dearest(self.restart_class[k] for k in changed).value


def from_spec(spec: str, **options: Any) -> ReplayTarget:
    """`replay:path/to/table.csv` -> ReplayTarget (options as for the constructor)."""
    if not spec.startswith("replay:"):
        raise ValueError(f"not a replay target spec: {spec!r}")
    return ReplayTarget(spec[len("replay:"):], **options)


def replay_space(target: ReplayTarget) -> Any:
    """A SearchSpace over the table's knobs (every knob global), priors and cuts from the side-car YAML.

    The space file format is the one `autoopt.space.space` reads; it is written to a temporary file and
    loaded through the public loader so a replay space validates exactly like any other.
    """
    import json
    import tempfile

    from autoopt.space.space import SearchSpace
    from autoopt.space.knobs import TargetInfo

    meta = target.table.meta
    priors = meta.get("priors") or {}
    base = target.baseline()
    knobs: dict[str, Any] = {}
    for spec in target.knob_specs():
        body: dict[str, Any] = {"values": [_plain(v) for v in spec.values], "scope": "global",
                                "restart_class": spec.restart_class, "buckets": list(spec.buckets)}
        prior: dict[str, Any] = {"apply_cost_s": target.restart_s[spec.name]}
        speedup = {str(v): float(s) for v, s in (priors.get(spec.name) or {}).items()
                   if match_value(spec.values, v) is not None and match_value(spec.values, v) != base[spec.name]}
        if speedup:
            prior["speedup"] = speedup
        body["prior"] = prior
        if spec.name in (meta.get("cuts") or {}):  # the host time / launches its values cut
            body["cuts"] = meta["cuts"][spec.name]
        knobs[spec.name] = body
    c = target.concurrency
    doc = {"name": f"replay_{target.table.path.stem}", "target": "replay", "device": "cpu",
           "description": f"every knob of the replay table {target.table.path.name}",
           "concurrency": [c], "objective": {"concurrency": c}, "knobs": knobs}
    if meta.get("apply_cost_s"):
        doc["priors"] = {"apply_cost_s": dict(meta["apply_cost_s"])}
    if meta.get("constraints"):  # the recorded space's constraints: its absent rows are not candidates
        doc["constraints"] = [str(c) for c in meta["constraints"]]
    info = TargetInfo.from_target(target)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / f"replay_{target.table.path.stem}.yaml"
        path.write_text(json.dumps(doc, indent=1))
        return SearchSpace.load(path, info=info)


def _hashable(v: Any) -> Any:
    return (type(v).__name__, v) if isinstance(v, (bool, int, float, str)) else (type(v).__name__, repr(v))


def _plain(v: Any) -> Any:
    return v if isinstance(v, (int, float, str)) and not isinstance(v, bool) else str(v)
