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

The `indexer_kernel` knob: "torch" is the above (the [B, Hi, S] logits materialised, ReLU, head
weights and sum as separate ops); "triton_fused" (CUDA) launches dsv4.triton_indexer's
indexer_scores_kernel directly on the stored FP8 codes (no upcast / cast copy of q or the keys):
GEMM + ReLU + weighted head sum + the length mask in one kernel, [B, S] scores out. Its MODE is
indexer_gemm: fp32 = codes converted to fp32 in registers, ieee fp32 products (SIMT); bf16 = codes
converted to bf16 in registers, tensor cores; fp8 = e4m3 tensor cores with the q/k row scales
applied in the kernel. In fp32/bf16 the kernel has no scales: q's is folded into the head weights
(as in torch) and k's multiplies the [B, S] scores after. (The public wrapper
triton_indexer.indexer_scores takes fp8 operands only in fp8 mode, hence the direct launch.)
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
FUSED_DESCRIPTIONS = {
    "fp32": "triton indexer_scores_kernel fused GEMM+ReLU+head sum, fp8 codes -> fp32 in registers, "
            "ieee fp32 products",
    "bf16": "triton indexer_scores_kernel fused GEMM+ReLU+head sum, fp8 codes -> bf16 in registers, "
            "tensor cores",
    "fp8": "triton indexer_scores_kernel fused GEMM+ReLU+head sum, fp8 e4m3 tensor cores, row "
           "scales in-kernel",
}


def describe(kernel: str, mode: str) -> str:
    """what_ran text for (indexer_kernel, indexer_gemm)."""
    return (FUSED_DESCRIPTIONS if kernel == "triton_fused" else GEMM_DESCRIPTIONS)[mode]


def update_keys(proj: dict[str, torch.Tensor], p: Params, lc: LayerCache, pos: torch.Tensor,
                freqs: torch.Tensor, rope_dim: int) -> None:
    """Stage token `pos` in the indexer's compressor; on a group boundary write one FP8 key.
    proj: the layer input's projections (dsv4.weights.project), idx_comp_wk / idx_comp_wgate used."""
    entry, complete, slot = compress_step(proj["idx_comp_wk"], proj["idx_comp_wgate"], p.idx_comp_ape,
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


@torch.compiler.disable  # opaque to step_compile=inductor: a graph break, launched as built
def fused_scores(q8: torch.Tensor, k8: torch.Tensor, w: torch.Tensor, lengths: torch.Tensor,
                 qscale: torch.Tensor, kscale: torch.Tensor, mode: str,
                 block_s: int = 64) -> torch.Tensor:
    """indexer_kernel=triton_fused: [B, S] fp32 scores, -inf at s >= lengths[b].

    q8 [B, Hi, Di] and k8 [B, S, Di] float8_e4m3fn codes, w [B, Hi] fp32 head weights *without*
    the q scale, lengths [B] int32, qscale [B, Hi] / kscale [B, S] fp32 row scales."""
    import triton

    from dsv4 import triton_indexer as ti
    from dsv4.triton_attention import interpreting

    if mode not in ti.MODES:
        raise ValueError(f"indexer_gemm {mode!r}: expected one of {ti.MODES}")
    B, H, D = q8.shape
    S = k8.shape[1]
    out = torch.empty(B, S, device=q8.device, dtype=torch.float32)
    if mode == "fp8":
        w_k, qs, ks = w, qscale, kscale  # the kernel applies both row scales to the fp32 logits
    else:
        w_k, qs, ks = w * qscale, w, w  # q scale folded (exact: a power of two); scales unread
    block_d = max(16, triton.next_power_of_2(D))
    if mode == "fp8":
        block_d = max(32, block_d)  # fp8 MMA consumes K in steps of 32
    ti.indexer_scores_kernel[(B, triton.cdiv(S, block_s))](
        q8, k8, w_k.contiguous(), lengths, qs.contiguous(), ks.contiguous(), out, H, S, D,
        BLOCK_H=max(16, triton.next_power_of_2(H)), BLOCK_D=block_d,
        BLOCK_DK=min(block_d, 32) if mode == "fp32" else block_d, BLOCK_S=block_s,
        MODE=ti.MODES.index(mode), EMULATE_BF16=interpreting(), num_warps=4)
    return out if mode == "fp8" else out * kscale


def select(q_low: torch.Tensor, head_w: torch.Tensor, p: Params, lc: LayerCache, n_valid: torch.Tensor,
           cos: torch.Tensor, sin: torch.Tensor, rope_dim: int, n_heads: int, topk: int, mode: str,
           break_op: bool = False, kernel: str = "torch") -> torch.Tensor:
    """Top-`topk` compressed entries per sequence.

    q_low: [B, q_rank] bf16 (normed low-rank query), head_w: [B, Hi] bf16 (the layer input times
    idx_wproj: per-head weights),
    n_valid: 0-d int64 complete compressed entries. Returns [B, topk] int64 entry index or -1.
    kernel: the indexer_kernel knob ("torch" | "triton_fused"); mode: the indexer_gemm knob.
    break_op (test hook) selects the *lowest* scoring entries instead.
    """
    B = q_low.shape[0]
    q = F.linear(q_low, p.idx_wq).view(B, n_heads, -1)  # [B, Hi, Di] bf16
    Di = q.shape[-1]
    q = apply_rope(q, cos, sin, rope_dim)
    q8, qscale = quantize_fp8_rowwise(q)  # [B, Hi, Di] fp8, [B, Hi, 1] fp32
    w0 = head_w.float() * (n_heads * Di) ** -0.5  # [B, Hi]
    k8 = lc.idx_k8.view(FP8)  # [B, S, Di]
    if kernel == "triton_fused":
        lengths = n_valid.to(torch.int32).expand(B).contiguous()  # [B], on the device: no sync
        scores = fused_scores(q8, k8, w0, lengths, qscale.squeeze(-1), lc.idx_kscale, mode)
    elif kernel == "torch":
        w = w0 * qscale.squeeze(-1)  # [B, Hi]
        logits = score_logits(q8, k8, mode)  # [B, Hi, S] fp32
        scores = (logits.relu() * w[:, :, None]).sum(dim=1) * lc.idx_kscale  # [B, S]
    else:
        raise ValueError(f"indexer_kernel {kernel!r}: expected torch or triton_fused")
    if break_op:
        scores = -scores
    S = scores.shape[1]
    invalid = torch.arange(S, device=q_low.device)[None, :] >= n_valid
    scores = scores.masked_fill(invalid, float("-inf"))
    vals, ids = scores.topk(min(topk, S), dim=-1)  # [B, k]
    return torch.where(vals == float("-inf"), torch.full_like(ids, -1), ids)
