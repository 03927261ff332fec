"""SearchSpace: what `autoopt run` may change, read from a YAML file and checked against the target.

    name: dsv4_tiny_cpu
    target: builtin            # which Target tunes it
    preset: tiny
    device: cpu                # cpu | cuda | auto
    concurrency: [1, 4]        # measured at each; the objective reads some of them
    objective: {concurrency: 4}            # or {weights: {1: 0.25, 4: 0.75}} (weighted geometric mean)
    measurement: {min_samples: 6, max_samples: 12, time_limit_s: 60, processes: 2}
    priors: {apply_cost_s: {none: 0, recompile: 5, rebuild: 8, restart: 25}}
    knobs:
      mhc_gemm:
        values: [fp32, bf16]
        scope: layer_class     # global | layer_class (+ classes: [..]) | layer (+ layers: [..])
        restart_class: none    # may be dearer than the target declares, never cheaper
        buckets: [gemm_simt, gemm_tensorop, copy_cast]
        prior: {speedup: {bf16: 2.0}}      # expected speed-up of its buckets (for the agent)
    constraints:                           # knob names: checked on every layer; parameter
      - "mhc_operand == 'cast_from_fp32' or mhc_gemm == 'bf16'"   # names (mhc_gemm@c4) too

Scopes make the parameters: `mhc_gemm` (global), `mhc_gemm@c4` (one per layer class), `attention@L3`
(one per listed layer). Values this device cannot run are dropped with the target's reason; a knob
left with nothing to choose is dropped with its reason. Errors name file, line, key and expectation.
"""
from __future__ import annotations

import itertools
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from autoopt.errors import SpaceError
from autoopt.space.constraints import Constraint, ConstraintSyntaxError, parse_constraint
from autoopt.space.document import LineMap, LineSeq, SpaceDocument
from autoopt.space.knobs import RESTART_CLASSES, SCOPES, KnobDef, KnobSpec, TargetInfo, parse_knob
from autoopt.space.objective import Objective

__all__ = ["SearchSpace", "KnobDef", "ParamDef", "Objective", "TargetInfo", "SCOPES"]

DEVICES = ("cpu", "cuda", "auto")
_ENUMERATE_MAX = 4096  # points checked one by one when proving constraints can hold
_TOP_KEYS = ("name", "description", "target", "preset", "device", "shape_overrides", "concurrency",
             "objective", "measurement", "priors", "knobs", "constraints")


@dataclass(frozen=True)
class ParamDef:
    """One search parameter: a knob at one scope position (`knob`, `knob@c4`, `knob@L3`)."""

    name: str
    knob: str
    scope: str
    where: Any  # None (global), a class name, or a layer index
    choices: tuple[Any, ...]
    layers: tuple[int, ...]  # layer indices it sets (all layers for global)


