"""Which events of a Chrome trace the profile counts, gathered in one pass (autoopt.profile.trace
buckets them): GPU activities, CPU ops, dsv4:: code sections, launch times by correlation id and
ProfilerStep spans. Counted events are kept slimmed to the fields the buckets read, so a streamed
1M-event trace holds a few hundred MB, not the parsed document.
"""
from __future__ import annotations

import contextlib
import gc
import re
from dataclasses import dataclass, field
from typing import Any, Iterable

from autoopt.profile import rules

GPU_CATS = ("kernel", "gpu_memcpy", "gpu_memset")
LAUNCH_CATS = ("cuda_runtime", "cuda_driver")
_STEP_NAME = re.compile(r"^ProfilerStep#\d+$")


@contextlib.contextmanager
def gc_paused():
    """A trace is millions of small dicts that form no reference cycles; the cyclic collector,
    triggered every few hundred allocations, would walk the growing heap again and again (a 1M-event
    trace: 7.4 s of CPU in json.loads with it, 3.3 s without). Reference counting still frees it."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def _complete(e: dict[str, Any]) -> bool:
    return e.get("ph") == "X" and isinstance(e.get("ts"), (int, float)) \
        and isinstance(e.get("dur"), (int, float))


def _cat(e: dict[str, Any]) -> str:
    return str(e.get("cat", "")).lower()


@dataclass
class Parts:
    """One pass over a trace's events: what each later stage needs, nothing more."""
    kernels: list[dict[str, Any]] = field(default_factory=list)  # GPU activities
    ops: list[dict[str, Any]] = field(default_factory=list)  # cpu_op events
    sections: list[dict[str, Any]] = field(default_factory=list)  # dsv4:: code sections
    launch_ts: dict[Any, float] = field(default_factory=dict)  # correlation id -> launch time
    # ProfilerStep spans by name (newer Kineto mirrors them as gpu_user_annotation: skipped)
    steps: dict[str, tuple[float, float]] = field(default_factory=dict)


KEPT_ARGS = ("correlation", "External id", "Input type")  # the only args the buckets read


def _slim(e: dict[str, Any], cat: str, name: str) -> dict[str, Any]:
    """What a counted event keeps: a streamed 1M-event trace holds these, not the parsed events
    (shapes, strides, flow ids: most of a torch.profiler event)."""
    args = e.get("args")
    kept = {k: args[k] for k in KEPT_ARGS if k in args} if isinstance(args, dict) else {}
    return {"name": name, "cat": cat, "ts": e["ts"], "dur": e["dur"], "pid": e.get("pid"),
            "tid": e.get("tid"), "args": kept}


def partition(events: Iterable[dict[str, Any]]) -> Parts:
    parts = Parts()
    names: dict[str, str] = {}  # one string object per distinct name
    cats: dict[Any, str] = {}  # the category as written -> lower case
    for e in events:
        raw_cat = e.get("cat", "")
        cat = cats.get(raw_cat) if isinstance(raw_cat, str) else None
        if cat is None:
            cat = cats.setdefault(raw_cat, str(raw_cat).lower()) if isinstance(raw_cat, str) \
                else str(raw_cat).lower()
        if cat in LAUNCH_CATS and isinstance(e.get("ts"), (int, float)):
            corr = (e.get("args") or {}).get("correlation")
            if corr is not None:
                parts.launch_ts[corr] = float(e["ts"])
        if e.get("ph") != "X" or not _complete(e):
            continue
        name = str(e.get("name", ""))
        name = names.setdefault(name, name)
        if name.startswith("ProfilerStep#") and _STEP_NAME.match(name) and not cat.startswith("gpu"):
            parts.steps.setdefault(name, (float(e["ts"]), float(e["ts"]) + float(e["dur"])))
        if cat in GPU_CATS:
            parts.kernels.append(_slim(e, cat, name))
            parts.ops.clear()  # a GPU trace counts its kernels only: its CPU ops are not kept
        elif cat == "cpu_op" and not parts.kernels:
            parts.ops.append(_slim(e, cat, name))
        elif cat == "user_annotation" and rules.is_section(name):
            parts.sections.append(_slim(e, cat, name))
    return parts
