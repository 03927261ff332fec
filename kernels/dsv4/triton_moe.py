"""Routed experts as a grouped GEMM in Triton, with no host synchronisation (CUDA-graph safe).

Contract: `dsv4.ref_ops.moe_experts_ref`:
    out[t] = sum_j topk_weights[t, j] * w_down[e] @ swiglu(w_gate[e] @ x[t], w_up[e] @ x[t]),
    e = topk_ids[t, j], swiglu clamped at swiglu_limit.

The "loop" variant launches a few GEMMs per active expert and needs the set of active experts on the
host (a sync, and a different launch sequence every step, so no CUDA graph). Here:
  1. the T*k (token, expert) pairs are sorted by expert on the device, and per-expert counts ->
     cumulative sums give each expert a contiguous segment cut into BLOCK_M-row blocks. Up to
     ROUTE_KERNEL_MAX_PAIRS pairs this routing metadata is ONE launch (`moe_route_kernel`, a stable
     counting sort in one program); above, ~15 torch launches (sort, scatter-add, scans, search).
     At C=1 on the H200 the torch chain cost ~25 us per layer, as much as the down GEMM's weights;
  2. the grid has a host-known upper bound of blocks, cdiv(T*k, BLOCK_M) + min(E, T*k) (each
     expert wastes at most one partial block); block b finds its expert by torch.searchsorted, and
     blocks past the last one exit at once;
  3. `moe_gate_up_kernel`: for its rows, gather x rows, [BLOCK_M, hidden] x w_gate[e]^T and
     x w_up[e]^T, clamped SwiGLU in registers -> h (sorted order);
  4. `moe_down_kernel`: h x w_down[e]^T, times the routing weight, written per pair;
  5. `moe_reduce_kernel`: out[t] = sum of its k pair rows, in a fixed order (deterministic, no
     atomics), cast to x.dtype.
All shapes, hence all launches, depend only on (T, k, E), so the sequence can be graph-captured.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from dsv4.triton_attention import check_out, check_tensor, interpreting

_FLOATS = (torch.float32, torch.float16, torch.bfloat16)
# One program compares every pair with every earlier one (O(N^2)): cheap up to a few thousand pairs
# (C=64 x top-6 is 384), slower than the torch chain beyond.
ROUTE_KERNEL_MAX_PAIRS = 2048


@triton.jit
def moe_route_kernel(ids_ptr, order_ptr, seg_start_ptr, seg_end_ptr, blk_start_ptr, blk_expert_ptr,
                     N, E, MAX_BLOCKS, BLOCK_M: tl.constexpr, BLOCK_E: tl.constexpr,
                     CHUNK_E: tl.constexpr, CHUNK: tl.constexpr):
    # grid (1,). ids [N] expert of each (token, slot) pair, pair = t*k + j. Writes, all int32:
    # order [N] pair ids grouped by expert (stable), seg_start / seg_end / blk_start [E] (first row,
    # end row, first block of each expert), blk_expert [MAX_BLOCKS] (E: past the last block).
    e_offs = tl.arange(0, BLOCK_E)
    e_ok = e_offs < E
    counts = tl.zeros([BLOCK_E], dtype=tl.int32)
    for n0 in range(0, N, CHUNK_E):  # [BLOCK_E, CHUNK_E] compares a pass
        offs = n0 + tl.arange(0, CHUNK_E)
        ids = tl.load(ids_ptr + offs, mask=offs < N, other=-1)  # [CHUNK_E]; -1 matches no expert
        counts += tl.sum((ids[None, :] == e_offs[:, None]).to(tl.int32), axis=1)
    seg_end = tl.cumsum(counts, axis=0)
    n_blk = (counts + BLOCK_M - 1) // BLOCK_M
    blk_end = tl.cumsum(n_blk, axis=0)
    tl.store(seg_start_ptr + e_offs, seg_end - counts, mask=e_ok)
    tl.store(seg_end_ptr + e_offs, seg_end, mask=e_ok)
    tl.store(blk_start_ptr + e_offs, blk_end - n_blk, mask=e_ok)
    for b0 in range(0, MAX_BLOCKS, CHUNK_E):  # searchsorted(blk_end, b, right=True)
        b = b0 + tl.arange(0, CHUNK_E)
        owner = tl.sum(((blk_end[None, :] <= b[:, None]) & e_ok[None, :]).to(tl.int32), axis=1)
        tl.store(blk_expert_ptr + b, owner, mask=b < MAX_BLOCKS)
    tl.debug_barrier()  # seg_start is read back below, gathered by expert id
    for i0 in range(0, N, CHUNK):  # pair i -> seg_start[id_i] + #(earlier pairs of its expert)
        i = i0 + tl.arange(0, CHUNK)
        i_ok = i < N
        id_i = tl.load(ids_ptr + i, mask=i_ok, other=-1)
        rank = tl.zeros([CHUNK], dtype=tl.int32)
        for j0 in range(0, i0 + CHUNK, CHUNK):  # only earlier pairs count
            j = j0 + tl.arange(0, CHUNK)
            id_j = tl.load(ids_ptr + j, mask=j < N, other=-2)
            same = (id_j[None, :] == id_i[:, None]) & (j[None, :] < i[:, None])  # [CHUNK, CHUNK]
            rank += tl.sum(same.to(tl.int32), axis=1)
        first = tl.load(seg_start_ptr + id_i, mask=i_ok, other=0)
        tl.store(order_ptr + first + rank, i.to(tl.int32), mask=i_ok)


@triton.jit
def _block_rows(blk_expert, seg_start, seg_end, blk_start, E, BLOCK_M: tl.constexpr):
    # -> (expert, rows [BLOCK_M] into the expert-sorted pair list, row mask). expert == E: no work.
    pid = tl.program_id(0)
    e = tl.load(blk_expert + pid)
    e_safe = tl.minimum(e, E - 1)
    first = tl.load(seg_start + e_safe) + (pid - tl.load(blk_start + e_safe)) * BLOCK_M
    rows = first + tl.arange(0, BLOCK_M)
    end = tl.where(e < E, tl.load(seg_end + e_safe), 0)  # blocks past the last expert: no rows
    r_ok = rows < end
    return e_safe, rows, r_ok


@triton.jit
def _mm(a, b, acc, FP32_DOT: tl.constexpr):
    # acc [BM, BN] += a [BM, BK] @ b[BN, BK]^T
    if FP32_DOT:
        acc = tl.dot(a.to(tl.float32), tl.trans(b.to(tl.float32)), acc, input_precision="ieee")
    else:
        acc = tl.dot(a, tl.trans(b), acc)
    return acc


@triton.jit
def moe_gate_up_kernel(x_ptr, wg_ptr, wu_ptr, order_ptr, blk_expert, seg_start, seg_end, blk_start,
                       h_ptr, E, HIDDEN, INNER, TOPK, limit,
                       BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                       FP32_DOT: tl.constexpr):
    # grid: (max_blocks, cdiv(INNER, BLOCK_N)). x [T, HIDDEN], w_gate/w_up [E, INNER, HIDDEN],
    # h [T*k, INNER] in expert-sorted row order.
    e, rows, r_ok = _block_rows(blk_expert, seg_start, seg_end, blk_start, E, BLOCK_M)
    if tl.max(r_ok.to(tl.int32), axis=0) > 0:  # blocks past the last expert's segment: no work
        tok = tl.load(order_ptr + rows, mask=r_ok, other=0) // TOPK  # [BLOCK_M] token of each pair
        offs_n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)  # [BLOCK_N]
        n_ok = offs_n < INNER
        w_rows = e.to(tl.int64) * INNER * HIDDEN + offs_n.to(tl.int64)[:, None] * HIDDEN
        acc_g = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
        acc_u = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
        for k0 in range(0, HIDDEN, BLOCK_K):
            offs_k = k0 + tl.arange(0, BLOCK_K)
            k_ok = offs_k < HIDDEN
            x = tl.load(x_ptr + tok.to(tl.int64)[:, None] * HIDDEN + offs_k[None, :],
                        mask=r_ok[:, None] & k_ok[None, :], other=0.0)  # [BLOCK_M, BLOCK_K]
            w_mask = n_ok[:, None] & k_ok[None, :]
            wg = tl.load(wg_ptr + w_rows + offs_k[None, :], mask=w_mask, other=0.0)  # [BN, BK]
            wu = tl.load(wu_ptr + w_rows + offs_k[None, :], mask=w_mask, other=0.0)
            acc_g = _mm(x, wg, acc_g, FP32_DOT)
            acc_u = _mm(x, wu, acc_u, FP32_DOT)
        g = tl.minimum(acc_g, limit)
        u = tl.minimum(tl.maximum(acc_u, -limit), limit)
        h = g / (1.0 + tl.exp(-g)) * u  # silu(min(g, limit)) * clamp(u, +-limit), fp32
        tl.store(h_ptr + rows.to(tl.int64)[:, None] * INNER + offs_n[None, :],
                 h.to(h_ptr.dtype.element_ty), mask=r_ok[:, None] & n_ok[None, :])


@triton.jit
def moe_down_kernel(h_ptr, wd_ptr, order_ptr, topw_ptr, blk_expert, seg_start, seg_end, blk_start,
                    y_ptr, E, HIDDEN, INNER,
                    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                    FP32_DOT: tl.constexpr):
    # grid: (max_blocks, cdiv(HIDDEN, BLOCK_N)). w_down [E, HIDDEN, INNER]; y [T*k, HIDDEN] fp32,
    # row = pair index (t*k + j), already weighted by topk_weights[t, j].
    e, rows, r_ok = _block_rows(blk_expert, seg_start, seg_end, blk_start, E, BLOCK_M)
    if tl.max(r_ok.to(tl.int32), axis=0) > 0:
        pair = tl.load(order_ptr + rows, mask=r_ok, other=0)  # [BLOCK_M]
        offs_n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
        n_ok = offs_n < HIDDEN
        w_rows = e.to(tl.int64) * HIDDEN * INNER + offs_n.to(tl.int64)[:, None] * INNER
        acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
        for k0 in range(0, INNER, BLOCK_K):
            offs_k = k0 + tl.arange(0, BLOCK_K)
            k_ok = offs_k < INNER
            h = tl.load(h_ptr + rows.to(tl.int64)[:, None] * INNER + offs_k[None, :],
                        mask=r_ok[:, None] & k_ok[None, :], other=0.0)  # [BLOCK_M, BLOCK_K]
            wd = tl.load(wd_ptr + w_rows + offs_k[None, :], mask=n_ok[:, None] & k_ok[None, :],
                         other=0.0)  # [BLOCK_N, BLOCK_K]
            acc = _mm(h, wd, acc, FP32_DOT)
        wt = tl.load(topw_ptr + pair, mask=r_ok, other=0.0)  # [BLOCK_M] routing weights
        tl.store(y_ptr + pair.to(tl.int64)[:, None] * HIDDEN + offs_n[None, :], acc * wt[:, None],
                 mask=r_ok[:, None] & n_ok[None, :])


@triton.jit
def moe_reduce_kernel(y_ptr, out_ptr, HIDDEN, TOPK: tl.constexpr, BLOCK: tl.constexpr):
    # grid: (T, cdiv(HIDDEN, BLOCK)). out[t] = sum_j y[t*k + j] in j order.
    t = tl.program_id(0)
    offs = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    ok = offs < HIDDEN
    acc = tl.zeros([BLOCK], dtype=tl.float32)
    for j in tl.static_range(TOPK):
        acc += tl.load(y_ptr + (t * TOPK + j).to(tl.int64) * HIDDEN + offs, mask=ok, other=0.0)
    tl.store(out_ptr + t.to(tl.int64) * HIDDEN + offs, acc.to(out_ptr.dtype.element_ty), mask=ok)


@triton.jit
def moe_router_topk_kernel(logits_ptr, bias_ptr, ids_ptr, w_ptr, E, scale, TOPK: tl.constexpr,
                       BLOCK_E: tl.constexpr, BLOCK_K: tl.constexpr):
    # grid (T,). logits [T, E] fp32 (the router GEMM), bias [E] fp32 (steers selection only)
    # -> ids [T, TOPK] int32 by descending biased score, w [T, TOPK] fp32 = scale * s / sum(s),
    # s = sqrt(softplus(logits)): dsv4.moe.route after its GEMM, in one launch instead of ~5.
    t = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, BLOCK_E)
    ok = offs < E
    x = tl.load(logits_ptr + t * E + offs, mask=ok, other=0.0)
    # softplus (beta 1, threshold 20) as max(x, 0) + log(1 + exp(-|x|)): no overflow
    sp = tl.where(x > 20.0, x, tl.maximum(x, 0.0) + tl.log(1.0 + tl.exp(-tl.abs(x))))
    s = tl.sqrt(sp)
    sel = tl.where(ok, s + tl.load(bias_ptr + offs, mask=ok, other=0.0), float("-inf"))
    k_offs = tl.arange(0, BLOCK_K)
    ids = tl.zeros([BLOCK_K], dtype=tl.int32)
    w = tl.zeros([BLOCK_K], dtype=tl.float32)
    for j in tl.static_range(TOPK):  # k rounds of arg-max (lowest index on a tie), then mask it
        best = tl.max(sel, axis=0)
        e = tl.min(tl.where(sel == best, offs, BLOCK_E), axis=0)
        ids = tl.where(k_offs == j, e, ids)
        w = tl.where(k_offs == j, tl.sum(tl.where(offs == e, s, 0.0), axis=0), w)
        sel = tl.where(offs == e, float("-inf"), sel)
    w = w / tl.sum(w, axis=0) * scale
    tl.store(ids_ptr + t * TOPK + k_offs, ids, mask=k_offs < TOPK)
    tl.store(w_ptr + t * TOPK + k_offs, w, mask=k_offs < TOPK)


@torch.compiler.disable  # opaque to step_compile=inductor: a graph break, launched as built
def router_topk(logits: torch.Tensor, bias: torch.Tensor, topk: int,
                scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    """logits [T, E] fp32, bias [E] fp32 -> (ids [T, topk] int32, weights [T, topk] fp32); the
    contract of dsv4.moe.route's top-k path (ids in descending order of the biased score)."""
    check_tensor("logits", logits, 2, (torch.float32,))
    check_tensor("bias", bias, 1, (torch.float32,), logits.device)
    T, E = logits.shape
    if not 0 < topk <= E or bias.shape[0] != E:
        raise ValueError(f"router_topk: topk={topk} of E={E} experts, bias {tuple(bias.shape)}")
    ids = torch.empty(T, topk, device=logits.device, dtype=torch.int32)
    w = torch.empty(T, topk, device=logits.device, dtype=torch.float32)
    if T:
        moe_router_topk_kernel[(T,)](logits.contiguous(), bias.contiguous(), ids, w, E, float(scale),
                                 TOPK=topk, BLOCK_E=max(16, triton.next_power_of_2(E)),
                                 BLOCK_K=triton.next_power_of_2(topk), num_warps=1)
    return ids, w


