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
from autoopt.targets.builtin import declared

EXPORT_VERSION = 1
_TOP_KEYS = ("autoopt_export", "target", "preset", "shape", "knobs", "layers", "space", "environment",
             "evidence", "autoopt_version", "warnings")  # warnings: what `best` said when it exported


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
    """Write an export document (autoopt.store.export.build_export's) as YAML, `autoopt_export` first
    and the known keys in their documented order: the one writer of this format. UserError when the
    path is a directory, its directory does not exist (nothing is created silently) or the write fails."""
    if "knobs" not in doc or "preset" not in doc:
        raise ValueError("an export document needs at least 'preset' and 'knobs'")
    path = Path(path)
    if path.is_dir():
        raise UserError(f"cannot write {path}: it is a directory (give a file name, e.g. {path / 'config.yaml'})")
    if not path.parent.is_dir():
        raise UserError(f"cannot write {path}: directory {path.parent} does not exist")
    ordered: dict[str, Any] = {"autoopt_export": doc.get("autoopt_export", EXPORT_VERSION)}
    for key in _TOP_KEYS[1:]:
        if key in doc:
            ordered[key] = doc[key]
    for key, value in doc.items():  # keep anything extra a caller added, after the known keys
        ordered.setdefault(key, value)
    try:
        path.write_text(yaml.safe_dump(_plain(ordered), sort_keys=False, default_flow_style=False))
    except OSError as exc:
        raise UserError(f"cannot write {path}: {exc.strerror or exc}") from None
    return path


def load_config_file(path: str | Path) -> LoadedConfig:
    """Read and validate a config file against the builtin target's knobs and the preset's layers."""
    from dsv4.config import preset

    where = str(path)
    raw = _read_mapping(Path(path))
    preset_name, shape = _header(raw, where)
    knobs = _global_knobs(_mapping(raw, "knobs", where), where)
    try:
        model = preset(preset_name, **shape)
    except (TypeError, ValueError) as exc:
        raise UserError(f"{where}: shape: {exc}") from None
    overrides = _layer_overrides(_mapping(raw, "layers", where), model, where)
    return LoadedConfig(target="builtin", preset=preset_name, knobs=knobs, layer_overrides=overrides,
                        raw=raw, shape=dict(shape))


def _read_mapping(path: Path) -> dict[str, Any]:
    where = str(path)
    try:
        text = path.read_text()
    except OSError as exc:
        raise UserError(f"{where}: cannot read config file ({exc.strerror or exc})") from None
    except UnicodeDecodeError:
        raise UserError(f"{where}: not a text file (expected a YAML config, as `autoopt best --export` "
                        f"writes)") from None
    try:
        raw = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise UserError(f"{where}: not valid YAML ({str(exc).splitlines()[0]})") from None
    if not isinstance(raw, dict):
        raise UserError(f"{where}: expected a mapping with keys preset, knobs, layers; "
                        f"got {type(raw).__name__}")
    return raw


def _header(raw: dict[str, Any], where: str) -> tuple[str, dict[str, int]]:
    """Version, top-level keys, target, preset and shape overrides of a config file."""
    from dsv4.config import PRESET_NAMES

    from autoopt.targets.builtin.target import parse_shape

    version = raw.get("autoopt_export", EXPORT_VERSION)
    if version != EXPORT_VERSION:
        raise UserError(f"{where}: autoopt_export: expected {EXPORT_VERSION}, got {version!r}")
    unknown = sorted((str(k) for k in set(raw) - set(_TOP_KEYS)))
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
        return preset_name, parse_shape(_mapping(raw, "shape", where))
    except UserError as exc:
        raise UserError(f"{where}: shape: {exc}") from None


def _global_knobs(knobs_in: dict[Any, Any], where: str) -> dict[str, Any]:
    return {name: declared.knob_value(name, value, f"{where}: knobs.{name}") for name, value in knobs_in.items()}


def _layer_ids(layer_key: Any, model: Any, where: str) -> tuple[list[int], str]:
    """A `layers:` key (an index or a layer class) -> (layer indices, scope)."""
    from dsv4.knobs import LAYER_CLASSES

    if str(layer_key) in LAYER_CLASSES:
        return model.layers_of_class(str(layer_key)), "layer_class"
    try:
        layer = int(layer_key)
    except (TypeError, ValueError):
        raise UserError(f"{where}: layers.{layer_key}: expected a layer index 0..{model.n_layers - 1} "
                        f"or a layer class ({', '.join(LAYER_CLASSES)})") from None
    if not 0 <= layer < model.n_layers:
        raise UserError(f"{where}: layers.{layer_key}: preset {model.preset} has layers "
                        f"0..{model.n_layers - 1}")
    return [layer], "layer"


def _layer_overrides(layers_in: dict[Any, Any], model: Any, where: str) -> list[list[Any]]:
    specs = declared.spec_by_name()
    overrides: list[list[Any]] = []
    per_class: dict[tuple[str, str], dict[int, Any]] = {}  # class-scoped knobs given layer by layer
    for layer_key, layer_knobs in layers_in.items():
        layer_ids, scope = _layer_ids(layer_key, model, where)
        if not isinstance(layer_knobs, dict):
            raise UserError(f"{where}: layers.{layer_key}: expected a mapping knob -> value")
        for name, value in layer_knobs.items():
            at = f"{where}: layers.{layer_key}.{name}"
            value = declared.knob_value(name, value, at)
            spec = specs[name]
            # a layer-class knob written layer by layer (as `autoopt best --export` writes every
            # override) is fine when each class's layers agree: checked once all layers are read
            by_class = scope == "layer" and "layer_class" in spec.scopes
            if scope not in spec.scopes and not by_class:
                raise UserError(f"{at}: knob allows scopes {', '.join(spec.scopes)}, not {scope}")
            if by_class and scope not in spec.scopes:
                per_class.setdefault((model.layer_class(layer_ids[0]), name), {})[layer_ids[0]] = value
            overrides.extend([layer, name, value] for layer in layer_ids)
    _check_classes_agree(per_class, model, where)
    return overrides


def _check_classes_agree(per_class: dict[tuple[str, str], dict[int, Any]], model: Any, where: str) -> None:
    for (cls, name), values in per_class.items():
        layers = model.layers_of_class(cls)
        if set(values) != set(layers) or len({str(v) for v in values.values()}) != 1:
            got = ", ".join(f"{i}: {values.get(i, '(unset)')}" for i in layers)
            raise UserError(f"{where}: layers: knob {name} is set per layer class, so the {cls} layers "
                            f"({', '.join(map(str, layers))}) need one value each alike; got {got}")


def _mapping(raw: dict[str, Any], key: str, where: str) -> dict[Any, Any]:
    value = raw.get(key)
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise UserError(f"{where}: {key}: expected a mapping, got {type(value).__name__}")
    return value
