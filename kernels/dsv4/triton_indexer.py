"""Lightning-indexer scores in one Triton kernel: GEMM + ReLU + weighted head sum, fused.

Contract: `dsv4.ref_ops.indexer_scores_ref`:
    score[b, s] = sum_h w[b, h] * relu(q[b, h] . k[b, s])   (-inf where s >= lengths[b])

The unfused form materialises the [B, Hi, S] logits (and, in the case study, casts them back to
fp32 for the ReLU and the sum). Here each program owns one (sequence, tile of BLOCK_S keys): it
computes the [Hi, BLOCK_S] logits tile with tl.dot, applies ReLU and the head weights in registers,
and writes only the [BLOCK_S] scores. Di (128 in the model) fits in one tile, so there is no K loop.

Modes (the `indexer_gemm` knob) fix the precision of the GEMM operands, accumulation is fp32:
  fp32  fp32 operands, true fp32 products (input_precision="ieee": the SIMT baseline, not TF32)
  bf16  operands rounded to bf16 in registers (lossless when they come from FP8)
  fp8   e4m3 operands with the power-of-two row scales of ref_ops.quantize_fp8_rowwise; the row
        scales multiply the fp32 logits. Native fp8 tl.dot needs sm_89+; elsewhere the wrapper
        raises. Triton's CPU interpreter emulates it, so the CPU tests cover this path too.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from dsv4.ref_ops import quantize_fp8_rowwise
from dsv4.triton_attention import check_out, check_tensor, interpreting

MODES = ("fp32", "bf16", "fp8")
_MODE_ID = {m: i for i, m in enumerate(MODES)}
_FLOATS = (torch.float32, torch.float16, torch.bfloat16)


@triton.jit
def _round_bf16(x):
    # fp32 -> nearest bf16 (ties to even) kept in fp32, by integer arithmetic on the bit pattern.
    bits = x.to(tl.float32).to(tl.uint32, bitcast=True)
    bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
    return bits.to(tl.float32, bitcast=True)


@triton.jit
def _qk(q, k, acc, MODE: tl.constexpr, EMULATE_BF16: tl.constexpr):
    # acc [BLOCK_H, BLOCK_S] += q [BLOCK_H, BK] @ k[BLOCK_S, BK]^T at the mode's operand precision
    if MODE == 0:
        acc = tl.dot(q.to(tl.float32), tl.trans(k.to(tl.float32)), acc, input_precision="ieee")
    elif MODE == 1 and EMULATE_BF16:
        # Triton's interpreter multiplies bf16 bit patterns as integers and rounds fp32 -> bf16
        # off by an ulp: round to bf16 by hand, multiply the (exact) values in fp32. GPU: never.
        acc = tl.dot(_round_bf16(q), tl.trans(_round_bf16(k)), acc, input_precision="ieee")
    elif MODE == 1:
        acc = tl.dot(q.to(tl.bfloat16), tl.trans(k.to(tl.bfloat16)), acc)
    else:
        acc = tl.dot(q, tl.trans(k), acc)  # e4m3 x e4m3, fp32 accumulation
    return acc


@triton.jit
def indexer_scores_kernel(q_ptr, k_ptr, w_ptr, len_ptr, qs_ptr, ks_ptr, out_ptr, H, S, D,
                          BLOCK_H: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_DK: tl.constexpr,
                          BLOCK_S: tl.constexpr, MODE: tl.constexpr, EMULATE_BF16: tl.constexpr):
    # grid: (B, cdiv(S, BLOCK_S)). q [B, H, D], k [B, S, D], w [B, H], scales [B, H] / [B, S].
    # D is walked in BLOCK_DK steps: the fp32 (FMA) dot spills registers on one 128-wide step.
    b = tl.program_id(0)
    offs_s = tl.program_id(1) * BLOCK_S + tl.arange(0, BLOCK_S)  # [BLOCK_S]
    offs_h = tl.arange(0, BLOCK_H)  # [BLOCK_H], padded to >= 16 for tl.dot
    h_ok = offs_h < H
    s_ok = offs_s < S
    q_rows = q_ptr + (b * H + offs_h)[:, None] * D
    k_rows = k_ptr + (b.to(tl.int64) * S + offs_s)[:, None] * D
    logits = tl.zeros([BLOCK_H, BLOCK_S], dtype=tl.float32)
    for d0 in tl.static_range(0, BLOCK_D, BLOCK_DK):
        offs_d = d0 + tl.arange(0, BLOCK_DK)  # [BLOCK_DK]
        d_ok = offs_d < D
        q = tl.load(q_rows + offs_d[None, :], mask=h_ok[:, None] & d_ok[None, :], other=0.0)
        k = tl.load(k_rows + offs_d[None, :], mask=s_ok[:, None] & d_ok[None, :], other=0.0)
        logits = _qk(q, k, logits, MODE, EMULATE_BF16)  # [BLOCK_H, BLOCK_S] fp32
    if MODE == 2:  # fp8: the power-of-two row scales, applied once to the fp32 logits
        qs = tl.load(qs_ptr + b * H + offs_h, mask=h_ok, other=0.0)  # [BLOCK_H]
        ks = tl.load(ks_ptr + b * S + offs_s, mask=s_ok, other=0.0)  # [BLOCK_S]
        logits = logits * qs[:, None] * ks[None, :]
    w = tl.load(w_ptr + b * H + offs_h, mask=h_ok, other=0.0)  # [BLOCK_H]; padded heads weigh 0
    score = tl.sum(tl.maximum(logits, 0.0) * w[:, None], axis=0)  # [BLOCK_S]
    length = tl.load(len_ptr + b)
    score = tl.where(offs_s < length, score, float("-inf"))
    tl.store(out_ptr + b.to(tl.int64) * S + offs_s, score, mask=s_ok)


def fp8_supported(device: torch.device) -> bool:
    """Native FP8 tl.dot: sm_89 (Ada) or newer; Triton's interpreter emulates it on the CPU."""
    if device.type == "cpu":
        return interpreting()
    return device.type == "cuda" and torch.cuda.get_device_capability(device) >= (8, 9)