class SearchSpace:
    """A validated space bound to a target's declarations (`TargetInfo`)."""

    def __init__(self, doc: SpaceDocument, info: TargetInfo) -> None:
        self.doc, self.info = doc, info
        self.path: Path = doc.path
        self.sha256: str = doc.sha256
        self.knobs: list[KnobDef] = []
        self.excluded_knobs: dict[str, str] = {}  # knob -> why it was dropped entirely
        self.constraints: list[Constraint] = []
        self._parse()
        self.params: list[ParamDef] = self._make_params()
        self.param_by_name = {p.name: p for p in self.params}
        self._knobs_over_every_layer = self._knobs_covering_every_layer()  # see params_to_config
        self._keys: dict[tuple, str] = {}  # config_key's memo: a search asks for it ~400 times a trial
        # knob names (any the target declares) and this space's parameter names (knob@c4, knob@L3)
        self._parse_constraints(self.doc.data, {s.name for s in self.info.knob_specs} | set(self.param_by_name))

    # ---- loading -------------------------------------------------------------------------------
    @classmethod
    def load(cls, name_or_path: str | Path, info: TargetInfo) -> "SearchSpace":
        """Read and validate against `info` (a live target's, or a target's declarations:
        `autoopt.targets.declared.load_declared` does both without starting anything)."""
        return cls(SpaceDocument.read(name_or_path), info)

    def _parse(self) -> None:
        doc, d = self.doc, self.doc.data
        for key in d:
            if key not in _TOP_KEYS:
                raise doc.error(d, key, str(key), f"unknown key (expected one of: {', '.join(_TOP_KEYS)})")
        self.name = str(d.get("name") or doc.path.stem)
        self.description = str(d.get("description") or "")
        self.target_name = str(d.get("target", "builtin"))
        self.preset = str(d.get("preset", "tiny"))
        self.device = str(d.get("device", "auto"))
        if self.device not in DEVICES:
            raise doc.error(d, "device", "device", f"expected one of {', '.join(DEVICES)}; got {self.device!r}")
        self.shape_overrides = dict(d.get("shape_overrides") or {})
        self.concurrency = self._parse_concurrency(d)
        self.objective = self._parse_objective(d)
        self.measurement = self._parse_measurement(d)
        self.apply_cost_s = self._parse_priors(d)
        knobs = d.get("knobs")
        if not isinstance(knobs, LineMap) or not knobs:
            raise doc.error(d, "knobs", "knobs", "expected a mapping of knob name -> settings")
        specs = {s.name: s for s in self.info.knob_specs}
        for name, body in knobs.items():
            self._parse_knob(knobs, name, body, specs)

    def _parse_concurrency(self, d: LineMap) -> tuple[int, ...]:
        raw = d.get("concurrency", list(self.info.default_concurrency))
        if isinstance(raw, int) and not isinstance(raw, bool):
            raw = [raw]
        if not isinstance(raw, list) or not raw or not all(
                isinstance(c, int) and not isinstance(c, bool) and c > 0 for c in raw):
            raise self.doc.error(d, "concurrency", "concurrency", f"expected a list of positive integers; got {raw!r}")
        return tuple(dict.fromkeys(raw))

    def _parse_objective(self, d: LineMap) -> Objective:
        raw = d.get("objective", {"concurrency": self.concurrency[-1]})
        err = lambda what: self.doc.error(d, "objective", "objective", what)  # noqa: E731
        if isinstance(raw, int) and not isinstance(raw, bool):
            raw = {"concurrency": raw}
        if not isinstance(raw, dict) or not (set(raw) - {"metric"}) <= {"concurrency", "weights"} \
                or ("concurrency" in raw) == ("weights" in raw):
            raise err(f"expected {{concurrency: C}} or {{weights: {{C: weight, ...}}}}; got {dict(raw) if isinstance(raw, dict) else raw!r}")
        if raw.get("metric", "tok_per_s") != "tok_per_s":
            raise err(f"metric: expected tok_per_s; got {raw['metric']!r}")
        weights = {raw["concurrency"]: 1.0} if "concurrency" in raw else dict(raw["weights"] or {})
        for c, w in weights.items():
            if c not in self.concurrency:
                raise err(f"concurrency {c!r} is not measured (concurrency: {list(self.concurrency)})")
            if not isinstance(w, (int, float)) or isinstance(w, bool) or w <= 0:
                raise err(f"weight of C={c} must be a positive number; got {w!r}")
        total = sum(weights.values())
        return Objective({int(c): w / total for c, w in weights.items()})

    def _parse_measurement(self, d: LineMap) -> dict[str, float]:
        raw = d.get("measurement") or {}
        # processes: worker processes each configuration is measured in (autoopt.targets.builtin.processes)
        out = {"min_samples": 10, "max_samples": 40, "time_limit_s": 300.0, "processes": 2}
        for k, v in raw.items():
            if k not in out:
                raise self.doc.error(raw, k, f"measurement.{k}", f"unknown key (expected one of: {', '.join(out)})")
            if not isinstance(v, (int, float)) or isinstance(v, bool) or v <= 0:
                raise self.doc.error(raw, k, f"measurement.{k}", f"expected a positive number; got {v!r}")
            out[k] = v
        if out["max_samples"] < out["min_samples"]:
            raise self.doc.error(raw, "max_samples", "measurement.max_samples", "expected >= min_samples")
        out["min_samples"], out["max_samples"] = int(out["min_samples"]), int(out["max_samples"])
        if out["processes"] not in (1, 2):
            raise self.doc.error(raw, "processes", "measurement.processes", f"expected 1 or 2; got {out['processes']!r}")
        return out

    def _parse_priors(self, d: LineMap) -> dict[str, float]:
        raw = d.get("priors") or {}
        out = {"none": 0.0, "recompile": 5.0, "rebuild": 10.0, "restart": 30.0}
        for k, v in raw.items():
            if k != "apply_cost_s" or not isinstance(v, dict):
                raise self.doc.error(raw, k, f"priors.{k}", "expected apply_cost_s: {restart_class: seconds}")
            for cls_name, secs in v.items():
                if cls_name not in RESTART_CLASSES or not isinstance(secs, (int, float)) or secs < 0:
                    raise self.doc.error(v, cls_name, f"priors.apply_cost_s.{cls_name}",
                                         f"expected a restart class ({', '.join(RESTART_CLASSES)}) -> seconds >= 0")
                out[cls_name] = float(secs)
        return out

    def _parse_knob(self, knobs: LineMap, name: str, body: Any, specs: dict[str, KnobSpec]) -> None:
        result = parse_knob(self.doc, knobs, name, body, specs, self.info)
        if isinstance(result, str):
            self.excluded_knobs[name] = result
        else:
            self.knobs.append(result)

    def _parse_constraints(self, d: LineMap, known: set[str]) -> None:
        raw = d.get("constraints")
        if raw is None:
            return
        if not isinstance(raw, LineSeq):
            raise self.doc.error(d, "constraints", "constraints", "expected a list of expressions")
        for i, text in enumerate(raw):
            try:
                constraint = parse_constraint(text, known)
                self._check_values(constraint)
                self._check_can_hold(constraint)
            except ConstraintSyntaxError as exc:
                raise self.doc.error(raw, i, f"constraints[{i}]", str(exc)) from None
            self.constraints.append(constraint)
        if self.constraints and not self._some_point_feasible():
            raise self.doc.error(d, "constraints", "constraints", "no configuration of this space satisfies "
                                 "every constraint together: the search would have nothing to try")

    def _declared_values(self, name: str) -> tuple[Any, ...]:
        """What a constraint name can hold: a knob's declared values, or a parameter's knob's."""
        knob = self.param_by_name[name].knob if name in self.param_by_name else name
        spec = next(s for s in self.info.knob_specs if s.name == knob)
        return spec.values

    def _check_values(self, constraint: Constraint) -> None:
        for name, value in constraint.compared_values():
            allowed = self._declared_values(name)
            if not any(value == v and type(value) is type(v) or str(value) == str(v) for v in allowed):
                raise ConstraintSyntaxError(
                    f"{name!r} has no value {value!r} (expected one of: {', '.join(map(str, allowed))}) "
                    f"in {str(constraint)!r}")

    def _searched_values(self, name: str) -> list[Any]:
        """The values `name` takes somewhere in this space (its parameters' choices; the baseline
        value for a knob the space does not search)."""
        if name in self.param_by_name:
            return list(self.param_by_name[name].choices)
        found = [v for p in self.params if p.knob == name for v in p.choices]
        return list(dict.fromkeys(found)) or [self.info.baseline.get(name)]

    def _check_can_hold(self, constraint: Constraint) -> None:
        """A constraint that holds for no combination of the values its names take is an error
        (checked alone: exact for that constraint, whatever the others say)."""
        names = sorted(constraint.names)
        pools = [self._searched_values(n) for n in names]
        if math.prod(len(p) for p in pools) > _ENUMERATE_MAX:
            return
        if not any(constraint.holds(dict(zip(names, combo))) for combo in itertools.product(*pools)):
            raise ConstraintSyntaxError(f"{str(constraint)!r} holds for no value this space gives "
                                        f"{', '.join(names)}: nothing could be tried")

    def _some_point_feasible(self) -> bool:
        """Whether some point satisfies every constraint: the baseline, else every point of a small
        space (true when it cannot tell: only a proven empty space is refused)."""
        if self.is_feasible(self.baseline_params()):
            return True
        names = [p.name for p in self.params]
        if self.size() <= _ENUMERATE_MAX:
            points = (dict(zip(names, combo)) for combo in itertools.product(*(p.choices for p in self.params)))
            return any(self.is_feasible(p) for p in points)
        return True  # too many points to prove it here; the sampler reports an empty space as it finds it

    def _make_params(self) -> list[ParamDef]:
        layers = self.info.layers
        out: list[ParamDef] = []
        for k in self.knobs:
            if k.scope == "global":
                out.append(ParamDef(k.name, k.name, "global", None, k.values, tuple(range(len(layers)))))
            elif k.scope == "layer_class":
                for cls_name in k.where:
                    idx = tuple(i for i, c in enumerate(layers) if c == cls_name)
                    out.append(ParamDef(f"{k.name}@{cls_name}", k.name, "layer_class", cls_name, k.values, idx))
            else:
                for i in k.where:
                    out.append(ParamDef(f"{k.name}@L{i}", k.name, "layer", i, k.values, (i,)))
        return out

    # ---- params <-> target config --------------------------------------------------------------
    def baseline_params(self) -> dict[str, Any]:
        """Every parameter at the target's baseline value (the case study's starting point)."""
        base = self.info.baseline
        return {p.name: base[p.knob] for p in self.params}

    def params_to_config(self, params: dict[str, Any]) -> dict[str, Any]:
        """Flat params -> the target's config: global knob values plus `layer_overrides`
        [[layer, knob, value], ...] (sorted, only where a layer differs from the global value).

        A knob chosen per layer class or per layer over every layer of the model keeps a global value
        that reaches only the parts outside the layers (dsv4: hc_head's mHC GEMM after the last layer).
        That value is the last layer's, the layer whose output those parts read: so `mhc_gemm@*=bf16`
        builds the all-bf16 step an engineer writes as `mhc_gemm: bf16`, not bf16 layers before an
        fp32 head that no parameter could reach."""
        self._check_keys(params)
        cfg = {k: v for k, v in self.info.baseline.items() if k != "layer_overrides"}
        for p in self.params:
            if p.scope == "global":
                cfg[p.knob] = params[p.name]
        per_layer: dict[tuple[int, str], Any] = {}
        for scope in ("layer_class", "layer"):  # a single-layer choice wins over its class
            for p in self.params:
                if p.scope == scope:
                    for layer in p.layers:
                        per_layer[(layer, p.knob)] = params[p.name]
        n_layers = len(self.info.layers)
        for knob in self._knobs_over_every_layer:
            cfg[knob] = per_layer[(n_layers - 1, knob)]
        cfg["layer_overrides"] = [[layer, knob, v] for (layer, knob), v in sorted(per_layer.items())
                                  if v != cfg[knob]]
        return cfg

    def _knobs_covering_every_layer(self) -> tuple[str, ...]:
        """Knobs with no global parameter whose per-layer parameters cover every layer of the model."""
        covered: dict[str, set[int]] = {}
        for p in self.params:
            if p.scope != "global":
                covered.setdefault(p.knob, set()).update(p.layers)
        every = set(range(len(self.info.layers)))
        return tuple(k for k, layers in covered.items() if every and layers >= every)

    def config_key(self, params: dict[str, Any]) -> str:
        """A canonical text of the config these params build (equal keys: same code paths).
        Memoised on the values with their types (1, 1.0 and True hash alike but key apart)."""
        try:
            memo = tuple((type(params[p.name]), params[p.name]) for p in self.params)
            key = self._keys.get(memo) if len(params) == len(self.params) else None
        except (KeyError, TypeError):  # another space's params, or an unhashable value: no memo
            memo = key = None
        if key is None:
            key = json.dumps(self.params_to_config(params), sort_keys=True, default=str)
            if memo is not None and len(params) == len(self.params):
                self._keys = {} if len(self._keys) > 100_000 else self._keys
                self._keys[memo] = key
        return key

    def layer_values(self, config: dict[str, Any], layer: int) -> dict[str, Any]:
        """Knob values in effect on `layer` under `config`."""
        env = {k: v for k, v in config.items() if k != "layer_overrides"}
        for lyr, knob, v in config.get("layer_overrides", ()):
            if lyr == layer:
                env[knob] = v
        return env

    def violations(self, params: dict[str, Any]) -> list[str]:
        """Why `params` is not a valid point of this space (empty list: valid)."""
        problems = []
        for name, v in params.items():
            p = self.param_by_name.get(name)
            if p is None:
                problems.append(f"unknown parameter {name!r}")
            elif v not in p.choices:
                problems.append(f"{name}={v!r} is not one of {list(p.choices)}")
        missing = [p.name for p in self.params if p.name not in params]
        if missing:
            problems.append(f"missing parameter(s) {', '.join(missing)}")
        if problems:
            return problems
        config = self.params_to_config(params)
        for c in self.constraints:
            for layer in range(max(1, len(self.info.layers))):
                env = {**params, **self.layer_values(config, layer)}  # knob@c4 names: a param's value
                if c.names <= set(env) and not c.holds(env):
                    cls_name = self.info.layers[layer] if self.info.layers else "?"
                    problems.append(f"constraint `{c}` fails on layer {layer} ({cls_name})")
                    break
        return problems

    def is_feasible(self, params: dict[str, Any]) -> bool:
        return not self.violations(params)

    def validate_params(self, params: dict[str, Any]) -> None:
        problems = self.violations(params)
        if problems:
            raise SpaceError(f"{self.doc.display_path}: params do not fit space {self.name!r}: "
                             + "; ".join(problems))

    def _check_keys(self, params: dict[str, Any]) -> None:
        missing = [p.name for p in self.params if p.name not in params]
        if missing:
            raise SpaceError(f"space {self.name!r}: params lack {', '.join(missing)}")

    # ---- introspection -------------------------------------------------------------------------
    def distributions(self) -> dict[str, Any]:
        """Optuna CategoricalDistribution per parameter (imports optuna lazily)."""
        from optuna.distributions import CategoricalDistribution

        return {p.name: CategoricalDistribution(list(p.choices)) for p in self.params}

    def size(self) -> int:
        """Number of parameter combinations (before constraints)."""
        return math.prod(len(p.choices) for p in self.params) if self.params else 1

    def restart_class_of(self, param_or_knob: str) -> str:
        knob = self.param_by_name[param_or_knob].knob if param_or_knob in self.param_by_name else param_or_knob
        return next(k.restart_class for k in self.knobs if k.name == knob)

    def measurement_settings(self) -> dict[str, Any]:
        return dict(self.measurement)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready description (for `autoopt spaces --json` and the run's recorded settings)."""
        return {
            "name": self.name, "path": str(self.path), "sha256": self.sha256,
            "description": self.description, "target": self.target_name, "preset": self.preset,
            "device": self.device, "concurrency": list(self.concurrency),
            "objective": {"weights": {str(c): w for c, w in self.objective.weights.items()},
                          "text": self.objective.describe()},
            "measurement": self.measurement, "apply_cost_s": self.apply_cost_s,
            "size": self.size(), "params": [p.name for p in self.params],
            "knobs": [{"name": k.name, "values": list(k.values), "scope": k.scope,
                       "where": list(k.where), "restart_class": k.restart_class,
                       "buckets": list(k.buckets), "baseline": k.baseline,
                       "prior_speedup": {str(v): s for v, s in k.prior_speedup.items()},
                       "excluded": {str(v): r for v, r in k.excluded.items()}} for k in self.knobs],
            "excluded_knobs": dict(self.excluded_knobs),
            "constraints": [str(c) for c in self.constraints],
        }
