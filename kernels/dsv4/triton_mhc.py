"""mHC kernels in Triton: the pre-norm GEMM (split-K, RMS fused) and hc_post fused with hc_pre.

`mhc_prenorm` (contract: ref_ops.mhc_prenorm_ref) computes
    mixes[t] = (x_flat[t] @ hc_fn.T) * rsqrt(mean(x_flat[t]^2) + eps)        [T, M] fp32
a tiny-N GEMM (M = 24 mixes) over a huge K (W = 16384 Flash, 28672 Pro) with few rows (T = decode
batch). One program per row tile would leave the GPU idle, so K is split across programs: each one
reads its slice of x_flat ONCE, accumulating both the partial products and the partial sum of
squares, and writes [M] + 1 floats; `mhc_prenorm_*_combine_kernel` adds the partials and applies
the RMS.
Operands are used at the precision they arrive in: both bf16 (or both fp16) -> tensor-core tl.dot
with fp32 accumulation; anything else -> fp32 operands with true fp32 products ("ieee": the SIMT
variant of the case study, TF32 off).

`mhc_post_pre_fused` (contract: `mhc_post_pre_ref` below) does hc_post of one sublayer and hc_pre's
GEMM + RMS of the next in one pass:
    R_new[t, j] = post[t, j] * out[t] + sum_i comb[t, i, j] * R[t, i]     (fp32 math, stored R.dtype)
    mixes       = mhc_prenorm_ref(R_new.view(T, -1), hc_fn, eps)         (on the stored values)
so R_new is written once and never read back for the next pre-norm. hc_mult must be 4 (V4).

Kernel names say how the GEMM runs, so a profile can tell tensor cores from CUDA cores (see
autoopt.profile.rules): `mhc_prenorm_fp32_kernel` / `mhc_post_pre_fp32_kernel` multiply fp32
operands with ieee fp32 products (FMA, the SIMT variant); `mhc_prenorm_bf16_kernel` /
`mhc_post_pre_bf16_kernel` run tl.dot on 16-bit operands (bf16 in the model; fp16 takes the same
kernel). Each pair shares one body (`_prenorm_partials`, `_post_pre_partials`) and differs only in
the constexpr FP32_DOT. The split-K reduction that follows either, `mhc_prenorm_fp32_combine_kernel`
/ `mhc_prenorm_bf16_combine_kernel` (one body, `_combine`), is named after the GEMM it finishes, so a
profile books it to that GEMM (as it books cuBLAS's splitKreduce) without tracking launches.
"""
from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

from dsv4.ref_ops import mhc_prenorm_ref
from dsv4.triton_attention import check_out, check_tensor, interpreting

_FLOATS = (torch.float32, torch.float16, torch.bfloat16)


@triton.jit
def _mac(x, w, acc, FP32_DOT: tl.constexpr):
    # acc [BT, BM] += x [BT, BK] @ w[BM, BK]^T at the operands' precision.
    if FP32_DOT:
        acc = tl.dot(x.to(tl.float32), tl.trans(w.to(tl.float32)), acc, input_precision="ieee")
    else:
        acc = tl.dot(x, tl.trans(w), acc)
    return acc


