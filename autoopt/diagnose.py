"""Bucket diffs: which buckets moved between two profiles, and a one-line verdict on what happened.

The case study's profile story is the reference: the fp32 SIMT GEMM (1004 ms) became a bf16
tensor-core GEMM (499 ms), a net GEMM gain of 505 ms, but the casts added to feed it rose 310 ms,
so `compare` says "... casts ate 61% of the GEMM gain".

How the verdict is reached (pure function of the two bucket dicts, no I/O, no torch):
- Buckets are grouped before judging: every `gemm*` bucket forms one group "GEMM" (a SIMT -> tensor
  core flip moves time *between* GEMM buckets; the gain is the group's net drop), every other
  bucket is its own group.
- Moves smaller than the noise floor (`noise_frac` of the larger total) are not named.
- The biggest falling group is "the gain"; the rising groups are what may have eaten it.
  Rises under 10% of the gain: the gain is kept ("nothing eaten"). Otherwise the verdict names the
  risers and the share of the gain they ate (over 100%: they ate all of it).
- No fall, only rises: a plain regression. Only falls: a plain gain. Nothing moved: unchanged.
The net change uses total_a_ms / total_b_ms when given (say, the step's wall time), else the sums.
Numbers use an ASCII minus so the line survives any terminal, log or database column.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

from autoopt.profile_rules import BUCKETS

EATEN_MIN_FRAC = 0.10  # rises below this share of the gain do not count as "eaten"
GEMM_GROUP = "GEMM"
# How a rising group is named in "... ate N% of the gain".
NOUNS = {"copy_cast": "casts", "elementwise": "elementwise ops", "reduce": "reductions",
         "norm": "norms", "attention": "attention", "moe": "MoE", "communication": "communication",
         "other": "unbucketed kernels", GEMM_GROUP: "GEMMs"}


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
            total_b_ms: float | None = None, noise_frac: float = 0.01) -> Diagnosis:
    """Per-bucket deltas from profile `a` (before) to `b` (after), and the verdict line."""
    names = [x for x in BUCKETS if x in a or x in b]
    names += sorted(x for x in set(a) | set(b) if x not in BUCKETS)
    deltas = {}
    for name in names:
        av, bv = float(a.get(name, 0.0)), float(b.get(name, 0.0))
        deltas[name] = BucketDelta(name, av, bv, bv - av, (bv - av) / av * 100 if av else None)
    ta = float(total_a_ms) if total_a_ms is not None else sum(d.a_ms for d in deltas.values())
    tb = float(total_b_ms) if total_b_ms is not None else sum(d.b_ms for d in deltas.values())
    net, net_pct = tb - ta, ((tb - ta) / ta * 100 if ta else None)
    base = dict(deltas=deltas, total_a_ms=ta, total_b_ms=tb, net_ms=net, net_pct=net_pct)
    if not deltas:
        return Diagnosis(**base, kind="empty", gain_group=None, gain_ms=0.0, eaten_ms=0.0,
                         eaten_frac=None, verdict=None)

    groups: dict[str, list[BucketDelta]] = {}
    for d in deltas.values():
        groups.setdefault(group_of(d.bucket), []).append(d)
    group_delta = {g: sum(d.delta_ms for d in ds) for g, ds in groups.items()}
    noise = noise_frac * max(ta, tb, 0.0)
    falls = sorted((g for g, v in group_delta.items() if v < -noise), key=lambda g: group_delta[g])
    rises = sorted((g for g, v in group_delta.items() if v > noise), key=lambda g: -group_delta[g])
    net_text = f"net {fmt_ms(net)} ms" + (f" ({net_pct:+.1f}%)" if net_pct is not None else "")

    def label(g: str) -> str:
        """'copy_cast +310 ms', or for a group 'GEMM -505 ms (gemm_simt -1004, gemm_tensorop +499)'."""
        # members in the group's direction first: "gemm_simt -1004, gemm_tensorop +499"
        moved = sorted((d for d in groups[g] if abs(d.delta_ms) > noise),
                       key=lambda d: d.delta_ms if group_delta[g] < 0 else -d.delta_ms)
        if len(groups[g]) == 1 or len(moved) <= 1:
            name = moved[0].bucket if moved else groups[g][0].bucket
            return f"{name} {fmt_ms(group_delta[g])} ms"
        parts = ", ".join(f"{d.bucket} {fmt_ms(d.delta_ms)}" for d in moved)
        return f"{g} {fmt_ms(group_delta[g])} ms ({parts})"

    def listing(gs: list[str], limit: int = 3) -> str:
        shown = ", ".join(label(g) for g in gs[:limit])
        return shown + (f" and {len(gs) - limit} more" if len(gs) > limit else "")

    if not falls and not rises:
        biggest = max(deltas.values(), key=lambda d: abs(d.delta_ms))
        verdict = (f"unchanged: no bucket moved by more than {fmt_ms(noise, sign=False)} ms "
                   f"({noise_frac:.0%} of the total; largest {biggest.bucket} "
                   f"{fmt_ms(biggest.delta_ms)} ms); {net_text}")
        return Diagnosis(**base, kind="unchanged", gain_group=None, gain_ms=0.0, eaten_ms=0.0,
                         eaten_frac=None, verdict=verdict)
    if not falls:
        eaten = sum(group_delta[g] for g in rises)
        verdict = f"slower: {listing(rises)}; nothing fell to offset it; {net_text}"
        return Diagnosis(**base, kind="regression", gain_group=None, gain_ms=0.0, eaten_ms=eaten,
                         eaten_frac=None, verdict=verdict)

    gain_group = falls[0]
    gain = -group_delta[gain_group]
    eaten = sum(group_delta[g] for g in rises)
    frac = eaten / gain
    also = f"; also fell: {listing(falls[1:])}" if len(falls) > 1 else ""
    gain_noun = f"the {gain_group} gain"
    if not rises:
        kind = "gain"
        verdict = (f"faster: {label(gain_group)}; nothing rose by more than "
                   f"{fmt_ms(noise, sign=False)} ms{also}; {net_text}")
    elif frac < EATEN_MIN_FRAC:
        kind = "kept"
        verdict = (f"{label(gain_group)}; rises elsewhere are small ({listing(rises)}, "
                   f"{frac:.0%} of {gain_noun}): nothing eaten{also}; {net_text}")
    else:
        kind = "eaten"
        nouns = [NOUNS.get(g, g) for g in rises[:3]] + (["others"] if len(rises) > 3 else [])
        who = nouns[0] if len(nouns) == 1 else ", ".join(nouns[:-1]) + " and " + nouns[-1]
        share = f"ate {frac:.0%} of {gain_noun}" if frac < 1 else \
            f"ate all of {gain_noun} ({frac:.0%})"
        verdict = f"{label(gain_group)}, {listing(rises)}: {who} {share}{also}; {net_text}"
    return Diagnosis(**base, kind=kind, gain_group=gain_group, gain_ms=gain, eaten_ms=eaten,
                     eaten_frac=frac, verdict=verdict)
