"""Sparse multi-query decode attention in Triton: the per-head SIMT kernel and the MMA kernel.

Contract: `dsv4.ref_ops.sparse_mqa_decode_ref`. One decode token per sequence; all H query heads
share one latent K=V row per cache entry; `idx` picks up to K entries (-1 = empty slot); a learned
per-head sink logit adds exp(sink) to the softmax denominator.

Two variants (the `attention` knob):
  per_head  one program per (token, head[, split]). Every program gathers the same KV rows again
            (H-fold redundant reads) and scores with an elementwise multiply + row sum on the CUDA
            cores: the slow kernel of the case study, kept as the baseline.
  mma       one program per (token, tile of heads[, split]). Each KV tile is gathered once per head
            tile and used for S = Q K^T and O += P V through tl.dot (tensor cores).
Both use the online softmax in base 2 (scale * log2(e) folded into the scores). With split_k > 1 the
selected entries are cut into split_k contiguous ranges; each program writes a partial (max, sum,
acc) and `sparse_mqa_decode_combine_kernel` merges them, adding the sink once, in the final denominator.

The helpers at the bottom (`check_tensor`, `interpreting`) are shared by the other dsv4.triton_*
modules so every wrapper reports bad inputs the same way.
"""
from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

LOG2E_F = 1.4426950408889634
LOG2E = tl.constexpr(LOG2E_F)  # kernels may read only constexpr globals
MODES = ("per_head", "mma")


@triton.jit
def sparse_mqa_decode_per_head_kernel(q_ptr, kv_ptr, idx_ptr, sink_ptr, out_ptr, m_ws, l_ws, acc_ws,
                     H, stride_kb, K, chunk, qk_scale,
                     D: tl.constexpr, BLOCK_KV: tl.constexpr, SPLIT: tl.constexpr):
    # grid: (B * H, SPLIT). One head of one token; entries [split*chunk, split*chunk + chunk).
    bh = tl.program_id(0)
    split = tl.program_id(1)
    b = bh // H
    h = bh % H
    offs_d = tl.arange(0, D)  # [D]
    q = tl.load(q_ptr + bh.to(tl.int64) * D + offs_d).to(tl.float32)  # [D]
    # Start the running max at the sink: it keeps every exp2 argument finite (no NaN from
    # -inf - -inf on all-empty rows) and, with l = 1, counts the sink exactly once (split == 1).
    sink2 = tl.load(sink_ptr + h) * LOG2E
    m_i = sink2
    if SPLIT == 1:
        l_i = tl.full([], 1.0, dtype=tl.float32)
    else:
        l_i = tl.full([], 0.0, dtype=tl.float32)
    acc = tl.zeros([D], dtype=tl.float32)  # [D]
    kv_base = kv_ptr + b.to(tl.int64) * stride_kb  # kv may be a slice of a longer cache
    lo = split * chunk
    hi = tl.minimum(lo + chunk, K)
    for start in range(lo, hi, BLOCK_KV):
        offs_k = start + tl.arange(0, BLOCK_KV)  # [BLOCK_KV]
        ids = tl.load(idx_ptr + b * K + offs_k, mask=offs_k < hi, other=-1)  # [BLOCK_KV]
        valid = ids >= 0
        rows = kv_base + ids.to(tl.int64)[:, None] * D + offs_d[None, :]
        kv = tl.load(rows, mask=valid[:, None], other=0.0).to(tl.float32)  # [BLOCK_KV, D]
        # .to(fp32): a float argument may arrive as fp64 (torch.compile's wrapper of user kernels), and
        # the loop-carried running max must keep one type
        s = (tl.sum(kv * q[None, :], axis=1) * qk_scale).to(tl.float32)  # [BLOCK_KV], no tensor cores
        s = tl.where(valid, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, axis=0))
        alpha = tl.exp2(m_i - m_new)
        p = tl.exp2(s - m_new)  # [BLOCK_KV]; empty slots give exp2(-inf) = 0
        l_i = l_i * alpha + tl.sum(p, axis=0)
        acc = acc * alpha + tl.sum(p[:, None] * kv, axis=0)
        m_i = m_new
    if SPLIT == 1:
        tl.store(out_ptr + bh.to(tl.int64) * D + offs_d, (acc / l_i).to(out_ptr.dtype.element_ty))
    else:
        ws = (b * SPLIT + split) * H + h  # partials laid out [B, SPLIT, H(, D)]
        tl.store(m_ws + ws, m_i)
        tl.store(l_ws + ws, l_i)
        tl.store(acc_ws + ws.to(tl.int64) * D + offs_d, acc)


