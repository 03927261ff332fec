"""Strategy registry: name -> factory(space, seed, **options) -> autoopt.search.strategy.Strategy.

Built in, registered here by name: `agent` (the default: cost-aware, profile-guided,
autoopt.search.agent), `grid` (autoopt.search.grid), and the Optuna samplers `tpe`, `random`, `gp`
(autoopt.search.sampler). Each factory imports its module when called, so listing the names imports
no strategy (and no numpy/optuna). `register` adds another (tests do).
"""
from __future__ import annotations

from typing import Any, Callable

from autoopt.errors import UserError

Factory = Callable[..., Any]
DEFAULT = "agent"


def _agent(space: Any, seed: int | None = None, warm_start: list[Any] | None = None,
           warm_start_source: str = "another study", **options: Any) -> Any:
    """warm_start: another study's trials (.params, .objective), named by warm_start_source in the
    agent's lines (autoopt.search.warm_start reads and maps them)."""
    from autoopt.search.agent.strategy import AgentStrategy

    agent = AgentStrategy(space, seed=seed, **options)
    if warm_start:
        agent.warm_start(warm_start, source=warm_start_source)
    return agent


def _grid(space: Any, seed: int | None = None, **options: Any) -> Any:
    from autoopt.search.grid import GridStrategy

    return GridStrategy(space, seed)


def _sampler(name: str) -> Factory:
    def factory(space: Any, seed: int | None = None, **options: Any) -> Any:
        from autoopt.search.sampler import SamplerStrategy

        return SamplerStrategy(space, sampler=name, seed=seed, **options)
    return factory


_FACTORIES: dict[str, Factory] = {"agent": _agent, "grid": _grid, "tpe": _sampler("tpe"),
                                  "random": _sampler("random"), "gp": _sampler("gp")}
_DESCRIPTIONS: dict[str, str] = {
    "agent": "Cost-aware, profile-guided agent: expected gain per second of restart + measurement; stops itself",
    "grid": "Exhaustive grid, dearest switches varying slowest (restarts not repeated)",
    "tpe": "Optuna TPE (multivariate) over the space's parameters; constraints by rejection",
    "random": "uniform random points of the space (constraints by rejection)",
    "gp": "Optuna Gaussian-process sampler (needs torch + scipy)",
}


def register(name: str, factory: Factory, description: str = "") -> None:
    """Add (or replace) a strategy. `factory(space, seed, **options)` returns a Strategy."""
    _FACTORIES[name] = factory
    _DESCRIPTIONS[name] = description or (factory.__doc__ or "").strip().split("\n")[0]


def names() -> list[str]:
    return sorted(_FACTORIES)


def describe() -> dict[str, str]:
    return {n: _DESCRIPTIONS.get(n, "") for n in names()}


def default_name() -> str:
    return DEFAULT


def get(name: str | None, space: Any, seed: int | None = None, **options: Any) -> Any:
    """A new Strategy instance. UserError (exit 2) naming the known strategies for an unknown name."""
    factory = _FACTORIES.get(name or DEFAULT)
    if factory is None:
        raise UserError(f"--strategy: unknown strategy {name!r} (expected one of: {', '.join(names())})")
    return factory(space, seed, **options)
