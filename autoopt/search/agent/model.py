"""Expected gain ± sd of an untried configuration: a Gaussian process on log(objective / baseline).

Mean function: the profile model's prediction (autoopt.search.agent.buckets: learned bucket milliseconds
composed bucket by bucket, Amdahl), or 0 without profiles. The GP models what the profile model
misses, with a kernel made for knobs. Per parameter p, a correlation c_p(v, v') between its values,
pinned to 0 at the baseline value (the baseline is the reference every effect is measured from):
  - categorical knobs: 1 when the values are equal (and not the baseline), else 0;
  - numeric knobs with 3+ values (tile sizes, stages, warps): a squared-exponential in the value's
    rank (neighbouring sizes behave alike), conditioned on c(base, .) = 0, and 0 between values on
    opposite sides of the baseline (what a smaller tile does says nothing about a bigger one).
Then, all scaled by an amplitude a^2 (how far configurations of this space differ at all):
    k(x, x') = s_c^2                                    a shared offset (the baseline's own noise)
             + sum_p w_p c_p(x_p, x'_p)                  main effects (w_p: per-value variance)
             + s_i^2 sum_{p<q} c_p c_q                   pairwise interactions
             + s_b^2 sum_{p<q sharing a bucket} c_p c_q  interactions of knobs sharing a bucket
             + s_l^2 exp(-theta sum_p d_p(x_p, x'_p))    every interaction, locally: configurations a
                                                         few steps apart behave alike (d_p: rank
                                                         steps, 2 for another categorical value)
             + s_x^2 [x == x']                           what no structure explains (rugged tables)
`shared` pairs are those whose knobs declare a common profile bucket (a bf16 GEMM and the cast that
feeds it both move `copy_cast`): that is where the case study's surprises live.

The scales are chosen by marginal likelihood (empirical Bayes), one coordinate at a time from the
previous choice, again whenever the history grew by a tenth: a table whose knobs interact gets a
model that expects interactions, a rugged one a model that expects every untried configuration to
differ, a nearly additive one a model that trusts additivity. The amplitude lets one kernel serve a
decode step whose knobs move it by percents and a GPU kernel whose tiles move it by 10x.

Speed (hundreds of trials, hundreds of candidates per proposal): every part but `shared` is a sum over
parameters of a per-value table, so it is one-hot(A) @ table @ one-hot(B).T (matrix products whose inner
size is the number of values; kernel() fuses the parts under the current scales, so each
candidate-by-trial entry is touched a few times, not once per part); the parts between the measured
configurations, their combination and the inverse of the training covariance are kept in growing
buffers and extended by the new rows (the inverse by blocks, Schur complement) while the scales and
noise stay; predictions are matrix products, on one BLAS thread (autoopt.search.agent.linalg).
`sd_scale` (the agent's online calibration) widens every predicted sd.
"""
from __future__ import annotations

import math

import numpy as np

from autoopt.search.agent.buckets import BucketModel
from autoopt.search.agent.linalg import Square, equal_pairs, forward_solve, one_blas_thread
from autoopt.search.agent.view import SpaceView

SD_MAIN_UNKNOWN = 0.10
SD_MAIN_PRIOR = 0.08
SD_MAIN_LEARNED = 0.05
SD_CONST = 0.01
NOISE_FLOOR = 0.002
ORDINAL_LENGTH = 1.0  # in rank steps: neighbouring values correlate 0.6, two apart 0.14
CATEGORICAL_STEPS = 2.0  # another categorical value is this many rank steps away (local term)
# the kernel's scales and the values marginal likelihood may choose among (first: the start)
HYPER_GRID = {"amp": (1.0, 4.0, 16.0, 64.0, 0.25),  # multiplies every part (variance)
              "main": (1.0, 0.25, 4.0),  # multiplies the main-effect variances
              "pair": (0.01, 0.005, 0.02, 0.04),
              "shared": (0.04, 0.015, 0.08),
              "local": (0.0, 0.05, 0.1, 0.2),
              "theta": (1.0, 0.5, 2.0),
              "ident": (0.0, 0.01, 0.02, 0.04)}
