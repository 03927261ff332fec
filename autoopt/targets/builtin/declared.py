"""What the builtin target declares, read from dsv4 alone (plain Python, no torch): its knobs, the
values a device cannot run, the baseline and the layer classes of a preset. `autoopt spaces` and the
space tests validate against this without starting a worker; a run validates against the live target,
which also knows what this GPU can run (FP8 needs sm_89+)."""
from __future__ import annotations

from typing import Any

from autoopt.errors import UserError
from autoopt.space.knobs import KnobSpec, TargetInfo

CPU_CONCURRENCY = (1, 4)
GPU_CONCURRENCY = (1, 16, 64)


# The values that cut host time or launches (KnobSpec.cuts; autoopt.space.knobs says what each means):
# the agent values them on the profile's host bucket, which on an eager GPU decode step is most of
# the wall (the committed H200 start trace: 219 of 234 ms with the device idle, 6299 launches).
HOST_CUTS: dict[str, dict[str, tuple[str, ...]]] = {
    "cuda_graphs": {"on": ("host", "launches")},  # the whole step replayed by one graph launch
    "step_compile": {"inductor": ("host", "launches")},  # no eager Python between kernels; glue fused
    "glue": {"compile": ("launches",), "triton": ("launches",)},  # one kernel per mHC epilogue call
    "mhc_kernel": {"triton_splitk": ("launches",)},  # the GEMM and its sum of squares in one pass
    "mhc_fuse_post_pre": {"on": ("launches",)},  # hc_post fused into the next hc_pre's pass
    "indexer_kernel": {"triton_fused": ("launches",)},  # GEMM + ReLU + weighted head sum: one kernel
    "proj_gemms": {"stacked": ("launches",)},  # one GEMM over the row-stacked projections
    "moe_experts": {"grouped": ("launches",), "triton_grouped": ("launches",)},  # no per-expert loop
}


def knob_specs() -> tuple[KnobSpec, ...]:
    import dsv4

    return tuple(KnobSpec(k.name, tuple(k.values), k.restart_class, tuple(k.scopes), tuple(k.buckets),
                          k.layer_classes, cuts=tuple(HOST_CUTS.get(k.name, {}).items()))
                 for k in dsv4.KNOBS)


def spec_by_name() -> dict[str, KnobSpec]:
    return {s.name: s for s in knob_specs()}


def knob_value(name: str, raw: Any, where: str) -> Any:
    """The builtin knob `name`'s value for `raw` as a person wrote it; UserError prefixed by `where`
    (the file and key, or the option) for an unknown knob or value."""
    specs = spec_by_name()
    if name not in specs:
        raise UserError(f"{where}: unknown knob {name!r} (expected one of: {', '.join(specs)})")
    try:
        return specs[name].coerce(raw)
    except ValueError as exc:
        raise UserError(f"{where}: {exc}") from None


def builtin_info(preset: str, device: str, shape_overrides: dict[str, Any] | None = None) -> TargetInfo:
    """The declarations for `preset` on `device`. On cpu every value that needs CUDA, FP8 or Triton is
    excluded; on cuda/auto none is (the live target decides FP8 when it starts). ValueError on an
    unknown preset or shape key."""
    import dsv4
    from dsv4.knobs import excluded_values

    cfg = dsv4.preset(preset, **(shape_overrides or {}))
    caps = {} if device == "cpu" else {"cuda": True, "triton": True, "fp8": True}
    return TargetInfo(name="builtin", knob_specs=knob_specs(), excluded=excluded_values(caps),
                      baseline=dsv4.baseline_knobs(),
                      layers=tuple(cfg.layer_class(i) for i in range(cfg.n_layers)),
                      default_concurrency=CPU_CONCURRENCY if device == "cpu" else GPU_CONCURRENCY)
