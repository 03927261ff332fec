"""The variant knobs of the decode step: every value is a real code path.

This module is the single declaration that the model, the correctness guard, the search spaces and the
worker all read. It imports nothing heavy (no torch) so the CLI can list knobs instantly.

Restart classes, cheapest first (what the worker must do to switch a knob's value):
  none       switch inside the running worker (a Python branch taken at the next step)
  recompile  JIT a kernel (Triton specialisation, torch.compile)
  rebuild    recreate modules / weight copies / CUDA graphs in the same process
  restart    a new worker process
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

RESTART_CLASSES = ("none", "recompile", "rebuild", "restart")
SCOPES = ("global", "layer_class", "layer")
# Layer classes of DeepSeek-V4: sliding-window only; 4:1 compressed KV + lightning indexer; 128:1
# compressed KV without indexer.
LAYER_CLASSES = ("window", "c4", "c128")
# the Triton attention kernel's tile knobs: it is compiled once per tuple of them (and its mode)
ATTENTION_TILE_KNOBS = ("attn_block_kv", "attn_heads_per_tile", "attn_num_warps", "attn_num_stages",
                        "attn_split_k")


@dataclass(frozen=True)
class Knob:
    name: str
    values: tuple[Any, ...]
    baseline: Any  # the case study's starting point
    restart_class: str
    scopes: tuple[str, ...]
    buckets: tuple[str, ...]  # profile buckets this knob is expected to move
    # value -> requirement that must hold on the device ("cuda", "fp8", "triton");
    # a value whose requirement fails is excluded from the space with that reason.
    requires: dict[Any, str] = field(default_factory=dict)
    # layer classes the knob applies to (None: every layer)
    layer_classes: tuple[str, ...] | None = None
    help: str = ""

    def restart_class_rank(self) -> int:
        return RESTART_CLASSES.index(self.restart_class)


KNOBS: tuple[Knob, ...] = (
    Knob("indexer_gemm", ("fp32", "bf16", "fp8"), "fp32", "none", ("global", "layer"),
         ("gemm_simt", "gemm_tensorop", "copy_cast", "elementwise"), {"fp8": "fp8"},
         layer_classes=("c4",),
         help="indexer scoring GEMM: fp32 upcast (SIMT), bf16 (lossless from FP8), native fp8"),
    Knob("mhc_gemm", ("fp32", "bf16"), "fp32", "none", SCOPES,
         ("gemm_simt", "gemm_tensorop", "copy_cast"),
         help="mHC pre-linear GEMM x_flat @ hc_fn.T ([T, 4*hidden] x [24, 4*hidden])"),
    Knob("mhc_operand", ("cast_from_fp32", "view_bf16_residual"), "cast_from_fp32", "none", SCOPES,
         ("copy_cast",),
         help="bf16 operand of the mHC GEMM: cast of the fp32 x_flat (a full copy) or a view of the "
              "bf16 residual that already exists"),
    Knob("hc_fn_weight", ("cast_per_call", "cached"), "cast_per_call", "rebuild", SCOPES,
         ("copy_cast",),
         help="bf16 hc_fn weight: cast on every call, or a cached bf16 copy built once"),
    Knob("attention", ("per_head", "mma"), "per_head", "recompile", SCOPES,
         ("attention",),
         help="sparse MQA decode: one program per (token, head) re-gathering KV, or a tile of heads "
              "sharing one gather (tl.dot on GPU, batched torch on CPU)"),
    Knob("attn_block_kv", (16, 32, 64, 128), 64, "recompile", ("global", "layer_class"),
         ("attention",), {16: "cuda", 32: "cuda", 64: "cuda", 128: "cuda"},
         help="KV entries per tile in the Triton attention kernel"),
    Knob("attn_heads_per_tile", (8, 16, 32, 64), 16, "recompile", ("global", "layer_class"),
         ("attention",), {8: "cuda", 16: "cuda", 32: "cuda", 64: "cuda"},
         help="query heads sharing one KV gather in the mma kernel"),
    Knob("attn_num_warps", (2, 4, 8), 4, "recompile", ("global", "layer_class"),
         ("attention",), {2: "cuda", 4: "cuda", 8: "cuda"},
         help="Triton num_warps of the attention kernel"),
    Knob("attn_num_stages", (1, 2, 3, 4), 2, "recompile", ("global", "layer_class"),
         ("attention",), {1: "cuda", 2: "cuda", 3: "cuda", 4: "cuda"},
         help="Triton num_stages (software pipelining depth) of the attention kernel"),
    Knob("attn_split_k", (1, 2, 4, 8), 1, "recompile", ("global", "layer_class"),
         ("attention",), {1: "cuda", 2: "cuda", 4: "cuda", 8: "cuda"},
         help="split the selected KV entries across programs (helps small batches)"),
    Knob("moe_experts", ("loop", "grouped", "triton_grouped"), "loop", "none",
         ("global", "layer_class", "layer"), ("moe", "gemm_tensorop", "gemm_simt"),
         {"triton_grouped": "cuda"},
         help="routed experts: a Python loop over active experts, one grouped/batched torch GEMM, or "
              "the Triton grouped GEMM (dsv4.triton_moe: expert-sorted row blocks, fused clamped "
              "SwiGLU, no host sync; JIT-compiled once per process, reported as a recompile)"),
    # ---- Triton kernels of the decode step (dsv4.triton_indexer / triton_mhc), CUDA only ----
    Knob("indexer_kernel", ("torch", "triton_fused"), "torch", "recompile", ("global", "layer"),
         ("attention", "gemm_simt", "gemm_tensorop", "copy_cast", "elementwise", "reduce"),
         {"triton_fused": "cuda"}, layer_classes=("c4",),
         help="indexer scoring: torch GEMM (bmm / _scaled_mm) with ReLU, head weights and sum as "
              "separate ops over [B, heads, S] logits, or one Triton kernel (GEMM + ReLU + weighted "
              "head sum) reading the fp8 key codes; operand precision from indexer_gemm"),
    Knob("mhc_kernel", ("torch", "triton_splitk"), "torch", "recompile", SCOPES,
         ("gemm_simt", "gemm_tensorop", "copy_cast", "elementwise", "reduce"),
         {"triton_splitk": "cuda"},
         help="mHC pre-norm GEMM (tiny N=24, K=4*hidden): torch.mm plus a separate RMS statistic, "
              "or a split-K Triton kernel with the sum of squares in the same pass; operands from "
              "mhc_gemm / mhc_operand / hc_fn_weight (bf16 + view_bf16_residual: no cast copy)"),
    Knob("mhc_fuse_post_pre", ("off", "on"), "off", "recompile", SCOPES,
         ("elementwise", "copy_cast", "gemm_simt", "gemm_tensorop"), {"on": "cuda"},
         help="fuse hc_post of a sublayer with the next hc_pre's GEMM + RMS (one Triton pass writes "
              "R_new and never reads it back); a layer's value decides its two hc_posts, the "
              "model's last hc_post (before hc_head) stays unfused"),
    Knob("glue", ("eager", "compile", "triton"), "eager", "recompile", ("global",),
         ("elementwise", "reduce", "norm", "copy_cast"), {"triton": "cuda"},
         help="mHC epilogues (sigmoids, Sinkhorn, stream collapse, sublayer RMSNorm; hc_post; "
              "hc_head): eager PyTorch (dozens of tiny kernels per call), torch.compile'd, or one "
              "Triton kernel per call (dsv4.triton_glue); q/kv norms stay eager"),
    Knob("proj_gemms", ("separate", "stacked"), "separate", "none", ("global", "layer_class", "layer"),
         ("gemm_tensorop",), {},
         help="the projections that read the same activation (attention input: wq_a, wkv, the "
              "compressor's kv / gate, the indexer's key compressor and head weights; MoE input: "
              "the shared expert's gate / up): one GEMM each, or one GEMM over their row-stacked "
              "weights (the weights are stored stacked either way: a free switch)"),
    Knob("step_compile", ("off", "inductor"), "off", "recompile", ("global",),
         ("elementwise", "reduce", "norm", "copy_cast", "other"), {},
         help="torch.compile (Inductor, default mode) of the whole decode step, sampling included: the "
              "torch code between the Triton kernels (norms, RoPE, casts, cache writes, index "
              "building, routing) fused into few kernels; the Triton kernels stay opaque (graph "
              "breaks). Each new configuration is a new compile (two: batch 1, and a symbolic batch)"),
    Knob("cuda_graphs", ("off", "on"), "off", "rebuild", ("global",),
         ("other",), {"on": "cuda"},
         help="capture the whole decode step in a CUDA graph and replay it"),
)

KNOB_BY_NAME: dict[str, Knob] = {k.name: k for k in KNOBS}


def baseline_knobs() -> dict[str, Any]:
    """Knob values of the case study's starting point (fp32 SIMT GEMMs, per-head attention,
    round-trip casts, eager)."""
    return {k.name: k.baseline for k in KNOBS}


def check_value(knob: Knob, value: Any) -> None:
    """ValueError naming the knob and its values unless `value` is one of them, type included
    (text from a command line or a file is parsed before it gets here, by whoever read it)."""
    if not any(value == v and type(value) is type(v) for v in knob.values):
        allowed_txt = ", ".join(str(v) for v in knob.values)
        raise ValueError(f"knob {knob.name!r} has no value {value!r} (expected one of: {allowed_txt})")


def unmet_requirement(requirement: str, capabilities: dict[str, bool]) -> str | None:
    """Why `requirement` cannot be met on a device with `capabilities`, or None when it can."""
    if capabilities.get(requirement, False):
        return None
    reasons = {
        "cuda": "needs a CUDA GPU",
        "fp8": "needs a GPU with native FP8 tensor cores (sm_89 or newer)",
        "triton": "needs Triton with a GPU back-end",
    }
    return reasons.get(requirement, f"needs {requirement}")


def excluded_values(capabilities: dict[str, bool]) -> dict[tuple[str, Any], str]:
    """(knob, value) -> reason, for every value this device cannot run."""
    out: dict[tuple[str, Any], str] = {}
    for knob in KNOBS:
        for value, req in knob.requires.items():
            reason = unmet_requirement(req, capabilities)
            if reason is not None:
                out[(knob.name, value)] = reason
    return out
