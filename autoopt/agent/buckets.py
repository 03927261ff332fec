"""What each parameter value does to each profile bucket, learned from profiles (prior: the space).

A decode step's time is a sum of buckets, and switching a knob adds or removes milliseconds in some of
them (the bf16 GEMM removes ~500 ms of `gemm_simt`, adds ~250 ms of `gemm_tensorop` and, through its
casts, ~300 ms of `copy_cast`). So per bucket b the model is additive in milliseconds:

    ms_b(x) = c_b + sum_p d[p, x_p, b]        (d[p, base_p, b] = 0)

fitted jointly over every profiled trial (ridge regression: confounded moves are sorted out by the
other trials, not guessed from pairs). Priors per (parameter value, bucket):
  - a bucket the knob declares and a value with a prior speed-up s in the space file:
    d = -(1 - 1/s) * f * baseline ms_b (f: share of the layers the parameter covers), sd half of it;
  - a declared bucket without a prior: d = 0, sd half the bucket;
  - a bucket the knob does not declare: d = 0, sd 5% of the bucket (profiles can still show it).

Predicted step time of a configuration (Amdahl, bucket by bucket), relative to a reference profile r
(the incumbent's, for profile-guided moves; the baseline's for the model's mean):
    T(x) = sum_b max(0, r_b + sum_p d[p, x_p, b] - d[p, r_p, b])
The buckets are what the profile saw running (GPU kernels, or CPU ops), and that is only part of the
wall time when the step is host-bound: an eager GPU decode step keeps the GPU busy 8 % of its wall on
the H200, so kernel time saved there does not reach tok/s. The relative change of T is therefore
scaled by the reference's coverage k (busy / wall, 1 when unknown):
    wall(x) / wall(r) = 1 - k (1 - T(x) / T(r))
a linear middle between host-bound (k -> 0: kernel savings are invisible) and GPU-bound (k = 1:
Amdahl as is).
"""
from __future__ import annotations

from typing import Any

import numpy as np

from autoopt.agent.view import SpaceView

OBS_SD_FRAC = 0.02  # a bucket's figure scatters by about this share of its baseline size
UNDECLARED_SD_FRAC = 0.05
DECLARED_SD_FRAC = 0.5


