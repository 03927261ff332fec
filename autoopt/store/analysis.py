"""Pure reasoning over stored trials: which figure is the objective, speed-ups with their spread, and
which trial is best outside the noise. No database, no I/O.

Definitions (also in db/README.md):
  objective   "tok_per_s@C": the median tok/s at concurrency C, with its 95 % CI [lo, hi]; or
              "tok_per_s@mix" for a space whose objective weighs several concurrencies: the weighted
              geometric mean of the medians, its CI the same mean of the CI ends (space.Objective, the
              figure `autoopt run` ranks by). Below, "at C" reads "on the mix" for it.
  speedup     of trial T over baseline B at C: median T.med / B.med, conservative interval
              [T.lo / B.hi, T.hi / B.lo] (the extreme ratios of the two CIs).
  significant T.lo > B.hi at C (equivalently speedup interval entirely above 1): the two 95 %
              intervals do not overlap, so the gain is outside the noise.
  best        among successful trials other than the baselines that are significant over the
              baseline of their session (the latest measured before them: every run measures its
              own), the highest median at C when every session ran on one machine (same recorded
              fingerprint), else the highest speed-up over its session's baseline (ties: higher CI
              low end); when none is, the latest baseline itself (no gain).
"""
from __future__ import annotations

import math
import re
from collections import Counter
from dataclasses import dataclass
from typing import Any, Sequence

from autoopt import stats
from autoopt.environment import same_machine
from autoopt.errors import UserError
from autoopt.measurement import Throughput

_OBJECTIVE = re.compile(r"^(tok_per_s)(?:@(\d+|mix))?$")
OBJECTIVE_HELP = ("tok_per_s, tok_per_s@<concurrency> (e.g. tok_per_s@16) or tok_per_s@mix (the weighted "
                  "mix the run declared)")
MIX = "mix"


@dataclass(frozen=True)
class Mix:
    """A weighted geometric mean of tok/s over several concurrencies: the objective of a space that
    declares `objective: {weights: ...}`, as the run recorded it (settings["objective_mix"])."""

    weights: tuple[tuple[int, float], ...]  # (concurrency, weight), by concurrency

    @classmethod
    def of(cls, weights: dict[Any, Any]) -> "Mix":
        return cls(tuple(sorted((int(c), float(w)) for c, w in weights.items())))

    def text(self) -> str:
        """"C=1:0.2 C=16:0.3 C=64:0.5"."""
        return " ".join(f"C={c}:{w:g}" for c, w in self.weights)

    def to_json(self) -> dict[str, float]:
        return {str(c): w for c, w in self.weights}


ObjectiveKey = int | Mix  # what figure() reads: one concurrency, or the run's weighted mix


def parse_objective(name: str) -> tuple[str, int | str | None]:
    """"tok_per_s@16" -> ("tok_per_s", 16); "tok_per_s@mix" -> ("tok_per_s", "mix");
    "tok_per_s" -> ("tok_per_s", None)."""
    m = _OBJECTIVE.match(name.strip())
    if not m:
        raise UserError(f"objective {name!r} not understood: expected {OBJECTIVE_HELP}")
    c = m.group(2)
    return m.group(1), (MIX if c == MIX else int(c)) if c else None


def concurrency_of(name: str | None) -> int | None:
    """C of "tok_per_s@C"; None for anything else (never raises: used on stored names)."""
    m = _OBJECTIVE.match((name or "").strip())
    return int(m.group(2)) if m and m.group(2) and m.group(2).isdigit() else None


def objective_name(c: ObjectiveKey) -> str:
    return f"tok_per_s@{MIX if isinstance(c, Mix) else c}"


def where(c: ObjectiveKey) -> str:
    """"C=64", or "the mix C=1:0.2 C=16:0.3 C=64:0.5": what a message says the figure was read at."""
    return f"the mix {c.text()}" if isinstance(c, Mix) else f"C={c}"


def key_of(doc: dict[str, Any]) -> ObjectiveKey | None:
    """The objective a history/show/best document was read at (its "objective" and "objective_mix")."""
    if doc.get("objective_mix"):
        return Mix.of(doc["objective_mix"])
    return concurrency_of(doc.get("objective"))


def figure(trial: Any, c: ObjectiveKey) -> Throughput | None:
    """tok/s at concurrency c (or on the mix c) of a successful trial (None when failed or not
    measured there)."""
    if trial is None or trial.state != "ok" or trial.measurement is None:
        return None
    return throughput_at(trial.measurement.tok_per_s, c)


