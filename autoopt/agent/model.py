"""Expected gain ± sd of an untried configuration: a Gaussian process on log(objective / baseline).

Mean function: the profile model's prediction (autoopt.agent.buckets: learned bucket milliseconds
composed bucket by bucket, Amdahl), or 0 without profiles. The GP models what the profile model
misses, with a kernel made for knobs. Per parameter p, a correlation c_p(v, v') between its values,
pinned to 0 at the baseline value (the baseline is the reference every effect is measured from):
  - categorical knobs: 1 when the values are equal (and not the baseline), else 0;
  - numeric knobs with 3+ values (tile sizes, stages, warps): a squared-exponential in the value's
    rank (neighbouring sizes behave alike), conditioned on c(base, .) = 0, and 0 between values on
    opposite sides of the baseline (what a smaller tile does says nothing about a bigger one).
Then
    k(x, x') = s_c^2                                    a shared offset (the baseline's own noise)
             + sum_p w_p c_p(x_p, x'_p)                  main effects (w_p: per-value variance)
             + s_i^2 sum_{p<q} c_p c_q                   pairwise interactions
             + s_b^2 sum_{p<q sharing a bucket} c_p c_q  interactions of knobs sharing a bucket
             + s_x^2 [x == x']                           what no structure explains (rugged tables)
`shared` pairs are those whose knobs declare a common profile bucket (a bf16 GEMM and the cast that
feeds it both move `copy_cast`): that is where the case study's surprises live, so they keep their
own, larger, interaction prior.

The scales are chosen by marginal likelihood (empirical Bayes), one coordinate at a time from the
previous choice: a table whose knobs interact gets a model that expects interactions, a rugged one a
model that expects every untried configuration to differ a little, a nearly additive one a model
that trusts additivity (and stops sooner). Main-effect prior sd per value: smaller when profiles
have shown it, larger when nothing is known. Observation noise: the measurement's own CI, plus
run-to-run scatter estimated from repeats (autoopt.agent.noise).
"""
from __future__ import annotations

import math

import numpy as np

from autoopt.agent.buckets import BucketModel
from autoopt.agent.view import SpaceView

SD_MAIN_UNKNOWN = 0.10
SD_MAIN_PRIOR = 0.08
SD_MAIN_LEARNED = 0.05
SD_CONST = 0.01
NOISE_FLOOR = 0.002
ORDINAL_LENGTH = 1.0  # in rank steps: neighbouring values correlate 0.6, two apart 0.14
# the kernel's scales and the values marginal likelihood may choose among (first: the start)
HYPER_GRID = {"main": (1.0, 0.25, 4.0),  # multiplies the main-effect variances
              "pair": (0.01, 0.005, 0.02, 0.04),
              "shared": (0.04, 0.015, 0.08),
              "ident": (0.0, 0.01, 0.02, 0.04)}
MIN_FOR_HYPER = 8  # measurements before the scales are fitted


def value_correlations(view: SpaceView) -> np.ndarray:
    """C[p, v, v']: correlation of parameter p's values, pinned to 0 at its baseline value."""
    P, V = len(view.params), int(view.n_choices.max(initial=1))
    C = np.zeros((P, V, V))
    for i, p in enumerate(view.params):
        n, b = len(p.choices), p.base
        numeric = n >= 3 and all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in p.choices)
        if numeric:
            rank = np.argsort(np.argsort(np.array(p.choices, dtype=float))).astype(float)
            r = np.exp(-0.5 * ((rank[:, None] - rank[None, :]) / ORDINAL_LENGTH) ** 2)
            # conditioned on the baseline, and no correlation across it: conditioning alone makes the
            # two sides anti-correlated (a smaller tile that loses would predict a bigger one wins),
            # while tile optima usually sit between two losing sides
            side = np.sign(rank - rank[b])
            C[i, :n, :n] = (r - np.outer(r[:, b], r[b, :])) * (side[:, None] == side[None, :])
        else:
            C[i, :n, :n] = np.eye(n)
        C[i, b, :] = 0.0
        C[i, :, b] = 0.0
    return C


