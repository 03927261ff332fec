"""Chrome traces (torch.profiler, production servers) -> time per profile bucket.

What is counted, and why:
- GPU traces (any event of cat "kernel", "gpu_memcpy" or "gpu_memset"): those device activities,
  each bucketed by name (autoopt.profile_rules). CPU ops in the same trace are ignored: the device
  time is what the decode step waits for.
- CPU-only traces: the "cpu_op" events, each counted by its *self* time (its duration minus its
  direct children's). Ops nest (aten::linear > aten::matmul > aten::mm; aten::to > aten::_to_copy >
  aten::copy_), so summing durations would count the same microseconds several times. Self time is
  additive by construction and puts the work where a GPU trace puts it: in the leaf that does it
  (the cast lands in aten::copy_ -> copy_cast, an eager RMSNorm in its pow/mean/mul ops).
- CPU-only traces with code sections (record_function scopes named `dsv4::<section>`, which the
  dsv4 decode step opens: dsv4.sections): the eager step spends much of its wall time in Python and
  the dispatcher *between* ops, which no op's self time covers. Each section's own host time (its
  duration minus the ops and sub-sections directly inside it, so the innermost section wins) is
  counted in the bucket profile_rules.SECTION_RULES gives it (attention, moe, the mHC glue in
  elementwise, ...). Ops keep their own buckets; the profile keeps the split (host_ms,
  host_buckets_ms, host_sections_ms) and says so in its notes: it is host time of the code, measured
  under the profiler (whose own per-op overhead it includes), not kernel time. GPU traces ignore
  sections entirely.
- ProfilerStep#N annotations (torch.profiler's `prof.step()`) make every figure a per-step
  average; a GPU kernel belongs to the step in which the CPU *launched* it (its cuda_runtime
  launch event, matched by correlation id), since the GPU runs behind the CPU. Activity outside
  every step is left out, and the profile's notes say how much.
- coverage = time in named buckets (not "other") / wall span, where the wall span is the summed
  step durations (or the trace's first-to-last counted event). On a GPU it uses the union of kernel
  intervals, so overlapping streams are not counted twice. A low coverage means the buckets do not
  explain the step (launch gaps, host overhead).

The CLI imports this module; torch is imported only inside `capture`.
"""
from __future__ import annotations

import bisect
import gzip
import json
import re
import tempfile
import warnings
import zlib
from collections import defaultdict
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable

from autoopt import profile_rules as rules
from autoopt.errors import UserError

GPU_CATS = ("kernel", "gpu_memcpy", "gpu_memset")
LAUNCH_CATS = ("cuda_runtime", "cuda_driver")
_STEP_NAME = re.compile(r"^ProfilerStep#\d+$")


@dataclass
class BucketProfile:
    """Time per bucket for one trace. With per_step, every ms figure and count is per step."""

    buckets_ms: dict[str, float]  # every bucket of rules.BUCKETS, 0.0 when absent
    kernel_count: int  # GPU activities (or CPU ops) counted
    total_ms: float  # sum of buckets_ms, "other" included
    covered_ms: float  # sum of the named buckets (all but "other")
    coverage: float  # 0..1: named-bucket time / wall span
    steps: int  # ProfilerStep spans found (0: none, figures are trace totals)
    per_step: bool
    top_kernels: list[tuple[str, str, float, float]]  # (name, bucket, ms, count), ms descending
    wall_ms: float = 0.0  # the span coverage is measured against
    source: str = ""  # "gpu" (device activities) or "cpu" (CPU ops, self time)
    path: str | None = None
    notes: list[str] = field(default_factory=list)  # what was left out or assumed
    # CPU traces with dsv4:: code sections: the part of total_ms that is section host time (Python /
    # dispatcher time between ops), by bucket and by section; the rest (total_ms - host_ms) is the
    # ops' self time. 0 / empty for GPU traces and for traces without sections.
    host_ms: float = 0.0
    host_buckets_ms: dict[str, float] = field(default_factory=dict)
    host_sections_ms: dict[str, float] = field(default_factory=dict)

    def measurement_fields(self) -> dict[str, Any]:
        """The fields of autoopt.results.Measurement this profile fills (per-step ms there)."""
        return {"buckets_ms": dict(self.buckets_ms), "bucket_coverage": self.coverage,
                "kernel_count": self.kernel_count}

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["top_kernels"] = [{"name": n, "bucket": b, "ms": ms, "count": c}
                            for n, b, ms, c in self.top_kernels]
        return d