@triton.jit
def _prenorm_partials(x_ptr, w_ptr, acc_ws, sq_ws, T, M, W, chunk,
                      BLOCK_T: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr,
                      FP32_DOT: tl.constexpr):
    # grid: (cdiv(T, BLOCK_T), SPLIT). x [T, W], w = hc_fn [M, W]; partials acc [SPLIT, T, M],
    # sq [SPLIT, T] for columns [split*chunk, split*chunk + chunk).
    offs_t = tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)  # [BLOCK_T]
    split = tl.program_id(1)
    offs_m = tl.arange(0, BLOCK_M)  # [BLOCK_M], M padded to >= 16
    t_ok = offs_t < T
    m_ok = offs_m < M
    acc = tl.zeros([BLOCK_T, BLOCK_M], dtype=tl.float32)
    sq = tl.zeros([BLOCK_T], dtype=tl.float32)
    lo = split * chunk
    hi = tl.minimum(lo + chunk, W)
    for k0 in range(lo, hi, BLOCK_K):
        offs_k = k0 + tl.arange(0, BLOCK_K)  # [BLOCK_K]
        k_ok = offs_k < hi
        x = tl.load(x_ptr + offs_t.to(tl.int64)[:, None] * W + offs_k[None, :],
                    mask=t_ok[:, None] & k_ok[None, :], other=0.0)  # [BLOCK_T, BLOCK_K]
        w = tl.load(w_ptr + offs_m.to(tl.int64)[:, None] * W + offs_k[None, :],
                    mask=m_ok[:, None] & k_ok[None, :], other=0.0)  # [BLOCK_M, BLOCK_K]
        xf = x.to(tl.float32)
        sq += tl.sum(xf * xf, axis=1)  # the RMS statistic from the same registers: x read once
        acc = _mac(x, w, acc, FP32_DOT)
    _store_partials(acc_ws, sq_ws, acc, sq, offs_t, offs_m, t_ok, m_ok, split, T, M)


@triton.jit
def mhc_prenorm_fp32_kernel(x_ptr, w_ptr, acc_ws, sq_ws, T, M, W, chunk, BLOCK_T: tl.constexpr,
                            BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr):
    _prenorm_partials(x_ptr, w_ptr, acc_ws, sq_ws, T, M, W, chunk, BLOCK_T, BLOCK_M, BLOCK_K, True)


@triton.jit
def mhc_prenorm_bf16_kernel(x_ptr, w_ptr, acc_ws, sq_ws, T, M, W, chunk, BLOCK_T: tl.constexpr,
                            BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr):
    _prenorm_partials(x_ptr, w_ptr, acc_ws, sq_ws, T, M, W, chunk, BLOCK_T, BLOCK_M, BLOCK_K, False)


@triton.jit
def _store_partials(acc_ws, sq_ws, acc, sq, offs_t, offs_m, t_ok, m_ok, split, T, M):
    tl.store(acc_ws + (split * T + offs_t)[:, None] * M + offs_m[None, :], acc,
             mask=t_ok[:, None] & m_ok[None, :])
    tl.store(sq_ws + split * T + offs_t, sq, mask=t_ok)


@triton.jit
def mhc_prenorm_fp32_combine_kernel(acc_ws, sq_ws, out_ptr, T, M, inv_w, eps, SPLIT: tl.constexpr,
                                    BLOCK_SPLIT: tl.constexpr, BLOCK_M: tl.constexpr):
    _combine(acc_ws, sq_ws, out_ptr, T, M, inv_w, eps, SPLIT, BLOCK_SPLIT, BLOCK_M)


@triton.jit
def mhc_prenorm_bf16_combine_kernel(acc_ws, sq_ws, out_ptr, T, M, inv_w, eps, SPLIT: tl.constexpr,
                                    BLOCK_SPLIT: tl.constexpr, BLOCK_M: tl.constexpr):
    _combine(acc_ws, sq_ws, out_ptr, T, M, inv_w, eps, SPLIT, BLOCK_SPLIT, BLOCK_M)


@triton.jit
def _combine(acc_ws, sq_ws, out_ptr, T, M, inv_w, eps, SPLIT: tl.constexpr,
             BLOCK_SPLIT: tl.constexpr, BLOCK_M: tl.constexpr):
    # grid: (T,). out[t] = (sum_s acc[s, t]) * rsqrt(sum_s sq[s, t] / W + eps); fixed order, so
    # the result is deterministic (no atomics).
    t = tl.program_id(0)
    offs_s = tl.arange(0, BLOCK_SPLIT)
    offs_m = tl.arange(0, BLOCK_M)
    s_ok = offs_s < SPLIT
    m_ok = offs_m < M
    acc = tl.load(acc_ws + (offs_s * T + t)[:, None] * M + offs_m[None, :],
                  mask=s_ok[:, None] & m_ok[None, :], other=0.0)  # [BLOCK_SPLIT, BLOCK_M]
    sq = tl.sum(tl.load(sq_ws + offs_s * T + t, mask=s_ok, other=0.0), axis=0)
    r = 1.0 / tl.sqrt(sq * inv_w + eps)
    tl.store(out_ptr + t * M + offs_m, tl.sum(acc, axis=0) * r, mask=m_ok)


