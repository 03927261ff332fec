"""The "glue" of the decode step: mHC epilogues, Sinkhorn and the sublayer norms. Elementwise chains
and small reductions, thousands of tiny kernels per step in eager mode (the case study's 69 %).

The `glue` knob picks eager functions, the same functions through torch.compile (inductor), or
hand-written Triton kernels (dsv4.triton_glue, CUDA only): one kernel per epilogue call where eager
mode launches dozens (the 20-iteration Sinkhorn alone is ~120 per mHC pre). The GEMMs around them
stay outside the compiled regions and the Triton kernels on purpose: the mhc_gemm / mhc_operand /
hc_fn_weight knobs must keep meaning what they say (inductor would otherwise fuse the cast into the
matmul and the operand knob would silently stop mattering).

Compiled regions (each called with one fixed shape per session, so each compiles once):
  mhc_pre_epilogue   RMS statistic, mixes split, sigmoids, Sinkhorn, collapse, sublayer RMSNorm
  mhc_post           R_new[:, j] = post_j * out + sum_i comb[i, j] * R[:, i]
  head_epilogue      final collapse of the streams + final RMSNorm
  mhc_pre_scaled / head_scaled   the same two without the RMS statistic, for mixes that a Triton
                     pre-norm kernel (mhc_kernel=triton_splitk, mhc_fuse_post_pre=on) already scaled
glue=triton replaces the same five regions, each by one kernel: mhc_pre_mix_kernel (both pre
variants: RAW_MIXES takes the RMS statistic in the kernel), mhc_post_kernel, mhc_head_mix_kernel.
The q / kv / compressor norms inside attention stay eager in every mode (said in what_ran).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

from dsv4.config import HC_EPS, NORM_EPS, DecodeConfig
COMPILED_REGIONS = ("mhc pre epilogue (rms, sigmoids, sinkhorn, collapse, sublayer rmsnorm), mhc post,"
                    " hc_head")
TRITON_REGIONS = ("one kernel per mHC pre epilogue (mhc_pre_mix_kernel: rms when unscaled, sigmoids, "
                  "sinkhorn, collapse, sublayer rmsnorm), per mhc post (mhc_post_kernel), per hc_head "
                  "(mhc_head_mix_kernel)")
MODES = ("eager", "compile", "triton")


def rmsnorm(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """x: [..., d] -> same shape and dtype; statistic and scaling in fp32."""
    xf = x.float()
    y = xf * torch.rsqrt(xf.pow(2).mean(dim=-1, keepdim=True) + NORM_EPS) * weight
    return y.to(x.dtype)


def sinkhorn(logits: torch.Tensor, iters: int) -> torch.Tensor:
    """logits: [B, n, n] fp32 -> doubly stochastic [B, n, n] (alternate row / column normalisation)."""
    m = torch.exp(logits - logits.amax(dim=(-2, -1), keepdim=True))
    for _ in range(iters):
        m = m / (m.sum(dim=-1, keepdim=True) + HC_EPS)
        m = m / (m.sum(dim=-2, keepdim=True) + HC_EPS)
    return m


def _mhc_pre_mix(src: torch.Tensor, mixes: torch.Tensor, scale: torch.Tensor, base: torch.Tensor,
                 norm_w: torch.Tensor, hc: int,
                 iters: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """src: the streams, [B, hc*hidden] fp32 x_flat or [B, hc, hidden] bf16 R (same values);
    mixes: [B, 2hc + hc*hc] fp32 already scaled by the RMS (the Triton pre-norm kernels do that)
    -> (normed layer input [B, hidden] bf16, post [B, hc] fp32, comb [B, hc, hc] fp32)."""
    B = mixes.shape[0]
    pre = torch.sigmoid(mixes[:, :hc] * scale[0] + base[:hc]) + HC_EPS  # [B, hc]
    post = 2.0 * torch.sigmoid(mixes[:, hc:2 * hc] * scale[1] + base[hc:2 * hc])  # [B, hc]
    comb_logits = (mixes[:, 2 * hc:] * scale[2] + base[2 * hc:]).view(B, hc, hc)
    comb = sinkhorn(comb_logits, iters)  # [B, hc, hc]
    streams = src.reshape(B, hc, -1).float()  # [B, hc, hidden] fp32 (no copy when src is fp32)
    layer_in = (pre[:, :, None] * streams).sum(dim=1)  # [B, hidden] fp32
    return rmsnorm(layer_in.to(torch.bfloat16), norm_w), post, comb


def _mhc_pre_epilogue(x_flat: torch.Tensor, mixes_raw: torch.Tensor, scale: torch.Tensor,
                      base: torch.Tensor, norm_w: torch.Tensor, hc: int,
                      iters: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """x_flat: [B, hc*hidden] fp32, mixes_raw: [B, 2hc + hc*hc] fp32 (x_flat @ hc_fn.T, unscaled)
    -> (normed layer input [B, hidden] bf16, post [B, hc] fp32, comb [B, hc, hc] fp32)."""
    r = torch.rsqrt(x_flat.pow(2).mean(dim=-1, keepdim=True) + NORM_EPS)  # [B, 1] one RMS per token
    return _mhc_pre_mix(x_flat, mixes_raw * r, scale, base, norm_w, hc, iters)


def _mhc_post(out: torch.Tensor, R: torch.Tensor, post: torch.Tensor,
              comb: torch.Tensor) -> torch.Tensor:
    """out: [B, hidden] bf16 sublayer output, R: [B, hc, hidden] bf16 -> R_new [B, hc, hidden] bf16."""
    mixed = torch.einsum("bij,bih->bjh", comb, R.float())  # [B, hc, hidden]
    return (post[:, :, None] * out.float()[:, None, :] + mixed).to(torch.bfloat16)


def _head_mix(src: torch.Tensor, mixes: torch.Tensor, scale: torch.Tensor, base: torch.Tensor,
              norm_w: torch.Tensor, hc: int) -> torch.Tensor:
    """Collapse the hc streams (src as in _mhc_pre_mix) with sigmoid weights of the RMS-scaled
    mixes [B, hc], then the final RMSNorm -> [B, hidden] bf16."""
    B = mixes.shape[0]
    pre = torch.sigmoid(mixes * scale[0] + base) + HC_EPS  # [B, hc]
    y = (pre[:, :, None] * src.reshape(B, hc, -1).float()).sum(dim=1)
    return rmsnorm(y.to(torch.bfloat16), norm_w)


def _head_epilogue(x_flat: torch.Tensor, mixes_raw: torch.Tensor, scale: torch.Tensor,
                   base: torch.Tensor, norm_w: torch.Tensor, hc: int) -> torch.Tensor:
    """Collapse the hc streams with sigmoid weights, then the final RMSNorm -> [B, hidden] bf16."""
    r = torch.rsqrt(x_flat.pow(2).mean(dim=-1, keepdim=True) + NORM_EPS)
    return _head_mix(x_flat, mixes_raw * r, scale, base, norm_w, hc)


def raise_recompile_limit(entries: int) -> None:
    """Let every compiled frame hold at least `entries` Dynamo entries (process-wide), and make
    hitting the limit an error: by default Dynamo silently runs the frame eagerly from then on."""
    dyn = torch._dynamo.config
    dyn.recompile_limit = max(dyn.recompile_limit, entries)
    if hasattr(dyn, "accumulated_recompile_limit"):
        dyn.accumulated_recompile_limit = max(dyn.accumulated_recompile_limit, 4 * entries)
    if hasattr(dyn, "fail_on_recompile_limit_hit"):
        dyn.fail_on_recompile_limit_hit = True


def specialize_int_inputs() -> None:
    """Keep every Python int a compiled frame reads a constant (process-wide): Dynamo's default
    (automatic dynamic) turns an int that differs between calls of one frame into a SymInt. The
    step reads per-layer ints — attention tiles per layer class, layer indices — so one step already
    calls a frame with several values; a SymInt tile then reaches a Triton constexpr ("'SymNodeVariable'
    object has no attribute 'value'": 24 failed trials of the live H200 run) and a SymInt layer index
    misses the (layer, prefix) keys of the cached bf16 hc_fn weights. Tensor shapes (the batch) stay
    dynamic. A new value now costs a recompile, as a changed string knob always did."""
    torch._dynamo.config.specialize_int = True


@dataclass(frozen=True)
class Glue:
    mode: str  # one of MODES
    mhc_pre_epilogue: Callable[..., tuple[torch.Tensor, torch.Tensor, torch.Tensor]]
    mhc_post: Callable[..., torch.Tensor]
    head_epilogue: Callable[..., torch.Tensor]
    # the same epilogues for mixes the Triton pre-norm kernels already scaled by the RMS
    mhc_pre_scaled: Callable[..., tuple[torch.Tensor, torch.Tensor, torch.Tensor]]
    head_scaled: Callable[..., torch.Tensor]

    def describe(self) -> str:
        if self.mode == "eager":
            return "eager"
        if self.mode == "triton":
            return f"triton (dsv4.triton_glue): {TRITON_REGIONS}; q/kv norms eager"
        return f"torch.compile (inductor, fullgraph): {COMPILED_REGIONS}; q/kv norms eager"


def make_glue(cfg: DecodeConfig, mode: str) -> Glue:
    hc, iters = cfg.hc_mult, cfg.sinkhorn_iters

    def pre(x_flat, mixes_raw, scale, base, norm_w):
        return _mhc_pre_epilogue(x_flat, mixes_raw, scale, base, norm_w, hc, iters)

    def head(x_flat, mixes_raw, scale, base, norm_w):
        return _head_epilogue(x_flat, mixes_raw, scale, base, norm_w, hc)

    def pre_scaled(src, mixes, scale, base, norm_w):
        return _mhc_pre_mix(src, mixes, scale, base, norm_w, hc, iters)

    def head_scaled(src, mixes, scale, base, norm_w):
        return _head_mix(src, mixes, scale, base, norm_w, hc)

    if mode == "eager":
        return Glue("eager", pre, _mhc_post, head, pre_scaled, head_scaled)
    if mode == "compile":
        # One compiled entry per (function, batch size): a worker holding sessions for several
        # concurrencies would pass Dynamo's default limit of 8
        raise_recompile_limit(64)

        def comp(fn):
            return torch.compile(fn, fullgraph=True, dynamic=False)
        return Glue("compile", comp(pre), comp(_mhc_post), comp(head), comp(pre_scaled),
                    comp(head_scaled))
    if mode == "triton":
        return _triton_glue(hc, iters)
    raise ValueError(f"glue mode {mode!r}: expected one of {MODES}")


def _triton_glue(hc: int, iters: int) -> Glue:
    # imported here: the eager and compile paths (and a CPU without Triton) never need triton
    from dsv4 import triton_glue as tg

    if hc != tg.HC_MULT:
        raise ValueError(f"glue=triton: hc_mult {hc}; the Triton glue kernels are written for "
                         f"{tg.HC_MULT} streams")

    def pre(x_flat, mixes_raw, scale, base, norm_w):
        return tg.mhc_pre_mix(x_flat, mixes_raw, scale, base, norm_w, hc, iters, raw_mixes=True)

    def post(out, R, post_w, comb):
        # the sublayer output's layout is not the glue's to assume; a no-op when already dense
        return tg.mhc_post(out.contiguous(), R, post_w.contiguous(), comb.contiguous())

    def head(x_flat, mixes_raw, scale, base, norm_w):
        return tg.mhc_head_mix(x_flat, mixes_raw, scale, base, norm_w, hc, raw_mixes=True)

    def pre_scaled(src, mixes, scale, base, norm_w):
        return tg.mhc_pre_mix(src, mixes, scale, base, norm_w, hc, iters)

    def head_scaled(src, mixes, scale, base, norm_w):
        return tg.mhc_head_mix(src, mixes, scale, base, norm_w, hc)

    return Glue("triton", pre, post, head, pre_scaled, head_scaled)