def route_metadata(topk_ids: torch.Tensor, E: int, block_m: int,
                   max_blocks: int) -> tuple[torch.Tensor, torch.Tensor, list[torch.Tensor]]:
    """topk_ids [T, k] -> (order [N], blk_expert [max_blocks], [seg_start, seg_end, blk_start] [E]),
    all int32 on the device; see moe_route_kernel. Which path ran: route_path(N)."""
    n_pairs, dev = topk_ids.numel(), topk_ids.device
    if n_pairs <= ROUTE_KERNEL_MAX_PAIRS:
        i32 = dict(device=dev, dtype=torch.int32)
        order, blk_expert = torch.empty(n_pairs, **i32), torch.empty(max_blocks, **i32)
        meta = [torch.empty(E, **i32) for _ in range(3)]
        block_e = max(16, triton.next_power_of_2(E))
        # tiles of ~1k elements (8 a thread): [128, 128] tiles spilled registers and took 17 us per
        # call at C=1 on the H200
        moe_route_kernel[(1,)](topk_ids.reshape(-1).contiguous(), order, *meta, blk_expert, n_pairs,
                               E, max_blocks, BLOCK_M=block_m, BLOCK_E=block_e,
                               CHUNK_E=max(4, 1024 // block_e), CHUNK=32, num_warps=4)
        return order, blk_expert, meta
    flat = topk_ids.reshape(-1).to(torch.int64)  # [N]
    order = torch.sort(flat, stable=True).indices.to(torch.int32)  # [N] pair ids by expert
    counts = torch.zeros(E, device=dev, dtype=torch.int64).scatter_add_(0, flat, torch.ones_like(flat))
    seg_end = torch.cumsum(counts, 0)
    n_blk = (counts + block_m - 1) // block_m
    blk_end = torch.cumsum(n_blk, 0)
    blk = torch.arange(max_blocks, device=dev, dtype=torch.int64)
    blk_expert = torch.searchsorted(blk_end, blk, right=True).to(torch.int32)  # E: past the end
    return order, blk_expert, [t.to(torch.int32) for t in (seg_end - counts, seg_end, blk_end - n_blk)]


def route_path(n_pairs: int) -> str:
    return ("routing metadata: one moe_route_kernel launch" if n_pairs <= ROUTE_KERNEL_MAX_PAIRS
            else f"routing metadata: torch sort/scan/search (> {ROUTE_KERNEL_MAX_PAIRS} pairs)")


@torch.compiler.disable  # opaque to step_compile=inductor: a graph break, launched as built
def moe_grouped(x: torch.Tensor, w_gate: torch.Tensor, w_up: torch.Tensor, w_down: torch.Tensor,
                topk_ids: torch.Tensor, topk_weights: torch.Tensor, swiglu_limit: float = 10.0,
                block_m: int = 16, block_n: int = 64, block_k: int = 64,
                num_warps: int = 4, out: torch.Tensor | None = None,
                num_stages: int | None = None) -> torch.Tensor:
    """Routed experts [T, hidden] in x.dtype; contract of ref_ops.moe_experts_ref.

    x [T, hidden]; w_gate, w_up [E, inner, hidden] and w_down [E, hidden, inner] in x.dtype;
    topk_ids [T, k] int32/int64 in [0, E) (not range-checked: that would need a host sync);
    topk_weights [T, k] fp32. `out` [T, hidden] x.dtype: optional buffer (CUDA graphs).
    """
    check_tensor("x", x, 2, _FLOATS)
    T, hidden = x.shape
    dev = x.device
    for name, w in (("w_gate", w_gate), ("w_up", w_up), ("w_down", w_down)):
        check_tensor(name, w, 3, (x.dtype,), dev)
    check_tensor("topk_ids", topk_ids, 2, (torch.int32, torch.int64), dev)
    check_tensor("topk_weights", topk_weights, 2, (torch.float32,), dev)
    E, inner = w_gate.shape[0], w_gate.shape[1]
    if (tuple(w_gate.shape) != (E, inner, hidden) or tuple(w_up.shape) != (E, inner, hidden)
            or tuple(w_down.shape) != (E, hidden, inner)):
        raise ValueError(f"moe_grouped: weights w_gate {tuple(w_gate.shape)}, w_up "
                         f"{tuple(w_up.shape)}, w_down {tuple(w_down.shape)} do not fit hidden="
                         f"{hidden} as [E, inner, hidden] / [E, hidden, inner]")
    if topk_ids.shape[0] != T or topk_weights.shape != topk_ids.shape:
        raise ValueError(f"moe_grouped: topk_ids {tuple(topk_ids.shape)} / topk_weights "
                         f"{tuple(topk_weights.shape)} must both be [T={T}, k]")
    for name, v, lo in (("block_m", block_m, 16), ("block_n", block_n, 16), ("block_k", block_k, 16)):
        if v < lo or v & (v - 1):
            raise ValueError(f"moe_grouped: {name}={v} must be a power of two >= {lo}")
    topk = topk_ids.shape[1]
    out = check_out("out", out, (T, hidden), x.dtype, dev)
    n_pairs = T * topk
    if n_pairs == 0 or hidden == 0:
        return out.zero_()
    # ---- routing metadata, all on the device (no .item(), no nonzero) ----
    max_blocks = triton.cdiv(n_pairs, block_m) + min(E, n_pairs)
    order, blk_expert, meta = route_metadata(topk_ids, E, block_m, max_blocks)
    # ---- the grouped GEMMs ----
    fp32_dot = x.dtype == torch.float32 or (x.dtype == torch.bfloat16 and interpreting())
    # None keeps Triton's default pipelining depth (what the decode path runs); a number is a tile
    # knob for benchmarks/record_kernel_landscape.py
    stages = {} if num_stages is None else {"num_stages": num_stages}
    h = torch.empty(n_pairs, inner, device=dev, dtype=torch.float32 if fp32_dot else x.dtype)
    moe_gate_up_kernel[(max_blocks, triton.cdiv(inner, block_n))](
        x, w_gate, w_up, order, blk_expert, *meta, h, E, hidden, inner, topk, float(swiglu_limit),
        BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k, FP32_DOT=fp32_dot,
        num_warps=num_warps, **stages)
    y = torch.empty(n_pairs, hidden, device=dev, dtype=torch.float32)
    moe_down_kernel[(max_blocks, triton.cdiv(hidden, block_n))](
        h, w_down, order, topk_weights, blk_expert, *meta, y, E, hidden, inner,
        BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k, FP32_DOT=fp32_dot,
        num_warps=num_warps, **stages)
    block = min(1024, triton.next_power_of_2(hidden))
    moe_reduce_kernel[(T, triton.cdiv(hidden, block))](y, out, hidden, TOPK=topk, BLOCK=block,
                                                       num_warps=4)
    return out
