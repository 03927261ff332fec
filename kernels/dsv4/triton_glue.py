"""The mHC glue in Triton (glue=triton): one kernel per epilogue call instead of dozens of tiny ones.

Contracts: the eager functions of dsv4.glue, value for value (hc_mult must be 4, hidden any size).
  mhc_pre_mix   `_mhc_pre_mix` (raw_mixes=False: mixes already RMS-scaled by a Triton pre-norm
                kernel) or `_mhc_pre_epilogue` (raw_mixes=True: the per-token RMS of the streams is
                taken in the same kernel). mhc_pre_mix_kernel, one program per token: the sigmoids,
                the 4x4 Sinkhorn, the weighted collapse of the 4 streams in fp32, its bf16 rounding
                (the eager code RMSNorms `layer_in.to(bf16)`), the RMSNorm (fp32 statistic), bf16 out.
                In eager mode that is ~130 launches per call (the Sinkhorn alone is 20 x 6).
  mhc_post      `_mhc_post`: R_new[:, j] = post_j * out + sum_i comb[i, j] * R[:, i], fp32 math,
                stored bf16. mhc_post_kernel, one program per (token, block of hidden columns).
  mhc_head_mix  `_head_mix` / `_head_epilogue` (raw_mixes): the hc_head collapse with sigmoid
                weights, bf16 rounding, final RMSNorm. mhc_head_mix_kernel, one program per token.
The streams (`src`) may be the fp32 x_flat [B, 4*hidden] or the bf16 residual R [B, 4, hidden]
(the same values); the kernels upcast what they load.

A per-token kernel reads its streams more than once (the RMS of a raw call, the collapse + its
statistic, then the collapse again to normalise): the later passes re-read the row (64 KB at Flash
widths, fp32) from L2 rather than writing the unnormalised row and reading it back, which would need
a cross-thread barrier on global memory inside the program.

Under Triton's CPU interpreter (tests) a fp32 -> bf16 cast truncates instead of rounding to nearest
even; the kernels then round with integer bit arithmetic (constexpr RNE_BITS), so the interpreter
computes exactly what the GPU's native cast computes and the CPU tests check the bf16 contract.
Kernel names are bucketed by autoopt.profile.rules as elementwise glue (no GEMM in them).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from dsv4.config import HC_EPS, NORM_EPS
from dsv4.triton_attention import check_out, check_tensor, interpreting

HC_MULT = 4  # the kernels hold the streams as [4, BLOCK_H] tiles and comb as a [4, 4] tile
MAX_BLOCK_H = 1024  # [4, 1024] fp32 stream tile: 32 registers a thread at 4 warps
_STREAM_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


@triton.jit
def _round_bf16(x, RNE_BITS: tl.constexpr):
    # x fp32 -> the nearest bf16 value (ties to even), kept as fp32.
    if RNE_BITS:  # interpreter: its cast truncates; add half an ulp (+1 on odd) and cut 16 bits
        bits = x.to(tl.int32, bitcast=True)
        bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & -65536
        return bits.to(tl.float32, bitcast=True)
    else:
        return x.to(tl.bfloat16).to(tl.float32)


@triton.jit
def _stream_rstd(row, HID, eps, HC: tl.constexpr, BLOCK_H: tl.constexpr):
    # rsqrt(mean(x_flat[t]^2) + eps) over all HC * HID values of one token's streams.
    offs_s = tl.arange(0, HC)
    sq = tl.zeros([HC, BLOCK_H], dtype=tl.float32)
    for h0 in range(0, HID, BLOCK_H):
        offs_h = h0 + tl.arange(0, BLOCK_H)
        x = tl.load(row + offs_s[:, None] * HID + offs_h[None, :], mask=(offs_h < HID)[None, :],
                    other=0.0).to(tl.float32)  # [HC, BLOCK_H]
        sq += x * x
    return 1.0 / tl.sqrt(tl.sum(tl.sum(sq, axis=1), axis=0) / (HC * HID) + eps)


@triton.jit
def _collapse(row, pre, offs_h, HID, HC: tl.constexpr, RNE_BITS: tl.constexpr):
    # layer_in [BLOCK_H] = bf16(sum_i pre_i * stream_i) as fp32; pre [HC] fp32.
    offs_s = tl.arange(0, HC)
    x = tl.load(row + offs_s[:, None] * HID + offs_h[None, :], mask=(offs_h < HID)[None, :],
                other=0.0).to(tl.float32)  # [HC, BLOCK_H]
    return _round_bf16(tl.sum(pre[:, None] * x, axis=0), RNE_BITS)


@triton.jit
def _collapse_rmsnorm(row, pre, w_ptr, out_row, HID, eps, HC: tl.constexpr, BLOCK_H: tl.constexpr,
                      RNE_BITS: tl.constexpr):
    # out_row [HID] bf16 = rmsnorm(bf16(sum_i pre_i * stream_i), w): statistic pass, then a second
    # pass recomputing the (deterministic) collapse to scale and store it.
    sq = tl.zeros([BLOCK_H], dtype=tl.float32)
    for h0 in range(0, HID, BLOCK_H):
        y = _collapse(row, pre, h0 + tl.arange(0, BLOCK_H), HID, HC, RNE_BITS)  # [BLOCK_H]
        sq += y * y
    rstd = 1.0 / tl.sqrt(tl.sum(sq, axis=0) / HID + eps)
    for h0 in range(0, HID, BLOCK_H):
        offs_h = h0 + tl.arange(0, BLOCK_H)
        ok = offs_h < HID
        y = _collapse(row, pre, offs_h, HID, HC, RNE_BITS)
        w = tl.load(w_ptr + offs_h, mask=ok, other=0.0).to(tl.float32)
        z = _round_bf16(y * rstd * w, RNE_BITS)  # (x * rstd) * w, the eager rmsnorm's order
        tl.store(out_row + offs_h, z.to(out_row.dtype.element_ty), mask=ok)


@triton.jit
def mhc_pre_mix_kernel(src_ptr, mixes_ptr, scale_ptr, base_ptr, w_ptr, x_ptr, post_ptr, comb_ptr,
                       HID, iters, hc_eps, norm_eps, HC: tl.constexpr, BLOCK_H: tl.constexpr,
                       RAW_MIXES: tl.constexpr, RNE_BITS: tl.constexpr):
    # grid: (B,). src [B, HC, HID] (fp32 / bf16), mixes [B, 2HC + HC*HC] fp32, scale [3], base
    # [2HC + HC*HC] fp32, w [HID] -> x [B, HID] bf16, post [B, HC] fp32, comb [B, HC, HC] fp32.
    b = tl.program_id(0).to(tl.int64)
    row = src_ptr + b * HC * HID
    mrow = mixes_ptr + b * (2 * HC + HC * HC)
    offs_s = tl.arange(0, HC)  # [HC]
    offs_ij = offs_s[:, None] * HC + offs_s[None, :]  # [HC, HC]: comb[i, j] at i * HC + j
    if RAW_MIXES:  # mixes = x_flat @ hc_fn.T unscaled: the per-token RMS from the same streams
        r = _stream_rstd(row, HID, norm_eps, HC, BLOCK_H)
    else:
        r = 1.0
    s0 = tl.load(scale_ptr)
    s1 = tl.load(scale_ptr + 1)
    s2 = tl.load(scale_ptr + 2)
    pre = tl.sigmoid(tl.load(mrow + offs_s) * r * s0 + tl.load(base_ptr + offs_s)) + hc_eps
    post = 2.0 * tl.sigmoid(tl.load(mrow + HC + offs_s) * r * s1
                            + tl.load(base_ptr + HC + offs_s))  # [HC]
    tl.store(post_ptr + b * HC + offs_s, post)
    logits = (tl.load(mrow + 2 * HC + offs_ij) * r * s2
              + tl.load(base_ptr + 2 * HC + offs_ij))  # [HC, HC]
    m = tl.exp(logits - tl.max(tl.max(logits, axis=1), axis=0))
    for _ in range(iters):  # glue.sinkhorn: rows (sum over j), then columns (sum over i)
        m = m / (tl.sum(m, axis=1)[:, None] + hc_eps)
        m = m / (tl.sum(m, axis=0)[None, :] + hc_eps)
    tl.store(comb_ptr + b * HC * HC + offs_ij, m)
    _collapse_rmsnorm(row, pre, w_ptr, x_ptr + b * HID, HID, norm_eps, HC, BLOCK_H, RNE_BITS)


@triton.jit
def mhc_head_mix_kernel(src_ptr, mixes_ptr, scale_ptr, base_ptr, w_ptr, y_ptr, HID, hc_eps,
                        norm_eps, HC: tl.constexpr, BLOCK_H: tl.constexpr, RAW_MIXES: tl.constexpr,
                        RNE_BITS: tl.constexpr):
    # grid: (B,). src [B, HC, HID], mixes [B, HC] fp32, scale [>= 1], base [HC] fp32, w [HID]
    # -> y [B, HID] bf16.
    b = tl.program_id(0).to(tl.int64)
    row = src_ptr + b * HC * HID
    offs_s = tl.arange(0, HC)
    if RAW_MIXES:
        r = _stream_rstd(row, HID, norm_eps, HC, BLOCK_H)
    else:
        r = 1.0
    pre = tl.sigmoid(tl.load(mixes_ptr + b * HC + offs_s) * r * tl.load(scale_ptr)
                     + tl.load(base_ptr + offs_s)) + hc_eps  # [HC]
    _collapse_rmsnorm(row, pre, w_ptr, y_ptr + b * HID, HID, norm_eps, HC, BLOCK_H, RNE_BITS)


@triton.jit
def mhc_post_kernel(o_ptr, r_ptr, post_ptr, comb_ptr, new_ptr, HID, HC: tl.constexpr,
                    BLOCK_H: tl.constexpr, RNE_BITS: tl.constexpr):
    # grid: (B, cdiv(HID, BLOCK_H)). out [B, HID], R [B, HC, HID], post [B, HC] fp32,
    # comb [B, HC, HC] fp32 -> R_new [B, HC, HID] bf16.
    b = tl.program_id(0).to(tl.int64)
    offs_h = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)  # [BLOCK_H]
    ok = (offs_h < HID)[None, :]
    offs_s = tl.arange(0, HC)
    tile = b * HC * HID + offs_s[:, None] * HID + offs_h[None, :]  # [HC, BLOCK_H]
    r = tl.load(r_ptr + tile, mask=ok, other=0.0).to(tl.float32)  # [HC (i), BLOCK_H]
    comb = tl.load(comb_ptr + b * HC * HC + offs_s[:, None] * HC + offs_s[None, :])  # [i, j]
    mixed = tl.sum(comb[:, :, None] * r[:, None, :], axis=0)  # [HC (j), BLOCK_H]
    o = tl.load(o_ptr + b * HID + offs_h, mask=offs_h < HID, other=0.0).to(tl.float32)
    p = tl.load(post_ptr + b * HC + offs_s)  # [HC]
    new = _round_bf16(p[:, None] * o[None, :] + mixed, RNE_BITS)
    tl.store(new_ptr + tile, new.to(new_ptr.dtype.element_ty), mask=ok)


# ---------------------------------------------------------------- wrappers

def _block_h(hidden: int, block_h: int | None) -> int:
    if block_h is None:
        return min(MAX_BLOCK_H, triton.next_power_of_2(hidden))
    if block_h < 16 or block_h & (block_h - 1):
        raise ValueError(f"block_h {block_h}: expected a power of two >= 16")
    return block_h


def _check_hc(fn: str, hc: int) -> None:
    if hc != HC_MULT:
        raise ValueError(f"{fn}: hc_mult {hc}; the Triton glue is written for {HC_MULT} streams")


def _check_mix_inputs(fn: str, src, mixes, scale, base, norm_w, hc: int, n_mix: int,
                      n_scale: int) -> int:
    """Checks of the collapse kernels' inputs -> B. src: [B, hc*hidden] or [B, hc, hidden]."""
    _check_hc(fn, hc)
    if not isinstance(src, torch.Tensor) or src.dim() not in (2, 3):
        raise ValueError(f"{fn}: src must be [B, hc*hidden] (x_flat) or [B, hc, hidden] (R), got "
                         f"{tuple(src.shape) if isinstance(src, torch.Tensor) else type(src)}")
    check_tensor("src", src, src.dim(), _STREAM_DTYPES)
    dev = src.device
    check_tensor("norm_w", norm_w, 1, _STREAM_DTYPES, dev)
    check_tensor("mixes", mixes, 2, (torch.float32,), dev)
    check_tensor("scale", scale, 1, (torch.float32,), dev)
    check_tensor("base", base, 1, (torch.float32,), dev)
    B, hidden = src.shape[0], norm_w.shape[0]
    want = (B, hc * hidden) if src.dim() == 2 else (B, hc, hidden)
    if tuple(src.shape) != want or hidden == 0:
        raise ValueError(f"{fn}: src {tuple(src.shape)} does not hold {hc} streams of hidden "
                         f"{hidden} (the size of norm_w): expected {want}")
    if (tuple(mixes.shape) != (B, n_mix) or tuple(base.shape) != (n_mix,)
            or scale.shape[0] < n_scale):
        raise ValueError(f"{fn}: mixes {tuple(mixes.shape)}, base {tuple(base.shape)}, scale "
                         f"{tuple(scale.shape)}: expected [{B}, {n_mix}], [{n_mix}], >= {n_scale}")
    return B