class BucketModel:
    def __init__(self, view: SpaceView) -> None:
        self.view = view
        self.buckets: list[str] = []
        self.codes: list[np.ndarray] = []
        self.rows: list[dict[str, float]] = []
        self.base_ms: np.ndarray | None = None
        self._V = int(view.n_choices.max(initial=1))
        self._d: np.ndarray | None = None  # [P, V, B]
        self._seen = np.zeros((len(view.params), self._V), dtype=bool)
        self.base_coverage = 1.0
        self._coverage: dict[tuple[int, ...], float] = {}  # latest coverage of each profiled config

    # ---- learning --------------------------------------------------------------------------------
    def add(self, code: np.ndarray, buckets_ms: dict[str, float], is_baseline: bool = False,
            coverage: float | None = None) -> None:
        if not buckets_ms:
            return
        for b in sorted(buckets_ms):
            if b not in self.buckets:
                self.buckets.append(b)
        cov = _coverage(coverage)
        self._coverage[tuple(int(c) for c in code)] = cov
        if is_baseline or self.base_ms is None:
            self.base_ms = np.array([float(buckets_ms.get(b, 0.0)) for b in self.buckets])
            self.base_coverage = cov
        self.codes.append(code.copy())
        self.rows.append({b: float(v) for b, v in buckets_ms.items()})
        self._seen[np.arange(len(code)), code] = True
        self._d = None

    def _features(self, X: np.ndarray) -> np.ndarray:
        """Intercept + one column per (parameter, non-baseline value)."""
        cols = [np.ones(len(X))]
        for i, p in enumerate(self.view.params):
            for v in range(len(p.choices)):
                if v != p.base:
                    cols.append((X[:, i] == v).astype(float))
        return np.stack(cols, axis=1)

    def _fit(self) -> np.ndarray:
        P, V, B = len(self.view.params), self._V, len(self.buckets)
        base = np.array([self.base_ms[j] if j < len(self.base_ms) else 0.0 for j in range(B)])
        total = float(base.sum()) or 1.0
        F = self._features(np.stack(self.codes))
        slots = [(i, v) for i, p in enumerate(self.view.params) for v in range(len(p.choices)) if v != p.base]
        d = np.zeros((P, V, B))
        for j, bucket in enumerate(self.buckets):
            scale = max(base[j], 0.02 * total)
            y = np.array([row.get(bucket, 0.0) for row in self.rows])
            mean = np.zeros(F.shape[1])
            sd = np.empty(F.shape[1])
            mean[0], sd[0] = base[j], 10.0 * scale
            for k, (i, v) in enumerate(slots, start=1):
                p = self.view.params[i]
                if bucket in p.buckets:
                    s = p.prior_speedup.get(v)
                    if s is not None:
                        mean[k] = -(1.0 - 1.0 / s) * p.layer_fraction * base[j]
                    sd[k] = max(DECLARED_SD_FRAC * abs(mean[k]), DECLARED_SD_FRAC * scale)
                else:
                    sd[k] = UNDECLARED_SD_FRAC * scale
            noise = OBS_SD_FRAC * scale + 1e-3
            prec = 1.0 / sd ** 2
            A = F.T @ F / noise ** 2 + np.diag(prec)
            w = np.linalg.solve(A, F.T @ y / noise ** 2 + prec * mean)
            for k, (i, v) in enumerate(slots, start=1):
                d[i, v, j] = w[k]
        return d

    # ---- queries ---------------------------------------------------------------------------------
    @property
    def ready(self) -> bool:
        return self.base_ms is not None and bool(self.buckets)

    def deltas(self) -> np.ndarray:
        """d[p, v, b]: milliseconds value v of parameter p adds to bucket b (vs its baseline value)."""
        if self._d is None:
            self._d = self._fit()
        return self._d

    def known(self, p: int, v: int) -> bool:
        """Whether a profile has shown value v of parameter p."""
        return bool(self._seen[p, v])

    def _ref(self, ms: dict[str, float]) -> np.ndarray:
        return np.array([float(ms.get(b, 0.0)) for b in self.buckets])

    def step_ms(self, codes: np.ndarray, ref_code: np.ndarray, ref_ms: np.ndarray) -> np.ndarray:
        d = self.deltas()
        P = len(self.view.params)
        moved = d[np.arange(P)[None, :], codes, :].sum(axis=1) - d[np.arange(P), ref_code, :].sum(axis=0)
        return np.maximum(0.0, ref_ms[None, :] + moved).sum(axis=1)

    def log_gain(self, codes: np.ndarray) -> np.ndarray:
        """Predicted log(T_baseline / T(x)) for each row of `codes` (0 when there are no profiles)."""
        if not self.ready or len(codes) == 0:
            return np.zeros(len(codes))
        base = np.array([self.base_ms[j] if j < len(self.base_ms) else 0.0 for j in range(len(self.buckets))])
        t = self.step_ms(codes, self.view.base_code, base)
        return -np.log(_wall_ratio(t / max(base.sum(), 1e-9), self.base_coverage))

    def amdahl(self, ref_code: np.ndarray, ref_ms: dict[str, float], p: int, v: int) -> tuple[float, str]:
        """Expected relative gain of switching parameter p to v from the profiled reference, and the
        bucket that carries most of it."""
        if not self.ready or not ref_ms:
            return 0.0, ""
        d = self.deltas()
        r = self._ref(ref_ms)
        change = d[p, v, :] - d[p, int(ref_code[p]), :]
        after = np.maximum(0.0, r + change)
        total, new_total = r.sum(), after.sum()
        if total <= 0 or new_total <= 0:
            return 0.0, ""
        saved = r - after
        top = self.buckets[int(np.argmax(saved))] if saved.max() > 0 else ""
        return 1.0 / float(_wall_ratio(new_total / total, self.coverage_of(ref_code))) - 1.0, top

    def explain(self, ref_code: np.ndarray, ref_ms: dict[str, float], code: np.ndarray) -> tuple[float, str]:
        """Predicted relative gain of moving from the profiled reference to `code` (any number of
        changes), and the bucket that saves most."""
        if not self.ready or not ref_ms:
            return 0.0, ""
        d = self.deltas()
        P = len(self.view.params)
        r = self._ref(ref_ms)
        change = d[np.arange(P), code, :].sum(axis=0) - d[np.arange(P), ref_code, :].sum(axis=0)
        after = np.maximum(0.0, r + change)
        if r.sum() <= 0 or after.sum() <= 0:
            return 0.0, ""
        saved = r - after
        gain = 1.0 / float(_wall_ratio(after.sum() / r.sum(), self.coverage_of(ref_code))) - 1.0
        return gain, (self.buckets[int(np.argmax(saved))] if saved.max() > 0 else "")

    def coverage_of(self, code: np.ndarray) -> float:
        """The profiled coverage (busy / wall) of a configuration, the baseline's when not profiled."""
        return self._coverage.get(tuple(int(c) for c in code), self.base_coverage)

    def speedup_text(self, p: int, v: int) -> str:
        """'attention x2.4' : the learned speed-up of p=v on the bucket it changes most."""
        if not self.ready:
            return ""
        d = self.deltas()[p, v, :]
        j = int(np.argmax(np.abs(d)))
        b0 = self.base_ms[j] if j < len(self.base_ms) else 0.0
        if b0 <= 0 or b0 + d[j] <= 0:
            return f"{self.buckets[j]} {d[j]:+.0f} ms"
        return f"{self.buckets[j]} x{b0 / (b0 + d[j]):.2f}"


def _coverage(coverage: float | None) -> float:
    """A profile's coverage as a usable factor: unknown -> 1 (Amdahl as is), floored at 0.05."""
    if coverage is None or not np.isfinite(coverage) or coverage <= 0:
        return 1.0
    return float(min(1.0, max(0.05, coverage)))


def _wall_ratio(bucket_ratio: Any, coverage: float) -> Any:
    """wall(x) / wall(ref) from T(x) / T(ref) and the reference's coverage (module docstring)."""
    return np.maximum(1.0 - coverage * (1.0 - np.asarray(bucket_ratio, dtype=float)), 1e-3)


def bucket_share_text(ms: dict[str, Any], top: int = 3) -> str:
    total = sum(float(v) for v in ms.values()) or 1.0
    items = sorted(ms.items(), key=lambda kv: -float(kv[1]))[:top]
    return ", ".join(f"{b} {100 * float(v) / total:.0f}%" for b, v in items)
