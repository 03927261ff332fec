"""What switching the builtin target's live worker to another configuration must do again: the
facts of its Transition (autoopt.targets.base), kept apart from the worker plumbing so that a replay
of a recorded study (benchmarks/cost_replay.py) derives the same facts the live target reported.

A worker caches three kinds of work, and a switch redoes whichever of them it invalidates:
  - a recompile-class knob's kernels compile once per specialisation (`kernels`): the attention
    kernel of a layer class once per tuple of its mode and tile knobs (Triton specialises on all of
    them together), every other recompile-class knob once per value, and under step_compile the
    kernels Inductor generates for the torch ops of each knob's value (a switch back to a value
    built eager, not compiled, took 10.5 s there: trial 58). A configuration all of whose
    kernels were compiled before is `cached`, even as a combination never built: on the H200, under
    step_compile, such switches took 0.5-0.8 s and those with one new kernel 8-12 s, while keying the
    cache on the whole combination called most of both cold (h200_live_10m_run5, trials 53-73);
  - under step_compile=inductor Dynamo traces the whole step, so ANY knob that changes the traced
    code (every knob but cuda_graphs, whose capture wraps the compiled step) makes a new graph. The
    step_compile knob keeps its value, yet its compile is redone (`redone`), with Inductor's
    in-process caches warm: on the H200 such re-traces took 3.5-16 s against 108 s for the first
    step compile (benchmarks/results/h200_live_10m_run3, trials 15-21), while a configuration traced
    before in this worker is a Dynamo cache hit (`traced`; 0.7-1.1 s there, trials 19 and 22). So is a
    new combination of parts traced before: the step breaks into graphs at every opaque Triton kernel,
    and each layer class's graphs are guarded on that class's knob values, so a switch all of whose
    (class, knob, value) parts this worker traced (`parts`) and whose kernels are cached re-traces
    nothing new (on the H200: 14 of 16 such switches took 0.55-1.06 s, while cached switches with a
    part new to a class took 1.3-11 s; benchmarks/results/h200_live_10m_run5..run8_resumed);
  - under cuda_graphs=on every switch that changes the step captures the graph again (1.1-3.3 s
    for runtime switches there, trials 3-13, against 2.3 s for turning the graphs on).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from autoopt.targets.base import Transition
from autoopt.trial import RestartClass


@dataclass
class WorkerCaches:
    """What the live worker has built (cleared with the worker). `layer_classes`: the preset's class
    of each layer (DecodeConfig.layer_class), which the attention kernels are specialised per."""

    layer_classes: tuple[str, ...] = ()
    kernels: set[tuple] = field(default_factory=set)  # kernel specialisations compiled (kernel_keys)
    traced: set[tuple] = field(default_factory=set)  # configurations whose step Dynamo traced
    parts: set[tuple] = field(default_factory=set)  # (class, knob, value) parts of traced steps (part_keys)

    def remember(self, config: dict[str, Any]) -> None:
        """`config` (normalized) was built and measured in this worker."""
        self.kernels |= self.kernel_keys(config)
        if step_compiled(config):
            self.traced.add(trace_key(config))
            self.parts |= self.part_keys(config)

    def clear(self) -> None:
        self.kernels.clear()
        self.traced.clear()
        self.parts.clear()

    def part_keys(self, config: dict[str, Any]) -> set[tuple]:
        """(layer class, knob, value) of every knob that changes the traced code, per class in use:
        what each class's graphs are guarded on. Layers unknown: one class."""
        per_layer = overrides_by_layer(config)
        return {(cls, k, per_layer.get(i, {}).get(k, config[k]))
                for i, cls in enumerate(self.layer_classes or ("all",)) for k in traced_knobs()}

    def parts_traced(self, config: dict[str, Any]) -> bool:
        """Whether every part of `config`'s step was traced here (a new combination of old parts)."""
        return bool(self.parts) and self.part_keys(config) <= self.parts

    def warm_for(self, config: dict[str, Any]) -> bool:
        """Whether every kernel `config` compiles was compiled here, in whatever combination: its
        compiles then hit warm in-process caches (a kernel never compiled, say the first step
        compile, is not)."""
        return bool(self.kernels) and self.kernel_keys(config) <= self.kernels

    def kernel_keys(self, config: dict[str, Any]) -> set[tuple]:
        """The specialisations `config` compiles: ("attention", class, mode, *tiles) per layer
        class in use, and (knob, value) for every other recompile-class knob's value in use."""
        from dsv4.knobs import ATTENTION_TILE_KNOBS

        attention = ("attention", *ATTENTION_TILE_KNOBS)
        if self.layer_classes:
            per_layer = overrides_by_layer(config)
            keys = {("attention", cls, *(per_layer.get(i, {}).get(k, config[k]) for k in attention))
                    for i, cls in enumerate(self.layer_classes)}
        else:  # the layers unknown: the attention knobs' whole assignment is one specialisation
            keys = {("attention", *(effective(config, k) for k in attention))}
        keys |= {v for v in recompile_values(config) if v[0] not in attention}
        keys |= self.triton_keys(config)
        if step_compiled(config):  # Inductor generates kernels for the torch ops every knob chooses
            keys |= {(config["step_compile"], *v) for v in knob_values(config) if v[0] != "cuda_graphs"}
        return keys

    def triton_keys(self, config: dict[str, Any]) -> set[tuple]:
        """The (kernel, operand) specialisations `config`'s Triton kernels compile
        (dsv4.specialisations, what the worker asks); layers unknown: none."""
        from dsv4.specialisations import model_triton_keys

        per_layer = overrides_by_layer(config)
        knobs = [k for k in config if k != "layer_overrides"]
        layers = [(cls, {k: per_layer.get(i, {}).get(k, config[k]) for k in knobs})
                  for i, cls in enumerate(self.layer_classes)]
        return model_triton_keys(layers, config) if layers else set()

    def respecialised(self, config: dict[str, Any]) -> set[str]:
        """The knobs whose Triton kernel `config` launches in an operand specialisation this worker
        never compiled (a dtype knob moved under it): their compile is redone though they keep
        their value. None before the worker compiled any."""
        from dsv4.specialisations import KERNEL_KNOB

        if not self.kernels:
            return set()
        return {KERNEL_KNOB[key[0]] for key in self.triton_keys(config) - self.kernels}


