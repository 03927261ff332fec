"""Candidates for the next trial, from three sources:

  sampler    an Optuna sampler (TPE by default, GP selectable) on an IN-MEMORY study that mirrors the
             evaluated history (measured trials COMPLETE, failed ones FAIL; rebuilt from scratch
             whenever the history is not an extension of what it holds). Its own proposals are told
             FAIL so TPE ignores them: the real study only ever receives evaluated trials.
  profile    moves from the incumbent: for each parameter whose buckets take time in the incumbent's
             profile, the Amdahl estimate share x learned speed-up (prior: the space file) of each
             other value.
  neighbour  cheap variants that reuse what is built now (runtime-only switches, one or two at a
             time), one-knob moves from the incumbent and from the runners-up, and two-knob moves
             from the incumbent (all of them when there are at most PAIRS_ALL, else as many drawn).
  scan       the model's view of the space within SCAN_RADIUS knobs of the incumbent: every untried
             configuration when the space is small (at most SCAN_ALL), else SCAN_SAMPLE random ones
             (those within the radius). The chooser keeps only the few
             with the largest expected improvement (a basin the neighbourhood cannot reach: four
             knobs away from a local optimum).

Nothing here scores or orders: autoopt.search.agent.choose does, with the cost model and the GP.
"""
from __future__ import annotations

import logging
import random
from dataclasses import dataclass
from typing import Any

import numpy as np

from autoopt.search.agent.buckets import BucketModel
from autoopt.search.agent.view import SpaceView
from autoopt.search.agent.repair import constraint_repairs
from autoopt.search.sampler import tpe_sampler

SAMPLERS = ("tpe", "gp", "random")
SCAN_ALL = 4096  # spaces up to this size are scanned whole
SCAN_SAMPLE = 512
PAIRS_ALL = 1500  # two-knob moves of the incumbent: all of them up to this many, else this many at random
SCAN_RADIUS = 5  # knobs changed from the incumbent at most: a trust region (the GP's EI far from
                 # every measurement is mostly its prior's width, not evidence)


@dataclass
class Candidate:
    code: np.ndarray
    source: str  # "sampler:tpe" | "profile:<bucket>" | "neighbour" | "neighbour:build" | "scan"
    note: str = ""


class SamplerMirror:
    """The in-memory Optuna study the sampler source asks."""

    def __init__(self, view: SpaceView, sampler: str = "tpe", seed: int = 0, n_startup: int = 6) -> None:
        if sampler not in SAMPLERS:
            raise ValueError(f"sampler must be one of {SAMPLERS}, got {sampler!r}")
        self.view, self.sampler, self.seed, self.n_startup = view, sampler, seed, n_startup
        self._study: Any = None
        self._mirrored: list[tuple[tuple[int, ...], float | None]] = []
        self._dists: dict[str, Any] | None = None

    def _new_study(self) -> Any:
        import optuna

        optuna.logging.set_verbosity(optuna.logging.WARNING)
        logging.getLogger("optuna").setLevel(logging.WARNING)
        if self.sampler == "gp":
            s = optuna.samplers.GPSampler(seed=self.seed, n_startup_trials=self.n_startup)
        elif self.sampler == "random":
            s = optuna.samplers.RandomSampler(seed=self.seed)
        else:
            s = tpe_sampler(seed=self.seed, n_startup_trials=self.n_startup, multivariate=True)
        return optuna.create_study(direction="maximize", sampler=s)

    def sync(self, trials: list[tuple[np.ndarray, float | None]]) -> None:
        """Make the study hold exactly `trials` (code, log-objective or None for a failure)."""
        import optuna

        if self._dists is None:
            self._dists = self.view.space.distributions()
        keyed = [(tuple(int(c) for c in code), y) for code, y in trials]
        junk = len(self._study.get_trials(deepcopy=False)) - len(self._mirrored) if self._study else 0
        if self._study is None or keyed[:len(self._mirrored)] != self._mirrored or junk > max(32, len(keyed)):
            # rebuilt: from scratch, or when the asked-and-discarded candidates outnumber the trials
            self._study, self._mirrored = self._new_study(), []
        for key, y in keyed[len(self._mirrored):]:
            params = self.view.decode(np.array(key))
            if y is None:
                frozen = optuna.trial.create_trial(params=params, distributions=self._dists,
                                                   state=optuna.trial.TrialState.FAIL)
            else:
                frozen = optuna.trial.create_trial(params=params, distributions=self._dists, value=float(y))
            self._study.add_trial(frozen)
            self._mirrored.append((key, y))

    def ask(self, n: int) -> list[np.ndarray]:
        import optuna

        out = []
        for _ in range(n):
            trial = self._study.ask(self._dists)
            code = self.view.encode(dict(trial.params))
            self._study.tell(trial, state=optuna.trial.TrialState.FAIL)  # a candidate, not a trial
            if code is not None:
                out.append(code)
        return out


