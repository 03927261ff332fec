"""autoopt measure: measure one configuration of the builtin decode step in a worker process
(correctness guard -> timed steps per concurrency -> optional profile) and print the figures.

Parsing and rendering only; the work is autoopt.targets.builtin.target. torch is imported by the worker,
never here.
"""
from __future__ import annotations

import json
import re
import sys
from pathlib import Path
from typing import Any, Optional

import typer

from autoopt.cli.app import app
from autoopt.errors import UserError

_SET_RE = re.compile(r"^(?P<knob>[A-Za-z_][A-Za-z0-9_]*)(?:@(?P<layer>[A-Za-z0-9_]+))?=(?P<value>.+)$")
_DEVICE_RE = re.compile(r"^(cpu|auto|cuda(:\d+)?)$")

EPILOG = ("Examples:\n\n  autoopt measure --preset tiny --json\n\n  autoopt measure --set mhc_gemm=bf16 --set mhc_operand=view_bf16_residual --profile\n\n  autoopt measure --config config.yaml\n\n"
          "Exit codes: 0 = measured and correct; 1 = the configuration is wrong (guard verdict) or "
          "failed (crash, hang, OOM, CUDA/compile error, excluded on this device) — its figures are "
          "still printed; 2 = bad input (unknown knob or value, bad --set/--shape syntax, unreadable "
          "--config file, unknown preset or device).")


def parse_sets(items: list[str], n_layers_of: Any) -> tuple[dict[str, Any], list[list[Any]]]:
    """--set KNOB=VALUE / KNOB@LAYER=VALUE (LAYER: an index or a layer class) -> (knobs, overrides).

    `n_layers_of` is the DecodeConfig of the preset, used to expand layer classes and check indices.
    """
    from dsv4.knobs import LAYER_CLASSES

    from autoopt.targets.builtin.declared import knob_value, spec_by_name

    specs = spec_by_name()

    knobs: dict[str, Any] = {}
    overrides: list[list[Any]] = []
    for item in items:
        m = _SET_RE.match(item.strip())
        if not m:
            raise UserError(f"--set {item!r}: expected KNOB=VALUE or KNOB@LAYER=VALUE "
                            f"(LAYER: a layer index or one of {', '.join(LAYER_CLASSES)})")
        name, layer, raw = m["knob"], m["layer"], m["value"]
        value = knob_value(name, raw, f"--set {item!r}")
        knob = specs[name]
        if layer is None:
            knobs[name] = value
            continue
        model = n_layers_of
        if layer in LAYER_CLASSES:
            scope, layers = "layer_class", model.layers_of_class(layer)
        elif layer.isdigit() and int(layer) < model.n_layers:
            scope, layers = "layer", [int(layer)]
        else:
            raise UserError(f"--set {item!r}: layer {layer!r}: expected an index 0..{model.n_layers - 1} "
                            f"or a layer class ({', '.join(LAYER_CLASSES)})")
        if scope not in knob.scopes:
            raise UserError(f"--set {item!r}: knob {name!r} allows scopes {', '.join(knob.scopes)}, "
                            f"not {scope}")
        overrides.extend([lyr, name, value] for lyr in layers)
    return knobs, overrides


def parse_kv(items: list[str], flag: str) -> dict[str, str]:
    out = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key.strip() or not value.strip():
            raise UserError(f"{flag} {item!r}: expected KEY=VALUE")
        out[key.strip()] = value.strip()
    return out


def parse_concurrency(text: str) -> tuple[int, ...]:
    try:  # an empty item ("1,,4", "4,") is a typo, not a value to skip
        values = tuple(int(x) for x in text.split(","))
    except ValueError:
        values = ()
    if not values or any(v < 1 for v in values):
        raise UserError(f"--concurrency {text!r}: expected positive integers separated by commas, e.g. 1,4")
    return values