def load_events(path: str | Path) -> list[dict[str, Any]]:
    """The event list of a Chrome trace (.json, or gzip whatever the suffix); UserError naming the
    file when it is missing, unreadable, not JSON or not a trace."""
    p = Path(path)
    expected = "expected a Chrome trace (.json or .json.gz) from torch.profiler"
    if not p.exists():
        raise UserError(f"{p}: no such file; {expected}")
    if p.is_dir():
        raise UserError(f"{p}: is a directory; {expected}")
    try:
        raw = p.read_bytes()
        if raw[:2] == b"\x1f\x8b":  # gzip magic: trust the bytes, not the suffix
            raw = gzip.decompress(raw)
        doc = json.loads(raw)
    except (OSError, EOFError, zlib.error) as exc:
        raise UserError(f"{p}: cannot read ({exc}); {expected}") from None
    except UnicodeDecodeError:
        raise UserError(f"{p}: not UTF-8 JSON text; {expected}") from None
    except json.JSONDecodeError as exc:
        raise UserError(f"{p}: not valid JSON (line {exc.lineno}, column {exc.colno}); {expected}") \
            from None
    events = doc.get("traceEvents") if isinstance(doc, dict) else doc
    if not isinstance(events, list):
        raise UserError(f"{p}: not a Chrome trace: expected a JSON object with a 'traceEvents' list")
    return [e for e in events if isinstance(e, dict)]


def profile_trace(path: str | Path, top: int = 20) -> BucketProfile:
    """Bucket a Chrome trace file (see the module docstring for what is counted)."""
    prof = profile_events(load_events(path), top=top, label=str(path))
    prof.path = str(path)
    return prof


def _complete(e: dict[str, Any]) -> bool:
    return e.get("ph") == "X" and isinstance(e.get("ts"), (int, float)) \
        and isinstance(e.get("dur"), (int, float))


def _cat(e: dict[str, Any]) -> str:
    return str(e.get("cat", "")).lower()


