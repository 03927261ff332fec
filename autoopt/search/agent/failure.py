"""The odds that a configuration fails (crash, compile error, out of resources), learned from trials.

A logistic regression with a Gaussian prior on its weights, on features that fit how configurations
fail in practice:
  - numeric knobs (tile sizes, stages, warps): log2 of the value, so resource limits such as
    block_kv x heads x stages > shared memory are one linear boundary;
  - every non-baseline value (one-hot), for a value that cannot work at all;
  - every pair of non-baseline values, for combinations that fail together (fp8 under CUDA graphs).
Before any failure the odds are 0; the intercept starts at the observed failure rate.

The odds are never surer than the model has earned: a prediction p is capped at the failure rate
observed among the trials it had called at least as likely to fail (`score`, the model's own odds
before any cap), smoothed towards ODDS_CAP (one in twenty: values and pairs of values cannot express
every constraint of a real space, and an unearned near-certain "fails" would hide a whole region from
the search and license a stop) as if that were CAP_PRIOR_TRIALS trials. One miss among its 80%-sure
calls does not cap its 99.9%-sure ones: a pattern called a near-certain failure and failing fifty
times reaches MAX_ODDS, and the search stops paying for it (on a real Kernel Tuner landscape a run
spent most of its trials on configurations its model gave 99.9% odds of failing, capped at 97.6%
by one miss among its calls of 80%).

It is fitted in its dual form (the same model: a Gaussian process classifier whose kernel is the
features' prior covariance, by Newton steps on the Laplace approximation), so its cost grows with the
trials, not with the pairs of values they cover (hundreds of trials of a ten-knob GPU kernel cover
thousands of value pairs); each fit starts from the previous one.
"""
from __future__ import annotations

import math

import numpy as np

from autoopt.search.agent.view import SpaceView

PRIOR_SD = 4.0  # weights: loose, so a few failures of one value or pair make it a near-certain failure
CAP_PRIOR_TRIALS = 4.0  # ODDS_CAP counts as this many scored calls
MAX_ODDS = 0.999
ODDS_CAP = 0.95
LIKELY = 0.8  # predictions at least this sure are scored against what happened
NUMERIC_SD = 3.0  # log2-size weights: a resource limit is a steep boundary, let it be one
INTERCEPT_SD = 10.0  # nearly free: successes may pull it far below the observed rate
NEWTON_STEPS = 12
NEWTON_TOL = 0.02  # latent (log-odds) units: 2% odds are as good as exact here


