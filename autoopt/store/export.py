"""Best trial -> the export document `autoopt best --export config.yaml` writes (pure, no I/O).

The target's config-file module writes and reads the file (for the builtin target
autoopt.targets.builtin.config_file: it puts the format's version key "autoopt_export": 1 first):
{
  "target": str | None, "preset": str | None,
  "knobs": {knob: value},                       # global values (the config minus layer overrides)
  "layers": {layer_index: {knob: value}},       # every layer, fully expanded, for per-layer knobs
  "space": {"name": str | None, "sha256": str | None},
  "environment": {...},                         # fingerprint of where the trial was measured
  "evidence": {
    "tok_per_s": {C: {"median", "ci_low", "ci_high"}},
    "speedup":   {C: {"median", "ci_low", "ci_high"}},   # over the baseline; {} without one
    "objective": {"name", "mix", "median", "ci_low", "ci_high", "speedup"} | None,  # what `best`
                 # ranked by: "tok_per_s@C", or "tok_per_s@mix" with its weights in "mix"
    "correctness": {...}, "study": str, "trial_number": int, "trial_id": int,
  },
  "autoopt_version": str,
}
C and layer indices are ints. Speed-up interval (conservative): [trial.ci_low / base.ci_high,
trial.ci_high / base.ci_low], median trial.median / base.median (autoopt.store.analysis.speedup).

Per-layer knobs: those named in the run's settings["per_layer_knobs"] plus any knob that appears in
the config's "layer_overrides" ([[layer, knob, value], ...] or {layer: {knob: value}}). Layers: 0 ..
settings["n_layers"]-1 when the run recorded it, else the layers the overrides name.
"""
from __future__ import annotations

from typing import Any, Iterable

import autoopt
from autoopt.errors import UserError
from autoopt.store import analysis as an

OVERRIDES_KEY = "layer_overrides"


def split_config(config: dict[str, Any]) -> tuple[dict[str, Any], dict[int, dict[str, Any]]]:
    """config -> (global knobs, {layer: {knob: value}} overrides)."""
    knobs = {k: v for k, v in config.items() if k != OVERRIDES_KEY}
    raw = config.get(OVERRIDES_KEY) or []
    overrides: dict[int, dict[str, Any]] = {}
    if isinstance(raw, dict):
        items = [(layer, k, v) for layer, kv in raw.items() for k, v in (kv or {}).items()]
    else:
        items = []
        for entry in raw:
            if not isinstance(entry, (list, tuple)) or len(entry) != 3:
                raise UserError(f"config {OVERRIDES_KEY} entry {entry!r}: expected [layer, knob, value]")
            items.append(tuple(entry))
    for layer, knob, value in items:
        try:
            idx = int(layer)
        except (TypeError, ValueError):
            raise UserError(f"config {OVERRIDES_KEY}: layer {layer!r} is not an integer") from None
        overrides.setdefault(idx, {})[str(knob)] = value
    return knobs, overrides


def expand_layers(knobs: dict[str, Any], overrides: dict[int, dict[str, Any]],
                  n_layers: int | None, per_layer_knobs: Iterable[str] = ()) -> dict[int, dict[str, Any]]:
    """{layer: {knob: value}} for every layer and every per-layer knob (override, else global)."""
    names = list(dict.fromkeys([*per_layer_knobs, *(k for o in overrides.values() for k in o)]))
    if not names:
        return {}
    if n_layers is not None:
        bad = [i for i in overrides if not 0 <= i < n_layers]
        if bad:
            raise UserError(f"config {OVERRIDES_KEY} names layer(s) {bad} outside 0..{n_layers - 1}")
        layers: Iterable[int] = range(n_layers)
    else:
        layers = sorted(overrides)
    out = {}
    for i in layers:
        row = {}
        for k in names:
            if k in overrides.get(i, {}):
                row[k] = overrides[i][k]
            elif k in knobs:
                row[k] = knobs[k]
        out[i] = row
    return out


def build_export(trial: Any, baseline: Any | None, run: Any | None, *, n_layers: int | None = None,
                 per_layer_knobs: Iterable[str] | None = None, objective: an.ObjectiveKey | None = None,
                 version: str = autoopt.__version__) -> dict[str, Any]:
    """The export document of a successful trial. UserError for a failed/wrong/unfinished one.
    `objective`: what the trial was chosen on (analysis.key_of of the `best` document)."""
    if trial.state != "ok" or trial.measurement is None:
        f = trial.failure
        why = f" ({f.kind}: {f.reason})" if f else ""
        raise UserError(f"trial {trial.number} of study {trial.study!r} is {trial.state}{why}: only a "
                        f"successful trial can be exported")
    settings = (run.settings if run is not None else {}) or {}
    if n_layers is None and settings.get("n_layers") is not None:
        n_layers = int(settings["n_layers"])
    if per_layer_knobs is None:
        per_layer_knobs = list(settings.get("per_layer_knobs") or [])
    m = trial.measurement
    knobs, overrides = split_config(trial.config or m.config or {})
    cs = sorted(int(c) for c in m.tok_per_s)
    return {
        "target": run.target if run is not None else None,
        "preset": run.preset if run is not None else None,
        "knobs": knobs,
        "layers": expand_layers(knobs, overrides, n_layers, per_layer_knobs),
        "space": {"name": run.space_name if run is not None else None,
                  "sha256": run.space_sha256 if run is not None else None},
        "environment": dict(m.environment or {}),
        "evidence": {
            "tok_per_s": {c: an.interval(m.tok_per_s[str(c)]) for c in cs},
            "speedup": an.speedups(trial, baseline),
            "objective": _objective_evidence(trial, baseline, objective),
            "correctness": dict(m.correctness or {}),
            "study": trial.study,
            "trial_number": trial.number,
            "trial_id": trial.trial_id,
        },
        "autoopt_version": version,
    }


def _objective_evidence(trial: Any, baseline: Any | None, key: an.ObjectiveKey | None) -> dict[str, Any] | None:
    fig = an.figure(trial, key) if key is not None else None
    if fig is None:
        return None
    return {"name": an.objective_name(key), "mix": key.to_json() if isinstance(key, an.Mix) else None,
            **an.interval(fig), "speedup": an.speedup(fig, an.figure(baseline, key))}