MIN_FOR_HYPER = 8  # measurements before the scales are fitted
REFIT_GROWTH = 0.1  # refit the scales when the history grew by this share (at least one row)
PARTS = ("main", "pair", "shared", "local", "ident")


def value_correlations(view: SpaceView) -> np.ndarray:
    """C[p, v, v']: correlation of parameter p's values, pinned to 0 at its baseline value."""
    P, V = len(view.params), int(view.n_choices.max(initial=1))
    C = np.zeros((P, V, V))
    for i, p in enumerate(view.params):
        n, b = len(p.choices), p.base
        rank = _rank(p.choices)
        if rank is not None:
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


def value_distances(view: SpaceView) -> np.ndarray:
    """D[p, v, v']: steps between parameter p's values (rank steps; categorical: CATEGORICAL_STEPS)."""
    P, V = len(view.params), int(view.n_choices.max(initial=1))
    D = np.zeros((P, V, V))
    for i, p in enumerate(view.params):
        n = len(p.choices)
        rank = _rank(p.choices)
        D[i, :n, :n] = np.abs(rank[:, None] - rank[None, :]) if rank is not None else \
            CATEGORICAL_STEPS * (1.0 - np.eye(n))
    return D


def _rank(choices: tuple) -> np.ndarray | None:
    numeric = len(choices) >= 3 and all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in choices)
    return np.argsort(np.argsort(np.array(choices, dtype=float))).astype(float) if numeric else None


