"""The measurement of one configuration: the document every target returns, the store records and
`autoopt measure --json` prints. Plain data, no torch.

JSON shape (stable; documented in the README):
{
  "status": "ok" | "wrong" | "failed",
  "failure": null | {"kind": "crash"|"hang"|"oom"|"exception"|"compile"|"cuda"|"excluded",
                     "reason": str, "stderr_tail": str},
  "config": {...},                       # the target's knob values (+ layer_overrides)
  "tok_per_s": {"<C>": {"median", "ci_low", "ci_high", "n", "samples_step_s": [...]}},
  "mbu": {"<C>": float},                 # fraction of the device's measured HBM (or DRAM) bandwidth
  "buckets_ms": {bucket: ms per decode step}, "bucket_coverage": 0..1, "kernel_count": int,
                                         # a profiled step also has bucket "host" (below)
  "step_wall_ms": float, "step_wall_clock": str, "device_busy_ms": float, "host_ms": float,
  "launches_per_step": float, "kernels_by_bucket": {bucket: kernels per step},  # null/{} unprofiled
  "correctness": {"verdict": "ok"|"wrong", "logits_rel_err": float, "token_agreement": float,
                  "tolerance": {...}, "steps": int},
  "costs_s": {"restart", "build", "compile", "warmup", "measure", "guard", "profile", "total"},
  "peak_memory_bytes": int,
  "what_ran": {op: "kernel/back-end/dtype that actually ran"},
  "environment": {...},                  # autoopt.environment fingerprint
  "serving": {"<C>": {metric: {"median", "ci_low", "ci_high", "n"}}},  # a server's figures (optional):
                                         # vLLM's names (output_throughput, median_ttft_ms, ...); {} else
}
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any

from autoopt.stats import median_ci
from autoopt.trial import FAILURE_KINDS

STATUSES = ("ok", "wrong", "failed")
# The bucket of a profiled step's wall time that no kernel/op bucket holds: the device waiting on the
# host (Python, dispatcher, launch calls). With it the buckets add up to the step's wall, so a knob
# that cuts host time (CUDA graphs, a compiled step) has a bucket to act on like any kernel knob.
HOST_BUCKET = "host"


@dataclass
class Throughput:
    median: float  # tokens/s
    ci_low: float  # 95% confidence interval of the median
    ci_high: float
    n: int  # timed samples
    samples_step_s: list[float] = field(default_factory=list)  # raw per-step seconds

    @property
    def rel_halfwidth(self) -> float:
        """Half the CI width relative to the median (the noise level of this figure)."""
        if self.median <= 0:
            return math.inf
        return (self.ci_high - self.ci_low) / (2 * self.median)


@dataclass
class Failure:
    kind: str
    reason: str
    stderr_tail: str = ""


@dataclass
class Measurement:
    status: str
    config: dict[str, Any]
    tok_per_s: dict[str, Throughput] = field(default_factory=dict)
    mbu: dict[str, float] = field(default_factory=dict)
    buckets_ms: dict[str, float] = field(default_factory=dict)
    bucket_coverage: float | None = None
    kernel_count: int | None = None
    correctness: dict[str, Any] = field(default_factory=dict)
    costs_s: dict[str, float] = field(default_factory=dict)
    peak_memory_bytes: int | None = None
    what_ran: dict[str, str] = field(default_factory=dict)
    environment: dict[str, Any] = field(default_factory=dict)
    failure: Failure | None = None
    serving: dict[str, dict[str, dict[str, float]]] = field(default_factory=dict)  # absent in older documents
    # The profiled step, per step (None / {} when not profiled, and in documents older than them):
    # its wall time as timed by the profiled run itself (`step_wall_clock` says which clock), the
    # device's busy time (GPU: the union of its kernels, copies and memsets; CPU trace: the ATen
    # ops' self time), host_ms = step wall - device busy (>= 0; on a CPU trace: Python, dispatcher
    # and framework time between the ops), the host calls that put work on the device (GPU: kernel
    # launches, a CUDA graph replay counting once; CPU: ATen ops dispatched) and the kernels (CPU:
    # ops) per bucket. buckets_ms[HOST_BUCKET] is the part of host_ms no other bucket holds (on a
    # CPU trace the dsv4:: code sections' host time is already in their buckets).
    step_wall_ms: float | None = None
    step_wall_clock: str = ""
    device_busy_ms: float | None = None
    host_ms: float | None = None
    launches_per_step: float | None = None
    kernels_by_bucket: dict[str, float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.status not in STATUSES:
            raise ValueError(f"status must be one of {STATUSES}, got {self.status!r}")

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    def objective(self, concurrency: int | str) -> float | None:
        tp = self.tok_per_s.get(str(concurrency))
        return tp.median if tp else None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "Measurement":
        d = dict(d)
        d["tok_per_s"] = {str(c): Throughput(**t) for c, t in (d.get("tok_per_s") or {}).items()}
        d["mbu"] = {str(c): v for c, v in (d.get("mbu") or {}).items()}
        if d.get("failure"):
            d["failure"] = Failure(**d["failure"])
        known = set(cls.__dataclass_fields__)
        return cls(**{k: v for k, v in d.items() if k in known})

    @classmethod
    def failed(cls, config: dict[str, Any], kind: str, reason: str, stderr_tail: str = "",
               **extra: Any) -> "Measurement":
        if kind not in FAILURE_KINDS:
            raise ValueError(f"failure kind must be one of {FAILURE_KINDS}, got {kind!r}")
        return cls(status="failed", config=config, failure=Failure(kind, reason, stderr_tail), **extra)


def throughput_from_step_times(step_s: list[float], concurrency: int) -> Throughput:
    """tokens/s figures from per-step seconds: each step produces `concurrency` tokens.

    The CI is taken on step time and inverted (a monotone map keeps order statistics exact).
    """
    med, lo, hi = median_ci(step_s)
    return Throughput(median=concurrency / med, ci_low=concurrency / hi, ci_high=concurrency / lo,
                      n=len(step_s), samples_step_s=list(step_s))