@triton.jit
def _post_stream(o, r0, r1, r2, r3, p, c0, c1, c2, c3, rn_ptrs, rn_mask, w_ptrs, w_mask, acc, sq,
                 FP32_DOT: tl.constexpr):
    # One output stream j: R_new_j = p_j * out + sum_i c_ij * R_i  ([BLOCK_T, BLOCK_D], fp32 math),
    # stored at the residual's dtype; the GEMM and the RMS then use exactly the stored values.
    new = p[:, None] * o + c0[:, None] * r0 + c1[:, None] * r1 + c2[:, None] * r2 + c3[:, None] * r3
    new = new.to(rn_ptrs.dtype.element_ty)
    tl.store(rn_ptrs, new, mask=rn_mask)
    w = tl.load(w_ptrs, mask=w_mask, other=0.0)  # [BLOCK_M, BLOCK_D]: hc_fn columns of stream j
    nf = new.to(tl.float32)
    sq += tl.sum(nf * nf, axis=1)
    acc = _mac(new, w, acc, FP32_DOT)
    return acc, sq


@triton.jit
def _post_pre_partials(r_ptr, o_ptr, post_ptr, comb_ptr, w_ptr, rn_ptr, acc_ws, sq_ws,
                       T, M, HID, chunk,
                       BLOCK_T: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_D: tl.constexpr,
                       FP32_DOT: tl.constexpr):
    # grid: (cdiv(T, BLOCK_T), SPLIT). R, R_new [T, 4, HID], out [T, HID], post [T, 4],
    # comb [T, 4, 4], hc_fn [M, 4 * HID]; this program covers hidden columns [lo, hi) of all 4
    # streams, so it reads each R value once and writes each R_new value once.
    offs_t = tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)  # [BLOCK_T]
    split = tl.program_id(1)
    offs_m = tl.arange(0, BLOCK_M)
    t_ok = offs_t < T
    m_ok = offs_m < M
    pb = post_ptr + offs_t * 4
    cb = comb_ptr + offs_t * 16  # comb[t, i, j] at t*16 + i*4 + j; all [BLOCK_T] vectors
    p0 = tl.load(pb + 0, mask=t_ok, other=0.0)
    p1 = tl.load(pb + 1, mask=t_ok, other=0.0)
    p2 = tl.load(pb + 2, mask=t_ok, other=0.0)
    p3 = tl.load(pb + 3, mask=t_ok, other=0.0)
    c00 = tl.load(cb + 0, mask=t_ok, other=0.0)
    c01 = tl.load(cb + 1, mask=t_ok, other=0.0)
    c02 = tl.load(cb + 2, mask=t_ok, other=0.0)
    c03 = tl.load(cb + 3, mask=t_ok, other=0.0)
    c10 = tl.load(cb + 4, mask=t_ok, other=0.0)
    c11 = tl.load(cb + 5, mask=t_ok, other=0.0)
    c12 = tl.load(cb + 6, mask=t_ok, other=0.0)
    c13 = tl.load(cb + 7, mask=t_ok, other=0.0)
    c20 = tl.load(cb + 8, mask=t_ok, other=0.0)
    c21 = tl.load(cb + 9, mask=t_ok, other=0.0)
    c22 = tl.load(cb + 10, mask=t_ok, other=0.0)
    c23 = tl.load(cb + 11, mask=t_ok, other=0.0)
    c30 = tl.load(cb + 12, mask=t_ok, other=0.0)
    c31 = tl.load(cb + 13, mask=t_ok, other=0.0)
    c32 = tl.load(cb + 14, mask=t_ok, other=0.0)
    c33 = tl.load(cb + 15, mask=t_ok, other=0.0)
    acc = tl.zeros([BLOCK_T, BLOCK_M], dtype=tl.float32)
    sq = tl.zeros([BLOCK_T], dtype=tl.float32)
    lo = split * chunk
    hi = tl.minimum(lo + chunk, HID)
    row4 = offs_t.to(tl.int64)[:, None] * 4 * HID  # [BLOCK_T, 1] start of token t's 4 streams
    wrow = offs_m.to(tl.int64)[:, None] * 4 * HID  # [BLOCK_M, 1]
    for d0 in range(lo, hi, BLOCK_D):
        offs_d = d0 + tl.arange(0, BLOCK_D)  # [BLOCK_D]
        mask = t_ok[:, None] & (offs_d < hi)[None, :]
        w_mask = m_ok[:, None] & (offs_d < hi)[None, :]
        o = tl.load(o_ptr + offs_t.to(tl.int64)[:, None] * HID + offs_d[None, :], mask=mask,
                    other=0.0).to(tl.float32)  # [BLOCK_T, BLOCK_D]
        rp = r_ptr + row4 + offs_d[None, :]
        r0 = tl.load(rp, mask=mask, other=0.0).to(tl.float32)
        r1 = tl.load(rp + HID, mask=mask, other=0.0).to(tl.float32)
        r2 = tl.load(rp + 2 * HID, mask=mask, other=0.0).to(tl.float32)
        r3 = tl.load(rp + 3 * HID, mask=mask, other=0.0).to(tl.float32)
        np_ = rn_ptr + row4 + offs_d[None, :]
        wp = w_ptr + wrow + offs_d[None, :]
        acc, sq = _post_stream(o, r0, r1, r2, r3, p0, c00, c10, c20, c30, np_, mask, wp, w_mask,
                               acc, sq, FP32_DOT)
        acc, sq = _post_stream(o, r0, r1, r2, r3, p1, c01, c11, c21, c31, np_ + HID, mask,
                               wp + HID, w_mask, acc, sq, FP32_DOT)
        acc, sq = _post_stream(o, r0, r1, r2, r3, p2, c02, c12, c22, c32, np_ + 2 * HID, mask,
                               wp + 2 * HID, w_mask, acc, sq, FP32_DOT)
        acc, sq = _post_stream(o, r0, r1, r2, r3, p3, c03, c13, c23, c33, np_ + 3 * HID, mask,
                               wp + 3 * HID, w_mask, acc, sq, FP32_DOT)
    _store_partials(acc_ws, sq_ws, acc, sq, offs_t, offs_m, t_ok, m_ok, split, T, M)