@triton.jit
def sparse_mqa_decode_mma_kernel(q_ptr, kv_ptr, idx_ptr, sink_ptr, out_ptr, m_ws, l_ws, acc_ws,
                H, stride_kb, K, chunk, qk_scale,
                D: tl.constexpr, BLOCK_KV: tl.constexpr, BLOCK_H: tl.constexpr,
                HEADS: tl.constexpr, SPLIT: tl.constexpr, FP32_DOT: tl.constexpr):
    # grid: (B, cdiv(H, HEADS), SPLIT). HEADS heads of one token share every KV gather; BLOCK_H is
    # HEADS padded to tl.dot's minimum of 16 rows (padded rows see q = 0 and are never stored).
    b = tl.program_id(0)
    tile = tl.program_id(1)
    split = tl.program_id(2)
    offs_h = tile * HEADS + tl.arange(0, BLOCK_H)  # [BLOCK_H]
    h_ok = (tl.arange(0, BLOCK_H) < HEADS) & (offs_h < H)
    offs_d = tl.arange(0, D)  # [D]
    q_rows = q_ptr + (b * H + offs_h).to(tl.int64)[:, None] * D + offs_d[None, :]
    q = tl.load(q_rows, mask=h_ok[:, None], other=0.0)  # [BLOCK_H, D], input dtype
    sink2 = tl.load(sink_ptr + offs_h, mask=h_ok, other=0.0) * LOG2E  # [BLOCK_H]
    m_i = sink2  # see sparse_mqa_decode_per_head_kernel: finite start, sink counted once
    if SPLIT == 1:
        l_i = tl.full([BLOCK_H], 1.0, dtype=tl.float32)
    else:
        l_i = tl.zeros([BLOCK_H], dtype=tl.float32)
    acc = tl.zeros([BLOCK_H, D], dtype=tl.float32)
    kv_base = kv_ptr + b.to(tl.int64) * stride_kb  # kv may be a slice of a longer cache
    lo = split * chunk
    hi = tl.minimum(lo + chunk, K)
    for start in range(lo, hi, BLOCK_KV):
        offs_k = start + tl.arange(0, BLOCK_KV)  # [BLOCK_KV]
        ids = tl.load(idx_ptr + b * K + offs_k, mask=offs_k < hi, other=-1)
        valid = ids >= 0
        rows = kv_base + ids.to(tl.int64)[:, None] * D + offs_d[None, :]
        kv = tl.load(rows, mask=valid[:, None], other=0.0)  # [BLOCK_KV, D], gathered once
        if FP32_DOT:  # fp32 products, not TF32 (fp32 inputs; bf16 under the interpreter)
            s = tl.dot(q.to(tl.float32), tl.trans(kv.to(tl.float32)), input_precision="ieee")
        else:
            s = tl.dot(q, tl.trans(kv))
        s = tl.where(valid[None, :], (s * qk_scale).to(tl.float32), float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, axis=1))  # [BLOCK_H]
        alpha = tl.exp2(m_i - m_new)
        p = tl.exp2(s - m_new[:, None])  # [BLOCK_H, BLOCK_KV]
        l_i = l_i * alpha + tl.sum(p, axis=1)
        # P goes to the KV dtype so the second product also runs on the tensor cores (flash style).
        if FP32_DOT:
            pv = tl.dot(p, kv.to(tl.float32), input_precision="ieee")
        else:
            pv = tl.dot(p.to(kv.dtype), kv)  # [BLOCK_H, D]
        acc = acc * alpha[:, None] + pv
        m_i = m_new
    if SPLIT == 1:
        out = acc / l_i[:, None]
        o_rows = out_ptr + (b * H + offs_h).to(tl.int64)[:, None] * D + offs_d[None, :]
        tl.store(o_rows, out.to(out_ptr.dtype.element_ty), mask=h_ok[:, None])
    else:
        ws = (b * SPLIT + split) * H + offs_h  # [BLOCK_H]
        tl.store(m_ws + ws, m_i, mask=h_ok)
        tl.store(l_ws + ws, l_i, mask=h_ok)
        tl.store(acc_ws + ws.to(tl.int64)[:, None] * D + offs_d[None, :], acc, mask=h_ok[:, None])


