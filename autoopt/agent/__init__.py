"""The cost-aware, profile-guided agent (`--strategy agent`, the default) and the grid strategy.

Modules: view (the space as integer codes), buckets (learned bucket speed-ups, Amdahl), model (GP of
the gain), cost (transition + measurement seconds, learned), propose (sampler / profile / neighbour
candidates), choose (expected gain per second, batched builds), noise (repeats until a win clears the
noise), stop (is the next trial worth it?), diagnosis (predicted vs actual, bucket diff), strategy.
Importing this package registers `agent` and `grid` in autoopt.strategies; nothing imports torch.
"""
from __future__ import annotations

from typing import Any

from autoopt.strategies import register


def make_agent_strategy(space: Any, seed: int | None = None, **options: Any) -> Any:
    """Cost-aware, profile-guided agent: expected gain per second of restart + measurement; stops itself"""
    from autoopt.agent.strategy import AgentStrategy

    return AgentStrategy(space, seed=seed, **options)


def _make_grid(space: Any, seed: int | None = None, **options: Any) -> Any:
    """Exhaustive grid, dearest switches varying slowest (restarts not repeated)"""
    from autoopt.strategies.grid import GridStrategy

    return GridStrategy(space, seed)


register("agent", make_agent_strategy, default=True)
register("grid", _make_grid)
