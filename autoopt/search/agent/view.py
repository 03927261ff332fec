"""The agent's compact view of a SearchSpace: parameters as integer codes, plus what the space file
says about each (knob, restart class, buckets, prior speed-up; its apply cost is the cost model's,
autoopt.search.cost).

Encoding a configuration as one small integer per parameter lets the model, the candidate generator
and the cost model work on numpy arrays (hundreds of candidates per proposal in milliseconds).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

@dataclass(frozen=True)
class ParamView:
    name: str
    knob: str
    choices: tuple[Any, ...]
    base: int  # index of the baseline value in choices
    restart_class: str
    buckets: tuple[str, ...]
    layer_fraction: float  # share of the model's layers this parameter sets (1.0 for global)
    prior_speedup: dict[int, float]  # value index -> expected speed-up of the knob's buckets


class SpaceView:
    def __init__(self, space: Any) -> None:
        self.space = space
        base = space.baseline_params()
        knobs = {k.name: k for k in getattr(space, "knobs", [])}
        n_layers = max(1, len(getattr(getattr(space, "info", None), "layers", ()) or ()))
        params: list[ParamView] = []
        for p in space.params:
            knob = knobs.get(p.knob)
            cls = knob.restart_class if knob is not None else space.restart_class_of(p.name)
            prior = getattr(knob, "prior_speedup", {}) or {}
            layers = getattr(p, "layers", ()) or ()
            frac = 1.0 if p.scope == "global" or not layers else min(1.0, len(layers) / n_layers)
            params.append(ParamView(
                name=p.name, knob=p.knob, choices=tuple(p.choices), base=list(p.choices).index(base[p.name]),
                restart_class=cls, buckets=tuple(getattr(knob, "buckets", ()) or ()),
                layer_fraction=frac,
                prior_speedup={list(p.choices).index(v): float(s) for v, s in prior.items() if v in p.choices}))
        self.params = params
        self.names = [p.name for p in params]
        self.n_choices = np.array([len(p.choices) for p in params], dtype=np.int64)
        self.base_code = np.array([p.base for p in params], dtype=np.int64)
        self.runtime = np.array([p.restart_class == "none" for p in params], dtype=bool)
        self._index = [{_key(v): i for i, v in enumerate(p.choices)} for p in params]
        self.constrained = bool(getattr(space, "constraints", None))
        # mixed-radix strides: one int64 per configuration (numpy set operations on candidates)
        self.strides = np.cumprod(np.concatenate([[1], self.n_choices[:0:-1]]))[::-1].astype(np.int64) \
            if len(self.n_choices) else np.zeros(0, dtype=np.int64)

    # ---- encode / decode --------------------------------------------------------------------------
    def encode(self, params: dict[str, Any]) -> np.ndarray | None:
        """Integer codes, or None when `params` is not a point of this space."""
        out = np.empty(len(self.params), dtype=np.int64)
        for i, p in enumerate(self.params):
            if p.name not in params:
                return None
            code = self._index[i].get(_key(params[p.name]))
            if code is None:
                return None
            out[i] = code
        return out

    def index(self, codes: np.ndarray) -> np.ndarray:
        """The configurations' mixed-radix numbers (rows of `codes`)."""
        return codes.reshape(-1, len(self.params)) @ self.strides if len(codes) else np.zeros(0, dtype=np.int64)

    def decode(self, code: np.ndarray) -> dict[str, Any]:
        return {p.name: p.choices[int(c)] for p, c in zip(self.params, code)}

    def feasible(self, code: np.ndarray) -> bool:
        if not self.constrained:
            return True
        return bool(self.space.is_feasible(self.decode(code)))

    def size(self) -> int:
        return int(math.prod(int(n) for n in self.n_choices)) if len(self.n_choices) else 1

    def describe(self, code: np.ndarray, ref: np.ndarray | None = None) -> str:
        """`knob=value, ...` for the parameters where `code` differs from `ref` (baseline default)."""
        ref = self.base_code if ref is None else ref
        parts = [f"{p.name}={p.choices[int(c)]}" for p, c, r in zip(self.params, code, ref) if c != r]
        return ", ".join(parts) if parts else "no change"

    def build_key(self, code: np.ndarray) -> tuple[int, ...]:
        """The values of every parameter that needs more than a runtime switch: configurations with
        the same build key run in one built worker."""
        return tuple(int(c) for c, rt in zip(code, self.runtime) if not rt)


def _key(v: Any) -> str:
    return f"{type(v).__name__}:{v}" if isinstance(v, bool) else str(v)