@triton.jit
def sparse_mqa_decode_combine_kernel(sink_ptr, m_ws, l_ws, acc_ws, out_ptr, H,
                    D: tl.constexpr, SPLIT: tl.constexpr, BLOCK_SPLIT: tl.constexpr):
    # grid: (B, H). Merge the SPLIT partials of one (token, head): rescale each to the common max,
    # add the sink's exp2 once to the denominator.
    b = tl.program_id(0)
    h = tl.program_id(1)
    offs_s = tl.arange(0, BLOCK_SPLIT)  # [BLOCK_SPLIT]
    s_ok = offs_s < SPLIT
    ws = (b * SPLIT + offs_s) * H + h
    m_s = tl.load(m_ws + ws, mask=s_ok, other=float("-inf"))  # [BLOCK_SPLIT], each >= sink
    l_s = tl.load(l_ws + ws, mask=s_ok, other=0.0)
    offs_d = tl.arange(0, D)
    acc_s = tl.load(acc_ws + ws.to(tl.int64)[:, None] * D + offs_d[None, :], mask=s_ok[:, None],
                    other=0.0)  # [BLOCK_SPLIT, D]
    sink2 = tl.load(sink_ptr + h) * LOG2E
    m = tl.maximum(tl.max(m_s, axis=0), sink2)
    w = tl.exp2(m_s - m)  # [BLOCK_SPLIT]; padded splits: exp2(-inf) = 0
    denom = tl.sum(l_s * w, axis=0) + tl.exp2(sink2 - m)
    out = tl.sum(acc_s * w[:, None], axis=0) / denom  # [D]
    tl.store(out_ptr + (b * H + h).to(tl.int64) * D + offs_d, out.to(out_ptr.dtype.element_ty))


def _check_decode_args(q: torch.Tensor, kv: torch.Tensor, idx: torch.Tensor, sink: torch.Tensor,
                       mode: str, block_kv: int, heads_per_tile: int, split_k: int) -> None:
    """sparse_mqa_decode's input contract; ValueError naming the argument."""
    if mode not in MODES:
        raise ValueError(f"sparse_mqa_decode: mode {mode!r}, expected one of {MODES}")
    check_tensor("q", q, 3, (torch.float32, torch.float16, torch.bfloat16))
    B, H, D = q.shape
    _check_kv(kv, q)
    check_tensor("idx", idx, 2, (torch.int32,), q.device)
    check_tensor("sink", sink, 1, (torch.float32,), q.device)
    if kv.shape[0] != B or kv.shape[2] != D:
        raise ValueError(f"sparse_mqa_decode: kv {tuple(kv.shape)} does not match q {tuple(q.shape)}")
    if idx.shape[0] != B or sink.shape[0] != H:
        raise ValueError(f"sparse_mqa_decode: idx {tuple(idx.shape)} / sink {tuple(sink.shape)} do "
                         f"not match B={B}, H={H}")
    if D < 16 or D & (D - 1):
        raise ValueError(f"sparse_mqa_decode: head dim {D} must be a power of two >= 16")
    for name, v in (("block_kv", block_kv), ("heads_per_tile", heads_per_tile)):
        if v < 1 or v & (v - 1):
            raise ValueError(f"sparse_mqa_decode: {name}={v} must be a power of two")
    if mode == "mma" and block_kv < 16:
        raise ValueError(f"sparse_mqa_decode: mma needs block_kv >= 16 (tl.dot), got {block_kv}")
    if split_k < 1:
        raise ValueError(f"sparse_mqa_decode: split_k={split_k} must be >= 1")


