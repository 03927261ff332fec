"""Constraint repair: a move that breaks a constraint is completed, not dropped.

A one-knob move of the incumbent can be infeasible only because of what another knob holds: in the
DeepSeek-V4 spaces `cuda_graphs=on` needs every `moe_experts@...` off the expert loop, so from the
eager baseline the move that matters most is never a legal one-knob (or two-knob) step. The repair
changes only the parameters that the broken constraints read (never the moved ones), fewest changes
first, and hands back the smallest feasible completions for the model to score like any candidate.
"""
from __future__ import annotations

import math

import numpy as np

from autoopt.search.agent.view import SpaceView

MAX_COMBINATIONS = 512  # completions enumerated per move (sampled beyond that)
MAX_REPAIRS = 8  # feasible completions kept per move, fewest changes first


def constraint_repairs(view: SpaceView, code: np.ndarray, ref: np.ndarray, rng: np.random.Generator,
                       limit: int = MAX_REPAIRS) -> list[np.ndarray]:
    """Feasible configurations that keep `code`'s moves away from `ref` and change as few of the
    other parameters as possible, among those read by a constraint that also reads a moved one."""
    fix = _repairable(view, code, ref)
    if not fix or view.feasible(code):
        return []
    sizes = [int(view.n_choices[p]) for p in fix]
    if math.prod(sizes) <= MAX_COMBINATIONS:
        combos = np.indices(sizes).reshape(len(fix), -1).T
    else:
        combos = rng.integers(0, sizes, size=(MAX_COMBINATIONS, len(fix)))
    rows = np.repeat(code[None, :], len(combos), axis=0)
    rows[:, fix] = combos
    changes = (rows != code[None, :]).sum(axis=1)
    out: list[np.ndarray] = []
    for i in np.argsort(changes, kind="stable"):
        if changes[i] == 0:
            continue
        if out and changes[i] > changes_of_first:
            break  # only the smallest repairs: a larger one is a different move
        if view.feasible(rows[i]):
            changes_of_first = changes[i]
            out.append(rows[i].copy())
            if len(out) >= limit:
                break
    return out


def _repairable(view: SpaceView, code: np.ndarray, ref: np.ndarray) -> list[int]:
    """Unmoved parameters read by a constraint that reads a moved parameter (by knob or by name)."""
    moved = set(int(p) for p in np.nonzero(code != ref)[0])
    moved_names = {view.params[p].knob for p in moved} | {view.params[p].name for p in moved}
    reads: set[str] = set()
    for constraint in getattr(view.space, "constraints", None) or ():
        if constraint.names & moved_names:
            reads |= set(constraint.names)
    return [p for p, pv in enumerate(view.params)
            if p not in moved and (pv.knob in reads or pv.name in reads) and view.n_choices[p] > 1]
