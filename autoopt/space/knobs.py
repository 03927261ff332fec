"""The knobs of a space, checked against what the target declares.

`KnobSpec` is a knob as a target declares it; `TargetInfo` is the part of a Target a space is validated
against (knob specs, values the device cannot run with their reasons, the baseline, the layer class of
every layer). It comes from a live target (`from_target`) or from a target's declarations without
starting anything (`autoopt.targets.declared`, what `autoopt spaces` uses): the space never imports a
target.

`parse_knob` turns one `knobs:` entry of a space file into a `KnobDef`, or into the reason the knob
was dropped (every value excluded on this device, or nothing left to choose).

Host cuts: a knob's values may cut host time or launches (`cuts`, of CUTS): "host" when the value
takes the host's per-op work out of the whole step it covers (a CUDA graph replays the step in one
launch; a compiled step runs no eager Python between kernels), "launches" when it merges kernels
(a fused epilogue, a one-launch GEMM), so the host time that comes with them shrinks with them.
In a space file: `cuts: [host, launches]` (every value but the baseline) or `cuts: {on: [host]}`
(per value); `cuts: []` drops the target's declaration. A knob with cuts also moves the profile's
host bucket (autoopt.measurement.HOST_BUCKET), added to its buckets.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from autoopt.measurement import HOST_BUCKET
from autoopt.space.document import LineMap, SpaceDocument
from autoopt.trial import RESTART_CLASSES

_KNOB_KEYS = ("values", "scope", "classes", "layers", "restart_class", "buckets", "cuts", "prior", "help")
SCOPES = ("global", "layer_class", "layer")  # one vocabulary: dsv4, KnobSpec, space files, parameters
CUTS = ("host", "launches")  # what a knob value may cut (module docstring)


@dataclass(frozen=True)
class KnobSpec:
    """A knob as a target declares it (the space file is validated against these)."""

    name: str
    values: tuple[Any, ...]
    restart_class: str  # none | recompile | rebuild | restart
    scopes: tuple[str, ...] = ("global",)  # of SCOPES
    buckets: tuple[str, ...] = ()
    layer_classes: tuple[str, ...] | None = None
    cuts: tuple[tuple[Any, tuple[str, ...]], ...] = ()  # (value, kinds of CUTS) pairs

    def coerce(self, raw: Any) -> Any:
        """The knob's own value for `raw` as a person wrote it (`--set attn_block_kv=64`, YAML): the
        one place text becomes a knob value. A YAML boolean matches only a boolean value (`on`/`off`
        in a space file are strings here). ValueError naming the knob and its values."""
        for allowed in self.values:
            if type(raw) is bool or type(allowed) is bool:
                if raw is allowed or (isinstance(raw, str) and raw.lower() == str(allowed).lower()):
                    return allowed
            elif raw == allowed or str(raw) == str(allowed):
                return allowed
        allowed_txt = ", ".join(str(v) for v in self.values)
        raise ValueError(f"knob {self.name!r} has no value {raw!r} (expected one of: {allowed_txt})")


@dataclass(frozen=True)
class TargetInfo:
    name: str
    knob_specs: tuple[KnobSpec, ...]
    excluded: dict[tuple[str, Any], str]  # (knob, value) -> why this device cannot run it
    baseline: dict[str, Any]
    layers: tuple[str, ...]  # layer class of each layer ("window" | "c4" | "c128")
    default_concurrency: tuple[int, ...] = (1,)

    @classmethod
    def from_target(cls, target: Any) -> "TargetInfo":
        layers = tuple(target.layers()) if hasattr(target, "layers") else ()
        return cls(name=getattr(target, "name", type(target).__name__),
                   knob_specs=tuple(target.knob_specs()), excluded=dict(target.excluded()),
                   baseline=dict(target.baseline()), layers=layers,
                   default_concurrency=tuple(target.default_concurrency()))


@dataclass(frozen=True)
class KnobDef:
    name: str
    values: tuple[Any, ...]  # what the search may choose (excluded values removed)
    scope: str  # global | layer_class | layer
    where: tuple[Any, ...]  # layer classes (layer_class) or layer indices (layers); () for global
    restart_class: str
    buckets: tuple[str, ...]
    baseline: Any
    prior_speedup: dict[Any, float] = field(default_factory=dict)  # value -> expected bucket speed-up
    prior_apply_cost_s: float | None = None  # overrides the space's per-restart-class prior
    excluded: dict[Any, str] = field(default_factory=dict)  # value -> reason
    help: str = ""
    cuts: dict[Any, tuple[str, ...]] = field(default_factory=dict)  # value -> kinds of CUTS


def parse_knob(doc: SpaceDocument, knobs: LineMap, name: Any, body: Any,
               specs: dict[str, KnobSpec], info: TargetInfo) -> KnobDef | str:
    """One `knobs:` entry -> KnobDef, or a string: why the knob was dropped on this device."""
    at = f"knobs.{name}"
    spec = specs.get(name)
    if spec is None:
        raise doc.error(knobs, name, at, f"unknown knob for target {info.name} "
                        f"(expected one of: {', '.join(sorted(specs))})")
    body = LineMap() if body is None else body
    if not isinstance(body, LineMap):
        raise doc.error(knobs, name, at, "expected a mapping (values, scope, restart_class, buckets, prior)")
    for key in body:
        if key not in _KNOB_KEYS:
            raise doc.error(body, key, f"{at}.{key}", f"unknown key (expected one of: {', '.join(_KNOB_KEYS)})")
    allowed_txt = ", ".join(str(v) for v in spec.values)

    raw_values = body.get("values", list(spec.values))
    if not isinstance(raw_values, list) or not raw_values:
        raise doc.error(body, "values", f"{at}.values", f"expected a non-empty list (of: {allowed_txt})")
    values: list[Any] = []
    for i, raw in enumerate(raw_values):
        try:
            v = spec.coerce(raw)
        except ValueError:
            raise doc.error(raw_values, i, f"{at}.values[{i}]",
                            f"expected one of: {allowed_txt}; got {raw!r}") from None
        if v not in values:
            values.append(v)
    excluded = {v: info.excluded[(name, v)] for v in values if (name, v) in info.excluded}
    baseline = info.baseline.get(name)
    if baseline in excluded:
        if len(excluded) == len(values):
            return f"excluded on this device: {excluded[baseline]}"
        return f"its baseline value {baseline!r} cannot run here: {excluded[baseline]}"
    usable = tuple(v for v in values if v not in excluded)
    if baseline not in usable:
        raise doc.error(body, "values", f"{at}.values",
                        f"must include the baseline value {baseline!r} (trial 0 is the baseline)")
    if len(usable) < 2:
        why = "; ".join(f"{v}: {r}" for v, r in excluded.items()) or "only one value listed"
        return f"nothing to choose besides the baseline {baseline!r} ({why})"

    scope, where = _parse_scope(doc, body, at, spec, info)
    restart = body.get("restart_class", spec.restart_class)
    if restart not in RESTART_CLASSES:
        raise doc.error(body, "restart_class", f"{at}.restart_class",
                        f"expected one of {', '.join(RESTART_CLASSES)}; got {restart!r}")
    if RESTART_CLASSES.index(restart) < RESTART_CLASSES.index(spec.restart_class):
        raise doc.error(body, "restart_class", f"{at}.restart_class",
                        f"{restart!r} is cheaper than the target declares ({spec.restart_class!r})")
    speedup, apply_cost = _parse_prior(doc, body, at, spec, usable, baseline)
    cuts = _parse_cuts(doc, body, at, spec, usable, baseline)
    return KnobDef(name=name, values=usable, scope=scope, where=where, restart_class=restart,
                   buckets=_parse_buckets(doc, body, at, spec, cuts), baseline=baseline, prior_speedup=speedup,
                   prior_apply_cost_s=apply_cost, excluded=excluded, help=str(body.get("help", "")),
                   cuts=cuts)


def _parse_buckets(doc: SpaceDocument, body: LineMap, at: str, spec: KnobSpec,
                   cuts: dict[Any, tuple[str, ...]]) -> tuple[str, ...]:
    """The buckets the knob moves; a knob with cuts also moves the host bucket."""
    buckets = body.get("buckets", list(spec.buckets))
    if not isinstance(buckets, list) or not all(isinstance(b, str) for b in buckets):
        raise doc.error(body, "buckets", f"{at}.buckets", f"expected a list of bucket names; got {buckets!r}")
    return tuple(buckets) + ((HOST_BUCKET,) if cuts and HOST_BUCKET not in buckets else ())


def _parse_cuts(doc: SpaceDocument, body: LineMap, at: str, spec: KnobSpec, usable: tuple[Any, ...],
                baseline: Any) -> dict[Any, tuple[str, ...]]:
    """`cuts` of a knob entry (module docstring) -> {usable non-baseline value: kinds}; absent: the
    target's declaration."""
    if "cuts" not in body:
        return {v: tuple(kinds) for v, kinds in spec.cuts if v in usable and v != baseline and kinds}
    raw = body["cuts"]
    if isinstance(raw, list):
        kinds = _cut_kinds(doc, body, "cuts", f"{at}.cuts", raw)
        return {v: kinds for v in usable if v != baseline} if kinds else {}
    if not isinstance(raw, LineMap):
        raise doc.error(body, "cuts", f"{at}.cuts",
                        f"expected a list of {' / '.join(CUTS)} or {{value: [..]}}; got {raw!r}")
    out: dict[Any, tuple[str, ...]] = {}
    for key, kinds_raw in raw.items():
        try:
            value = spec.coerce(key)
        except ValueError:
            raise doc.error(raw, key, f"{at}.cuts.{key}", f"unknown value {key!r} (expected one of: "
                            f"{', '.join(str(v) for v in spec.values)})") from None
        if value == baseline:
            raise doc.error(raw, key, f"{at}.cuts.{key}", "the baseline value: cuts are measured from it")
        kinds = _cut_kinds(doc, raw, key, f"{at}.cuts.{key}", kinds_raw)
        if value in usable and kinds:
            out[value] = kinds
    return out