def sparse_mqa_decode(q: torch.Tensor, kv: torch.Tensor, idx: torch.Tensor, sink: torch.Tensor,
                      scale: float, mode: str = "mma", block_kv: int = 64, heads_per_tile: int = 16,
                      num_warps: int = 4, num_stages: int = 2, split_k: int = 1,
                      out: torch.Tensor | None = None) -> torch.Tensor:
    """Sparse MQA decode attention; same contract as ref_ops.sparse_mqa_decode_ref.

    q [B, H, D], kv [B, S, D] (same dtype as q; dense rows, any batch stride, so a [:, :S] slice of
    a longer cache works), idx [B, K] int32 (-1 = empty), sink [H] fp32.
    D must be a power of two >= 16. Returns [B, H, D] in q.dtype. Indices are not range-checked
    (that would need a host sync); an index >= S reads out of bounds. `out`, if given, is
    written in place (a static buffer for CUDA graphs).
    """
    _check_decode_args(q, kv, idx, sink, mode, block_kv, heads_per_tile, split_k)
    B, H, D = q.shape
    K = idx.shape[1]
    out = check_out("out", out, q.shape, q.dtype, q.device)
    if B == 0 or H == 0:
        return out
    # Each split covers whole tiles, so tiles never straddle two programs.
    chunk = triton.cdiv(triton.cdiv(max(K, 1), split_k), block_kv) * block_kv
    if split_k > 1:
        m_ws = torch.empty(B, split_k, H, device=q.device, dtype=torch.float32)
        l_ws = torch.empty_like(m_ws)
        acc_ws = torch.empty(B, split_k, H, D, device=q.device, dtype=torch.float32)
    else:  # unused by the kernels when SPLIT == 1
        m_ws = l_ws = acc_ws = out
    qk_scale = float(scale) * LOG2E_F
    if mode == "per_head":
        sparse_mqa_decode_per_head_kernel[(B * H, split_k)](
            q, kv, idx, sink, out, m_ws, l_ws, acc_ws, H, kv.stride(0), K, chunk, qk_scale,
            D=D, BLOCK_KV=block_kv, SPLIT=split_k, num_warps=num_warps, num_stages=num_stages)
    else:
        heads = min(heads_per_tile, triton.next_power_of_2(H))
        sparse_mqa_decode_mma_kernel[(B, triton.cdiv(H, heads), split_k)](
            q, kv, idx, sink, out, m_ws, l_ws, acc_ws, H, kv.stride(0), K, chunk, qk_scale,
            D=D, BLOCK_KV=block_kv, BLOCK_H=max(16, heads), HEADS=heads, SPLIT=split_k,
            # the interpreter multiplies bf16 bit patterns as integers: fp32 products there
            FP32_DOT=q.dtype == torch.float32 or (q.dtype == torch.bfloat16 and interpreting()),
            num_warps=num_warps, num_stages=num_stages)
    if split_k > 1:
        sparse_mqa_decode_combine_kernel[(B, H)](sink, m_ws, l_ws, acc_ws, out, H, D=D, SPLIT=split_k,
                                BLOCK_SPLIT=triton.next_power_of_2(split_k), num_warps=4)
    return out



