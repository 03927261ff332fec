"""Chrome traces (torch.profiler, production servers) -> time per profile bucket.

What is counted, and why:
- GPU traces (any event of cat "kernel", "gpu_memcpy" or "gpu_memset"): those device activities,
  each bucketed by name (autoopt.profile.rules). CPU ops in the same trace are ignored: the device
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
- Beside the buckets, per step: the device's busy time, the host time (step wall - device busy) and
  the launches (autoopt.profile.host says how each is counted). `measurement_fields` adds the host
  time no bucket holds as bucket "host" (autoopt.measurement.HOST_BUCKET), so the buckets add up to
  the step's wall and a knob that cuts host time has a bucket to act on.

The CLI imports this module; torch is imported only inside `capture`.
"""
from __future__ import annotations

import bisect
import tempfile
import warnings
from collections import defaultdict
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable

from autoopt.measurement import HOST_BUCKET
from autoopt.profile import chrome, rules
from autoopt.profile.events import Parts, gc_paused, partition
from autoopt.profile.host import WALL_FROM_SPAN, WALL_FROM_STEPS, StepSplit, host_ms, step_split, union_length
from autoopt.profile.chrome import load_events  # noqa: F401 (the public reader, re-exported)
from autoopt.errors import UserError



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
    # The step's wall split (autoopt.profile.host): device busy time, host time = step wall - device
    # busy (>= 0; on a CPU trace this includes host_ms above), launches and kernels per bucket. The
    # step wall is wall_ms unless the profiled run timed its steps itself (`timed`); the clock says.
    device_busy_ms: float = 0.0
    step_host_ms: float = 0.0
    launches: float = 0.0
    kernels_by_bucket: dict[str, float] = field(default_factory=dict)
    step_wall_ms: float = 0.0
    step_wall_clock: str = ""

    def timed(self, step_s: list[float], clock: str) -> None:
        """The step wall from the profiled run's own clock (seconds of each profiled step, the
        steps the trace holds): host time follows it."""
        if not step_s:
            raise ValueError("timed: no step times")
        self.step_wall_ms = 1e3 * sum(step_s) / len(step_s)
        self.step_wall_clock = clock
        self.step_host_ms = host_ms(self.step_wall_ms, self.device_busy_ms)

    @property
    def host_bucket_ms(self) -> float:
        """The step wall no bucket holds (what bucket "host" gets): the host time, less the code
        sections' host time a CPU trace already put in their buckets."""
        return max(0.0, self.step_wall_ms - self.total_ms)

    def measurement_fields(self) -> dict[str, Any]:
        """The fields of autoopt.measurement.Measurement this profile fills (per-step ms there).
        The host figures need step marks: a trace without them has no step to split."""
        fields: dict[str, Any] = {"buckets_ms": dict(self.buckets_ms), "bucket_coverage": self.coverage,
                                  "kernel_count": self.kernel_count}
        if not self.per_step:
            return fields
        fields["buckets_ms"][HOST_BUCKET] = self.host_bucket_ms
        return fields | {"step_wall_ms": self.step_wall_ms, "step_wall_clock": self.step_wall_clock,
                         "device_busy_ms": self.device_busy_ms, "host_ms": self.step_host_ms,
                         "launches_per_step": self.launches,
                         "kernels_by_bucket": dict(self.kernels_by_bucket)}

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["top_kernels"] = [{"name": n, "bucket": b, "ms": ms, "count": c}
                            for n, b, ms, c in self.top_kernels]
        return d


def profile_trace(path: str | Path, top: int = 20) -> BucketProfile:
    """Bucket a Chrome trace file (see the module docstring for what is counted)."""
    with gc_paused():
        parts = chrome.read_events(path, partition)
        prof = _profile_parts(parts, top=top, label=str(path))
    prof.path = str(path)
    return prof


def profile_events(events: list[dict[str, Any]], top: int = 20, label: str = "trace") -> BucketProfile:
    """Bucket already-loaded trace events; `label` names the source in errors and notes."""
    return _profile_parts(partition(events), top, label)


def _profile_parts(parts: Parts, top: int, label: str) -> BucketProfile:
    host_items: list[Item] = []  # CPU code sections' host time (none on a GPU trace)
    if parts.kernels:
        items, notes, source = _gpu_items(parts.kernels, parts.launch_ts), [], "gpu"
    elif parts.ops:
        items, host_items, notes = _cpu_items(parts.ops, parts.sections)
        source = "cpu"
    else:
        raise UserError(f"{label}: a trace with no GPU kernels (cat kernel/gpu_memcpy/gpu_memset) "
                        "and no CPU ops (cat cpu_op): nothing to bucket")
    steps = sorted(parts.steps.values())
    if steps:
        items, host_items = _in_steps(items, steps, source, notes), _in_steps(host_items, steps)
        wall_us = sum(end - start for start, end in steps)
    else:
        wall_us = (max(it[2] + it[3] for it in items) - min(it[2] for it in items)) if items else 0.0
    return _summarise(items, host_items, len(steps), wall_us, source, notes, top)


def _in_steps(items: list[Item], steps: list[tuple[float, float]], source: str = "",
              notes: list[str] | None = None) -> list[Item]:
    """The items whose anchor lies in a step span; a note says how many were left out."""
    starts = [s for s, _ in steps]

    def in_step(anchor: float) -> bool:
        i = bisect.bisect_right(starts, anchor) - 1
        return i >= 0 and anchor <= steps[i][1]

    kept = [it for it in items if in_step(it[4])]
    if notes is not None and len(kept) < len(items):
        notes.append(f"{len(items) - len(kept)} of {len(items)} {source} events fall outside the "
                     f"{len(steps)} ProfilerStep spans and are not counted")
    return kept


