"""Candidates for the next trial, from three sources:

  sampler    an Optuna sampler (TPE by default, GP selectable) on an IN-MEMORY study that mirrors the
             evaluated history (measured trials COMPLETE, failed ones FAIL; rebuilt from scratch
             whenever the history is not an extension of what it holds). Its own proposals are told
             FAIL so TPE ignores them: the real study only ever receives evaluated trials.
  profile    moves from the incumbent: for each parameter whose buckets take time in the incumbent's
             profile, the Amdahl estimate share x learned speed-up (prior: the space file) of each
             other value.
  neighbour  cheap variants that reuse what is built now (runtime-only switches, one or two at a
             time), one-knob moves from the incumbent and from the runners-up, and a few two-knob
             moves from the incumbent.
  scan       the model's view of the space within SCAN_RADIUS knobs of the incumbent: every untried
             configuration when the space is small (at most SCAN_ALL), else SCAN_SAMPLE random ones
             (those within the radius). The chooser keeps only the few
             with the largest expected improvement (a basin the neighbourhood cannot reach: four
             knobs away from a local optimum).

Nothing here scores or orders: autoopt.agent.choose does, with the cost model and the GP.
"""
from __future__ import annotations

import logging
import random
from dataclasses import dataclass
from typing import Any

import numpy as np

from autoopt.agent.buckets import BucketModel
from autoopt.agent.view import SpaceView

SAMPLERS = ("tpe", "gp", "random")
SCAN_ALL = 4096  # spaces up to this size are scanned whole
SCAN_SAMPLE = 1024
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
            s = optuna.samplers.TPESampler(seed=self.seed, n_startup_trials=self.n_startup, multivariate=True)
        return optuna.create_study(direction="maximize", sampler=s)

    def sync(self, trials: list[tuple[np.ndarray, float | None]]) -> None:
        """Make the study hold exactly `trials` (code, log-objective or None for a failure)."""
        import optuna

        if self._dists is None:
            self._dists = self.view.space.distributions()
        keyed = [(tuple(int(c) for c in code), y) for code, y in trials]
        if self._study is None or keyed[:len(self._mirrored)] != self._mirrored:
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
    def __init__(self, view: SpaceView, sampler: str = "tpe", seed: int = 0, n_sampler: int = 3,
                 n_pairs: int = 40) -> None:
        self.view = view
        self.rng = random.Random(seed)
        self.mirror = SamplerMirror(view, sampler, seed)
        self.sampler_name = sampler
        self.n_sampler = n_sampler
        self.n_pairs = n_pairs

    def candidates(self, trials: list[tuple[np.ndarray, float | None]], incumbent: np.ndarray,
                   incumbent_ms: dict[str, float], built: np.ndarray | None, runners_up: list[np.ndarray],
                   buckets: BucketModel, skip: set[tuple[int, ...]]) -> list[Candidate]:
        out: dict[tuple[int, ...], Candidate] = {}

        def add(code: np.ndarray, source: str, note: str = "") -> None:
            key = tuple(int(c) for c in code)
            if key in skip or key in out or not self.view.feasible(code):
                return
            out[key] = Candidate(code.copy(), source, note)

        for cand in self._profile_moves(incumbent, incumbent_ms, buckets):
            add(cand.code, cand.source, cand.note)
        if built is not None:
            for code in self._runtime_variants(built):
                add(code, "neighbour:build", "reuses the running build")
        for code in self._one_knob(incumbent):
            add(code, "neighbour", "one knob from the incumbent")
        for ref in runners_up:
            for code in self._one_knob(ref):
                add(code, "neighbour", "one knob from a runner-up")
        for code in self._two_knob(incumbent):
            add(code, "neighbour", "two knobs from the incumbent")
        if trials:
            self.mirror.sync(trials)
            for code in self.mirror.ask(self.n_sampler):
                add(code, f"sampler:{self.sampler_name}", f"{self.sampler_name.upper()} on the history")
        for code in self._scan():
            if int((code != incumbent).sum()) <= SCAN_RADIUS:
                add(code, "scan", "the model's best guess elsewhere in the space")
        return list(out.values())

    def _scan(self) -> list[np.ndarray]:
        n = self.view.n_choices
        if not len(n):
            return []
        if self.view.size() <= SCAN_ALL:
            grid = np.indices(tuple(int(k) for k in n)).reshape(len(n), -1).T
            return list(grid.astype(np.int64))
        return [np.array([self.rng.randrange(int(k)) for k in n], dtype=np.int64) for _ in range(SCAN_SAMPLE)]

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

    def _one_knob(self, ref: np.ndarray) -> list[np.ndarray]:
        out = []
        for p, n in enumerate(self.view.n_choices):
            for v in range(int(n)):
                if v != ref[p]:
                    code = ref.copy()
                    code[p] = v
                    out.append(code)
        return out

    def _runtime_variants(self, built: np.ndarray) -> list[np.ndarray]:
        rt = [p for p in range(len(self.view.params)) if self.view.runtime[p]]
        out = []
        for p in rt:
            for v in range(int(self.view.n_choices[p])):
                if v != built[p]:
                    code = built.copy()
                    code[p] = v
                    out.append(code)
                    for q in rt:
                        if q > p:
                            for w in range(int(self.view.n_choices[q])):
                                if w != built[q]:
                                    code2 = code.copy()
                                    code2[q] = w
                                    out.append(code2)
        return out

    def _two_knob(self, ref: np.ndarray) -> list[np.ndarray]:
        P = len(self.view.params)
        if P < 2:
            return []
        out = []
        for _ in range(self.n_pairs):
            p, q = self.rng.sample(range(P), 2)
            code = ref.copy()
            code[p] = self._other(p, int(ref[p]))
            code[q] = self._other(q, int(ref[q]))
            out.append(code)
        return out

    def _other(self, p: int, v: int) -> int:
        n = int(self.view.n_choices[p])
        w = self.rng.randrange(n - 1)
        return w + 1 if w >= v else w
