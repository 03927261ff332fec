"""The odds that a configuration fails (crash, compile error, out of resources), learned from trials.

A logistic regression with a Gaussian prior on its weights (fitted by Newton steps, a few ms), on
features that fit how configurations fail in practice:
  - numeric knobs (tile sizes, stages, warps): log2 of the value, so resource limits such as
    block_kv x heads x stages > shared memory are one linear boundary;
  - every non-baseline value (one-hot), for a value that cannot work at all;
  - every pair of non-baseline values, for combinations that fail together (fp8 under CUDA graphs).
Before any failure the odds are 0; the intercept starts at the observed failure rate.
"""
from __future__ import annotations

import math

import numpy as np

from autoopt.agent.view import SpaceView

PRIOR_SD = 4.0  # weights: loose, so a few failures of one value or pair make it a near-certain failure
MAX_ODDS = 0.995
NUMERIC_SD = 3.0  # log2-size weights: a resource limit is a steep boundary, let it be one


class FailureModel:
    def __init__(self, view: SpaceView) -> None:
        self.view = view
        self.codes: list[np.ndarray] = []
        self.failed: list[bool] = []
        self._w: np.ndarray | None = None
        self._dirty = False
        self._pair_lut: dict[tuple[int, int], np.ndarray] = {}
        self._n_pair_cols = 0
        self._numeric: list[tuple[int, np.ndarray]] = []  # (param, log2 value of each choice, standardised)
        for i, p in enumerate(view.params):
            vals = p.choices
            if len(vals) > 2 and all(isinstance(v, (int, float)) and not isinstance(v, bool) and v > 0 for v in vals):
                lv = np.log2(np.array(vals, dtype=float))
                self._numeric.append((i, (lv - lv.mean()) / (lv.std() or 1.0)))

    @property
    def n_failed(self) -> int:
        return int(sum(self.failed))

    def add(self, code: np.ndarray, failed: bool) -> None:
        self.codes.append(code.copy())
        self.failed.append(bool(failed))
        self._dirty = True

    # ---- features --------------------------------------------------------------------------------
    def _features(self, X: np.ndarray) -> np.ndarray:
        n, P = X.shape
        V = int(self.view.n_choices.max(initial=1))
        nb = X != self.view.base_code[None, :]
        onehot = np.zeros((n, P * V))
        rows, cols = np.nonzero(nb)
        onehot[rows, cols * V + X[rows, cols]] = 1.0
        pairs = np.zeros((n, self._n_pair_cols))
        for (a, b), lut in self._pair_lut.items():
            both = nb[:, a] & nb[:, b]
            col = lut[X[:, a] * V + X[:, b]]
            hit = both & (col >= 0)
            pairs[np.nonzero(hit)[0], col[hit]] = 1.0
        numeric = [vals[X[:, i]][:, None] for i, vals in self._numeric]
        return np.concatenate([np.ones((n, 1)), *numeric, onehot, pairs], axis=1)

    def _register_pairs(self, X: np.ndarray) -> None:
        """One column per (pair of parameters, pair of non-baseline values) seen among the trials."""
        P, V = X.shape[1], int(self.view.n_choices.max(initial=1))
        nb = X != self.view.base_code[None, :]
        self._pair_lut, self._n_pair_cols = {}, 0
        for a in range(P):
            for b in range(a + 1, P):
                both = nb[:, a] & nb[:, b]
                if not both.any():
                    continue
                lut = np.full(V * V, -1, dtype=np.int64)
                for v in np.unique(X[both, a] * V + X[both, b]):
                    lut[v] = self._n_pair_cols
                    self._n_pair_cols += 1
                self._pair_lut[(a, b)] = lut

    # ---- fit / predict ---------------------------------------------------------------------------
    def _fit(self) -> None:
        self._dirty = False
        if not self.n_failed:
            self._w = None
            return
        X = np.stack(self.codes)
        self._register_pairs(X)
        F = self._features(X)
        y = np.array(self.failed, dtype=float)
        rate = (y.sum() + 0.5) / (len(y) + 1.0)
        w = np.zeros(F.shape[1])
        w[0] = math.log(rate / (1 - rate))
        prior_prec = np.full(F.shape[1], 1.0 / PRIOR_SD ** 2)
        prior_prec[1:1 + len(self._numeric)] = 1.0 / NUMERIC_SD ** 2
        prior_prec[0] = 1e-4
        for _ in range(12):  # Newton steps on the penalised log-likelihood
            p = 1.0 / (1.0 + np.exp(-np.clip(F @ w, -30, 30)))
            grad = F.T @ (p - y) + prior_prec * w
            H = (F * (p * (1 - p))[:, None]).T @ F + np.diag(prior_prec)
            step = np.linalg.solve(H, grad)
            w -= step
            if np.abs(step).max() < 1e-4:
                break
        self._w = w

    def prob(self, code: np.ndarray) -> float:
        return float(self.probs(code[None, :])[0])

    def probs(self, X: np.ndarray) -> np.ndarray:
        if self._dirty:
            self._fit()
        if self._w is None:
            return np.zeros(len(X))
        F = self._features(X)
        return np.minimum(MAX_ODDS, 1.0 / (1.0 + np.exp(-np.clip(F @ self._w, -30, 30))))