def overrides_by_layer(config: dict[str, Any]) -> dict[int, dict[str, Any]]:
    """layer -> {knob: value} of `config`'s per-layer overrides (later entries win)."""
    per_layer: dict[int, dict[str, Any]] = {}
    for layer, knob, value in config.get("layer_overrides", []):
        per_layer.setdefault(int(layer), {})[knob] = value
    return per_layer


def traced_knobs() -> list[str]:
    """The knobs that change the code Dynamo traces: all but cuda_graphs (it captures, not traces)."""
    from dsv4.knobs import KNOBS

    return [k.name for k in KNOBS if k.name != "cuda_graphs"]


def effective(config: dict[str, Any], name: str) -> tuple:
    """A knob's global value plus its per-layer overrides (later entries win), comparable."""
    per_layer = {}
    for layer, knob, value in config.get("layer_overrides", []):
        if knob == name:
            per_layer[layer] = value
    return (config[name], tuple(sorted(per_layer.items())))


def recompile_values(config: dict[str, Any]) -> set[tuple]:
    """Each (knob, value) a recompile-class knob takes in `config`, globally or on some layer."""
    from dsv4.knobs import KNOBS

    names = {k.name for k in KNOBS if k.restart_class == "recompile"}
    return {v for v in knob_values(config) if v[0] in names}


def knob_values(config: dict[str, Any]) -> set[tuple]:
    """Each (knob, value) `config` sets, globally or on some layer."""
    from dsv4.knobs import KNOBS

    out = {(k.name, config[k.name]) for k in KNOBS}
    return out | {(knob, value) for _layer, knob, value in config.get("layer_overrides", [])}


def trace_key(config: dict[str, Any]) -> tuple:
    """Every knob that changes the code Dynamo traces, with its per-layer overrides."""
    return tuple(effective(config, k) for k in traced_knobs())


def step_compiled(config: dict[str, Any]) -> bool:
    return config.get("step_compile", "off") != "off"


def transition_facts(built: dict[str, Any] | None, to: dict[str, Any], caches: WorkerCaches,
                     alive: bool) -> Transition:
    """The Transition from `built` (normalized; None: nothing trusted runs) to `to` (normalized) in a
    worker that is `alive` (False: a new one must start) and holds `caches`."""
    from dsv4.knobs import KNOB_BY_NAME

    everything = tuple(k for k in to if k != "layer_overrides")
    if not alive:
        return Transition(RestartClass.RESTART.value, everything)
    if built is None:  # a live worker with nothing trusted in it (fresh, or after a failure)
        # cached: its in-process caches (Dynamo, Triton) are warm for what `to` compiles; a surviving
        # worker is not warm for a value it never compiled (on the H200 step_compile after a failed trial was
        # predicted at 38 s as a warm relaunch and took 2 min 26 s: h200_live_10m_run4, trial 25)
        # not warm, but it step-compiled before: the new kernels come with a re-trace whose Inductor
        # caches are warm, not the first step compile (on the H200 such relaunches took 5-36 s and
        # were priced as a fresh start's 120-151 s: h200_live_10m run 2, h200_live_10m_run3 run 2)
        warm = caches.warm_for(to)
        redone = ("step_compile",) if not warm and step_compiled(to) and caches.traced else ()
        return Transition(RestartClass.REBUILD.value, everything, cached=warm, redone=redone)
    changed = tuple(k for k in KNOB_BY_NAME if effective(built, k) != effective(to, k))
    if not changed:
        return Transition(RestartClass.NONE.value, ())
    cls = RestartClass.dearest(KNOB_BY_NAME[k].restart_class for k in changed)
    redone = []
    warm = caches.warm_for(to)
    # no re-trace: this configuration was traced here, or every part of it was and its kernels are cached
    retrace = (step_compiled(to) and "step_compile" not in changed and trace_key(to) not in caches.traced
               and not (warm and caches.parts_traced(to)))
    # cached: every kernel `to` compiles (a re-trace's included) was compiled in this worker, in this
    # combination or another
    cached = (cls is RestartClass.RECOMPILE or retrace) and warm
    if retrace:
        redone.append("step_compile")
    # a dtype switch under a Triton kernel that reads the operand compiles that kernel anew
    redone += sorted(caches.respecialised(to) - set(changed))
    if to.get("cuda_graphs") == "on" and "cuda_graphs" not in changed:
        redone.append("cuda_graphs")
    for knob in redone:
        cls = RestartClass.dearest([cls.value, KNOB_BY_NAME[knob].restart_class])
    return Transition(cls.value, changed, cached, redone=tuple(redone))