class FailureModel:
    def __init__(self, view: SpaceView) -> None:
        self.view = view
        self.codes: list[np.ndarray] = []
        self.failed: list[bool] = []
        self._dirty = False
        self._called: list[tuple[float, bool]] = []  # (uncapped odds, failed) of trials called likely failures
        self._X = np.zeros((0, len(view.params)), dtype=np.int64)
        self._a = np.zeros(0)  # dual weights of the last fit (latent minus the intercept = K @ a)
        self._dual = np.zeros(0)  # y - p at the fit: predictions are K(x, X) @ dual
        self._offset = 0.0
        self._K = np.zeros((0, 0))
        self._K_X = self._X
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

    # ---- the kernel: the features' prior covariance ------------------------------------------------
    def kernel(self, A: np.ndarray, B: np.ndarray) -> np.ndarray:
        # S: the non-baseline values two configurations share, as one product of one-hot codes
        S = self._onehot(A) @ self._onehot(B).T
        # the intercept (loose around the observed rate's logit), one-hot values, pairs of values
        k = INTERCEPT_SD ** 2 + PRIOR_SD ** 2 * (S + 0.5 * S * (S - 1.0))
        if self._numeric:
            k += NUMERIC_SD ** 2 * (self._log2_sizes(A) @ self._log2_sizes(B).T)
        return k

    def _onehot(self, X: np.ndarray) -> np.ndarray:
        """[n, sum of choices]: one column per (parameter, value), the baseline values' left at 0."""
        offset = np.concatenate([[0], np.cumsum(self.view.n_choices)[:-1]]).astype(np.int64)
        out = np.zeros((len(X), int(self.view.n_choices.sum())))
        out[np.arange(len(X))[:, None], X + offset[None, :]] = 1.0
        out[:, offset + self.view.base_code] = 0.0
        return out

    def _log2_sizes(self, X: np.ndarray) -> np.ndarray:
        return np.stack([vals[X[:, i]] for i, vals in self._numeric], axis=1)

    # ---- fit / predict ---------------------------------------------------------------------------
    def _fit(self) -> None:
        self._dirty = False
        if not self.n_failed:
            self._dual = np.zeros(0)
            return
        X = np.stack(self.codes)
        y = np.array(self.failed, dtype=float)
        rate = (y.sum() + 0.5) / (len(y) + 1.0)
        self._offset = math.log(rate / (1 - rate))
        K = self._train_kernel(X)
        a = np.zeros(len(X))  # the dual weights: latent = K @ a
        n_old = min(len(self._a), len(X))
        if n_old >= 20 and np.array_equal(self._X[:n_old], X[:n_old]):
            # warm start: the new rows enter with no weight of their own. Newton goes on until the
            # latents settle (NEWTON_TOL), as from scratch: a new failure next to many successes can
            # move the mode far, and a fit cut short after a step or two left such a failure's own
            # configuration at 1e-13 odds where the full fit gives 0.97 (the live H200 run 7 proposed
            # one attention tile beyond the shared memory six times so)
            a[:n_old] = self._a[:n_old]
        a = self._newton(K, y, a, NEWTON_STEPS)
        self._X, self._a = X, a
        self._dual = y - _sigmoid(self._offset + K @ a)

    def _train_kernel(self, X: np.ndarray) -> np.ndarray:
        """K(X, X), extended by the new rows only (the trials only grow)."""
        n_old = len(self._K)
        if n_old > len(X) or not np.array_equal(self._K_X[:n_old], X[:n_old]):
            n_old = 0
        K = np.empty((len(X), len(X)))
        K[:n_old, :n_old] = self._K[:n_old, :n_old]
        if n_old < len(X):
            new = self.kernel(X[n_old:], X)
            K[n_old:, :] = new
            K[:n_old, n_old:] = new[:, :n_old].T
        self._K, self._K_X = K, X
        return K

    def _newton(self, K: np.ndarray, y: np.ndarray, a: np.ndarray, steps: int) -> np.ndarray:
        """The Laplace mode (Rasmussen & Williams, algorithm 3.1) in dual weights, from `a`, each
        Newton step halved until the penalised likelihood rises (an undamped step can overshoot
        when the prior is as loose as this one)."""
        n = len(y)
        g = K @ a
        psi = self._psi(a, g, y)
        for _ in range(steps):
            p = _sigmoid(self._offset + g)
            w = np.maximum(p * (1 - p), 1e-6)
            sw = np.sqrt(w)
            B = K * np.outer(sw, sw)  # I + W^1/2 K W^1/2, in two passes over n x n
            B.flat[::n + 1] += 1.0
            b = w * g + (y - p)
            target = b - sw * np.linalg.solve(B, sw * (K @ b))
            step = 1.0
            while True:
                new_a = a + step * (target - a)
                new_g = K @ new_a
                new_psi = self._psi(new_a, new_g, y)
                if new_psi >= psi - 1e-9 or step < 0.1:
                    break
                step *= 0.5
            done = np.abs(new_g - g).max() < NEWTON_TOL
            a, g, psi = new_a, new_g, new_psi
            if done:
                break
        return a

    def _psi(self, a: np.ndarray, g: np.ndarray, y: np.ndarray) -> float:
        f = self._offset + g
        return float(-0.5 * a @ g + (y * f - np.logaddexp(0.0, f)).sum())

    @property
    def likely_scored(self) -> list[int]:
        """[trials called likely failures, of which failed]."""
        return [len(self._called), sum(f for _, f in self._called)]

    def caps(self, raw: np.ndarray) -> np.ndarray:
        """The most each uncapped prediction may say: the smoothed failure rate among the trials
        called at least as likely to fail (and at least LIKELY)."""
        called = sorted(self._called)
        odds = np.array([q for q, _ in called])
        # failed_from[i]: failures among called[i:], the calls at least as sure as called[i]
        failed_from = np.concatenate([np.cumsum([f for _, f in reversed(called)])[::-1], [0]])
        first = np.searchsorted(odds, np.maximum(raw, LIKELY), side="left")
        n, k = len(called) - first, failed_from[first]
        return np.minimum(MAX_ODDS, np.maximum(LIKELY, (k + ODDS_CAP * CAP_PRIOR_TRIALS) / (n + CAP_PRIOR_TRIALS)))

    def score(self, predicted: float, failed: bool) -> None:
        """A tried configuration's uncapped predicted odds (`raw_probs`) against its outcome."""
        if predicted >= LIKELY:
            self._called.append((float(predicted), bool(failed)))

    def prob(self, code: np.ndarray) -> float:
        return float(self.probs(code[None, :])[0])

    def probs(self, X: np.ndarray) -> np.ndarray:
        """The odds each configuration fails, capped by what such calls earned."""
        raw = self.raw_probs(X)
        return np.minimum(raw, self.caps(raw))

    def raw_probs(self, X: np.ndarray) -> np.ndarray:
        """The model's own odds, before any cap (what `score` is given)."""
        if self._dirty:
            self._fit()
        if not len(self._dual):
            return np.zeros(len(X))
        g = self.kernel(X, self._X) @ self._dual
        return _sigmoid(self._offset + g)


def _sigmoid(x: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-np.clip(x, -30, 30)))
