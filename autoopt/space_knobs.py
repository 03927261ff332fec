"""The knobs of a space, checked against what the target declares.

`TargetInfo` is the part of a Target a space is validated against (knob specs, values the device cannot
run with their reasons, the baseline, the layer class of every layer). It comes either from a live
target (`from_target`) or, without starting anything and without torch, from the dsv4 declarations
(`declared`) — what `autoopt spaces` uses.

`parse_knob` turns one `knobs:` entry of a space file into a `KnobDef`, or into the reason the knob
was dropped (every value excluded on this device, or nothing left to choose).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from autoopt.space_doc import LineMap, SpaceDocument
from autoopt.targets.base import KnobSpec

RESTART_CLASSES = ("none", "recompile", "rebuild", "restart")
_KNOB_KEYS = ("values", "scope", "classes", "layers", "restart_class", "buckets", "prior", "help")
_SPEC_SCOPE = {"global": "global", "layer_class": "layer_class", "layers": "layer"}


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

    @classmethod
    def declared(cls, preset: str, device: str, shape_overrides: dict[str, Any] | None = None) -> "TargetInfo":
        """The builtin target's declarations for `preset` on `device`, from dsv4 alone (no torch).
        On cpu every value that needs CUDA/FP8/Triton is excluded; on cuda/auto nothing is
        (the live target decides FP8 when it starts)."""
        import dsv4
        from dsv4.knobs import excluded_values

        cfg = dsv4.preset(preset, **(shape_overrides or {}))
        caps = {} if device == "cpu" else {"cuda": True, "triton": True, "fp8": True}
        specs = tuple(KnobSpec(k.name, tuple(k.values), k.restart_class, tuple(k.scopes), tuple(k.buckets),
                               k.layer_classes) for k in dsv4.KNOBS)
        return cls(name="builtin", knob_specs=specs, excluded=excluded_values(caps),
                   baseline=dsv4.baseline_knobs(),
                   layers=tuple(cfg.layer_class(i) for i in range(cfg.n_layers)),
                   default_concurrency=(1, 4) if device == "cpu" else (1, 16, 64))


@dataclass(frozen=True)
class KnobDef:
    name: str
    values: tuple[Any, ...]  # what the search may choose (excluded values removed)
    scope: str  # global | layer_class | layers
    where: tuple[Any, ...]  # layer classes (layer_class) or layer indices (layers); () for global
    restart_class: str
    buckets: tuple[str, ...]
    baseline: Any
    prior_speedup: dict[Any, float] = field(default_factory=dict)  # value -> expected bucket speed-up
    prior_apply_cost_s: float | None = None  # overrides the space's per-restart-class prior
    excluded: dict[Any, str] = field(default_factory=dict)  # value -> reason
    help: str = ""


def _coerce(spec: KnobSpec, raw: Any) -> Any:
    for allowed in spec.values:
        if type(raw) is bool or type(allowed) is bool:
            if raw is allowed:
                return allowed
        elif raw == allowed or str(raw) == str(allowed):
            return allowed
    raise ValueError(raw)


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
            v = _coerce(spec, raw)
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
    buckets = body.get("buckets", list(spec.buckets))
    if not isinstance(buckets, list) or not all(isinstance(b, str) for b in buckets):
        raise doc.error(body, "buckets", f"{at}.buckets", f"expected a list of bucket names; got {buckets!r}")
    speedup, apply_cost = _parse_prior(doc, body, at, spec, usable, baseline)
    return KnobDef(name=name, values=usable, scope=scope, where=where, restart_class=restart,
                   buckets=tuple(buckets), baseline=baseline, prior_speedup=speedup,
                   prior_apply_cost_s=apply_cost, excluded=excluded, help=str(body.get("help", "")))


def _parse_scope(doc: SpaceDocument, body: LineMap, at: str, spec: KnobSpec,
                 info: TargetInfo) -> tuple[str, tuple[Any, ...]]:
    raw = body.get("scope", "global")
    classes, layers = body.get("classes"), body.get("layers")
    if isinstance(raw, LineMap) and len(raw) == 1 and next(iter(raw)) in ("layer_class", "layers"):
        key = next(iter(raw))
        classes, layers = (raw[key], layers) if key == "layer_class" else (classes, raw[key])
        raw = key
    expected = "global, layer_class (classes: [..]) or layers (layers: [..])"
    if raw not in _SPEC_SCOPE:
        raise doc.error(body, "scope", f"{at}.scope", f"expected {expected}; got {raw!r}")
    if _SPEC_SCOPE[raw] not in spec.scopes:
        ok = ", ".join(s if s != "layer" else "layers" for s in spec.scopes)
        raise doc.error(body, "scope", f"{at}.scope", f"{raw!r} is not supported by this knob (expected: {ok})")
    if classes is not None and raw != "layer_class":
        raise doc.error(body, "classes", f"{at}.classes", "only with scope: layer_class")
    if layers is not None and raw != "layers":
        raise doc.error(body, "layers", f"{at}.layers", "only with scope: layers")
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
    return "layers", tuple(dict.fromkeys(layers))


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
                    value = _coerce(spec, value)
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


__all__ = ["TargetInfo", "KnobDef", "parse_knob", "RESTART_CLASSES"]
