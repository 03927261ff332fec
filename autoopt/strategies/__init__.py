"""Strategy registry: name -> factory(space, seed, **options) -> autoopt.strategy.Strategy.

Built in (autoopt.strategies.sampler): `tpe`, `random`, `gp` (Optuna samplers on an in-memory copy of
the history). Other packages slot in by registering on import, e.g. in autoopt/agent/__init__.py:

    from autoopt.strategies import register
    register("agent", make_agent_strategy, default=True)
    register("grid", make_grid_strategy)

`get()` imports `autoopt.agent` (when it exists) before looking a name up, so those entries are there
whenever they are asked for. The default strategy is the one registered with default=True (the agent,
once it exists), else `tpe`.
"""
from __future__ import annotations

import importlib
import importlib.util
from dataclasses import dataclass, field
from typing import Any, Callable

from autoopt.errors import UserError

Factory = Callable[..., Any]

# Modules that register strategies when imported (only imported when they exist).
PLUGIN_MODULES = ("autoopt.agent",)


@dataclass
class Registry:
    factories: dict[str, Factory] = field(default_factory=dict)
    descriptions: dict[str, str] = field(default_factory=dict)
    default: str | None = None
    plugins_loaded: bool = False

    def register(self, name: str, factory: Factory, description: str = "", default: bool = False) -> None:
        self.factories[name] = factory
        self.descriptions[name] = description or (factory.__doc__ or "").strip().split("\n")[0]
        if default:
            self.default = name

    def load_plugins(self) -> None:
        if self.plugins_loaded:
            return
        self.plugins_loaded = True
        for mod in PLUGIN_MODULES:
            if _module_exists(mod):
                importlib.import_module(mod)


def _module_exists(name: str) -> bool:
    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError):
        return False
    # an empty directory is a namespace package: nothing to register
    return spec is not None and spec.origin not in (None, "namespace")


def _builtin(name: str) -> Factory:
    def factory(space: Any, seed: int | None = None, **options: Any) -> Any:
        from autoopt.strategies.sampler import SamplerStrategy

        return SamplerStrategy(space, sampler=name, seed=seed, **options)

    factory.__doc__ = {
        "tpe": "Optuna TPE (multivariate) over the space's parameters; constraints by rejection",
        "random": "uniform random points of the space (constraints by rejection)",
        "gp": "Optuna Gaussian-process sampler (needs torch + scipy)",
    }[name]
    return factory


_REGISTRY = Registry()
for _name in ("tpe", "random", "gp"):
    _REGISTRY.register(_name, _builtin(_name))


def register(name: str, factory: Factory, description: str = "", default: bool = False) -> None:
    """Add (or replace) a strategy. `factory(space, seed, **options)` returns a Strategy."""
    _REGISTRY.register(name, factory, description, default)


def names() -> list[str]:
    _REGISTRY.load_plugins()
    return sorted(_REGISTRY.factories)


def describe() -> dict[str, str]:
    _REGISTRY.load_plugins()
    return {n: _REGISTRY.descriptions.get(n, "") for n in sorted(_REGISTRY.factories)}


def default_name() -> str:
    """`agent` when autoopt.agent registered it (default=True or under that name), else `tpe`."""
    _REGISTRY.load_plugins()
    if _REGISTRY.default:
        return _REGISTRY.default
    return "agent" if "agent" in _REGISTRY.factories else "tpe"


def get(name: str | None, space: Any, seed: int | None = None, **options: Any) -> Any:
    """A new Strategy instance. UserError (exit 2) naming the known strategies for an unknown name."""
    _REGISTRY.load_plugins()
    name = name or default_name()
    factory = _REGISTRY.factories.get(name)
    if factory is None:
        raise UserError(f"--strategy: unknown strategy {name!r} (expected one of: {', '.join(names())})")
    return factory(space, seed, **options)
