"""Sorting and filtering the trials table (summary rows of the history document).

A filter is words separated by spaces, all of which must hold:

    state=ok            the trial's state (ok, failed, wrong, interrupted, running)
    source=profile      the decision's source starts with this (profile matches profile:attention)
    glue=triton         a knob (a param of the space) has this value
    failed              only failed, wrong and interrupted trials (as `autoopt history --failed`)

A word for a knob no trial has, or one that is not KEY=VALUE, is an error with the known names.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

from autoopt.store.reports import NOT_OK

SORTS = ("number", "objective", "speedup", "cost", "state", "source")


def _objective(row: dict[str, Any]) -> float | None:
    return row["objective"]["median"] if row["objective"] else None


def _speedup(row: dict[str, Any]) -> float | None:
    return row["speedup"]["median"] if row["speedup"] else None


_KEYS: dict[str, Callable[[dict[str, Any]], Any]] = {
    "number": lambda r: r["number"], "objective": _objective, "speedup": _speedup,
    "cost": lambda r: r["cost_s"], "state": lambda r: r["state"], "source": lambda r: r["source"] or "",
}
# the natural direction of each column: figures best first, labels and numbers ascending
_DESCENDING = {"objective", "speedup"}


def sort_rows(rows: list[dict[str, Any]], key: str, reverse: bool = False) -> list[dict[str, Any]]:
    """Rows sorted by `key` (one of SORTS); rows without a value (failed trials' figures) go last."""
    get = _KEYS[key]
    have = [r for r in rows if get(r) is not None]
    lack = [r for r in rows if get(r) is None]
    have.sort(key=lambda r: (get(r), -r["number"] if key in _DESCENDING else r["number"]),
              reverse=(key in _DESCENDING) != reverse)
    return have + sorted(lack, key=lambda r: r["number"])


@dataclass(frozen=True)
class TrialFilter:
    states: frozenset[str] = frozenset()
    source: str | None = None
    knobs: dict[str, str] = field(default_factory=dict)
    not_ok_only: bool = False

    def matches(self, row: dict[str, Any]) -> bool:
        if self.not_ok_only and row["state"] not in NOT_OK:
            return False
        if self.states and row["state"] not in self.states:
            return False
        if self.source is not None and not (row["source"] or "").startswith(self.source):
            return False
        params = row["params"] or {}
        return all(k in params and str(params[k]) == v for k, v in self.knobs.items())

    def toggled_failed(self) -> "TrialFilter":
        return TrialFilter(self.states, self.source, dict(self.knobs), not self.not_ok_only)

    def text(self) -> str:
        """The filter as it would be typed (empty: no filter)."""
        words = [f"state={s}" for s in sorted(self.states)]
        words += [f"source={self.source}"] if self.source is not None else []
        words += [f"{k}={v}" for k, v in self.knobs.items()]
        return " ".join(words + (["failed"] if self.not_ok_only else []))


def parse_filter(text: str, knobs: dict[str, list[Any]]) -> TrialFilter:
    """TrialFilter from typed words; ValueError with a one-line reason for a word it cannot use."""
    states: set[str] = set()
    source, wanted, failed = None, {}, False
    for word in text.split():
        if word == "failed":
            failed = True
            continue
        key, eq, value = word.partition("=")
        if not eq or not key or not value:
            raise ValueError(f"{word!r}: expected KEY=VALUE (state=, source=, or a knob) or 'failed'")
        if key == "state":
            states.add(value)
        elif key == "source":
            source = value
        elif key in knobs:
            wanted[key] = value
        else:
            names = ", ".join(sorted(knobs)[:12]) or "none"
            raise ValueError(f"{key!r} is not state, source or a knob of this study (knobs: {names})")
    return TrialFilter(frozenset(states), source, wanted, failed)