@torch.library.custom_op("dsv4::sparse_mqa_decode", mutates_args=())
def sparse_mqa_decode_op(q: torch.Tensor, kv: torch.Tensor, idx: torch.Tensor, sink: torch.Tensor,
                         scale: float, mode: str, block_kv: int, heads_per_tile: int, num_warps: int,
                         num_stages: int, split_k: int) -> torch.Tensor:
    """`sparse_mqa_decode` as one opaque operator, for code under torch.compile: Inductor then calls
    the kernel as built instead of re-tracing its Triton source (which it re-types and re-compiles,
    and may reject: the reason torch.compile of the starting point once failed on the H200)."""
    return sparse_mqa_decode(q, kv, idx, sink, scale, mode=mode, block_kv=block_kv,
                             heads_per_tile=heads_per_tile, num_warps=num_warps,
                             num_stages=num_stages, split_k=split_k)


@sparse_mqa_decode_op.register_fake
def _sparse_mqa_decode_fake(q: torch.Tensor, kv: torch.Tensor, idx: torch.Tensor, sink: torch.Tensor,
                            scale: float, mode: str, block_kv: int, heads_per_tile: int,
                            num_warps: int, num_stages: int, split_k: int) -> torch.Tensor:
    return torch.empty_like(q)  # [B, H, D] in q.dtype, like the kernel's output

def _check_kv(kv: torch.Tensor, q: torch.Tensor) -> None:
    if kv.dim() != 3:
        raise ValueError(f"kv: expected 3 dims, got shape {tuple(kv.shape)}")
    # the strides the kernel relies on; then dtype/device (on one row: the rest is dense too)
    if kv.stride(2) != 1 or (kv.shape[1] > 1 and kv.stride(1) != kv.shape[2]):
        raise ValueError(f"kv: rows must be dense (strides [*, D, 1]), got {kv.stride()}; "
                         "call .contiguous() first")
    check_tensor("kv", kv[:1, :1], 3, (q.dtype,), q.device)


# ---- shared input checks for the dsv4.triton_* wrappers ----

def interpreting() -> bool:
    """True when Triton runs kernels in its CPU interpreter (TRITON_INTERPRET=1)."""
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def check_tensor(name: str, t: torch.Tensor, ndim: int, dtypes: tuple[torch.dtype, ...],
                 device: torch.device | None = None) -> None:
    """Raise ValueError unless `t` has `ndim` dims, one of `dtypes`, is contiguous and lives where a
    Triton kernel can read it (a CUDA device; the CPU only under the interpreter), on `device`."""
    if not isinstance(t, torch.Tensor):
        raise ValueError(f"{name}: expected a torch.Tensor, got {type(t).__name__}")
    if t.dim() != ndim:
        raise ValueError(f"{name}: expected {ndim} dims, got shape {tuple(t.shape)}")
    if t.dtype not in dtypes:
        allowed = ", ".join(str(d).replace("torch.", "") for d in dtypes)
        raise ValueError(f"{name}: dtype {str(t.dtype).replace('torch.', '')}, expected {allowed}")
    if not t.is_contiguous():
        raise ValueError(f"{name}: must be contiguous (call .contiguous() first)")
    if t.device.type != "cuda" and not (t.device.type == "cpu" and interpreting()):
        raise ValueError(f"{name}: on {t.device}; Triton kernels need a CUDA tensor "
                         "(CPU tensors only with TRITON_INTERPRET=1)")
    if device is not None and t.device != device:
        raise ValueError(f"{name}: on {t.device}, expected {device} like the other inputs")



def check_out(name: str, out: torch.Tensor | None, shape: tuple[int, ...], dtype: torch.dtype,
              device: torch.device) -> torch.Tensor:
    """A fresh output tensor, or the caller's `out` after checking it matches exactly."""
    if out is None:
        return torch.empty(shape, device=device, dtype=dtype)
    if tuple(out.shape) != tuple(shape) or out.dtype != dtype or out.device != device:
        raise ValueError(f"{name}: expected {tuple(shape)} {dtype} on {device}, got "
                         f"{tuple(out.shape)} {out.dtype} on {out.device}")
    if not out.is_contiguous():
        raise ValueError(f"{name}: must be contiguous")
    return out