class Proposer:
    def __init__(self, view: SpaceView, sampler: str = "tpe", seed: int = 0, n_sampler: int = 2,
                 n_pairs: int = 40) -> None:
        self.view = view
        self.rng = random.Random(seed)
        self.np_rng = np.random.default_rng(seed)
        self.mirror = SamplerMirror(view, sampler, seed)
        self.sampler_name = sampler
        self.n_sampler = n_sampler
        self.n_pairs = n_pairs
        self._grid: np.ndarray | None = None
        self._feasible: dict[int, bool] = {}
        self._repairs: dict[tuple[int, tuple[int, ...]], list[np.ndarray]] = {}

    def candidates(self, trials: list[tuple[np.ndarray, float | None]], incumbent: np.ndarray,
                   incumbent_ms: dict[str, float], built: np.ndarray | None, runners_up: list[np.ndarray],
                   buckets: BucketModel, skip: set[tuple[int, ...]]) -> list[Candidate]:
        """Every source's candidates, first source first, without repeats, measured or infeasible
        configurations (numpy blocks: hundreds of candidates in a few milliseconds)."""
        blocks: list[tuple[np.ndarray, str, str]] = []
        for cand in self._profile_moves(incumbent, incumbent_ms, buckets):
            blocks.append((cand.code[None, :], cand.source, cand.note))
            blocks.append((self._repaired(cand.code[None, :], incumbent), cand.source,
                           cand.note + "; with what its constraints need"))
        if built is not None and self.view.runtime.any():
            blocks.append((self._runtime_variants(built), "neighbour:build", "reuses the running build"))
        one = self._one_knob(incumbent)
        blocks.append((one, "neighbour", "one knob from the incumbent"))
        blocks.append((self._repaired(one, incumbent), "neighbour",
                       "one knob from the incumbent, with the knobs its constraints read set to fit"))
        for ref in runners_up:
            blocks.append((self._one_knob(ref), "neighbour", "one knob from a runner-up"))
        blocks.append((self._two_knob(incumbent), "neighbour", "two knobs from the incumbent"))
        if trials:
            self.mirror.sync(trials)
            asked = self.mirror.ask(self.n_sampler)
            if asked:
                blocks.append((np.stack(asked), f"sampler:{self.sampler_name}",
                               f"{self.sampler_name.upper()} on the history"))
        scan = self._scan()
        scan = scan[(scan != incumbent[None, :]).sum(axis=1) <= SCAN_RADIUS]
        blocks.append((scan, "scan", "the model's best guess elsewhere in the space"))
        return self._merge(blocks, skip)

    def _merge(self, blocks: list[tuple[np.ndarray, str, str]], skip: set[tuple[int, ...]]) -> list[Candidate]:
        blocks = [b for b in blocks if len(b[0])]
        if not blocks:
            return []
        codes = np.concatenate([b[0] for b in blocks]).astype(np.int64)
        which = np.concatenate([np.full(len(b[0]), i) for i, b in enumerate(blocks)])
        idx = self.view.index(codes)
        _, first = np.unique(idx, return_index=True)
        first.sort()
        done = self.view.index(np.array(sorted(skip), dtype=np.int64)) if skip else np.zeros(0, dtype=np.int64)
        first = first[~np.isin(idx[first], done)]
        out = []
        for i in first:
            if self.view.constrained and not self._is_feasible(int(idx[i]), codes[i]):
                continue
            _, source, note = blocks[which[i]]
            out.append(Candidate(codes[i].copy(), source, note))
        return out

    def _repaired(self, codes: np.ndarray, ref: np.ndarray) -> np.ndarray:
        """The smallest feasible completions of the infeasible rows of `codes` (moves of `ref`)."""
        if not self.view.constrained or not len(codes):
            return np.zeros((0, len(ref)), dtype=np.int64)
        rows: list[np.ndarray] = []
        for code, index in zip(codes, self.view.index(codes)):
            if self._is_feasible(int(index), code):
                continue
            key = (int(index), tuple(int(x) for x in ref))
            if key not in self._repairs:
                self._repairs[key] = constraint_repairs(self.view, code, ref, self.np_rng)
            rows += self._repairs[key]
        return np.stack(rows) if rows else np.zeros((0, len(ref)), dtype=np.int64)

    def _is_feasible(self, index: int, code: np.ndarray) -> bool:
        hit = self._feasible.get(index)
        if hit is None:
            hit = self._feasible[index] = self.view.feasible(code)
        return hit

    def _scan(self) -> np.ndarray:
        n = self.view.n_choices
        if not len(n):
            return np.zeros((0, 0), dtype=np.int64)
        if self.view.size() <= SCAN_ALL:
            if self._grid is None:
                self._grid = np.indices(tuple(int(k) for k in n)).reshape(len(n), -1).T.astype(np.int64)
            return self._grid
        return self.np_rng.integers(0, n, size=(SCAN_SAMPLE, len(n)), dtype=np.int64)

    def _profile_moves(self, inc: np.ndarray, inc_ms: dict[str, float], buckets: BucketModel) -> list[Candidate]:
        if not inc_ms or not buckets.buckets:
            return []
        total = sum(inc_ms.values()) or 1.0
        moves = []
        for p, pv in enumerate(self.view.params):
            share = sum(inc_ms.get(b, 0.0) for b in pv.buckets) / total
            for v in range(len(pv.choices)):
                if v == inc[p]:
                    continue
                gain, top = buckets.amdahl(inc, inc_ms, p, v)
                if gain <= 0.002:
                    continue
                code = inc.copy()
                code[p] = v
                note = (f"{top or 'its buckets'} {100 * inc_ms.get(top, 0.0) / total:.0f}% of the step "
                        f"({pv.knob}'s buckets {100 * share:.0f}%): Amdahl {100 * gain:+.1f}%")
                moves.append((gain, Candidate(code, f"profile:{top or pv.knob}", note)))
        moves.sort(key=lambda m: -m[0])
        return [c for _, c in moves[:12]]

    def _one_knob(self, ref: np.ndarray, params: np.ndarray | None = None) -> np.ndarray:
        """Every configuration one value away from `ref` (among `params`, default all)."""
        rows = []
        for p in (range(len(ref)) if params is None else params):
            n = int(self.view.n_choices[p])
            if n < 2:
                continue
            block = np.repeat(ref[None, :], n - 1, axis=0)
            block[:, p] = [v for v in range(n) if v != ref[p]]
            rows.append(block)
        return np.concatenate(rows) if rows else np.zeros((0, len(ref)), dtype=np.int64)

    def _runtime_variants(self, built: np.ndarray) -> np.ndarray:
        """One runtime-only switch from what is built, and n_pairs random two-switch variants."""
        rt = np.nonzero(self.view.runtime & (self.view.n_choices > 1))[0]
        one = self._one_knob(built, rt)
        if len(rt) < 2:
            return one
        return np.concatenate([one, self._pairs(built, rt)])

    def _two_knob(self, ref: np.ndarray) -> np.ndarray:
        """Every configuration two values away from `ref` (an interaction one-knob moves cannot see:
        two block sizes whose product is what counts), or PAIRS_ALL of them drawn at random when
        there are more."""
        movable = np.nonzero(self.view.n_choices > 1)[0]
        if len(movable) < 2:
            return np.zeros((0, len(ref)), dtype=np.int64)
        alt = self.view.n_choices[movable] - 1
        n_all = (int(alt.sum()) ** 2 - int((alt * alt).sum())) // 2
        if n_all > PAIRS_ALL:
            return self._pairs(ref, movable, PAIRS_ALL)
        one = self._one_knob(ref, movable)  # rows grouped by the parameter they move
        moved = np.repeat(np.arange(len(movable)), alt)
        i, j = np.triu_indices(len(one), k=1)
        keep = moved[i] != moved[j]
        i, j = i[keep], j[keep]
        out = one[i].copy()
        cols = movable[moved[j]]
        out[np.arange(len(j)), cols] = one[j, cols]
        return out

    def _pairs(self, ref: np.ndarray, params: np.ndarray, n: int | None = None) -> np.ndarray:
        out = np.repeat(ref[None, :], self.n_pairs if n is None else n, axis=0)
        for row in out:
            for p in self.rng.sample(list(params), 2):
                row[p] = self._other(int(p), int(ref[p]))
        return out

    def _other(self, p: int, v: int) -> int:
        n = int(self.view.n_choices[p])
        w = self.rng.randrange(n - 1)
        return w + 1 if w >= v else w