class GainModel:
    def __init__(self, view: SpaceView, buckets: BucketModel | None = None) -> None:
        self.view = view
        self.buckets = buckets
        self.hyper = {name: grid[0] for name, grid in HYPER_GRID.items()}
        P = len(view.params)
        self._share = np.array([[float(p != q and bool(set(view.params[p].buckets) & set(view.params[q].buckets)))
                                 for q in range(P)] for p in range(P)])
        self._any_share = bool(self._share.any())
        self._C = value_correlations(view)
        self._D = value_distances(view)
        self._P = np.arange(P)
        # every (parameter, value) is one column of a one-hot code: parameter p's values start at _offset[p]
        self._offset = np.concatenate([[0], np.cumsum(view.n_choices)[:-1]]).astype(np.int64)
        self._width = int(view.n_choices.sum())
        self._numbered = view.size() < 2 ** 62  # every configuration has its own int64 (view.index)
        self.X = np.zeros((0, P), dtype=np.int64)
        self.y = np.zeros(0)
        self.sd_scale = 1.0  # the agent's calibration: observed misses / predicted sd
        self._alpha = np.zeros(0)
        self._Kinv: Square | None = None  # inverse of the training covariance (noise included)
        self._set_weights(self._main_weights())
        self._tr: dict[str, Square] = {}  # kernel parts between the training rows (unscaled)
        self._K = Square()  # their combination under the current scales (noise not included)
        self._noise = np.zeros(0)
        self._hyper_n = 0  # rows when the scales were last fitted

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

    def _set_weights(self, W: np.ndarray) -> None:
        """The main-effect variances, and the per-value tables every sum-over-parameters part of the
        kernel is read from: block-diagonal over (parameter, value), side by side [T, 4T] for the
        main effects, the correlations, their squares and the steps."""
        self._W = W
        T = self._width
        tables, blocks = np.zeros((4, T, T)), np.zeros((T, T))
        for p, n in enumerate(self.view.n_choices):
            o, n = int(self._offset[p]), int(n)
            c, w = self._C[p, :n, :n], np.sqrt(W[p, :n])
            block = np.s_[o:o + n, o:o + n]
            tables[0][block] = c * np.outer(w, w)
            tables[1][block] = c
            tables[2][block] = c * c
            tables[3][block] = self._D[p, :n, :n]
            blocks[block] = 1.0
        self._tables = np.concatenate(tables, axis=1)
        self._blocks = blocks
        self._fused: tuple[tuple, np.ndarray] | None = None  # kernel()'s tables under the current scales

    # ---- kernel ----------------------------------------------------------------------------------
    def _parts(self, A: np.ndarray, B: np.ndarray) -> dict[str, np.ndarray]:
        """The kernel's parts between rows of A and B, before their scales ("dist": summed steps).
        A sum over parameters of a per-value table t_p is one-hot(A) @ blockdiag(t) @ one-hot(B).T:
        four matrix products with an inner size of the number of values, not a gather per parameter."""
        T = self._width
        left = self._tables[A + self._offset[None, :]].sum(axis=1)  # [a, 4T]: one-hot(A) @ tables
        onehot_b = np.zeros((T, len(B)))
        onehot_b[B + self._offset[None, :], np.arange(len(B))[:, None]] = 1.0
        main, S, Q, dist = (left[:, k * T:(k + 1) * T] @ onehot_b for k in range(4))
        # dist sums whole rank steps (and CATEGORICAL_STEPS): exactly 0 only for the same configuration
        return {"main": main, "pair": 0.5 * (S * S - Q), "shared": self._shared(A, B), "dist": dist,
                "ident": (dist <= 1e-9).astype(float)}

    def _shared(self, A: np.ndarray, B: np.ndarray) -> np.ndarray:
        """Products of two bucket-sharing parameters' correlations (not a sum over parameters)."""
        shared = np.zeros((len(A), len(B)))
        if self._any_share:
            cs = {p: self._C[p][A[:, p]][:, B[:, p]] for p in np.nonzero(self._share.any(axis=1))[0]}
            for p, q in zip(*np.nonzero(np.triu(self._share, 1))):
                shared += cs[p] * cs[q]
        return shared

    def _combine(self, parts: dict[str, np.ndarray], hyper: dict[str, float]) -> np.ndarray:
        k = hyper["main"] * parts["main"] + hyper["pair"] ** 2 * parts["pair"] \
            + hyper["ident"] ** 2 * parts["ident"]
        if self._any_share:
            k = k + hyper["shared"] ** 2 * parts["shared"]
        if hyper["local"] > 0:
            k = k + hyper["local"] ** 2 * np.exp(-hyper["theta"] * parts["dist"])
        return SD_CONST ** 2 + hyper["amp"] * k

    def kernel(self, A: np.ndarray, B: np.ndarray) -> np.ndarray:
        """k(A, B) under the current scales: what _combine(_parts(A, B)) gives, in fewer passes over
        the [a, b] result (every candidate against every trial, each proposal). The main effects, the
        squares' share of the pairs and the offset are one table; the shared-value count S is one
        product, then squared; steps only when the local term is on; identity where rows are equal."""
        h, T = self.hyper, self._width
        left = self._fused_tables()[A + self._offset[None, :]].sum(axis=1)  # [a, 3T]
        onehot_b = np.zeros((T, len(B)))
        onehot_b[B + self._offset[None, :], np.arange(len(B))[:, None]] = 1.0
        k = left[:, :T] @ onehot_b
        S = left[:, T:2 * T] @ onehot_b
        np.multiply(S, S, out=S)
        S *= 0.5 * h["amp"] * h["pair"] ** 2
        k += S
        if h["local"] > 0:
            local = left[:, 2 * T:] @ onehot_b
            local *= -h["theta"]
            np.exp(local, out=local)
            local *= h["amp"] * h["local"] ** 2
            k += local
        if h["ident"] > 0 and len(A) and len(B):
            k[self._same_rows(A, B)] += h["amp"] * h["ident"] ** 2
        if self._any_share:
            k += h["amp"] * h["shared"] ** 2 * self._shared(A, B)
        return k

    def _same_rows(self, A: np.ndarray, B: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(i, j) of every A[i] equal to B[j], by their configuration numbers."""
        if self._numbered:
            return equal_pairs(self.view.index(A), self.view.index(B))
        _, ids = np.unique(np.concatenate([A, B]), axis=0, return_inverse=True)  # too many for an int64
        return equal_pairs(ids.reshape(-1)[:len(A)], ids.reshape(-1)[len(A):])

    def _fused_tables(self) -> np.ndarray:
        """[T, 3T] for kernel(): the linear parts and the offset (spread over the P blocks: every
        configuration picks one value of each parameter), the correlations, the steps."""
        key = tuple(sorted(self.hyper.items()))
        if self._fused is None or self._fused[0] != key:
            h, T = self.hyper, self._width
            main, corr, square, steps = (self._tables[:, k * T:(k + 1) * T] for k in range(4))
            lin = h["amp"] * (h["main"] * main - 0.5 * h["pair"] ** 2 * square) \
                + self._blocks * SD_CONST ** 2 / max(1, len(self._P))
            self._fused = (key, np.concatenate([lin, corr, steps], axis=1))
        return self._fused[1]

    def _diag(self, A: np.ndarray) -> np.ndarray:
        C = self._C[self._P[None, :], A, A]  # [a, P]
        s = C.sum(axis=1)
        shared = 0.5 * ((C @ self._share) * C).sum(axis=1)
        parts = {"main": (C * self._W[self._P[None, :], A]).sum(axis=1), "pair": 0.5 * (s * s - (C * C).sum(axis=1)),
                 "shared": shared, "dist": np.zeros(len(A)), "ident": np.ones(len(A))}
        return self._combine(parts, self.hyper)

    def prior_mean(self, X: np.ndarray) -> np.ndarray:
        if self.buckets is None or not self.buckets.ready or len(X) == 0:
            return np.zeros(len(X))
        return self.buckets.log_gain(X)

    # ---- fit / predict ---------------------------------------------------------------------------
    @one_blas_thread
    def fit(self, X: np.ndarray, y: np.ndarray, noise_sd: np.ndarray) -> None:
        """X: codes of measured trials; y: log(objective / baseline objective); noise_sd: per trial.
        Rows are expected to extend the previous fit's (the history only grows); anything else refits
        from scratch."""
        W = self._main_weights()
        noise = np.maximum(noise_sd, NOISE_FLOOR) ** 2 + 1e-9
        n_old = len(self.X)
        same_prefix = n_old <= len(X) and np.array_equal(self.X, X[:n_old]) and np.array_equal(W, self._W)
        if not same_prefix:  # not an extension of the last fit (e.g. a warm start dropped): from scratch
            if len(X) < n_old:  # rows went away: the scales they chose are refitted, from the start
                self._hyper_n = 0
                self.hyper = {name: grid[0] for name, grid in HYPER_GRID.items()}
            self._tr, self._K, self._Kinv, n_old = {}, Square(), None, 0
            if not np.array_equal(W, self._W):
                self._set_weights(W)
        self._extend_parts(X, n_old)
        self.X, self.y = X, y
        if len(X) == 0:
            self._Kinv = None
            return
        resid = y - self.prior_mean(X)
        grow = len(X) >= MIN_FOR_HYPER and (self._hyper_n < MIN_FOR_HYPER or
                                            len(X) >= self._hyper_n * (1 + REFIT_GROWTH))
        if grow:
            before = dict(self.hyper)
            self._fit_hyper(resid, noise)
            self._hyper_n = len(X)
            if self.hyper != before:
                self._K.assign(self._train_k(self.hyper))
            n_old = 0
        noise_same = len(self._noise) == n_old and np.array_equal(self._noise, noise[:n_old])
        if self._Kinv is None or n_old == 0 or not noise_same or self._Kinv.n != n_old:
            self._Kinv = Square()
            self._Kinv.assign(np.linalg.inv(self._K.m + np.diag(noise)))
        elif len(X) > n_old:
            self._extend_inverse(noise, n_old)
        self._noise = noise
        self._alpha = self._Kinv.m @ resid

    def _extend_parts(self, X: np.ndarray, n_old: int) -> None:
        """The kernel parts, and their combination under the current scales, for the new rows."""
        if len(X) == n_old and self._tr:
            return
        new = self._parts(X[n_old:], X)  # [k, n]
        for name, block in new.items():
            if name not in self._tr:
                self._tr[name] = Square()
            self._tr[name].extend(block)
        self._K.extend(self._combine(new, self.hyper))

    def _train_k(self, hyper: dict[str, float]) -> np.ndarray:
        return self._combine({name: part.m for name, part in self._tr.items()}, hyper)

    def _extend_inverse(self, noise: np.ndarray, n_old: int) -> None:
        """The inverse of K + diag(noise) from the inverse of its leading n_old block (Schur), in place."""
        K = self._K.m
        B = K[:n_old, n_old:]
        D = K[n_old:, n_old:] + np.diag(noise[n_old:])
        inv = self._Kinv.grow(len(K))
        AiB = inv[:n_old, :n_old] @ B
        Si = np.linalg.inv(D - B.T @ AiB)
        top_right = -AiB @ Si
        inv[:n_old, :n_old] -= top_right @ AiB.T
        inv[:n_old, n_old:] = top_right
        inv[n_old:, :n_old] = top_right.T
        inv[n_old:, n_old:] = Si

    def _fit_hyper(self, resid: np.ndarray, noise: np.ndarray) -> None:
        """Coordinate ascent on the marginal likelihood over HYPER_GRID, from the current scales."""
        def evaluate(hyper: dict[str, float]) -> float | None:
            try:
                L = np.linalg.cholesky(self._train_k(hyper) + np.diag(noise))
            except np.linalg.LinAlgError:
                return None
            z = forward_solve(L, resid)
            return -0.5 * float(z @ z) - float(np.log(np.diag(L)).sum())

        best_h = dict(self.hyper)
        best = evaluate(best_h)
        for name, grid in HYPER_GRID.items():
            if name == "shared" and not self._any_share or name == "theta" and best_h["local"] == 0:
                continue
            for value in grid:
                if value == best_h[name]:
                    continue
                trial = {**best_h, name: value}
                got = evaluate(trial)
                if got is not None and (best is None or got > best):
                    best, best_h = got, trial
        self.hyper = best_h

    @one_blas_thread
    def predict(self, Xc: np.ndarray, scaled: bool = True) -> tuple[np.ndarray, np.ndarray]:
        """Mean and sd of log(objective / baseline) for each candidate row (sd widened by
        `sd_scale` unless scaled=False)."""
        mu = self.prior_mean(Xc)
        var = self._diag(Xc)
        if self._Kinv is not None and len(Xc):
            Ks = self.kernel(Xc, self.X)  # [c, n]
            mu = mu + Ks @ self._alpha
            var = var - ((Ks @ self._Kinv.m) * Ks).sum(axis=1)
        sd = np.sqrt(np.maximum(var, 1e-10))
        return mu, sd * (self.sd_scale if scaled else 1.0)

    def train_mean(self) -> np.ndarray:
        """Posterior mean at every training row (cheap: the kept training covariance)."""
        if self._Kinv is None:
            return np.zeros(0)
        return self.prior_mean(self.X) + self._K.m @ self._alpha

    @one_blas_thread
    def difference(self, a: np.ndarray, b: np.ndarray) -> tuple[float, float]:
        """Posterior mean and sd of f(a) - f(b): the joint posterior, so evidence shared through the
        model (a main effect seen in many pairs of trials) counts, not only repeats of a and b."""
        X = np.stack([a, b])
        mu = self.prior_mean(X)
        K = self.kernel(X, X)
        if self._Kinv is not None:
            Ks = self.kernel(X, self.X)
            mu = mu + Ks @ self._alpha
            K = K - Ks @ self._Kinv.m @ Ks.T
        var = K[0, 0] + K[1, 1] - 2 * K[0, 1]
        return float(mu[0] - mu[1]), math.sqrt(max(var, 1e-12)) * self.sd_scale


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