def profile_events(events: list[dict[str, Any]], top: int = 20, label: str = "trace") -> BucketProfile:
    """Bucket already-loaded trace events; `label` names the source in errors and notes."""
    kernels = [e for e in events if _complete(e) and _cat(e) in GPU_CATS]
    host_items: list[Item] = []  # CPU code sections' host time (none on a GPU trace)
    if kernels:
        items, notes = _gpu_items(events, kernels), []
        source = "gpu"
    else:
        ops = [e for e in events if _complete(e) and _cat(e) == "cpu_op"]
        if not ops:
            raise UserError(f"{label}: a trace with no GPU kernels (cat kernel/gpu_memcpy/gpu_memset) "
                            "and no CPU ops (cat cpu_op): nothing to bucket")
        sections = [e for e in events if _complete(e) and _cat(e) == "user_annotation"
                    and rules.is_section(str(e.get("name", "")))]
        items, host_items, notes = _cpu_items(ops, sections)
        source = "cpu"

    # Step spans, deduplicated by name (newer Kineto mirrors them as gpu_user_annotation too).
    spans: dict[str, tuple[float, float]] = {}
    for e in events:
        if _complete(e) and _STEP_NAME.match(str(e.get("name", ""))) and not _cat(e).startswith("gpu"):
            spans.setdefault(e["name"], (float(e["ts"]), float(e["ts"]) + float(e["dur"])))
    steps = sorted(spans.values())
    if steps:
        starts = [s for s, _ in steps]

        def in_step(anchor: float) -> bool:
            i = bisect.bisect_right(starts, anchor) - 1
            return i >= 0 and anchor <= steps[i][1]

        kept = [it for it in items if in_step(it[4])]
        if len(kept) < len(items):
            notes.append(f"{len(items) - len(kept)} of {len(items)} {source} events fall outside the "
                         f"{len(steps)} ProfilerStep spans and are not counted")
        items = kept
        host_items = [it for it in host_items if in_step(it[4])]
        wall_us = sum(end - start for start, end in steps)
    else:
        wall_us = (max(it[2] + it[3] for it in items) - min(it[2] for it in items)) if items else 0.0

    buckets_us = {b: 0.0 for b in rules.BUCKETS}
    host_buckets_us: dict[str, float] = {}
    host_sections_us: dict[str, float] = {}
    # by (name, bucket): one name can land in two buckets (aten::mm in fp32 and in bf16)
    per_kernel: dict[tuple[str, str], list[float]] = {}
    for name, bucket, _start, dur, _anchor in items + host_items:
        buckets_us[bucket] += dur
        agg = per_kernel.setdefault((name, bucket), [0.0, 0])
        agg[0] += dur
        agg[1] += 1
    for name, bucket, _start, dur, _anchor in host_items:
        host_buckets_us[bucket] = host_buckets_us.get(bucket, 0.0) + dur
        host_sections_us[name] = host_sections_us.get(name, 0.0) + dur
    covered_us = sum(v for b, v in buckets_us.items() if b != "other")
    if source == "gpu":  # GPU: union of named-bucket kernel intervals (streams overlap)
        named = [(it[2], it[2] + it[3]) for it in items if it[1] != "other"]
        busy_us = _union_length(named)
    else:  # CPU self times on one thread are disjoint; threads are summed (clamped below)
        busy_us = covered_us
    coverage = min(1.0, busy_us / wall_us) if wall_us > 0 else 0.0

    n = max(len(steps), 1)
    host_us = sum(host_buckets_us.values())
    if host_items:
        unit = "ms/step" if steps else "ms"
        split = ", ".join(f"{b} {us / 1e3 / n:.2f}" for b, us in
                          sorted(host_buckets_us.items(), key=lambda kv: -kv[1]))
        notes.append(f"host time of dsv4:: code sections (Python/dispatcher time between their ops, "
                     f"profiler overhead included; not kernel time) is counted in their buckets: "
                     f"{host_us / 1e3 / n:.2f} {unit} ({split}); the ops' own self time is "
                     f"{(sum(buckets_us.values()) - host_us) / 1e3 / n:.2f} {unit}")
    ranked = sorted(per_kernel.items(), key=lambda kv: -kv[1][0])[:max(top, 0)]
    return BucketProfile(
        buckets_ms={b: v / 1e3 / n for b, v in buckets_us.items()},
        kernel_count=round(len(items) / n),
        total_ms=sum(buckets_us.values()) / 1e3 / n,
        covered_ms=covered_us / 1e3 / n,
        coverage=coverage,
        steps=len(steps),
        per_step=bool(steps),
        top_kernels=[(name, b, us / 1e3 / n, count / n) for (name, b), (us, count) in ranked],
        wall_ms=wall_us / 1e3 / n,
        source=source,
        notes=notes,
        host_ms=host_us / 1e3 / n,
        host_buckets_ms={b: us / 1e3 / n for b, us in host_buckets_us.items()},
        host_sections_ms={name: us / 1e3 / n for name, us in
                          sorted(host_sections_us.items(), key=lambda kv: -kv[1])},
    )


# An item is (name, bucket, start_us, counted_us, anchor_us): the anchor places it in a step.
Item = tuple[str, str, float, float, float]