def _cut_kinds(doc: SpaceDocument, parent: Any, key: Any, at: str, raw: Any) -> tuple[str, ...]:
    if not isinstance(raw, list):
        raise doc.error(parent, key, at, f"expected a list of: {', '.join(CUTS)}; got {raw!r}")
    for i, kind in enumerate(raw):
        if kind not in CUTS:
            raise doc.error(raw, i, f"{at}[{i}]", f"expected one of: {', '.join(CUTS)}; got {kind!r}")
    return tuple(dict.fromkeys(raw))


def _parse_scope(doc: SpaceDocument, body: LineMap, at: str, spec: KnobSpec,
                 info: TargetInfo) -> tuple[str, tuple[Any, ...]]:
    raw = body.get("scope", "global")
    classes, layers = body.get("classes"), body.get("layers")
    if isinstance(raw, LineMap) and len(raw) == 1 and next(iter(raw)) in ("layer_class", "layer"):
        key = next(iter(raw))
        classes, layers = (raw[key], layers) if key == "layer_class" else (classes, raw[key])
        raw = key
    expected = "global, layer_class (classes: [..]) or layer (layers: [..])"
    if raw not in SCOPES:
        raise doc.error(body, "scope", f"{at}.scope", f"expected {expected}; got {raw!r}")
    if raw not in spec.scopes:
        raise doc.error(body, "scope", f"{at}.scope",
                        f"{raw!r} is not supported by this knob (expected: {', '.join(spec.scopes)})")
    if classes is not None and raw != "layer_class":
        raise doc.error(body, "classes", f"{at}.classes", "only with scope: layer_class")
    if layers is not None and raw != "layer":
        raise doc.error(body, "layers", f"{at}.layers", "only with scope: layer")
    applies = lambda cls: spec.layer_classes is None or cls in spec.layer_classes  # noqa: E731
    if raw == "global":
        return "global", ()
    if raw == "layer_class":
        order = {c: i for i, c in enumerate(("window", "c4", "c128"))}  # DeepSeek-V4's, others after
        present = sorted((c for c in dict.fromkeys(info.layers) if applies(c)), key=lambda c: order.get(c, 99))
        if classes is None:
            if not present:
                raise doc.error(body, "scope", f"{at}.scope", "the model has no layer this knob applies to")
            return "layer_class", tuple(present)
        if not isinstance(classes, list) or not classes:
            raise doc.error(body, "classes", f"{at}.classes", f"expected a list of: {', '.join(present)}")
        for i, c in enumerate(classes):
            if c not in present:
                raise doc.error(classes, i, f"{at}.classes[{i}]",
                                f"expected one of: {', '.join(present)} (classes of this model the knob applies to); got {c!r}")
        return "layer_class", tuple(dict.fromkeys(classes))
    n = len(info.layers)
    if layers == "all":
        layers = [i for i in range(n) if applies(info.layers[i])]
    if not isinstance(layers, list) or not layers:
        raise doc.error(body, "layers" if "layers" in body else "scope", f"{at}.layers",
                        f"expected a list of layer indices 0..{n - 1} or 'all'")
    for i, layer in enumerate(layers):
        if not isinstance(layer, int) or isinstance(layer, bool) or not 0 <= layer < n:
            raise doc.error(layers, i, f"{at}.layers[{i}]", f"expected a layer index 0..{n - 1}; got {layer!r}")
        if not applies(info.layers[layer]):
            raise doc.error(layers, i, f"{at}.layers[{i}]",
                            f"layer {layer} is a {info.layers[layer]} layer; this knob applies to "
                            f"{', '.join(spec.layer_classes or ())} layers only")
    return "layer", tuple(dict.fromkeys(layers))


