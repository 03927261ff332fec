"""Pure-torch references of the decode step's hot ops. Every fast op (Triton kernels in
`dsv4.triton_*`, the model's CPU variants) is checked against these. Math in fp32.

Shapes use B = sequences decoding together (one token each), H = query heads, D = latent head dim,
S = cache entries, K = selected entries, W = residual width (hc_mult * hidden), M = mHC mixes (24).
"""
from __future__ import annotations

import torch

FP8_MAX = 448.0  # largest finite float8_e4m3fn


def sparse_mqa_decode_ref(q: torch.Tensor, kv: torch.Tensor, idx: torch.Tensor, sink: torch.Tensor,
                          scale: float) -> torch.Tensor:
    """Sparse multi-query attention for one decode token per sequence, with a sink logit.

    q:    [B, H, D]   queries (fp32 or bf16)
    kv:   [B, S, D]   one shared latent per cache entry, used as key AND value
    idx:  [B, K]      int32 entry indices into kv; -1 marks an empty slot
    sink: [H]         fp32 per-head sink logit (adds exp(sink) to the softmax denominator)
    returns [B, H, D] in q.dtype
    """
    B, H, D = q.shape
    valid = idx >= 0  # [B, K]
    safe = idx.clamp_min(0).long()
    sel = torch.gather(kv.float(), 1, safe[:, :, None].expand(B, safe.shape[1], D))  # [B, K, D]
    s = torch.einsum("bhd,bkd->bhk", q.float(), sel) * scale  # [B, H, K]
    s = s.masked_fill(~valid[:, None, :], float("-inf"))
    sink_b = sink.float()[None, :, None].expand(B, H, 1)  # [B, H, 1]
    m = torch.maximum(s.amax(dim=-1, keepdim=True), sink_b)  # [B, H, 1]
    p = torch.exp(s - m)  # [B, H, K]; exp(-inf) = 0 for empty slots
    denom = p.sum(dim=-1, keepdim=True) + torch.exp(sink_b - m)
    out = torch.einsum("bhk,bkd->bhd", p / denom, sel)
    return out.to(q.dtype)


def quantize_fp8_rowwise(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """x [..., N] -> (x_fp8 [..., N] float8_e4m3fn, scale [..., 1] fp32) with power-of-two scales,
    so that x ~= x_fp8 * scale."""
    amax = x.float().abs().amax(dim=-1, keepdim=True).clamp_min(1e-12)
    scale = torch.exp2(torch.ceil(torch.log2(amax / FP8_MAX)))
    return (x.float() / scale).to(torch.float8_e4m3fn), scale


def indexer_scores_ref(q: torch.Tensor, k: torch.Tensor, w: torch.Tensor, lengths: torch.Tensor,
                       mode: str = "fp32") -> torch.Tensor:
    """Lightning-indexer scores: score[b, s] = sum_h w[b, h] * relu(q[b, h] . k[b, s]).

    q: [B, Hi, Di], k: [B, S, Di], w: [B, Hi] fp32 (head weights, scales folded in),
    lengths: [B] int32 valid compressed entries per sequence (scores past it are -inf).
    mode: dtype the GEMM operands are rounded to: "fp32", "bf16" or "fp8" (e4m3, row scales).
    returns [B, S] fp32
    """
    if mode == "fp32":
        qm, km = q.float(), k.float()
    elif mode == "bf16":
        qm, km = q.to(torch.bfloat16).float(), k.to(torch.bfloat16).float()
    elif mode == "fp8":
        q8, qs = quantize_fp8_rowwise(q)
        k8, ks = quantize_fp8_rowwise(k)
        qm, km = q8.float() * qs, k8.float() * ks
    else:
        raise ValueError(f"indexer mode {mode!r}: expected fp32, bf16 or fp8")
    logits = torch.einsum("bhd,bsd->bhs", qm, km).relu()  # [B, Hi, S]
    scores = torch.einsum("bhs,bh->bs", logits, w.float())  # [B, S]
    S = k.shape[1]
    pos = torch.arange(S, device=k.device)[None, :]
    return scores.masked_fill(pos >= lengths[:, None].to(k.device), float("-inf"))


def mhc_prenorm_ref(x_flat: torch.Tensor, hc_fn: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """mHC pre-mix logits: (x_flat @ hc_fn.T) * rsqrt(mean(x_flat^2) + eps).

    x_flat: [T, W] (bf16 or fp32), hc_fn: [M, W]; returns mixes [T, M] fp32. The GEMM's operands are
    taken at the precision they arrive in; accumulation and the RMS statistic are fp32.
    """
    xf = x_flat.float()
    r = torch.rsqrt(xf.pow(2).mean(dim=-1, keepdim=True) + eps)  # [T, 1]
    return (x_flat.float() @ hc_fn.float().T) * r


def swiglu_ref(gate: torch.Tensor, up: torch.Tensor, limit: float) -> torch.Tensor:
    """Clamped SwiGLU: silu(min(gate, limit)) * clamp(up, -limit, limit)."""
    return torch.nn.functional.silu(gate.clamp(max=limit)) * up.clamp(-limit, limit)


def moe_experts_ref(x: torch.Tensor, w_gate: torch.Tensor, w_up: torch.Tensor, w_down: torch.Tensor,
                    topk_ids: torch.Tensor, topk_weights: torch.Tensor,
                    swiglu_limit: float = 10.0) -> torch.Tensor:
    """Routed experts, token by token (the slow, obviously-right form).

    x: [T, hidden], w_gate/w_up: [E, inner, hidden], w_down: [E, hidden, inner],
    topk_ids: [T, k] int, topk_weights: [T, k] fp32; returns [T, hidden] in x.dtype.
    """
    T = x.shape[0]
    out = torch.zeros(T, x.shape[1], dtype=torch.float32, device=x.device)
    for t in range(T):
        for j in range(topk_ids.shape[1]):
            e = int(topk_ids[t, j])
            xt = x[t].float()
            h = swiglu_ref(w_gate[e].float() @ xt, w_up[e].float() @ xt, swiglu_limit)  # [inner]
            out[t] += topk_weights[t, j].float() * (w_down[e].float() @ h)
    return out.to(x.dtype)