@triton.jit
def mhc_post_pre_fp32_kernel(r_ptr, o_ptr, post_ptr, comb_ptr, w_ptr, rn_ptr, acc_ws, sq_ws,
                             T, M, HID, chunk, BLOCK_T: tl.constexpr, BLOCK_M: tl.constexpr,
                             BLOCK_D: tl.constexpr):
    _post_pre_partials(r_ptr, o_ptr, post_ptr, comb_ptr, w_ptr, rn_ptr, acc_ws, sq_ws, T, M, HID,
                       chunk, BLOCK_T, BLOCK_M, BLOCK_D, True)


@triton.jit
def mhc_post_pre_bf16_kernel(r_ptr, o_ptr, post_ptr, comb_ptr, w_ptr, rn_ptr, acc_ws, sq_ws,
                             T, M, HID, chunk, BLOCK_T: tl.constexpr, BLOCK_M: tl.constexpr,
                             BLOCK_D: tl.constexpr):
    _post_pre_partials(r_ptr, o_ptr, post_ptr, comb_ptr, w_ptr, rn_ptr, acc_ws, sq_ws, T, M, HID,
                       chunk, BLOCK_T, BLOCK_M, BLOCK_D, False)


@functools.lru_cache(maxsize=None)
def _sm_count(device: torch.device) -> int:
    if device.type != "cuda":
        return 4  # interpreter: a few splits are enough to exercise the combine
    return torch.cuda.get_device_properties(device).multi_processor_count