def throughput_at(tok_per_s: dict[str, Throughput], c: ObjectiveKey) -> Throughput | None:
    """One measurement's tok/s at concurrency c, or on the mix c (None where not measured): what
    `autoopt best` ranks stored trials by and the search loop ranks its outcomes by."""
    if isinstance(c, Mix):
        return _mix_figure(tok_per_s, c)
    return tok_per_s.get(str(c))


def _mix_figure(tok_per_s: dict[str, Throughput], mix: Mix) -> Throughput | None:
    """The weighted geometric mean of the median and of each CI end (space.Objective.value and .ci,
    so the store ranks trials as the run did); None unless every concurrency of the mix was measured."""
    parts = [(tok_per_s.get(str(c)), w) for c, w in mix.weights]
    if any(tp is None or min(tp.median, tp.ci_low) <= 0 for tp, _ in parts):
        return None
    mean = lambda get: math.exp(sum(w * math.log(get(tp)) for tp, w in parts))  # noqa: E731
    return Throughput(median=mean(lambda tp: tp.median), ci_low=mean(lambda tp: tp.ci_low),
                      ci_high=mean(lambda tp: tp.ci_high), n=min(tp.n for tp, _ in parts))


def _declared_mix(runs: Sequence[Any], requested: str) -> Mix:
    for run in reversed(list(runs)):
        if (run.settings or {}).get("objective_mix"):
            return Mix.of(run.settings["objective_mix"])
    raise UserError(f"--objective {requested}: no run of this study declared a weighted mix of "
                    f"concurrencies; pass tok_per_s@<concurrency>")


def measured_concurrencies(trials: Sequence[Any]) -> list[int]:
    cs = {int(c) for t in trials if t.state == "ok" and t.measurement for c in t.measurement.tok_per_s}
    return sorted(cs)


def resolve_objective(requested: str | None, trials: Sequence[Any], runs: Sequence[Any]) -> ObjectiveKey:
    """What the objective reads: --objective, else the latest run's settings ("objective", else the
    weighted mix it ranked by, "objective_mix", else "objective_concurrency" of runs recorded before
    the mix was), else the objective the trials were stored with, else the only concurrency measured.
    "tok_per_s@mix" is the latest run's mix. UserError when it stays ambiguous or no run declared a mix."""
    if requested:
        _, c = parse_objective(requested)
        if c == MIX:
            return _declared_mix(runs, requested)
        if c is not None:
            return c
    for run in reversed(list(runs)):
        s = run.settings or {}
        if s.get("objective"):
            _, c = parse_objective(str(s["objective"]))
            if isinstance(c, int):
                return c
        if s.get("objective_mix"):
            return Mix.of(s["objective_mix"])
        if s.get("objective_concurrency") is not None:
            return int(s["objective_concurrency"])
    names = Counter(t.objective_name for t in trials if t.state == "ok" and t.objective_name)
    for name, _ in names.most_common():
        c = concurrency_of(name)
        if c is not None:
            return c
    cs = measured_concurrencies(trials)
    if len(cs) == 1:
        return cs[0]
    raise UserError(f"cannot tell which concurrency is the objective (measured: "
                    f"{', '.join(map(str, cs)) or 'none'}): pass --objective {OBJECTIVE_HELP}")


def interval(tp: Throughput | None) -> dict[str, float] | None:
    if tp is None:
        return None
    return {"median": tp.median, "ci_low": tp.ci_low, "ci_high": tp.ci_high}


def speedup(t: Throughput | None, base: Throughput | None) -> dict[str, float] | None:
    """Ratio of two tok/s figures with the conservative interval [t.lo/b.hi, t.hi/b.lo]."""
    found = stats.speedup(t, base) if t is not None and base is not None else None
    return found.to_dict() if found is not None else None


def significant(t: Throughput | None, base: Throughput | None) -> bool:
    """Gain outside the noise: the trial's CI low end above the baseline's CI high end."""
    return t is not None and base is not None and t.ci_low > base.ci_high


Interval = tuple[float, float]  # a 95 % CI (low, high)


def confirmation_verdict(trial: Interval, conf: Interval, trial_base: Interval | None,
                         conf_base: Interval | None) -> tuple[bool, str] | None:
    """A re-measurement `conf` of the trial's configuration against the trial, each with the CI of its
    baseline: None when the two CIs overlap; else (refuse, why). Both still beating their baseline
    outside the noise confirm the win but not its size (refuse False: a warning); either not beating
    it leaves the win itself in doubt (refuse True: `best --export` wants --force). `why` goes right
    after a sentence saying the CIs do not overlap."""
    if not (conf[1] < trial[0] or conf[0] > trial[1]):
        return None
    beats = lambda ci, base: base is not None and ci[0] > base[1]  # noqa: E731
    if beats(trial, trial_base) and beats(conf, conf_base):
        return False, (", though both beat the baseline outside the noise: the win holds, its size is "
                       "uncertain (the machine changed or one figure was luck)")
    return True, (" and one of them does not beat the baseline outside the noise: the machine changed "
                  "or one figure was luck; measure again before trusting this win")


