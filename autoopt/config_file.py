"""The exported configuration file (YAML): what `autoopt best --export` writes and `autoopt measure
--config` reads.

Full export:
    autoopt_export: 1
    target: builtin
    preset: flash-slice
    shape: {context_len: 8192}           # optional shape overrides of the preset
    knobs: {mhc_gemm: bf16, attention: mma, ...}
    layers: {3: {mhc_operand: view_bf16_residual}}   # layer index (or layer class) -> knob -> value
    space: {...}  environment: {...}  evidence: {...}  autoopt_version: 0.1.0

A hand-written file may hold only {preset, knobs, layers}. Layer keys may be a layer index or a layer
class ("window", "c4", "c128"), which expands to every layer of that class in the preset. Every error
is a UserError naming the file, the key and what was expected (the CLI prints it and exits 2).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from autoopt.errors import UserError

EXPORT_VERSION = 1
_TOP_KEYS = ("autoopt_export", "target", "preset", "shape", "knobs", "layers", "space", "environment",
             "evidence", "autoopt_version")


@dataclass
class LoadedConfig:
    target: str
    preset: str
    knobs: dict[str, Any]
    layer_overrides: list[list[Any]]  # [[layer, knob, value], ...], layer classes expanded
    raw: dict[str, Any]
    shape: dict[str, Any] = field(default_factory=dict)

    def config(self) -> dict[str, Any]:
        """The target-config dict (knob -> value + layer_overrides) an EvalRequest carries."""
        return {**self.knobs, "layer_overrides": [list(t) for t in self.layer_overrides]}


def _plain(obj: Any) -> Any:
    # yaml.safe_dump refuses tuples and numpy scalars; exports must stay plain YAML (no python tags)
    if isinstance(obj, dict):
        return {(k if isinstance(k, (str, int, float, bool)) else str(k)): _plain(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_plain(v) for v in obj]
    if hasattr(obj, "item") and not isinstance(obj, (str, bytes)):
        return obj.item()
    return obj


def write_export(path: str | Path, doc: dict[str, Any]) -> Path:
    """Write an export document as YAML; keys in the documented order, `autoopt_export` first."""
    if "knobs" not in doc or "preset" not in doc:
        raise ValueError("an export document needs at least 'preset' and 'knobs'")
    ordered: dict[str, Any] = {"autoopt_export": doc.get("autoopt_export", EXPORT_VERSION)}
    for key in _TOP_KEYS[1:]:
        if key in doc:
            ordered[key] = doc[key]
    for key, value in doc.items():  # keep anything extra a caller added, after the known keys
        ordered.setdefault(key, value)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(_plain(ordered), sort_keys=False, default_flow_style=False))
    return path


def load_config_file(path: str | Path) -> LoadedConfig:
    """Read and validate a config file against dsv4's knobs and the preset's layers."""
    from dsv4.config import PRESET_NAMES, preset
    from dsv4.knobs import KNOB_BY_NAME, LAYER_CLASSES, coerce_value

    path = Path(path)
    where = str(path)
    try:
        text = path.read_text()
    except OSError as exc:
        raise UserError(f"{where}: cannot read config file ({exc.strerror or exc})") from None
    try:
        raw = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise UserError(f"{where}: not valid YAML ({str(exc).splitlines()[0]})") from None
    if not isinstance(raw, dict):
        raise UserError(f"{where}: expected a mapping with keys preset, knobs, layers; "
                        f"got {type(raw).__name__}")
    version = raw.get("autoopt_export", EXPORT_VERSION)
    if version != EXPORT_VERSION:
        raise UserError(f"{where}: autoopt_export: expected {EXPORT_VERSION}, got {version!r}")
    unknown = sorted(set(raw) - set(_TOP_KEYS))
    if unknown:
        raise UserError(f"{where}: unknown top-level key {unknown[0]!r} (expected some of: "
                        f"{', '.join(_TOP_KEYS)})")
    target = raw.get("target", "builtin")
    if target != "builtin":
        raise UserError(f"{where}: target: only 'builtin' configs can be loaded here, got {target!r}")
    preset_name = raw.get("preset", "tiny")
    if preset_name not in PRESET_NAMES:
        raise UserError(f"{where}: preset: expected one of {', '.join(PRESET_NAMES)}, got {preset_name!r}")
    try:
        from autoopt.targets.builtin import parse_shape

        shape = parse_shape(_mapping(raw, "shape", where))
    except UserError as exc:
        raise UserError(f"{where}: shape: {exc}") from None
    knobs_in = _mapping(raw, "knobs", where)
    layers_in = _mapping(raw, "layers", where)

    knobs: dict[str, Any] = {}
    for name, value in knobs_in.items():
        knob = KNOB_BY_NAME.get(name)
        if knob is None:
            raise UserError(f"{where}: knobs.{name}: unknown knob (expected one of: "
                            f"{', '.join(KNOB_BY_NAME)})")
        try:
            knobs[name] = coerce_value(knob, value)
        except ValueError as exc:
            raise UserError(f"{where}: knobs.{name}: {exc}") from None
    try:
        model = preset(preset_name, **shape)
    except (TypeError, ValueError) as exc:
        raise UserError(f"{where}: shape: {exc}") from None

    overrides: list[list[Any]] = []
    per_class: dict[tuple[str, str], dict[int, Any]] = {}  # class-scoped knobs given layer by layer
    for layer_key, layer_knobs in layers_in.items():
        if str(layer_key) in LAYER_CLASSES:
            layer_ids, scope = model.layers_of_class(str(layer_key)), "layer_class"
        else:
            try:
                layer_ids, scope = [int(layer_key)], "layer"
            except (TypeError, ValueError):
                raise UserError(f"{where}: layers.{layer_key}: expected a layer index 0..{model.n_layers - 1} "
                                f"or a layer class ({', '.join(LAYER_CLASSES)})") from None
            if not 0 <= layer_ids[0] < model.n_layers:
                raise UserError(f"{where}: layers.{layer_key}: preset {preset_name} has layers "
                                f"0..{model.n_layers - 1}")
        if not isinstance(layer_knobs, dict):
            raise UserError(f"{where}: layers.{layer_key}: expected a mapping knob -> value")
        for name, value in layer_knobs.items():
            knob = KNOB_BY_NAME.get(name)
            if knob is None:
                raise UserError(f"{where}: layers.{layer_key}.{name}: unknown knob")
            # a layer-class knob written layer by layer (as `autoopt best --export` writes every
            # override) is fine when each class's layers agree: checked once all layers are read
            by_class = scope == "layer" and "layer_class" in knob.scopes
            if scope not in knob.scopes and not by_class:
                raise UserError(f"{where}: layers.{layer_key}.{name}: knob allows scopes "
                                f"{', '.join(knob.scopes)}, not {scope}")
            try:
                value = coerce_value(knob, value)
            except ValueError as exc:
                raise UserError(f"{where}: layers.{layer_key}.{name}: {exc}") from None
            if by_class and scope not in knob.scopes:
                per_class.setdefault((model.layer_class(layer_ids[0]), name), {})[layer_ids[0]] = value
            overrides.extend([layer, name, value] for layer in layer_ids)
    for (cls, name), values in per_class.items():
        layers = model.layers_of_class(cls)
        if set(values) != set(layers) or len({str(v) for v in values.values()}) != 1:
            got = ", ".join(f"{i}: {values.get(i, '(unset)')}" for i in layers)
            raise UserError(f"{where}: layers: knob {name} is set per layer class, so the {cls} layers "
                            f"({', '.join(map(str, layers))}) need one value each alike; got {got}")
    return LoadedConfig(target=target, preset=preset_name, knobs=knobs, layer_overrides=overrides,
                        raw=raw, shape=dict(shape))


def _mapping(raw: dict[str, Any], key: str, where: str) -> dict[Any, Any]:
    value = raw.get(key)
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise UserError(f"{where}: {key}: expected a mapping, got {type(value).__name__}")
    return value