def _gpu_items(events: list[dict[str, Any]], kernels: list[dict[str, Any]]) -> list[Item]:
    launch_ts: dict[Any, float] = {}
    for e in events:
        corr = (e.get("args") or {}).get("correlation")
        if corr is not None and _cat(e) in LAUNCH_CATS and isinstance(e.get("ts"), (int, float)):
            launch_ts[corr] = float(e["ts"])
    kernels = sorted(kernels, key=lambda e: float(e["ts"]))
    # cuBLAS helpers take the bucket of their GEMM: a split-K reduce, or a memset that zeroes the
    # GEMM's output (seen with fp32 split-K on an H200), launched by the same op (same External id)
    # as a GEMM kernel; a split-K reduce with no such op takes the last GEMM on its stream.
    gemm_of_op: dict[Any, str] = {}
    for e in kernels:
        rule = rules.match(str(e.get("name", "")))
        ext = (e.get("args") or {}).get("External id")
        if rule is not None and rules.is_gemm_bucket(rule.bucket) and ext is not None:
            gemm_of_op.setdefault(ext, rule.bucket)
    last_gemm: dict[Any, str] = {}
    items: list[Item] = []
    for e in kernels:
        name, args = str(e.get("name", "")), (e.get("args") or {})
        stream = (e.get("pid"), e.get("tid"))
        rule = rules.match(name)
        hint = None
        if rule is not None and rule.bucket == rules.OF_GEMM:
            hint = gemm_of_op.get(args.get("External id")) or last_gemm.get(stream)
        if _cat(e) == "gpu_memset":
            bucket = gemm_of_op.get(args.get("External id")) or rules.classify(name)
        else:
            bucket = rules.classify(name, gemm_of_launch=hint)
        if rules.is_gemm_bucket(bucket) and hint is None:
            last_gemm[stream] = bucket
        ts, dur = float(e["ts"]), float(e["dur"])
        items.append((name, bucket, ts, dur, launch_ts.get(args.get("correlation"), ts)))
    return items


def _cpu_items(ops: list[dict[str, Any]],
               sections: list[dict[str, Any]] = ()) -> tuple[list[Item], list[Item], list[str]]:
    """-> (one item per op, by self time; one item per code section, by host time; notes).

    Ops and sections of a thread form one tree (ordered by start, the longer first, a section before
    an op that starts and ends with it): each node's self time is its duration minus its direct
    children's, so every microsecond is counted once, in the innermost op or section around it."""
    by_thread: dict[Any, list[tuple[dict[str, Any], bool]]] = defaultdict(list)
    for e in ops:
        by_thread[(e.get("pid"), e.get("tid"))].append((e, False))
    for e in sections:
        by_thread[(e.get("pid"), e.get("tid"))].append((e, True))
    items: list[Item] = []
    host_items: list[Item] = []
    untyped_gemms = 0
    unknown_sections: set[str] = set()
    for nodes in by_thread.values():
        nodes.sort(key=lambda n: (float(n[0]["ts"]), -float(n[0]["dur"]), not n[1]))
        ends = [float(e["ts"]) + float(e["dur"]) for e, _ in nodes]
        child_us = [0.0] * len(nodes)
        stack: list[int] = []  # indices of the nodes enclosing the current one
        for i, (e, _is_section) in enumerate(nodes):
            ts, end = float(e["ts"]), ends[i]
            while stack and ends[stack[-1]] <= ts:
                stack.pop()
            if stack:  # direct child: clip to the parent's end (timestamps can be off by a ns)
                child_us[stack[-1]] += min(end, ends[stack[-1]]) - ts
            stack.append(i)
        for (e, is_section), children in zip(nodes, child_us):
            name = str(e.get("name", ""))
            self_us = max(float(e["dur"]) - children, 0.0)
            if is_section:
                bucket = rules.section_bucket(name)
                if bucket is None:
                    unknown_sections.add(name)
                    bucket = "other"
                host_items.append((name, bucket, float(e["ts"]), self_us, float(e["ts"])))
                continue
            types = (e.get("args") or {}).get("Input type")
            rule = rules.match(name, "cpu_op")
            if rule is not None and rule.bucket == rules.BY_DTYPE \
                    and rules.gemm_bucket_for_types(types) is None:
                untyped_gemms += 1
            bucket = rules.classify(name, "cpu_op", input_types=types)
            items.append((name, bucket, float(e["ts"]), self_us, float(e["ts"])))
    notes = []
    if untyped_gemms:
        notes.append(f"{untyped_gemms} CPU GEMM ops carry no 'Input type' (profile with "
                     "record_shapes=True): counted as gemm_simt")
    if unknown_sections:
        notes.append(f"code sections with no rule in profile_rules.SECTION_RULES: their host time is "
                     f"counted as other: {', '.join(sorted(unknown_sections))}")
    return items, host_items, notes