def speedups(trial: Any, base: Any) -> dict[int, dict[str, float]]:
    """Speed-up at every concurrency both measured."""
    out = {}
    if trial is None or base is None or trial.measurement is None or base.measurement is None:
        return out
    for c in sorted(int(k) for k in trial.measurement.tok_per_s):
        s = speedup(figure(trial, c), figure(base, c))
        if s is not None:
            out[c] = s
    return out


@dataclass(frozen=True)
class ObjectiveUnit:
    """What the objective measures, as the target that measured it said (the trials' recorded
    environment): the built-in and server targets measure tok/s (higher is better); a replayed table
    names its own column, unit and direction. The stored figure is always a rate, higher is better:
    a minimised column (a Kernel Tuner `time` in ms) is stored as its reciprocal, so speed-ups and
    significance read the same for both, and `value` turns a stored interval back into the column's."""

    quantity: str  # "tok_per_s", or the replay table's objective column ("time")
    unit: str | None  # "tok/s", "ms", ...; None when the table did not say
    direction: str  # "maximize" | "minimize"

    @property
    def reciprocal(self) -> bool:
        return self.direction == "minimize"

    def value(self, iv: dict[str, float] | None) -> dict[str, float] | None:
        """A stored interval (median, ci_low, ci_high) in the objective's own unit."""
        if iv is None or not self.reciprocal:
            return iv
        inv = lambda x: 1.0 / x if x else float("inf")  # noqa: E731
        return {"median": inv(iv["median"]), "ci_low": inv(iv["ci_high"]), "ci_high": inv(iv["ci_low"])}

    def describe(self) -> str:
        """e.g. "tok/s, higher is better" or "time in ms, lower is better"."""
        better = "lower is better" if self.reciprocal else "higher is better"
        if self.quantity == "tok_per_s":
            return f"tok/s, {better}"
        return f"{self.quantity} {f'in {self.unit}' if self.unit else '(unit not recorded)'}, {better}"

    def to_json(self) -> dict[str, Any]:
        return {"quantity": self.quantity, "unit": self.unit, "direction": self.direction,
                "stored_as": f"1/{self.quantity}" if self.reciprocal else self.quantity,
                "text": self.describe()}


TOK_PER_S = ObjectiveUnit("tok_per_s", "tok/s", "maximize")


def objective_unit(trials: Sequence[Any]) -> ObjectiveUnit:
    """The study's objective as its target recorded it in each measurement's environment (a replay
    table: objective column, unit, direction); tok/s for every other target."""
    for t in trials:
        env = t.measurement.environment if t.measurement is not None else {}
        if env.get("target") == "replay" and env.get("objective"):
            direction = "minimize" if env.get("direction") == "minimize" else "maximize"
            return ObjectiveUnit(str(env["objective"]), env.get("unit"), direction)
    return TOK_PER_S


@dataclass
class BestChoice:
    trial: Any  # TrialRecord: the best trial (the baseline when nothing beats it)
    baseline: Any  # TrialRecord | None
    concurrency: ObjectiveKey
    significant: bool  # the chosen trial beats the baseline outside the noise
    candidates: int  # successful trials considered (baseline excluded)
    significant_count: int


def best_outside_noise(cands: Sequence[tuple[Any, Throughput, int]], base_fig: Throughput) -> tuple[Any, int]:
    """The rule's pick among (item, figure at C, trial number) candidates (the baseline left out):
    the highest median among those significant over `base_fig` (ties: higher CI low end, then lower
    number), and how many were significant. (None, 0) when none is. Shared by `autoopt best` (stored
    trials) and the search loop (what `autoopt run` calls the best), so the two always agree."""
    sig = [(item, fig, n) for item, fig, n in cands if significant(fig, base_fig)]
    if not sig:
        return None, 0
    best = max(sig, key=lambda x: (x[1].median, x[1].ci_low, -x[2]))
    return best[0], len(sig)


def session_baselines(trials: Sequence[Any]) -> list[Any]:
    """The study's successful baselines in number order (every run measures its own)."""
    return [t for t in trials if t.is_baseline and t.state == "ok"]


