"""The Target protocol: one contract test suite (tests/test_target_contract.py) runs against every
implementation."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

from autoopt.results import Measurement


@dataclass(frozen=True)
class KnobSpec:
    """A knob as a target declares it (the space file is validated against these)."""

    name: str
    values: tuple[Any, ...]
    restart_class: str  # none | recompile | rebuild | restart
    scopes: tuple[str, ...] = ("global",)
    buckets: tuple[str, ...] = ()
    layer_classes: tuple[str, ...] | None = None


@dataclass
class Transition:
    """What switching the built configuration to a candidate would cost."""

    restart_class: str  # the most expensive class among the knobs that change
    changed_knobs: tuple[str, ...] = ()
    expected_s: float = 0.0
    cached: bool = False  # kernels compiled before cost nothing


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
        """What moving from the configuration built now to `to_config` would cost."""

    def evaluate(self, request: EvalRequest) -> Measurement:
        """Apply the configuration and measure it. Never raises for a bad trial: a crash, hang, OOM
        or wrong numerics come back as Measurement(status="failed"/"wrong")."""

    def close(self) -> None:
        ...