def _parse_prior(doc: SpaceDocument, body: LineMap, at: str, spec: KnobSpec, usable: tuple[Any, ...],
                 baseline: Any) -> tuple[dict[Any, float], float | None]:
    raw = body.get("prior")
    if raw is None:
        return {}, None
    if not isinstance(raw, LineMap):
        raise doc.error(body, "prior", f"{at}.prior", "expected {speedup: x | {value: x}, apply_cost_s: s}")
    speedup: dict[Any, float] = {}
    apply_cost: float | None = None
    for key, v in raw.items():
        if key == "speedup":
            items = v.items() if isinstance(v, dict) else [(u, v) for u in usable if u != baseline]
            for value, x in items:
                try:
                    value = spec.coerce(value)
                except ValueError:
                    raise doc.error(v if isinstance(v, LineMap) else raw, value if isinstance(v, LineMap) else key,
                                    f"{at}.prior.speedup", f"unknown value {value!r}") from None
                if not isinstance(x, (int, float)) or isinstance(x, bool) or x <= 0:
                    raise doc.error(raw, key, f"{at}.prior.speedup",
                                    f"expected a positive factor (2.0 = its buckets twice as fast); got {x!r}")
                speedup[value] = float(x)
        elif key == "apply_cost_s":
            if not isinstance(v, (int, float)) or isinstance(v, bool) or v < 0:
                raise doc.error(raw, key, f"{at}.prior.apply_cost_s", f"expected seconds >= 0; got {v!r}")
            apply_cost = float(v)
        else:
            raise doc.error(raw, key, f"{at}.prior.{key}", "unknown key (expected speedup, apply_cost_s)")
    return speedup, apply_cost


__all__ = ["KnobSpec", "TargetInfo", "KnobDef", "parse_knob", "RESTART_CLASSES", "SCOPES", "CUTS"]