def baseline_before(trial: Any, baselines: Sequence[Any]) -> Any:
    """The baseline a trial is compared with: the latest successful baseline measured before it (every
    run measures its own; runs at the same time share one), else the first one there is."""
    earlier = [b for b in baselines if b.number <= trial.number]
    return earlier[-1] if earlier else (baselines[0] if baselines else None)


def select_best(trials: Sequence[Any], baselines: Sequence[Any] | Any, c: ObjectiveKey) -> BestChoice:
    """The best trial at concurrency c by the rule in this module's docstring, each trial against
    the baseline of its session (baseline_before); the highest median on one machine, else the
    highest speed-up over the session's baseline."""
    if not isinstance(baselines, (list, tuple)):  # one baseline record (or None)
        baselines = [baselines] if baselines is not None else []
    baselines = [b for b in baselines if figure(b, c) is not None]
    if not baselines:
        raise UserError(f"the study has no successful baseline measured at {where(c)}: a gain cannot be "
                        f"told from noise without one (export a trial explicitly with --trial N)")
    ids = {b.trial_id for b in baselines}
    cands = [t for t in trials if t.trial_id not in ids and figure(t, c) is not None]
    sig = [t for t in cands if significant(figure(t, c), figure(baseline_before(t, baselines), c))]
    if not sig:
        return BestChoice(baselines[-1], baselines[-1], c, False, len(cands), 0)
    if one_machine([*baselines, *sig]):  # tok/s compare directly; a baseline's drift is no gain
        rank = lambda t: figure(t, c).median  # noqa: E731
    else:
        rank = lambda t: figure(t, c).median / figure(baseline_before(t, baselines), c).median  # noqa: E731
    best = max(sig, key=lambda t: (rank(t), figure(t, c).ci_low, -t.number))
    return BestChoice(best, baseline_before(best, baselines), c, True, len(cands), len(sig))


def one_machine(trials: Sequence[Any]) -> bool:
    """Whether the trials were measured on one machine (autoopt.environment.same_machine on their
    recorded fingerprints). Across sessions of one machine the slow baseline is the noisiest yardstick
    there is: on the live H200 a resumed run's baseline read 870 tok/s at C=64 against the first
    run's 664 (+31 %), and a ratio to it ranked the first run's 14,025 tok/s above the resume's 14,444."""
    envs = [t.measurement.environment for t in trials if t.measurement is not None]
    return all(same_machine(envs[0], e)[0] for e in envs[1:])


def guard_margins(correctness: dict[str, Any]) -> dict[str, float]:
    """How much of each allowance a guard verdict used: error / tolerance, and for token agreement
    the share of the allowed disagreement (1 - agreement) / (1 - minimum)."""
    tol = correctness.get("tolerance") if isinstance(correctness.get("tolerance"), dict) else {}
    out = {}
    err, err_tol = correctness.get("logits_rel_err"), tol.get("logits_rel_err")
    if isinstance(err, (int, float)) and isinstance(err_tol, (int, float)) and err_tol > 0:
        out["logits_rel_err"] = err / err_tol
    agree, agree_min = correctness.get("token_agreement"), tol.get("token_agreement")
    if isinstance(agree, (int, float)) and isinstance(agree_min, (int, float)) and agree_min < 1:
        out["token_agreement"] = (1 - agree) / (1 - agree_min)
    return out


def knob_diff(a: dict[str, Any], b: dict[str, Any]) -> list[dict[str, Any]]:
    """Keys whose values differ (missing = None), in a stable order."""
    keys = list(dict.fromkeys([*a, *b]))
    return [{"name": k, "a": a.get(k), "b": b.get(k)} for k in keys if a.get(k) != b.get(k)]


def bucket_diff(a: dict[str, float], b: dict[str, float]) -> list[dict[str, Any]]:
    """Bucket-by-bucket delta (ms per decode step, and % of a), largest |delta| first."""
    rows = []
    for k in dict.fromkeys([*a, *b]):
        am, bm = a.get(k, 0.0), b.get(k, 0.0)
        rows.append({"bucket": k, "a_ms": am, "b_ms": bm, "delta_ms": bm - am,
                     "delta_pct": (bm - am) / am * 100.0 if am else None})
    return sorted(rows, key=lambda r: -abs(r["delta_ms"]))


def environment_differences(measured: dict[str, Any], current: dict[str, Any]) -> list[str]:
    """'key: measured -> current' for every top-level key that differs."""
    out = []
    for k in sorted(set(measured) | set(current)):
        if measured.get(k) != current.get(k):
            out.append(f"{k}: {measured.get(k)!r} -> {current.get(k)!r}")
    return out