def indexer_scores(q: torch.Tensor, k: torch.Tensor, w: torch.Tensor, lengths: torch.Tensor,
                   mode: str = "fp32", q_scale: torch.Tensor | None = None,
                   k_scale: torch.Tensor | None = None, block_s: int = 64,
                   num_warps: int = 4, out: torch.Tensor | None = None) -> torch.Tensor:
    """Indexer scores [B, S] fp32; same contract as ref_ops.indexer_scores_ref.

    q [B, Hi, Di], k [B, S, Di] (fp32/fp16/bf16; in fp8 mode also already-quantised
    float8_e4m3fn with q_scale [B, Hi(, 1)] and k_scale [B, S(, 1)] fp32), w [B, Hi] fp32,
    lengths [B] int32. In fp8 mode float inputs are quantised here with
    ref_ops.quantize_fp8_rowwise (torch ops, no host sync). `out` [B, S] fp32: optional buffer.
    """
    if mode not in MODES:
        raise ValueError(f"indexer_scores: mode {mode!r}, expected one of {MODES}")
    fp8 = torch.float8_e4m3fn
    check_tensor("q", q, 3, _FLOATS + ((fp8,) if mode == "fp8" else ()))
    B, H, D = q.shape
    check_tensor("k", k, 3, (q.dtype,) if q.dtype == fp8 else _FLOATS, q.device)
    check_tensor("w", w, 2, (torch.float32,), q.device)
    check_tensor("lengths", lengths, 1, (torch.int32,), q.device)
    if k.shape[0] != B or k.shape[2] != D or tuple(w.shape) != (B, H) or lengths.shape[0] != B:
        raise ValueError(f"indexer_scores: shapes q {tuple(q.shape)}, k {tuple(k.shape)}, "
                         f"w {tuple(w.shape)}, lengths {tuple(lengths.shape)} do not agree")
    S = k.shape[1]
    if block_s < 16 or block_s & (block_s - 1):
        raise ValueError(f"indexer_scores: block_s={block_s} must be a power of two >= 16")
    qs = ks = w  # placeholders: the kernel reads scales only in fp8 mode
    if mode == "fp8":
        if not fp8_supported(q.device):
            cap = torch.cuda.get_device_capability(q.device) if q.device.type == "cuda" else None
            raise RuntimeError(f"indexer_scores: mode 'fp8' needs native FP8 tensor cores (sm_89 or "
                               f"newer); {q.device} has compute capability {cap}")
        q, qs = _fp8_operand("q", q, q_scale, (B, H))
        k, ks = _fp8_operand("k", k, k_scale, (B, S))
    elif q_scale is not None or k_scale is not None:
        raise ValueError("indexer_scores: q_scale/k_scale are only used in mode 'fp8'")
    out = check_out("out", out, (B, S), torch.float32, q.device)
    if B == 0 or S == 0:
        return out
    block_d = max(16, triton.next_power_of_2(D))
    if mode == "fp8":
        block_d = max(32, block_d)  # fp8 MMA consumes K in steps of 32
    indexer_scores_kernel[(B, triton.cdiv(S, block_s))](
        q, k, w, lengths, qs, ks, out, H, S, D,
        BLOCK_H=max(16, triton.next_power_of_2(H)), BLOCK_D=block_d,
        BLOCK_DK=min(block_d, 32) if mode == "fp32" else block_d, BLOCK_S=block_s,
        MODE=_MODE_ID[mode], EMULATE_BF16=interpreting(), num_warps=num_warps)
    return out


def _fp8_operand(name: str, x: torch.Tensor, scale: torch.Tensor | None,
                 rows: tuple[int, int]) -> tuple[torch.Tensor, torch.Tensor]:
    """(e4m3 tensor, fp32 row scales [*rows]) for one operand: quantise floats, or check the scales
    that come with an already-quantised tensor."""
    if x.dtype != torch.float8_e4m3fn:
        if scale is not None:
            raise ValueError(f"indexer_scores: {name}_scale given but {name} is not float8_e4m3fn")
        x8, s = quantize_fp8_rowwise(x)
        return x8.contiguous(), s.reshape(rows).contiguous()
    if scale is None:
        raise ValueError(f"indexer_scores: {name} is float8_e4m3fn, so {name}_scale is required")
    if scale.dtype != torch.float32 or scale.numel() != rows[0] * rows[1]:
        raise ValueError(f"indexer_scores: {name}_scale must be fp32 with {rows[0]}x{rows[1]} "
                         f"elements, got {scale.dtype} {tuple(scale.shape)}")
    if scale.device != x.device:
        raise ValueError(f"indexer_scores: {name}_scale on {scale.device}, expected {x.device}")
    return x, scale.reshape(rows).contiguous()