def _union_length(intervals: list[tuple[float, float]]) -> float:
    total, cur_start, cur_end = 0.0, None, None
    for start, end in sorted(intervals):
        if cur_end is None or start > cur_end:
            if cur_end is not None:
                total += cur_end - cur_start
            cur_start, cur_end = start, end
        else:
            cur_end = max(cur_end, end)
    if cur_end is not None:
        total += cur_end - cur_start
    return total


def short_name(name: str, width: int = 90) -> str:
    """A kernel name a person can read in a table: no `void`, no at::native:: / anonymous-namespace
    prefixes, no parameter list; the template arguments stay (the functor says what an ATen
    elementwise kernel does), cut to `width` characters."""
    s = name.removeprefix("void ")
    for noise in ("at::native::", "(anonymous namespace)::", "at::cuda::detail::", "std::"):
        s = s.replace(noise, "")
    depth = 0
    for i, ch in enumerate(s):  # drop the top-level "(params)" that follows the template args
        if ch == "<":
            depth += 1
        elif ch == ">":
            depth -= 1
        elif ch == "(" and depth == 0 and i > 0:
            s = s[:i]
            break
    return s if len(s) <= width else s[:width - 1] + "…"


def capture(step_fn: Callable[[], Any], steps: int, device: str = "cpu",
            trace_path: str | Path | None = None, warmup: int = 1, top: int = 20) -> BucketProfile:
    """Profile `steps` calls of `step_fn` (after `warmup` untimed ones) with torch.profiler and
    bucket them: per-step figures. CPU activity on "cpu", CUDA activity too on "cuda[:N]" (each
    step ends with a synchronize so its GPU work lies inside its step). record_shapes=True so CPU
    GEMMs are bucketed by dtype. `trace_path` (.json or .json.gz) keeps the raw trace."""
    if steps < 1 or warmup < 0:
        raise ValueError(f"capture needs steps >= 1 and warmup >= 0, got steps={steps} warmup={warmup}")
    import torch  # here, not at module level: the CLI must not pay for torch
    from torch.profiler import ProfilerActivity, profile, schedule

    on_gpu = device.startswith("cuda")
    if on_gpu and not torch.cuda.is_available():
        raise UserError(f"profile capture on device {device!r}: torch.cuda is not available here")
    if not on_gpu and device != "cpu":
        raise UserError(f"profile capture: device must be 'cpu' or 'cuda[:N]', got {device!r}")
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if on_gpu else [])
    with tempfile.TemporaryDirectory(prefix="autoopt-trace-") as tmp:
        out = Path(trace_path) if trace_path is not None else Path(tmp) / "trace.json.gz"
        out.parent.mkdir(parents=True, exist_ok=True)
        plan = schedule(wait=0, warmup=warmup, active=steps, repeat=1)
        with warnings.catch_warnings():
            # one cycle only, so torch's "Profiler clears events at the end of each cycle" is noise
            warnings.filterwarnings("ignore", message=".*clears events at the end of each cycle")
            with profile(activities=activities, record_shapes=True, schedule=plan) as prof:
                for _ in range(warmup + steps):
                    step_fn()
                    if on_gpu:
                        torch.cuda.synchronize(device)
                    prof.step()
        prof.export_chrome_trace(str(out))
        result = profile_trace(out, top=top)
    result.path = str(trace_path) if trace_path is not None else None
    return result
