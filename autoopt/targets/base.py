"""The Target protocol: one contract test suite (tests/test_target_contract.py) runs against every
implementation."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

from autoopt.measurement import Measurement
from autoopt.space.knobs import KnobSpec  # the space's vocabulary; targets declare their knobs in it


@dataclass
class Transition:
    """Facts about switching the built configuration to a candidate (the seconds it will take are
    estimated by the one cost model, autoopt.search.cost, from these and what earlier switches cost)."""

    restart_class: str  # a RestartClass value: the most expensive class among the knobs that change
    changed_knobs: tuple[str, ...] = ()
    cached: bool = False  # these kernels were compiled before in the live worker
    known_s: float | None = None  # seconds the switch is known to take (a recorded table); None: unknown
    # knobs whose build work the switch redoes though their value stays (a re-trace of the compiled
    # step, a new CUDA graph capture): the cost model charges their redo seconds, learned apart
    redone: tuple[str, ...] = ()


@dataclass
class EvalRequest:
    config: dict[str, Any]  # knob name -> value, plus optional "layer_overrides": [[layer, knob, value]]
    concurrency: tuple[int, ...]
    profile: bool = False
    min_samples: int = 10
    max_samples: int = 40
    time_limit_s: float = 300.0  # a hang past this is a failed trial ("hang")
    extra: dict[str, Any] = field(default_factory=dict)


class Target(Protocol):
    name: str

    def knob_specs(self) -> list[KnobSpec]:
        """Every knob this target can switch, with allowed values."""

    def excluded(self) -> dict[tuple[str, Any], str]:
        """(knob, value) -> reason, for values this device cannot run."""

    def baseline(self) -> dict[str, Any]:
        """The starting-point configuration every speedup is relative to."""

    def default_concurrency(self) -> tuple[int, ...]:
        ...

    def environment(self) -> dict[str, Any]:
        """Fingerprint of where measurements happen (GPU name, capability, driver, versions)."""

    def now(self) -> float:
        """Seconds on this target's clock (wall clock, or simulated for replay)."""

    def transition(self, to_config: dict[str, Any]) -> Transition:
        """What moving from the configuration built now to `to_config` involves (facts, no estimate)."""

    def evaluate(self, request: EvalRequest) -> Measurement:
        """Apply the configuration and measure it. Never raises for a bad trial: a crash, hang, OOM
        or wrong numerics come back as Measurement(status="failed"/"wrong")."""

    def close(self) -> None:
        ...
