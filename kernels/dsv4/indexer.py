"""The lightning indexer of the c4 layers: which compressed entries each token attends to.

    q_idx = W_idx(q_lowrank)  [B, Hi, Di], RoPE on the last rope_dim, FP8 e4m3 per (token, head)
            with a power-of-two scale folded into the head weights
    w     = W_proj(x) * Hi^-1/2 * Di^-1/2 * q_scale          [B, Hi] fp32
    score[b, s] = k_scale[b, s] * sum_h w[b, h] * relu(q8[b, h] . k8[b, s])
    top idx_topk valid entries -> int64 entry indices (-1 where fewer are valid)
Because scales are positive and ReLU is positively homogeneous, applying them after the GEMM is exact:
the GEMM runs on the raw FP8 codes in every mode, and the modes differ only in how:
  fp32  upcast q8/k8 to fp32, torch.bmm with TF32 off (SIMT sgemm on a GPU): the case study's baseline
  bf16  cast q8/k8 to bf16 (lossless from FP8), torch.bmm bf16 (tensor cores); the bf16 result is
        upcast to fp32 for ReLU / weighted sum (its rounding is this mode's only error)
  fp8   torch._scaled_mm on the e4m3 codes, fp32 output, one call per sequence (torch has no batched
        fp8 GEMM); CUDA sm_89+ only
Keys come from the indexer's own compressor (dsv4.compressor) and are stored FP8 (dsv4.cache).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from dsv4.cache import LayerCache, write_slot
from dsv4.compressor import compress_step
from dsv4.ref_ops import quantize_fp8_rowwise
from dsv4.rope import apply_rope
from dsv4.weights import Params

FP8 = torch.float8_e4m3fn
GEMM_DESCRIPTIONS = {
    "fp32": "torch.bmm fp32 upcast of fp8 q/k (tf32 off)",
    "bf16": "torch.bmm bf16 (lossless from fp8), result upcast to fp32",
    "fp8": "torch._scaled_mm fp8 e4m3, fp32 out, one call per sequence",
}


def update_keys(x: torch.Tensor, p: Params, lc: LayerCache, pos: torch.Tensor, freqs: torch.Tensor,
                rope_dim: int) -> None:
    """Stage token `pos` in the indexer's compressor; on a group boundary write one FP8 key."""
    entry, complete, slot = compress_step(x, p.idx_comp_wk, p.idx_comp_wgate, p.idx_comp_ape,
                                          p.idx_comp_norm, lc.idx_kv_stage, lc.idx_gate_stage,
                                          pos, lc.ratio, freqs, rope_dim)
    k8, kscale = quantize_fp8_rowwise(entry)  # [B, Di] fp8, [B, 1] fp32
    write_slot(lc.idx_k8, slot, k8.view(torch.uint8), complete)
    write_slot(lc.idx_kscale, slot, kscale.squeeze(-1), complete)


def _scaled_mm_rows(q8: torch.Tensor, k8: torch.Tensor) -> torch.Tensor:
    """q8: [Hi, Di] fp8, k8: [S, Di] fp8 -> [Hi, S] fp32 via the native FP8 GEMM (unit scales)."""
    hi = q8.shape[0]
    pad = -hi % 16  # _scaled_mm wants M a multiple of 16 (tiny configs have 4 heads)
    if pad:
        q8 = torch.cat([q8, q8.new_zeros(pad, q8.shape[1])])
    one = torch.ones((), dtype=torch.float32, device=q8.device)
    out = torch._scaled_mm(q8, k8.t(), scale_a=one, scale_b=one, out_dtype=torch.float32)
    return out[:hi]


def score_logits(q8: torch.Tensor, k8: torch.Tensor, mode: str) -> torch.Tensor:
    """q8: [B, Hi, Di] fp8, k8: [B, S, Di] fp8 -> q8 . k8 as [B, Hi, S] fp32 (codes, no scales)."""
    if mode == "fp32":
        return torch.bmm(q8.float(), k8.float().transpose(1, 2))
    if mode == "bf16":
        return torch.bmm(q8.to(torch.bfloat16), k8.to(torch.bfloat16).transpose(1, 2)).float()
    if mode == "fp8":
        if q8.device.type != "cuda":
            raise RuntimeError("indexer_gemm=fp8 needs a CUDA GPU with FP8 tensor cores (sm_89+)")
        return torch.stack([_scaled_mm_rows(q8[b], k8[b]) for b in range(q8.shape[0])])
    raise ValueError(f"indexer_gemm {mode!r}: expected fp32, bf16 or fp8")


def select(q_low: torch.Tensor, x: torch.Tensor, p: Params, lc: LayerCache, n_valid: torch.Tensor,
           cos: torch.Tensor, sin: torch.Tensor, rope_dim: int, n_heads: int, topk: int, mode: str,
           break_op: bool = False) -> torch.Tensor:
    """Top-`topk` compressed entries per sequence.

    q_low: [B, q_rank] bf16 (normed low-rank query), x: [B, hidden] bf16 (layer input),
    n_valid: 0-d int64 complete compressed entries. Returns [B, topk] int64 entry index or -1.
    break_op (test hook) selects the *lowest* scoring entries instead.
    """
    B = x.shape[0]
    q = F.linear(q_low, p.idx_wq).view(B, n_heads, -1)  # [B, Hi, Di] bf16
    Di = q.shape[-1]
    q = apply_rope(q, cos, sin, rope_dim)
    q8, qscale = quantize_fp8_rowwise(q)  # [B, Hi, Di] fp8, [B, Hi, 1] fp32
    w = F.linear(x, p.idx_wproj).float() * (n_heads * Di) ** -0.5 * qscale.squeeze(-1)  # [B, Hi]
    k8 = lc.idx_k8.view(FP8)  # [B, S, Di]
    logits = score_logits(q8, k8, mode)  # [B, Hi, S] fp32
    scores = (logits.relu() * w[:, :, None]).sum(dim=1) * lc.idx_kscale  # [B, S]
    if break_op:
        scores = -scores
    S = scores.shape[1]
    invalid = torch.arange(S, device=x.device)[None, :] >= n_valid
    scores = scores.masked_fill(invalid, float("-inf"))
    vals, ids = scores.topk(min(topk, S), dim=-1)  # [B, k]
    return torch.where(vals == float("-inf"), torch.full_like(ids, -1), ids)
