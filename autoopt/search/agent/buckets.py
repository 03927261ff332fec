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

Host time is a bucket. A profile with step marks adds bucket "host" (autoopt.measurement.HOST_BUCKET:
the step's wall no kernel bucket holds), so its buckets add up to the wall and k = 1 for it: a
kernel saving reaches the wall millisecond for millisecond, and host time has a bucket a knob can
cut. A knob value that declares a cut (KnobDef.cuts, autoopt.space.knobs) gets its prior there:
    d[p, x, host] = -c * f * share * baseline host ms,   sd half of it (at least half of f*share*bucket)
  c: the value's prior speed-up s as a cut, 1 - 1/s; without one, half (the size is unknown, the
     direction is declared);
  share: 1 for a "host" cut (the value takes the host's per-op work out of all it covers: a CUDA
     graph, a compiled step); for a "launches" cut, its part of the baseline's launches, since host
     time comes per launch: the launches (kernels) of each of its buckets, split evenly among the
     knobs whose launch cuts claim that bucket (a launch goes away once, and which fusion owns it
     is not known before it is measured); without kernel counts, kernel time stands in for them.
Host time is shared by every cut that claims it, so on the host bucket the deltas compose as kept
shares, not milliseconds: f[p, v] = -d[p, v, host] / baseline host ms, and from the reference
    host(x) = r_host * prod_p (1 - f[p, x_p]) / prod_p (1 - f[p, r_p])