@app.command("measure", epilog=EPILOG)
def measure(
    preset: Optional[str] = typer.Option(None, "--preset", help="Model preset: tiny, flash-slice, pro-slice "
                                         "(default: the --config file's, else tiny)."),
    sets: list[str] = typer.Option([], "--set", help="KNOB=VALUE, or KNOB@LAYER=VALUE with LAYER an index "
                                   "or a layer class (window, c4, c128). Repeatable; wins over --config."),
    shapes: list[str] = typer.Option([], "--shape", help="Shape override of the preset, KEY=VALUE "
                                     "(e.g. hidden=512, context_len=8192). Repeatable."),
    config: Optional[Path] = typer.Option(None, "--config", help="Exported or hand-written config YAML."),
    concurrency: Optional[str] = typer.Option(None, "--concurrency", help="Comma-separated batch sizes "
                                              "(default: 1,16,64 on a GPU, 1,4 on a CPU)."),
    profile: bool = typer.Option(False, "--profile", help="Capture a profile and report kernel buckets."),
    steps: Optional[int] = typer.Option(None, "--steps", min=3, help="Timed steps per concurrency "
                                        "(default: adaptive, 10 to 40 until the 95% CI is within ±2%)."),
    warmup: int = typer.Option(3, "--warmup", min=1, help="Warm-up steps per concurrency (discarded)."),
    warmup_s: float = typer.Option(0.5, "--warmup-s", min=0.0, help="...and warm up for at least this "
                                   "many seconds (clocks ramp up from idle)."),
    device: str = typer.Option("auto", "--device", help="cpu, cuda, cuda:N or auto (default: cuda where "
                               "an NVIDIA GPU is visible, else cpu; it says which and why)."),
    threads: Optional[int] = typer.Option(None, "--threads", min=1, help="torch intra-op threads in the "
                                          "worker (default: 1 on a CPU, torch's default on a GPU)."),
    timeout: float = typer.Option(300.0, "--timeout", help="Seconds before the worker counts as hung."),
    json_out: bool = typer.Option(False, "--json", help="Print one JSON document (the Measurement)."),
) -> None:
    """Measure one configuration: correctness guard, tokens/s ± 95% CI per concurrency, MBU,
    optional profile buckets, costs and what actually ran."""
    try:
        target, request = _prepare(preset, sets, shapes, config, concurrency, profile, steps, warmup,
                                   device, timeout, threads, warmup_s)
    except UserError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from None
    try:
        if json_out:
            m = target.evaluate(request)
        else:
            from rich.console import Console

            with Console(stderr=True).status(f"measuring preset {target.preset} on {target.device} "
                                             f"at C={','.join(map(str, request.concurrency))} ..."):
                m = target.evaluate(request)
    except UserError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from None
    finally:
        target.close()
    if json_out:
        sys.stdout.write(json.dumps(m.to_dict()) + "\n")
    else:
        from autoopt.cli.render import print_measurement

        print_measurement(m, header=f"autoopt measure — preset {target.preset} on {target.device}")
    raise typer.Exit(0 if m.status == "ok" else 1)


def _prepare(preset: str | None, sets: list[str], shapes: list[str], config: Path | None,
             concurrency: str | None, profile: bool, steps: int | None, warmup: int, device: str,
             timeout: float, threads: int | None = None, warmup_s: float | None = None) -> tuple[Any, Any]:
    from dsv4.config import PRESET_NAMES, preset as make_preset

    from autoopt.targets.base import EvalRequest
    from autoopt.targets.builtin.limits import require_fit
    from autoopt.targets.builtin.target import BuiltinTarget, parse_shape

    if not timeout > 0:
        raise UserError(f"--timeout {timeout:g}: expected a positive number of seconds")
    if not _DEVICE_RE.match(device):
        raise UserError(f"--device {device!r}: expected cpu, cuda, cuda:N or auto")
    knobs: dict[str, Any] = {}
    overrides: list[list[Any]] = []
    shape: dict[str, Any] = {}
    if config is not None:
        from autoopt.targets.builtin.config_file import load_config_file

        loaded = load_config_file(config)
        preset = preset or loaded.preset
        knobs, overrides, shape = dict(loaded.knobs), list(loaded.layer_overrides), dict(loaded.shape)
    preset = preset or "tiny"
    if preset not in PRESET_NAMES:
        raise UserError(f"--preset {preset!r}: expected one of {', '.join(PRESET_NAMES)}")
    try:
        shape.update(parse_shape(parse_kv(shapes, "--shape")))
    except UserError as exc:
        raise UserError(f"--shape: {exc}" if not str(exc).startswith("--shape") else str(exc)) from None
    try:
        model = make_preset(preset, **shape)
    except ValueError as exc:
        raise UserError(f"--shape: {exc}") from None
    set_knobs, set_overrides = parse_sets(sets, model)
    knobs.update(set_knobs)
    overrides.extend(set_overrides)  # later entries win, so --set beats the file per layer too
    chosen = None
    if device == "auto":  # decided here without torch; the worker records what it really ran on
        from autoopt.targets.builtin.devices import guess_device

        guess = guess_device()
        device, chosen = guess.device, f"device: {guess.device} ({guess.how}; --device picks another)"
    target = BuiltinTarget(preset, device, shape, warmup_steps=warmup, warmup_min_s=warmup_s, threads=threads)
    conc = parse_concurrency(concurrency) if concurrency else target.default_concurrency()
    require_fit(target, conc)  # DoesNotFit (a UserError, exit 2) before any session is built
    n_min, n_max = (steps, steps) if steps else (10, 40)
    request = EvalRequest(config={**knobs, "layer_overrides": overrides}, concurrency=conc,
                          profile=profile, min_samples=n_min, max_samples=n_max, time_limit_s=timeout)
    target.normalize(request.config)  # unknown knob/value -> UserError now, before a worker starts
    if chosen:
        print(chosen, file=sys.stderr)  # said once the input is known good (errors stay one line)
    return target, request