def _plan(T: int, K: int, device: torch.device, split_k: int | None, block_k: int | None,
          ) -> tuple[int, int, int, int]:
    """(BLOCK_T, BLOCK_K, split, chunk): rows per program, K tile, programs along K, K per split.
    Auto split aims at ~2 programs per SM; chunk is a whole number of tiles."""
    block_t = min(64, max(16, triton.next_power_of_2(T)))
    if block_k is None:
        block_k = max(64, min(256, 8192 // block_t))  # keeps an x tile near 4-8K elements
    n_tiles = triton.cdiv(K, block_k)
    if split_k is None:
        split_k = max(1, 2 * _sm_count(device) // triton.cdiv(T, block_t))
    split_k = max(1, min(split_k, n_tiles))
    chunk = triton.cdiv(n_tiles, split_k) * block_k
    return block_t, block_k, triton.cdiv(K, chunk), chunk


def _fp32_dot(a: torch.dtype, b: torch.dtype) -> bool:
    # Tensor-core dot only when both operands are the same 16-bit type; the interpreter cannot
    # multiply bf16, so there bf16 goes through the fp32 path (same values, exact products).
    if a != b or a == torch.float32:
        return True
    return a == torch.bfloat16 and interpreting()


def _finish(acc_ws, sq_ws, T, M, W, eps, out, fp32_dot: bool) -> torch.Tensor:
    split = acc_ws.shape[0]
    kernel = mhc_prenorm_fp32_combine_kernel if fp32_dot else mhc_prenorm_bf16_combine_kernel
    kernel[(T,)](acc_ws, sq_ws, out, T, M, 1.0 / W, eps, SPLIT=split,
                 BLOCK_SPLIT=triton.next_power_of_2(split),
                 BLOCK_M=max(16, triton.next_power_of_2(M)), num_warps=4)
    return out


@torch.compiler.disable  # opaque to step_compile=inductor: a graph break, launched as built
def mhc_prenorm(x_flat: torch.Tensor, hc_fn: torch.Tensor, eps: float = 1e-6,
                split_k: int | None = None, block_k: int | None = None,
                num_warps: int = 4, out: torch.Tensor | None = None) -> torch.Tensor:
    """mixes [T, M] fp32 = (x_flat @ hc_fn.T) * rsqrt(mean(x_flat^2) + eps); contract of
    ref_ops.mhc_prenorm_ref. x_flat [T, W], hc_fn [M, W], fp32/fp16/bf16 each; `out` [T, M] fp32
    optional. split_k None: about two programs per SM."""
    check_tensor("x_flat", x_flat, 2, _FLOATS)
    check_tensor("hc_fn", hc_fn, 2, _FLOATS, x_flat.device)
    (T, W), M = x_flat.shape, hc_fn.shape[0]
    if hc_fn.shape[1] != W or W == 0:
        raise ValueError(f"mhc_prenorm: hc_fn {tuple(hc_fn.shape)} does not match x_flat "
                         f"{tuple(x_flat.shape)}")
    out = check_out("out", out, (T, M), torch.float32, x_flat.device)
    if T == 0:
        return out
    block_t, block_k, split, chunk = _plan(T, W, x_flat.device, split_k, block_k)
    acc_ws = torch.empty(split, T, M, device=x_flat.device, dtype=torch.float32)
    sq_ws = torch.empty(split, T, device=x_flat.device, dtype=torch.float32)
    fp32_dot = _fp32_dot(x_flat.dtype, hc_fn.dtype)
    kernel = mhc_prenorm_fp32_kernel if fp32_dot else mhc_prenorm_bf16_kernel
    kernel[(triton.cdiv(T, block_t), split)](
        x_flat, hc_fn, acc_ws, sq_ws, T, M, W, chunk, BLOCK_T=block_t,
        BLOCK_M=max(16, triton.next_power_of_2(M)), BLOCK_K=block_k,
        num_warps=num_warps)
    return _finish(acc_ws, sq_ws, T, M, W, eps, out, fp32_dot)


def mhc_post_pre_ref(residual: torch.Tensor, out: torch.Tensor, post: torch.Tensor,
                     comb: torch.Tensor, hc_fn: torch.Tensor,
                     eps: float = 1e-6) -> tuple[torch.Tensor, torch.Tensor]:
    """Torch reference of hc_post followed by the next hc_pre's pre-norm GEMM.

    residual [T, hc, hidden], out [T, hidden] (sublayer output), post [T, hc] fp32,
    comb [T, hc, hc] fp32 (comb[t, i, j]: weight of stream i in new stream j), hc_fn [M, hc*hidden].
    returns (R_new [T, hc, hidden] in residual.dtype, mixes [T, M] fp32 of R_new as stored).
    """
    T = residual.shape[0]
    new = post.float()[:, :, None] * out.float()[:, None, :] \
        + torch.einsum("tij,tid->tjd", comb.float(), residual.float())
    new = new.to(residual.dtype)
    return new, mhc_prenorm_ref(new.view(T, -1), hc_fn, eps)


@torch.compiler.disable  # opaque to step_compile=inductor: a graph break, launched as built
def mhc_post_pre_fused(residual: torch.Tensor, out: torch.Tensor, post: torch.Tensor,
                       comb: torch.Tensor, hc_fn: torch.Tensor, eps: float = 1e-6,
                       split_k: int | None = None, block_d: int | None = None,
                       num_warps: int = 4) -> tuple[torch.Tensor, torch.Tensor]:
    """hc_post + next hc_pre pre-norm in one pass; contract of `mhc_post_pre_ref` (hc = 4)."""
    check_tensor("residual", residual, 3, _FLOATS)
    T, HC, HID = residual.shape
    dev = residual.device
    check_tensor("out", out, 2, (residual.dtype,), dev)
    check_tensor("post", post, 2, (torch.float32,), dev)
    check_tensor("comb", comb, 3, (torch.float32,), dev)
    check_tensor("hc_fn", hc_fn, 2, _FLOATS, dev)
    if HC != 4:
        raise ValueError(f"mhc_post_pre_fused: hc_mult {HC}; the kernel is written for 4 streams")
    M = hc_fn.shape[0]
    if (tuple(out.shape) != (T, HID) or tuple(post.shape) != (T, HC)
            or tuple(comb.shape) != (T, HC, HC) or hc_fn.shape[1] != HC * HID or HID == 0):
        raise ValueError(f"mhc_post_pre_fused: shapes residual {tuple(residual.shape)}, out "
                         f"{tuple(out.shape)}, post {tuple(post.shape)}, comb {tuple(comb.shape)},"
                         f" hc_fn {tuple(hc_fn.shape)} do not agree")
    new = torch.empty_like(residual)
    if T == 0:
        return new, torch.empty(0, M, device=dev, dtype=torch.float32)
    # 32 hidden columns x 4 streams per step: on an H200 (2026-11-30) T=64 with 32-wide steps
    # (128 programs at hidden 4096) ran in 8 us, T=1/16 with 128-wide steps (32 programs) in 14 us:
    # parallelism across K matters more than tile width at decode sizes.
    block_t, block_d, split, chunk = _plan(T, HID, dev, split_k, block_d or 32)
    acc_ws = torch.empty(split, T, M, device=dev, dtype=torch.float32)
    sq_ws = torch.empty(split, T, device=dev, dtype=torch.float32)
    fp32_dot = _fp32_dot(residual.dtype, hc_fn.dtype)
    kernel = mhc_post_pre_fp32_kernel if fp32_dot else mhc_post_pre_bf16_kernel
    kernel[(triton.cdiv(T, block_t), split)](
        residual, out, post, comb, hc_fn, new, acc_ws, sq_ws, T, M, HID, chunk,
        BLOCK_T=block_t, BLOCK_M=max(16, triton.next_power_of_2(M)), BLOCK_D=block_d,
        num_warps=num_warps)
    mixes = torch.empty(T, M, device=dev, dtype=torch.float32)
    return new, _finish(acc_ws, sq_ws, T, M, HC * HID, eps, mixes, fp32_dot)
