"""Bucket diffs: which buckets moved between two profiles, and a one-line verdict on what happened.

The case study's profile story is the reference: the fp32 SIMT GEMM (1004 ms) became a bf16
tensor-core GEMM (499 ms), a net GEMM gain of 505 ms, but the casts added to feed it rose 310 ms,
so `compare` says "... casts ate 61% of the GEMM gain".

How the verdict is reached (pure function of the two bucket dicts, no I/O, no torch):
- Buckets are grouped before judging: every `gemm*` bucket forms one group "GEMM" (a SIMT -> tensor
  core flip moves time *between* GEMM buckets; the gain is the group's net drop), every other
  bucket is its own group.
- Moves smaller than the noise floor (`noise_frac` of the larger total) are not named, with one
  exception that makes a small bucket's story visible however small the net: a group that fell by
  at least SIGNIFICANT_FALL_FRAC (20 %) of its own time is a gain, and a group that rose by at
  least EATEN_NAMED_FRAC (a fifth) of the biggest gain is named as eating it.
- The biggest falling group is "the gain"; the rising groups are what may have eaten it.
  Rises under 10% of the gain: the gain is kept ("nothing eaten"). Otherwise the verdict names the
  risers and the share of the gain they ate (over 100%: they ate all of it).
- The step's wall time, when both traces have step marks (`wall_a_ms`, `wall_b_ms`: ProfilerStep
  spans per step), is stated, and when it rose by more than WALL_MOVE_FRAC while the buckets fell
  the verdict opens with that: the time went somewhere no bucket counts (launch gaps, host time,
  synchronisation), so the bucket net is not the speed-up.
- No fall, only rises: a plain regression. Only falls: a plain gain. Nothing moved: unchanged.
The net change uses total_a_ms / total_b_ms when given (say, the step's wall time), else the sums.
Numbers use an ASCII minus so the line survives any terminal, log or database column.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

from autoopt.profile.rules import BUCKETS

EATEN_MIN_FRAC = 0.10  # rises below this share of the gain do not count as "eaten"
SIGNIFICANT_FALL_FRAC = 0.20  # a group falling by this share of its own time is a gain, even if small
EATEN_NAMED_FRAC = 0.20  # a group rising by this share of the gain is named, even if small
WALL_MOVE_FRAC = 0.02  # the wall per step moved (beyond run-to-run jitter of a profiled step)
GEMM_GROUP = "GEMM"
# How a rising group is named in "... ate N% of the gain".
NOUNS = {"copy_cast": "casts", "elementwise": "elementwise ops", "reduce": "reductions",
         "norm": "norms", "attention": "attention", "moe": "MoE", "communication": "communication",
         "other": "unbucketed kernels", "host": "host time", GEMM_GROUP: "GEMMs"}


@dataclass(frozen=True)
class BucketDelta:
    bucket: str
    a_ms: float
    b_ms: float
    delta_ms: float  # b - a
    delta_pct: float | None  # relative to a; None when a is 0


@dataclass(frozen=True)
class Diagnosis:
    deltas: dict[str, BucketDelta]  # every bucket of a or b, known buckets in BUCKETS order first
    total_a_ms: float
    total_b_ms: float
    net_ms: float  # total_b - total_a
    net_pct: float | None
    kind: str  # "eaten" | "kept" | "gain" | "regression" | "unchanged" | "empty"
    gain_group: str | None  # the biggest falling group ("GEMM" or a bucket name)
    gain_ms: float  # how much it fell (>= 0)
    eaten_ms: float  # how much the rising groups rose (>= 0)
    eaten_frac: float | None  # eaten_ms / gain_ms when there is a gain
    verdict: str | None  # one line; None only when both sides are empty
    wall_a_ms: float | None = None  # wall per step (step marks on both sides), else None
    wall_b_ms: float | None = None
    wall_rose: bool = False  # the wall per step rose while the buckets' net fell

    @property
    def delta_ms(self) -> dict[str, float]:
        return {b: d.delta_ms for b, d in self.deltas.items()}


def group_of(bucket: str) -> str:
    return GEMM_GROUP if bucket.startswith("gemm") else bucket


def fmt_ms(ms: float, sign: bool = True) -> str:
    """Three significant figures at most (-1004, +310, -0.34); an ASCII sign when `sign`."""
    mag = abs(ms)
    digits = 0 if mag >= 100 else 1 if mag >= 10 else 2 if mag >= 1 else 3
    text = f"{mag:.{digits}f}"
    return (("-" if ms < 0 else "+") + text) if sign else text


def compare(a: Mapping[str, float], b: Mapping[str, float], total_a_ms: float | None = None,
            total_b_ms: float | None = None, noise_frac: float = 0.01,
            wall_a_ms: float | None = None, wall_b_ms: float | None = None) -> Diagnosis:
    """Per-bucket deltas from profile `a` (before) to `b` (after), and the verdict line."""
    deltas = _deltas(a, b)
    ta = float(total_a_ms) if total_a_ms is not None else sum(d.a_ms for d in deltas.values())
    tb = float(total_b_ms) if total_b_ms is not None else sum(d.b_ms for d in deltas.values())
    net, net_pct = tb - ta, ((tb - ta) / ta * 100 if ta else None)
    walls = (wall_a_ms, wall_b_ms) if wall_a_ms and wall_b_ms else (None, None)
    wall_rose = walls[0] is not None and net < 0 and walls[1] > walls[0] * (1 + WALL_MOVE_FRAC)
    base = dict(deltas=deltas, total_a_ms=ta, total_b_ms=tb, net_ms=net, net_pct=net_pct,
                wall_a_ms=walls[0], wall_b_ms=walls[1], wall_rose=wall_rose)
    if not deltas:
        return Diagnosis(**base, kind="empty", gain_group=None, gain_ms=0.0, eaten_ms=0.0,
                         eaten_frac=None, verdict=None)
    moves = _Moves(deltas, noise_frac * max(ta, tb, 0.0))
    net_text = f"net {fmt_ms(net)} ms" + (f" ({net_pct:+.1f}%)" if net_pct is not None else "")
    if walls[0] is not None:
        net_text += (f"; wall per step {fmt_ms(walls[0], sign=False)} -> "
                     f"{fmt_ms(walls[1], sign=False)} ms ({(walls[1] / walls[0] - 1) * 100:+.0f}%)")
    kind, verdict = moves.verdict(noise_frac, net_text)
    if wall_rose:
        verdict = (f"slower at the wall: the step rose {fmt_ms(walls[1] - walls[0])} ms while its "
                   f"kernels fell {fmt_ms(net)} ms (time outside every bucket: launch gaps, host "
                   f"time, syncs); {verdict}")
    gain = -moves.delta[moves.falls[0]] if moves.falls else 0.0
    eaten = sum(moves.delta[g] for g in moves.rises)
    return Diagnosis(**base, kind=kind, gain_group=moves.falls[0] if moves.falls else None,
                     gain_ms=gain, eaten_ms=eaten, eaten_frac=eaten / gain if gain else None,
                     verdict=verdict)


def _deltas(a: Mapping[str, float], b: Mapping[str, float]) -> dict[str, BucketDelta]:
    names = [x for x in BUCKETS if x in a or x in b]
    names += sorted(x for x in set(a) | set(b) if x not in BUCKETS)
    deltas = {}
    for name in names:
        av, bv = float(a.get(name, 0.0)), float(b.get(name, 0.0))
        deltas[name] = BucketDelta(name, av, bv, bv - av, (bv - av) / av * 100 if av else None)
    return deltas


class _Moves:
    """The groups that fell and rose, by the rules of the module docstring, and their wording."""

    def __init__(self, deltas: dict[str, BucketDelta], noise: float) -> None:
        self.noise, self.groups = noise, {}
        for d in deltas.values():
            self.groups.setdefault(group_of(d.bucket), []).append(d)
        self.delta = {g: sum(d.delta_ms for d in ds) for g, ds in self.groups.items()}
        before = {g: sum(d.a_ms for d in ds) for g, ds in self.groups.items()}
        self.falls = sorted((g for g, v in self.delta.items()
                             if v < -noise or (v < 0 and -v >= SIGNIFICANT_FALL_FRAC * before[g])),
                            key=lambda g: self.delta[g])
        gain = -self.delta[self.falls[0]] if self.falls else 0.0
        floor = min(noise, EATEN_NAMED_FRAC * gain) if gain else noise
        self.rises = sorted((g for g, v in self.delta.items() if v > floor and v > 0),
                            key=lambda g: -self.delta[g])
        self.deltas = deltas

    def label(self, g: str) -> str:
        """'copy_cast +310 ms', or for a group 'GEMM -505 ms (gemm_simt -1004, gemm_tensorop +499)'."""
        # members in the group's direction first: "gemm_simt -1004, gemm_tensorop +499"
        floor = min(self.noise, abs(self.delta[g]) / 4)
        moved = sorted((d for d in self.groups[g] if abs(d.delta_ms) > floor),
                       key=lambda d: d.delta_ms if self.delta[g] < 0 else -d.delta_ms)
        if len(self.groups[g]) == 1 or len(moved) <= 1:
            name = moved[0].bucket if moved else self.groups[g][0].bucket
            return f"{name} {fmt_ms(self.delta[g])} ms"
        parts = ", ".join(f"{d.bucket} {fmt_ms(d.delta_ms)}" for d in moved)
        return f"{g} {fmt_ms(self.delta[g])} ms ({parts})"

    def listing(self, gs: list[str], limit: int = 3) -> str:
        shown = ", ".join(self.label(g) for g in gs[:limit])
        return shown + (f" and {len(gs) - limit} more" if len(gs) > limit else "")

    def verdict(self, noise_frac: float, net_text: str) -> tuple[str, str]:
        """(kind, one line)."""
        falls, rises, noise = self.falls, self.rises, self.noise
        if not falls and not rises:
            biggest = max(self.deltas.values(), key=lambda d: abs(d.delta_ms))
            return "unchanged", (f"unchanged: no bucket moved by more than "
                                 f"{fmt_ms(noise, sign=False)} ms ({noise_frac:.0%} of the total; "
                                 f"largest {biggest.bucket} {fmt_ms(biggest.delta_ms)} ms); "
                                 f"{net_text}")
        if not falls:
            return "regression", f"slower: {self.listing(rises)}; nothing fell to offset it; {net_text}"
        gain_group, gain = falls[0], -self.delta[falls[0]]
        frac = sum(self.delta[g] for g in rises) / gain
        also = f"; also fell: {self.listing(falls[1:])}" if len(falls) > 1 else ""
        gain_noun = f"the {gain_group} gain"
        if not rises:
            return "gain", (f"faster: {self.label(gain_group)}; nothing rose by more than "
                            f"{fmt_ms(noise, sign=False)} ms{also}; {net_text}")
        if frac < EATEN_MIN_FRAC:
            return "kept", (f"{self.label(gain_group)}; rises elsewhere are small "
                            f"({self.listing(rises)}, {frac:.0%} of {gain_noun}): nothing eaten"
                            f"{also}; {net_text}")
        nouns = [NOUNS.get(g, g) for g in rises[:3]] + (["others"] if len(rises) > 3 else [])
        who = nouns[0] if len(nouns) == 1 else ", ".join(nouns[:-1]) + " and " + nouns[-1]
        share = f"ate {frac:.0%} of {gain_noun}" if frac < 1 else \
            f"ate all of {gain_noun} ({frac:.0%})"
        return "eaten", (f"{self.label(gain_group)}, {self.listing(rises)}: {who} {share}{also}; "
                         f"{net_text}")