@torch.compiler.disable  # opaque to step_compile=inductor: a graph break, launched as built
def mhc_pre_mix(src: torch.Tensor, mixes: torch.Tensor, scale: torch.Tensor, base: torch.Tensor,
                norm_w: torch.Tensor, hc: int, iters: int, raw_mixes: bool = False,
                block_h: int | None = None, num_warps: int = 4,
                ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """hc_pre's epilogue in one kernel; contract of glue._mhc_pre_mix (raw_mixes=False: mixes
    already RMS-scaled) or glue._mhc_pre_epilogue (raw_mixes=True). src [B, hc*hidden] or
    [B, hc, hidden] fp32/bf16/fp16, mixes [B, 2hc + hc*hc] fp32, scale [3] fp32, base [2hc + hc*hc]
    fp32, norm_w [hidden] -> (x [B, hidden] bf16, post [B, hc] fp32, comb [B, hc, hc] fp32)."""
    B = _check_mix_inputs("mhc_pre_mix", src, mixes, scale, base, norm_w, hc, 2 * hc + hc * hc, 3)
    if iters < 0:
        raise ValueError(f"mhc_pre_mix: iters {iters} < 0")
    hidden, dev = norm_w.shape[0], src.device
    x = torch.empty(B, hidden, device=dev, dtype=torch.bfloat16)
    post = torch.empty(B, hc, device=dev, dtype=torch.float32)
    comb = torch.empty(B, hc, hc, device=dev, dtype=torch.float32)
    if B:
        mhc_pre_mix_kernel[(B,)](src, mixes, scale, base, norm_w, x, post, comb, hidden, iters,
                                 HC_EPS, NORM_EPS, HC=hc, BLOCK_H=_block_h(hidden, block_h),
                                 RAW_MIXES=raw_mixes, RNE_BITS=interpreting(),
                                 num_warps=num_warps)
    return x, post, comb


@torch.compiler.disable  # opaque to step_compile=inductor: a graph break, launched as built
def mhc_head_mix(src: torch.Tensor, mixes: torch.Tensor, scale: torch.Tensor, base: torch.Tensor,
                 norm_w: torch.Tensor, hc: int, raw_mixes: bool = False,
                 block_h: int | None = None, num_warps: int = 4) -> torch.Tensor:
    """hc_head's collapse + final RMSNorm in one kernel; contract of glue._head_mix (raw_mixes=False)
    or glue._head_epilogue (raw_mixes=True). src as mhc_pre_mix, mixes [B, hc] fp32, scale [>= 1]
    fp32, base [hc] fp32, norm_w [hidden] -> [B, hidden] bf16."""
    B = _check_mix_inputs("mhc_head_mix", src, mixes, scale, base, norm_w, hc, hc, 1)
    hidden = norm_w.shape[0]
    y = torch.empty(B, hidden, device=src.device, dtype=torch.bfloat16)
    if B:
        mhc_head_mix_kernel[(B,)](src, mixes, scale, base, norm_w, y, hidden, HC_EPS, NORM_EPS,
                                  HC=hc, BLOCK_H=_block_h(hidden, block_h), RAW_MIXES=raw_mixes,
                                  RNE_BITS=interpreting(), num_warps=num_warps)
    return y


@torch.compiler.disable  # opaque to step_compile=inductor: a graph break, launched as built
def mhc_post(out: torch.Tensor, R: torch.Tensor, post: torch.Tensor, comb: torch.Tensor,
             block_h: int | None = None, num_warps: int = 4,
             new: torch.Tensor | None = None) -> torch.Tensor:
    """hc_post in one kernel; contract of glue._mhc_post. out [B, hidden], R [B, hc, hidden]
    (fp32/bf16/fp16), post [B, hc] fp32, comb [B, hc, hc] fp32 -> R_new [B, hc, hidden] bf16
    (`new`, optional, is written and returned)."""
    check_tensor("R", R, 3, _STREAM_DTYPES)
    B, hc, hidden = R.shape
    _check_hc("mhc_post", hc)
    dev = R.device
    check_tensor("out", out, 2, _STREAM_DTYPES, dev)
    check_tensor("post", post, 2, (torch.float32,), dev)
    check_tensor("comb", comb, 3, (torch.float32,), dev)
    if (tuple(out.shape) != (B, hidden) or tuple(post.shape) != (B, hc)
            or tuple(comb.shape) != (B, hc, hc) or hidden == 0):
        raise ValueError(f"mhc_post: shapes out {tuple(out.shape)}, R {tuple(R.shape)}, post "
                         f"{tuple(post.shape)}, comb {tuple(comb.shape)} do not agree")
    new = check_out("new", new, (B, hc, hidden), torch.bfloat16, dev)
    if B:
        # 256 columns x 4 streams per program: enough programs to spread a decode batch over the
        # SMs at hidden 4096 (16 per token), small [4, 4, 256] mixing tiles
        bh = _block_h(hidden, block_h) if block_h else min(256, triton.next_power_of_2(hidden))
        mhc_post_kernel[(B, triton.cdiv(hidden, bh))](out, R, post, comb, new, hidden, HC=hc,
                                                     BLOCK_H=bh, RNE_BITS=interpreting(),
                                                     num_warps=num_warps)
    return new
