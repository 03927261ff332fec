"""Manifold-constrained hyper-connections (mHC): the 4-stream residual of DeepSeek-V4.

hc_pre (before attention and before the MoE):
    x_flat = R.view(B, hc*hidden).float()            # [B, W] fp32 upcast (RMS statistic + collapse)
    mixes  = (x_flat @ hc_fn.T) * rsqrt(mean(x_flat^2) + eps)     # [B, 24]: K = W, N = 24
    pre, post, comb = split 4 / 4 / 16; comb -> Sinkhorn (doubly stochastic)
    layer_input = RMSNorm(sum_i pre_i * R_i)
hc_post:  R_new[:, j] = post_j * out + sum_i comb[i, j] * R[:, i]

The GEMM is where the case study's variants live (knobs mhc_gemm, mhc_operand, hc_fn_weight):
  fp32                      x_flat @ hc_fn.T in fp32 (TF32 off: SIMT sgemm on a GPU)
  bf16 + cast_from_fp32     x_flat.to(bf16): a full extra copy of [B, W] per call (the cast that ate
                            the gains)
  bf16 + view_bf16_residual R.view(B, W): the bf16 residual already holds exactly those values
                            (x_flat was upcast from it), so no copy at all
  hc_fn_weight cast_per_call / cached: hc_fn.to(bf16) at every call, or a bf16 copy built once
With mhc_gemm fp32 the operand and weight knobs are inert; what_ran says so.
"""
from __future__ import annotations

import torch

from dsv4.glue import Glue
from dsv4.weights import Params


def mhc_mixes(x_flat: torch.Tensor, R: torch.Tensor, hc_fn: torch.Tensor,
              hc_fn_cached: torch.Tensor | None, gemm: str, operand: str,
              weight: str) -> tuple[torch.Tensor, str]:
    """Unscaled mixes [B, M] fp32 = x_flat @ hc_fn.T, and a description of what ran.

    x_flat: [B, W] fp32 (upcast of R), R: [B, hc, hidden] bf16 contiguous, hc_fn: [M, W] fp32,
    hc_fn_cached: [M, W] bf16 or None.
    """
    if gemm == "fp32":
        return x_flat @ hc_fn.T, "torch.mm fp32 (tf32 off); mhc_operand/hc_fn_weight inert"
    if gemm != "bf16":
        raise ValueError(f"mhc_gemm {gemm!r}: expected fp32 or bf16")
    B = R.shape[0]
    if operand == "cast_from_fp32":
        a = x_flat.to(torch.bfloat16)  # [B, W] bf16: a new tensor, the extra copy per call
    elif operand == "view_bf16_residual":
        a = R.view(B, -1)  # [B, W] bf16: a view, no copy (same values as x_flat, exactly)
    else:
        raise ValueError(f"mhc_operand {operand!r}: expected cast_from_fp32 or view_bf16_residual")
    if weight == "cast_per_call":
        w = hc_fn.to(torch.bfloat16)  # [M, W] bf16, cast again at every call
    elif weight == "cached":
        if hc_fn_cached is None:
            raise RuntimeError("hc_fn_weight=cached but no cached bf16 hc_fn was built for this layer")
        w = hc_fn_cached
    else:
        raise ValueError(f"hc_fn_weight {weight!r}: expected cast_per_call or cached")
    mixes = (a @ w.T).float()  # bf16 GEMM (tensor cores on a GPU), bf16 result upcast
    return mixes, f"torch.mm bf16 operands via {operand}, hc_fn {weight}"


def hc_pre(R: torch.Tensor, p: Params, prefix: str, norm_w: torch.Tensor,
           hc_fn_cached: torch.Tensor | None, knobs: dict, glue: Glue,
           ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, str]:
    """R: [B, hc, hidden] bf16 -> (normed sublayer input [B, hidden] bf16, post [B, hc] fp32,
    comb [B, hc, hc] fp32, what ran for the GEMM). prefix: "hc_attn" | "hc_ffn"."""
    B = R.shape[0]
    x_flat = R.view(B, -1).float()  # [B, W] fp32
    mixes_raw, desc = mhc_mixes(x_flat, R, p[f"{prefix}_fn"], hc_fn_cached, knobs["mhc_gemm"],
                                knobs["mhc_operand"], knobs["hc_fn_weight"])
    x, post, comb = glue.mhc_pre_epilogue(x_flat, mixes_raw, p[f"{prefix}_scale"],
                                          p[f"{prefix}_base"], norm_w)
    return x, post, comb, desc


def hc_post(out: torch.Tensor, R: torch.Tensor, post: torch.Tensor, comb: torch.Tensor,
            glue: Glue) -> torch.Tensor:
    """out: [B, hidden] bf16, R: [B, hc, hidden] bf16 -> R_new [B, hc, hidden] bf16."""
    return glue.mhc_post(out, R, post, comb)


def hc_head(R: torch.Tensor, g: Params, knobs: dict, glue: Glue,
            hc_head_cached: torch.Tensor | None = None) -> tuple[torch.Tensor, str]:
    """Collapse the streams for the LM head: R [B, hc, hidden] -> normed [B, hidden] bf16."""
    B = R.shape[0]
    x_flat = R.view(B, -1).float()
    mixes_raw, desc = mhc_mixes(x_flat, R, g.hc_head_fn, hc_head_cached, knobs["mhc_gemm"],
                                knobs["mhc_operand"], knobs["hc_fn_weight"])
    return glue.head_epilogue(x_flat, mixes_raw, g.hc_head_scale, g.hc_head_base, g.norm), desc
