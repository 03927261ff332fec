"""The attention sublayer of one decode step: low-rank query, shared latent KV, sparse MQA with a
per-head sink, inverse RoPE, grouped output projection.

    q   = wq_b(RMSNorm(wq_a(x)))  -> [B, H, D], per-head RMS, RoPE on the last rope_dim
    kv  = RMSNorm(wkv(x)), RoPE   -> [B, D] into the window ring (+ the compressor on c4/c128 layers)
    idx = window slots + (c4: indexer top-k | c128: every complete compressed entry)  [B, K] int32
    o   = sparse_mqa(q, kv_cache, idx, sink, D^-1/2)  [B, H, D]
    out = wo_b(concat_g wo_a[g] @ o_g)   (inverse RoPE on o first: V carries the keys' rotation)

The `attention` knob (dsv4.knobs):
  CPU   per_head  Python loop over heads; each head gathers the same KV rows again (H-fold redundant
                  reads) and scores by elementwise multiply + row sum, fp32 accumulate, no matmul
        mma       one gather for all heads, S = Q K^T and O = P V as batched matmuls on bf16 values
                  (P rounded to bf16 like the MMA kernel's second tl.dot), fp32 accumulate
  CUDA  dsv4.triton_attention.sparse_mqa_decode(mode=per_head|mma, tile knobs). It must exist:
        there is no fallback to the CPU code on a GPU.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from dsv4 import indexer
from dsv4.cache import LayerCache, write_slot
from dsv4.compressor import compress_step
from dsv4.config import DecodeConfig
from dsv4.knobs import ATTENTION_TILE_KNOBS
from dsv4.glue import rmsnorm
from dsv4.rope import apply_rope
from dsv4.sections import section
from dsv4.weights import Params, project

TILE_KNOBS = ATTENTION_TILE_KNOBS
BREAK_ATTENTION_FACTOR = 1.25  # DSV4_TEST_BREAK=attention scales the attention output by this


def _softmax_sink(s: torch.Tensor, sink: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """s: [..., K] fp32 scores (-inf = empty), sink: broadcastable to [..., 1]
    -> (unnormalised p [..., K], denominator [..., 1] including exp(sink))."""
    m = torch.maximum(s.amax(dim=-1, keepdim=True), sink)
    p = torch.exp(s - m)
    return p, p.sum(dim=-1, keepdim=True) + torch.exp(sink - m)


def sparse_mqa_per_head_torch(q: torch.Tensor, kv: torch.Tensor, idx: torch.Tensor,
                              sink: torch.Tensor, scale: float) -> torch.Tensor:
    """The per-head SIMT algorithm in torch. q [B,H,D], kv [B,S,D], idx [B,K] int32 -> [B,H,D]."""
    B, H, D = q.shape
    valid = idx >= 0  # [B, K]
    gather_idx = idx.clamp_min(0).long()[:, :, None].expand(B, idx.shape[1], D)
    outs = []
    for h in range(H):
        sel = torch.gather(kv, 1, gather_idx).float()  # [B, K, D]: re-read for every head
        s = (q[:, h, None, :].float() * sel).sum(dim=-1) * scale  # [B, K] no matmul
        s = s.masked_fill(~valid, float("-inf"))
        p, denom = _softmax_sink(s, sink[h].float().reshape(1, 1))
        outs.append((p[:, :, None] * sel).sum(dim=1) / denom)  # [B, D]
    return torch.stack(outs, dim=1).to(q.dtype)


def sparse_mqa_mma_torch(q: torch.Tensor, kv: torch.Tensor, idx: torch.Tensor, sink: torch.Tensor,
                         scale: float) -> torch.Tensor:
    """All heads share one gather; two batched matmuls. Same contract as the per-head version."""
    B, H, D = q.shape
    valid = idx >= 0
    gather_idx = idx.clamp_min(0).long()[:, :, None].expand(B, idx.shape[1], D)
    sel = torch.gather(kv, 1, gather_idx).float()  # [B, K, D] bf16 values, gathered once
    s = torch.bmm(q.float(), sel.transpose(1, 2)) * scale  # [B, H, K]
    s = s.masked_fill(~valid[:, None, :], float("-inf"))
    p, denom = _softmax_sink(s, sink.float()[None, :, None])
    p = p.to(kv.dtype).float()  # the MMA kernel feeds P to tl.dot in the cache dtype
    return (torch.bmm(p, sel) / denom).to(q.dtype)


def sparse_mqa(q: torch.Tensor, kv: torch.Tensor, idx: torch.Tensor, sink: torch.Tensor,
               scale: float, knobs: dict) -> tuple[torch.Tensor, str]:
    """Dispatch on the device and the attention knob; returns (o [B, H, D], what ran)."""
    mode = knobs["attention"]
    if mode not in ("per_head", "mma"):
        raise ValueError(f"attention {mode!r}: expected per_head or mma")
    if q.device.type == "cuda":
        try:
            from dsv4.triton_attention import sparse_mqa_decode, sparse_mqa_decode_op
        except ImportError as exc:
            raise RuntimeError(f"attention={mode} on CUDA needs dsv4.triton_attention."
                               f"sparse_mqa_decode, which could not be imported: {exc}") from exc
        tiles = {k: knobs[k] for k in TILE_KNOBS}
        args = (q, kv, idx, sink, float(scale), mode, tiles["attn_block_kv"], tiles["attn_heads_per_tile"],
                tiles["attn_num_warps"], tiles["attn_num_stages"], tiles["attn_split_k"])
        tile_txt = " ".join(f"{k.removeprefix('attn_')}={v}" for k, v in tiles.items())
        ran = f"triton {mode} {str(q.dtype).removeprefix('torch.')} ({tile_txt})"
        if torch.compiler.is_compiling():  # opaque to Inductor: the kernel runs as built
            return sparse_mqa_decode_op(*args), ran + ", as the opaque op dsv4::sparse_mqa_decode"
        return sparse_mqa_decode(*args[:5], mode=mode, block_kv=args[6], heads_per_tile=args[7],
                                 num_warps=args[8], num_stages=args[9], split_k=args[10]), ran
    if mode == "per_head":
        o = sparse_mqa_per_head_torch(q, kv, idx, sink, scale)
        return o, "torch per_head fp32-accum bf16 (cpu; tile knobs n/a on cpu)"
    o = sparse_mqa_mma_torch(q, kv, idx, sink, scale)
    return o, "torch mma: one gather + bmm, bf16 values fp32-accum (cpu; tile knobs n/a on cpu)"


def attention_block(x: torch.Tensor, p: Params, lc: LayerCache, pos: torch.Tensor,
                    rope: tuple[torch.Tensor, torch.Tensor, torch.Tensor], cfg: DecodeConfig,
                    knobs: dict, breaks: frozenset[str] = frozenset()) -> tuple[torch.Tensor, dict]:
    """x: [B, hidden] bf16 normed layer input; pos: 0-d int64 position of this token.
    rope = (freqs, cos, sin) at pos. Appends this token to lc. Returns ([B, hidden] bf16, what ran)."""
    freqs, cos, sin = rope
    B, H, D, rd, W = x.shape[0], cfg.n_heads, cfg.head_dim, cfg.rope_dim, cfg.window
    ran: dict[str, str] = {}
    proj = project(x, p, "attn_in", knobs["proj_gemms"])  # name -> x @ W.T, [B, rows] bf16
    q_low = rmsnorm(proj["wq_a"], p.q_norm)  # [B, q_rank] bf16
    q = F.linear(q_low, p.wq_b).view(B, H, D)  # [B, H, D] bf16
    q = rmsnorm(q, torch.ones((), device=x.device))  # per-head RMS, no weight
    q = apply_rope(q, cos, sin, rd)
    kv = apply_rope(rmsnorm(proj["wkv"], p.kv_norm), cos, sin, rd)  # [B, D] bf16
    write_slot(lc.kv, pos % W, kv)

    slots_w = torch.arange(W, device=x.device)
    idx_w = torch.where(slots_w <= pos, slots_w, -1)[None, :].expand(B, W)  # [B, W] ring slots
    parts = [idx_w]
    if lc.ratio:
        entry, complete, group = compress_step(proj["comp_wkv"], proj["comp_wgate"], p.comp_ape,
                                               p.comp_norm,
                                               lc.comp_kv_stage, lc.comp_gate_stage, pos, lc.ratio,
                                               freqs, rd)
        write_slot(lc.kv, W + group, entry, complete)
        n_valid = (pos + 1) // lc.ratio  # complete compressed entries, this token's included
        if lc.cls == "c4":
            with section("indexer"):  # nested in dsv4::attention: its host time is the indexer's
                indexer.update_keys(proj, p, lc, pos, freqs, rd)
                sel = indexer.select(q_low, proj["idx_wproj"], p, lc, n_valid, cos, sin, rd,
                                     cfg.idx_heads, cfg.idx_topk, knobs["indexer_gemm"],
                                     "indexer" in breaks, knobs["indexer_kernel"])
            parts.append(torch.where(sel >= 0, sel + W, -1))  # [B, topk]
            ran["indexer"] = indexer.describe(knobs["indexer_kernel"], knobs["indexer_gemm"])
        else:  # c128: every complete compressed entry
            n_slots = lc.kv.shape[1] - W
            slots_c = torch.arange(n_slots, device=x.device)
            parts.append(torch.where(slots_c < n_valid, slots_c + W, -1)[None, :].expand(B, n_slots))
    idx = torch.cat(parts, dim=1).to(torch.int32)  # [B, K]

    o, ran["attention"] = sparse_mqa(q, lc.kv, idx, p.sink, D ** -0.5, knobs)  # [B, H, D]
    if "attention" in breaks:
        o = o * BREAK_ATTENTION_FACTOR
    o = apply_rope(o, cos, sin, rd, inverse=True)
    G = cfg.o_groups
    o_g = o.reshape(B, G, -1).transpose(0, 1)  # [G, B, H/G * D]
    a = torch.bmm(o_g, p.wo_a.transpose(1, 2))  # [G, B, o_rank]
    out = F.linear(a.transpose(0, 1).reshape(B, -1), p.wo_b)  # [B, hidden]
    return out, ran