def _summarise(items: list[Item], host_items: list[Item], n_steps: int, wall_us: float,
               source: str, notes: list[str], top: int) -> BucketProfile:
    buckets_us = {b: 0.0 for b in rules.BUCKETS}
    # by (name, bucket): one name can land in two buckets (aten::mm in fp32 and in bf16)
    per_kernel: dict[tuple[str, str], list[float]] = {}
    for name, bucket, _start, dur, *_ in items + host_items:
        buckets_us[bucket] += dur
        agg = per_kernel.setdefault((name, bucket), [0.0, 0])
        agg[0] += dur
        agg[1] += 1
    host_buckets_us: dict[str, float] = defaultdict(float)
    host_sections_us: dict[str, float] = defaultdict(float)
    for name, bucket, _start, dur, *_ in host_items:
        host_buckets_us[bucket] += dur
        host_sections_us[name] += dur
    covered_us = sum(v for b, v in buckets_us.items() if b != "other")
    if source == "gpu":  # GPU: union of named-bucket kernel intervals (streams overlap)
        busy_us = union_length([(it[2], it[2] + it[3]) for it in items if it[1] != "other"])
    else:  # CPU self times on one thread are disjoint; threads are summed (clamped below)
        busy_us = covered_us
    n = max(n_steps, 1)
    host_us = sum(host_buckets_us.values())
    if host_items:
        notes.append(_host_note(host_buckets_us, sum(buckets_us.values()) - host_us, n_steps))
    ranked = sorted(per_kernel.items(), key=lambda kv: -kv[1][0])[:max(top, 0)]
    split = step_split(items, source, n_steps)
    wall_ms = wall_us / 1e3 / n
    return BucketProfile(
        buckets_ms={b: v / 1e3 / n for b, v in buckets_us.items()},
        kernel_count=round(len(items) / n), total_ms=sum(buckets_us.values()) / 1e3 / n,
        covered_ms=covered_us / 1e3 / n,
        coverage=min(1.0, busy_us / wall_us) if wall_us > 0 else 0.0,
        steps=n_steps, per_step=bool(n_steps),
        top_kernels=[(name, b, us / 1e3 / n, count / n) for (name, b), (us, count) in ranked],
        wall_ms=wall_ms, source=source, notes=notes, host_ms=host_us / 1e3 / n,
        host_buckets_ms={b: us / 1e3 / n for b, us in host_buckets_us.items()},
        host_sections_ms={name: us / 1e3 / n for name, us in
                          sorted(host_sections_us.items(), key=lambda kv: -kv[1])},
        **_split_fields(split, wall_ms, n_steps),
    )


def _split_fields(split: StepSplit, wall_ms: float, n_steps: int) -> dict[str, Any]:
    return {"device_busy_ms": split.device_busy_ms, "launches": split.launches,
            "kernels_by_bucket": split.kernels_by_bucket, "step_wall_ms": wall_ms,
            "step_wall_clock": WALL_FROM_STEPS if n_steps else WALL_FROM_SPAN,
            "step_host_ms": host_ms(wall_ms, split.device_busy_ms)}


def _host_note(host_buckets_us: dict[str, float], ops_us: float, n_steps: int) -> str:
    n, unit = max(n_steps, 1), "ms/step" if n_steps else "ms"
    host_us = sum(host_buckets_us.values())
    split = ", ".join(f"{b} {us / 1e3 / n:.2f}" for b, us in
                      sorted(host_buckets_us.items(), key=lambda kv: -kv[1]))
    return (f"host time of dsv4:: code sections (Python/dispatcher time between their ops, "
            f"profiler overhead included; not kernel time) is counted in their buckets: "
            f"{host_us / 1e3 / n:.2f} {unit} ({split}); the ops' own self time is "
            f"{ops_us / 1e3 / n:.2f} {unit}")


# An item is (name, bucket, start_us, counted_us, anchor_us, launch): the anchor places it in a step;
# launch is the host call that put it on the device (a GPU activity's correlation id; None: its own).
Item = tuple[str, str, float, float, float, Any]


def _gpu_items(kernels: list[dict[str, Any]], launch_ts: dict[Any, float]) -> list[Item]:
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
        if e["cat"] == "gpu_memset":  # slimmed events carry the lower-case category
            bucket = gemm_of_op.get(args.get("External id")) or rules.classify(name)
        else:
            bucket = rules.classify(name, gemm_of_launch=hint)
        if rules.is_gemm_bucket(bucket) and hint is None:
            last_gemm[stream] = bucket
        ts, dur = float(e["ts"]), float(e["dur"])
        corr = args.get("correlation")
        items.append((name, bucket, ts, dur, launch_ts.get(corr, ts), corr))
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
                host_items.append((name, bucket, float(e["ts"]), self_us, float(e["ts"]), None))
                continue
            types = (e.get("args") or {}).get("Input type")
            rule = rules.match(name, "cpu_op")
            if rule is not None and rule.bucket == rules.BY_DTYPE \
                    and rules.gemm_bucket_for_types(types) is None:
                untyped_gemms += 1
            bucket = rules.classify(name, "cpu_op", input_types=types)
            items.append((name, bucket, float(e["ts"]), self_us, float(e["ts"]), None))
    notes = []
    if untyped_gemms:
        notes.append(f"{untyped_gemms} CPU GEMM ops carry no 'Input type' (profile with "
                     "record_shapes=True): counted as gemm_simt")
    if unknown_sections:
        notes.append(f"code sections with no rule in profile_rules.SECTION_RULES: their host time is "
                     f"counted as other: {', '.join(sorted(unknown_sections))}")
    return items, host_items, notes


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