(once CUDA graphs took 99 % of the host time, a launch cut takes its share of the 1 % left; in
milliseconds it removed the eager baseline's 124 ms again: the live H200 run predicted +266 % for a
move that measured +1.9 %). Kernel buckets stay additive: composing them as shares too made the
committed case-study replay slower to converge (its effects are additive milliseconds); that
tuned references overstate a kernel bucket's saving (+44 % predicted, -1.4 % measured for an
indexer move on a step whose elementwise time had gone) is left to the GP's residual.
So on a host-bound step (the H200's eager start: 93 % host) CUDA graphs is worth most of the wall,
and on a device-bound one the same prior is worth little: the mechanism is the measured split, not a
constant. A row without a bucket (a profile without step marks has no host) says nothing about it.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from autoopt.measurement import HOST_BUCKET
from autoopt.search.agent.view import SpaceView

OBS_SD_FRAC = 0.02  # a bucket's figure scatters by about this share of its baseline size
UNDECLARED_SD_FRAC = 0.05
DECLARED_SD_FRAC = 0.5
CUT_MAX = 0.99  # no value takes away all host time: cuts of it compose as kept shares
UNKNOWN_CUT_FRAC = 0.5  # a declared cut of unknown size: the middle of "none" and "all of it"


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
        self._cuts = _cuts_by_param(view)  # per parameter: value index -> kinds it cuts
        self._claims = _launch_claims(view, self._cuts)  # bucket -> knobs whose launch cuts claim it
        self.base_kernels: dict[str, float] = {}  # kernels per bucket of the baseline's profile

    # ---- learning --------------------------------------------------------------------------------
    def add(self, code: np.ndarray, buckets_ms: dict[str, float], is_baseline: bool = False,
            coverage: float | None = None, kernels_by_bucket: dict[str, float] | None = None) -> None:
        if not buckets_ms:
            return
        for b in sorted(buckets_ms):
            if b not in self.buckets:
                self.buckets.append(b)
        # with the host bucket the buckets are the whole wall: Amdahl as is (module docstring)
        cov = 1.0 if HOST_BUCKET in buckets_ms else _coverage(coverage)
        self._coverage[tuple(int(c) for c in code)] = cov
        if is_baseline or self.base_ms is None:
            self.base_ms = np.array([float(buckets_ms.get(b, 0.0)) for b in self.buckets])
            self.base_coverage = cov
            self.base_kernels = dict(kernels_by_bucket or {})
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
        # the kernel buckets' scale floor as without a host bucket (a host-bound wall would widen it)
        total = float(sum(x for b, x in zip(self.buckets, base) if b != HOST_BUCKET)) or 1.0
        F = self._features(np.stack(self.codes))
        slots = [(i, v) for i, p in enumerate(self.view.params) for v in range(len(p.choices)) if v != p.base]
        d = np.zeros((P, V, B))
        for j, bucket in enumerate(self.buckets):
            scale = max(base[j], 0.02 * total)
            has = np.array([bucket in row for row in self.rows])  # a row without it says nothing
            y = np.array([row.get(bucket, 0.0) for row in self.rows])[has]
            mean, sd = self._prior(bucket, base[j], scale, slots)
            noise = OBS_SD_FRAC * scale + 1e-3
            prec = 1.0 / sd ** 2
            Fj = F[has]
            A = Fj.T @ Fj / noise ** 2 + np.diag(prec)
            w = np.linalg.solve(A, Fj.T @ y / noise ** 2 + prec * mean)
            for k, (i, v) in enumerate(slots, start=1):
                d[i, v, j] = w[k]
        return d

    def _prior(self, bucket: str, base_ms: float, scale: float,
               slots: list[tuple[int, int]]) -> tuple[np.ndarray, np.ndarray]:
        """Prior mean and sd of the intercept and every (parameter, value) slot in one bucket."""
        mean = np.zeros(len(slots) + 1)
        sd = np.empty(len(slots) + 1)
        mean[0], sd[0] = base_ms, 10.0 * scale
        for k, (i, v) in enumerate(slots, start=1):
            p = self.view.params[i]
            if bucket == HOST_BUCKET and self._cuts[i]:  # a knob with cuts: they decide its host prior
                kinds = self._cuts[i].get(v)
                mean[k], sd[k] = self._cut_prior(i, v, kinds, base_ms, scale) if kinds \
                    else (0.0, UNDECLARED_SD_FRAC * scale)
            elif bucket in p.buckets:
                s = p.prior_speedup.get(v)
                if s is not None:
                    mean[k] = -(1.0 - 1.0 / s) * p.layer_fraction * base_ms
                sd[k] = max(DECLARED_SD_FRAC * abs(mean[k]), DECLARED_SD_FRAC * scale)
            else:
                sd[k] = UNDECLARED_SD_FRAC * scale
        return mean, sd

    def _cut_prior(self, i: int, v: int, kinds: tuple[str, ...], host_ms: float,
                   scale: float) -> tuple[float, float]:
        """(mean, sd) ms that value v of parameter i adds to the host bucket (module docstring)."""
        p = self.view.params[i]
        share = p.layer_fraction * (1.0 if "host" in kinds else self.launch_share(i))
        s = p.prior_speedup.get(v)
        cut = 1.0 - 1.0 / s if s is not None else UNKNOWN_CUT_FRAC
        mean = -cut * share * host_ms
        return mean, DECLARED_SD_FRAC * max(abs(mean), share * scale)

    def launch_share(self, i: int) -> float:
        """Parameter i's part of the baseline's launches: each of its kernel buckets' launches over
        the knobs that claim that bucket (kernel time when the profile counted no kernels)."""
        own = [b for b in self.view.params[i].buckets if b != HOST_BUCKET]
        counts = self.base_kernels
        if not counts and self.base_ms is not None:
            counts = {b: float(x) for b, x in zip(self.buckets, self.base_ms) if b != HOST_BUCKET}
        total = sum(counts.values())
        if total <= 0:
            return 1.0
        return sum(counts.get(b, 0.0) / max(self._claims.get(b, 1), 1) for b in own) / total

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
        return self._after(codes, ref_code, ref_ms).sum(axis=1)

    def _after(self, codes: np.ndarray, ref_code: np.ndarray, ref_ms: np.ndarray) -> np.ndarray:
        """[N, B] bucket ms of each row of `codes`, from the reference's: milliseconds on the kernel
        buckets, kept shares on the host bucket (module docstring)."""
        d = self.deltas()
        P = len(self.view.params)
        moved = d[np.arange(P)[None, :], codes, :].sum(axis=1) - d[np.arange(P), ref_code, :].sum(axis=0)
        after = np.maximum(0.0, ref_ms[None, :] + moved)
        f, shared = self._kept_fraction()
        if shared.any():
            kept = np.prod(1.0 - f[np.arange(P)[None, :], codes], axis=1) / np.prod(1.0 - f[np.arange(P), ref_code],
                                                                                    axis=0)
            after[:, shared] = (ref_ms[None, :] * kept)[:, shared]
        return after

    def _kept_fraction(self) -> tuple[np.ndarray, np.ndarray]:
        """f[p, v, b]: the share of the host bucket value v of parameter p takes away (its fitted ms
        over the baseline's host ms; negative when it adds), and which buckets compose as shares
        (the host bucket, when the baseline has one)."""
        B = len(self.buckets)
        base = np.array([float(self.base_ms[j]) if j < len(self.base_ms) else 0.0 for j in range(B)])
        shared = np.array([b == HOST_BUCKET for b in self.buckets], dtype=bool) & (base > 0)
        f = np.zeros_like(self.deltas())
        f[:, :, shared] = np.minimum(-self.deltas()[:, :, shared] / base[shared], CUT_MAX)
        return f, shared

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
        code = np.array(ref_code, copy=True)
        code[p] = v
        return self.explain(ref_code, ref_ms, code)

    def explain(self, ref_code: np.ndarray, ref_ms: dict[str, float], code: np.ndarray) -> tuple[float, str]:
        """Predicted relative gain of moving from the profiled reference to `code` (any number of
        changes), and the bucket that saves most."""
        if not self.ready or not ref_ms:
            return 0.0, ""
        r = self._ref(ref_ms)
        after = self._after(np.asarray(code)[None, :], np.asarray(ref_code), r)[0]
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


def _cuts_by_param(view: SpaceView) -> list[dict[int, tuple[str, ...]]]:
    """Per parameter: value index -> the kinds of cut its knob declares for that value."""
    knobs = {k.name: k for k in getattr(view.space, "knobs", None) or ()}
    out = []
    for p in view.params:
        cuts = getattr(knobs.get(p.knob), "cuts", None) or {}
        out.append({i: tuple(cuts[c]) for i, c in enumerate(p.choices) if c in cuts and cuts[c]})
    return out


def _launch_claims(view: SpaceView, cuts: list[dict[int, tuple[str, ...]]]) -> dict[str, int]:
    """bucket -> how many knobs cut launches there (a "host" cut is not a claim: it takes all)."""
    claimants: dict[str, set[str]] = {}
    for p, by_value in zip(view.params, cuts):
        if any("launches" in kinds and "host" not in kinds for kinds in by_value.values()):
            for b in p.buckets:
                if b != HOST_BUCKET:
                    claimants.setdefault(b, set()).add(p.knob)
    return {b: len(knobs) for b, knobs in claimants.items()}


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
