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

Triton kernels (CUDA; dsv4.triton_mhc), picked by two more knobs:
  mhc_kernel=triton_splitk  mhc_prenorm: split-K tiny-N GEMM with the sum of squares in the same
                            pass, so its mixes come back already RMS-scaled (glue *_scaled
                            epilogues). Operands as above: fp32 -> the fp32 x_flat with fp32 hc_fn
                            (ieee products, the SIMT variant); bf16 -> the bf16 operand per
                            mhc_operand (view_bf16_residual: R itself, no copy, no x_flat at all)
                            and hc_fn per hc_fn_weight (tensor cores).
  mhc_fuse_post_pre=on      hc_post_pre: mhc_post_pre_fused writes R_new once and feeds the stored
                            bf16 values straight into the next pre-norm GEMM (mhc_operand inert:
                            the operand is R_new in registers); fp32 hc_fn -> ieee products,
                            bf16 hc_fn (mhc_gemm=bf16, per hc_fn_weight) -> tensor cores.
"""
from __future__ import annotations

import torch

from dsv4.config import NORM_EPS
from dsv4.glue import Glue
from dsv4.weights import Params

TRITON_KERNELS = ("torch", "triton_splitk")


def _bf16_operand(x_flat: torch.Tensor | None, R: torch.Tensor, operand: str) -> torch.Tensor:
    B = R.shape[0]
    if operand == "cast_from_fp32":
        if x_flat is None:
            x_flat = R.view(B, -1).float()
        return x_flat.to(torch.bfloat16)  # [B, W] bf16: a new tensor, the extra copy per call
    if operand == "view_bf16_residual":
        return R.view(B, -1)  # [B, W] bf16: a view, no copy (same values as x_flat, exactly)
    raise ValueError(f"mhc_operand {operand!r}: expected cast_from_fp32 or view_bf16_residual")


def _bf16_weight(hc_fn: torch.Tensor, hc_fn_cached: torch.Tensor | None,
                 weight: str) -> torch.Tensor:
    if weight == "cast_per_call":
        return hc_fn.to(torch.bfloat16)  # [M, W] bf16, cast again at every call
    if weight == "cached":
        if hc_fn_cached is None:
            raise RuntimeError("hc_fn_weight=cached but no cached bf16 hc_fn was built for this layer")
        return hc_fn_cached
    raise ValueError(f"hc_fn_weight {weight!r}: expected cast_per_call or cached")


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
    a = _bf16_operand(x_flat, R, operand)
    w = _bf16_weight(hc_fn, hc_fn_cached, weight)
    mixes = (a @ w.T).float()  # bf16 GEMM (tensor cores on a GPU), bf16 result upcast
    return mixes, f"torch.mm bf16 operands via {operand}, hc_fn {weight}"


def mhc_mixes_triton(R: torch.Tensor, hc_fn: torch.Tensor, hc_fn_cached: torch.Tensor | None,
                     gemm: str, operand: str, weight: str,
                     ) -> tuple[torch.Tensor, torch.Tensor, str]:
    """mhc_kernel=triton_splitk. R: [B, hc, hidden] bf16 -> (streams for the collapse: the fp32
    x_flat when one was made, else R; mixes [B, M] fp32 already RMS-scaled; what ran)."""
    from dsv4.triton_mhc import mhc_prenorm

    B = R.shape[0]
    if gemm == "fp32":
        x_flat = R.view(B, -1).float()  # [B, W] fp32: the fp32 operand
        mixes = mhc_prenorm(x_flat, hc_fn, eps=NORM_EPS)
        return x_flat, mixes, ("triton mhc_prenorm_fp32_kernel split-K, fp32 x_flat x fp32 hc_fn "
                               "(ieee fp32 products), sum of squares fused; mhc_operand/"
                               "hc_fn_weight inert")
    if gemm != "bf16":
        raise ValueError(f"mhc_gemm {gemm!r}: expected fp32 or bf16")
    x_flat = R.view(B, -1).float() if operand == "cast_from_fp32" else None
    a = _bf16_operand(x_flat, R, operand)
    mixes = mhc_prenorm(a, _bf16_weight(hc_fn, hc_fn_cached, weight), eps=NORM_EPS)
    src = x_flat if x_flat is not None else R
    return src, mixes, (f"triton mhc_prenorm_bf16_kernel split-K (tensor cores), bf16 operand via "
                        f"{operand}, hc_fn {weight}, sum of squares fused")


def hc_pre(R: torch.Tensor, p: Params, prefix: str, norm_w: torch.Tensor,
           hc_fn_cached: torch.Tensor | None, knobs: dict, glue: Glue,
           ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, str]:
    """R: [B, hc, hidden] bf16 -> (normed sublayer input [B, hidden] bf16, post [B, hc] fp32,
    comb [B, hc, hc] fp32, what ran for the GEMM). prefix: "hc_attn" | "hc_ffn"."""
    B = R.shape[0]
    scale, base = p[f"{prefix}_scale"], p[f"{prefix}_base"]
    if _kernel(knobs) == "triton_splitk":
        src, mixes, desc = mhc_mixes_triton(R, p[f"{prefix}_fn"], hc_fn_cached, knobs["mhc_gemm"],
                                            knobs["mhc_operand"], knobs["hc_fn_weight"])
        x, post, comb = glue.mhc_pre_scaled(src, mixes, scale, base, norm_w)
        return x, post, comb, desc
    x_flat = R.view(B, -1).float()  # [B, W] fp32
    mixes_raw, desc = mhc_mixes(x_flat, R, p[f"{prefix}_fn"], hc_fn_cached, knobs["mhc_gemm"],
                                knobs["mhc_operand"], knobs["hc_fn_weight"])
    x, post, comb = glue.mhc_pre_epilogue(x_flat, mixes_raw, scale, base, norm_w)
    return x, post, comb, desc


def _kernel(knobs: dict) -> str:
    kernel = knobs.get("mhc_kernel", "torch")
    if kernel not in TRITON_KERNELS:
        raise ValueError(f"mhc_kernel {kernel!r}: expected one of {TRITON_KERNELS}")
    return kernel


def hc_post_pre(out: torch.Tensor, R: torch.Tensor, post: torch.Tensor, comb: torch.Tensor,
                p: Params, prefix: str, norm_w: torch.Tensor, hc_fn_cached: torch.Tensor | None,
                knobs: dict, glue: Glue,
                ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, str]:
    """mhc_fuse_post_pre=on: hc_post(out, R, post, comb) of the previous sublayer fused with this
    hc_pre (`knobs`, `p`, `prefix` are this hc_pre's). -> (R_new [B, hc, hidden] bf16, normed
    sublayer input [B, hidden] bf16, post [B, hc], comb [B, hc, hc], what ran)."""
    from dsv4.triton_mhc import mhc_post_pre_fused

    hc_fn = p[f"{prefix}_fn"]
    gemm = knobs["mhc_gemm"]
    if gemm == "fp32":
        w, how = hc_fn, "fp32 hc_fn (ieee fp32 products); mhc_operand/hc_fn_weight inert"
    elif gemm == "bf16":
        w = _bf16_weight(hc_fn, hc_fn_cached, knobs["hc_fn_weight"])
        how = f"bf16 hc_fn {knobs['hc_fn_weight']} (tensor cores); mhc_operand inert"
    else:
        raise ValueError(f"mhc_gemm {gemm!r}: expected fp32 or bf16")
    R_new, mixes = mhc_post_pre_fused(R, out.contiguous(), post.contiguous(), comb.contiguous(),
                                      w, eps=NORM_EPS)
    x, post_n, comb_n = glue.mhc_pre_scaled(R_new, mixes, p[f"{prefix}_scale"],
                                            p[f"{prefix}_base"], norm_w)
    kname = "fp32" if gemm == "fp32" else "bf16"
    return R_new, x, post_n, comb_n, (f"triton mhc_post_pre_{kname}_kernel: hc_post fused with "
                                      f"this hc_pre, GEMM on R_new as stored, {how}")


def hc_post(out: torch.Tensor, R: torch.Tensor, post: torch.Tensor, comb: torch.Tensor,
            glue: Glue) -> torch.Tensor:
    """out: [B, hidden] bf16, R: [B, hc, hidden] bf16 -> R_new [B, hc, hidden] bf16."""
    return glue.mhc_post(out, R, post, comb)


def hc_head(R: torch.Tensor, g: Params, knobs: dict, glue: Glue,
            hc_head_cached: torch.Tensor | None = None) -> tuple[torch.Tensor, str]:
    """Collapse the streams for the LM head: R [B, hc, hidden] -> normed [B, hidden] bf16."""
    B = R.shape[0]
    if _kernel(knobs) == "triton_splitk":
        src, mixes, desc = mhc_mixes_triton(R, g.hc_head_fn, hc_head_cached, knobs["mhc_gemm"],
                                            knobs["mhc_operand"], knobs["hc_fn_weight"])
        return glue.head_scaled(src, mixes, g.hc_head_scale, g.hc_head_base, g.norm), desc
    x_flat = R.view(B, -1).float()
    mixes_raw, desc = mhc_mixes(x_flat, R, g.hc_head_fn, hc_head_cached, knobs["mhc_gemm"],
                                knobs["mhc_operand"], knobs["hc_fn_weight"])
    return glue.head_epilogue(x_flat, mixes_raw, g.hc_head_scale, g.hc_head_base, g.norm), desc