class GainModel:
    def __init__(self, view: SpaceView, buckets: BucketModel | None = None) -> None:
        self.view = view
        self.buckets = buckets
        self.hyper = {name: grid[0] for name, grid in HYPER_GRID.items()}
        P = len(view.params)
        self._share = np.array([[float(p != q and bool(set(view.params[p].buckets) & set(view.params[q].buckets)))
                                 for q in range(P)] for p in range(P)])
        self._C = value_correlations(view)
        self._P = np.arange(P)
        self.X = np.zeros((0, P), dtype=np.int64)
        self.y = np.zeros(0)
        self._alpha = np.zeros(0)
        self._L: np.ndarray | None = None
        self._W = self._main_weights()

    def _main_weights(self) -> np.ndarray:
        P, V = len(self.view.params), int(self.view.n_choices.max(initial=1))
        W = np.zeros((P, V))
        for i, p in enumerate(self.view.params):
            for v in range(len(p.choices)):
                if v == p.base:
                    continue
                if self.buckets is not None and self.buckets.known(i, v):
                    sd = SD_MAIN_LEARNED
                elif v in p.prior_speedup:
                    sd = SD_MAIN_PRIOR
                else:
                    sd = SD_MAIN_UNKNOWN
                W[i, v] = sd * sd
        return W

    # ---- kernel ----------------------------------------------------------------------------------
    def _parts(self, A: np.ndarray, B: np.ndarray) -> dict[str, np.ndarray]:
        """The kernel's parts between rows of A and B, before their scales."""
        C = self._C[self._P[None, None, :], A[:, None, :], B[None, :, :]]  # [a, b, P]
        sw = np.sqrt(self._W[self._P[None, :], A])[:, None, :] * np.sqrt(self._W[self._P[None, :], B])[None, :, :]
        s = C.sum(axis=2)
        return {"main": (C * sw).sum(axis=2),
                "pair": 0.5 * (s * s - (C * C).sum(axis=2)),
                "shared": 0.5 * ((C @ self._share) * C).sum(axis=2),
                "ident": (A[:, None, :] == B[None, :, :]).all(axis=2).astype(float)}

    def _combine(self, parts: dict[str, np.ndarray], hyper: dict[str, float]) -> np.ndarray:
        return SD_CONST ** 2 + hyper["main"] * parts["main"] + hyper["pair"] ** 2 * parts["pair"] \
            + hyper["shared"] ** 2 * parts["shared"] + hyper["ident"] ** 2 * parts["ident"]

    def kernel(self, A: np.ndarray, B: np.ndarray) -> np.ndarray:
        return self._combine(self._parts(A, B), self.hyper)

    def _diag(self, A: np.ndarray) -> np.ndarray:
        C = self._C[self._P[None, :], A, A]  # [a, P]
        s = C.sum(axis=1)
        parts = {"main": (C * self._W[self._P[None, :], A]).sum(axis=1),
                 "pair": 0.5 * (s * s - (C * C).sum(axis=1)),
                 "shared": 0.5 * ((C @ self._share) * C).sum(axis=1), "ident": np.ones(len(A))}
        return self._combine(parts, self.hyper)

    def prior_mean(self, X: np.ndarray) -> np.ndarray:
        if self.buckets is None or not self.buckets.ready or len(X) == 0:
            return np.zeros(len(X))
        return self.buckets.log_gain(X)

    # ---- fit / predict ---------------------------------------------------------------------------
    def fit(self, X: np.ndarray, y: np.ndarray, noise_sd: np.ndarray) -> None:
        """X: codes of measured trials; y: log(objective / baseline objective); noise_sd: per trial."""
        self._W = self._main_weights()
        self.X, self.y = X, y
        if len(X) == 0:
            self._L = None
            return
        parts = self._parts(X, X)
        noise = np.diag(np.maximum(noise_sd, NOISE_FLOOR) ** 2 + 1e-9)
        resid = y - self.prior_mean(X)

        def evaluate(hyper: dict[str, float]) -> tuple[float, np.ndarray, np.ndarray] | None:
            try:
                L = np.linalg.cholesky(self._combine(parts, hyper) + noise)
            except np.linalg.LinAlgError:
                return None
            a = np.linalg.solve(L.T, np.linalg.solve(L, resid))
            return -0.5 * float(resid @ a) - float(np.log(np.diag(L)).sum()), L, a

        best_h = dict(self.hyper)
        best = evaluate(best_h)
        if len(X) >= MIN_FOR_HYPER:
            for name, grid in HYPER_GRID.items():
                for value in grid:
                    if value == best_h[name]:
                        continue
                    trial = {**best_h, name: value}
                    got = evaluate(trial)
                    if got is not None and (best is None or got[0] > best[0]):
                        best, best_h = got, trial
        self.hyper = best_h
        _, self._L, self._alpha = best

    def predict(self, Xc: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Mean and sd of log(objective / baseline) for each candidate row."""
        mu = self.prior_mean(Xc)
        var = self._diag(Xc)
        if self._L is not None and len(Xc):
            Ks = self.kernel(Xc, self.X)  # [c, n]
            mu = mu + Ks @ self._alpha
            v = np.linalg.solve(self._L, Ks.T)
            var = var - (v * v).sum(axis=0)
        return mu, np.sqrt(np.maximum(var, 1e-10))


    def difference(self, a: np.ndarray, b: np.ndarray) -> tuple[float, float]:
        """Posterior mean and sd of f(a) - f(b): the joint posterior, so evidence shared through the
        model (a main effect seen in many pairs of trials) counts, not only repeats of a and b."""
        X = np.stack([a, b])
        mu = self.prior_mean(X)
        K = self.kernel(X, X)
        if self._L is not None:
            Ks = self.kernel(X, self.X)
            mu = mu + Ks @ self._alpha
            v = np.linalg.solve(self._L, Ks.T)
            K = K - v.T @ v
        var = K[0, 0] + K[1, 1] - 2 * K[0, 1]
        return float(mu[0] - mu[1]), math.sqrt(max(var, 1e-12))


def expected_improvement(mu: np.ndarray, sd: np.ndarray, best: float) -> np.ndarray:
    """E[max(0, f - best)] for f ~ N(mu, sd) (all in log-objective units)."""
    z = (mu - best) / sd
    cdf = 0.5 * (1.0 + _erf(z / math.sqrt(2.0)))
    pdf = np.exp(-0.5 * z * z) / math.sqrt(2.0 * math.pi)
    return np.maximum(0.0, (mu - best) * cdf + sd * pdf)


def _erf(x: np.ndarray) -> np.ndarray:
    # Abramowitz-Stegun 7.1.26 (|error| < 1.5e-7): numpy has no vectorised erf, scipy is not needed
    sign = np.sign(x)
    x = np.abs(x)
    t = 1.0 / (1.0 + 0.3275911 * x)
    poly = t * (0.254829592 + t * (-0.284496736 + t * (1.421413741 + t * (-1.453152027 + t * 1.061405429))))
    return sign * (1.0 - poly * np.exp(-x * x))
