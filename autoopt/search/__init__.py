"""The search: a run's session, the loop, the budget, the strategy protocols and registry, the Optuna
samplers, grid, the replay benchmark, and the agent."""
