"""The KV compressors of the c4 / c128 layers (and the indexer's key compressor on c4 layers).

Every token writes its projected latent and its pooling logits into a staging ring of `ratio` rows;
when the group is complete (the token at position p with (p + 1) % ratio == 0), the group is pooled
(per-dimension softmax over its tokens, with a learned position bias), RMS-normalised, rotated at the
group's first position, and written as one new compressed entry.

Simplification against DeepSeek-V4: the real 4:1 compressor pools overlapping windows; here groups
are disjoint. Cost per step is the same order (two [d, hidden] projections + a [ratio, d] pooling).
The projections are the caller's (dsv4.weights.project), so they can share one GEMM with the layer's
other ones.

The pooling runs at every step and the write is masked (torch.where) rather than skipped in Python:
the boundary test must stay on the device for a CUDA graph to replay it correctly.
"""
from __future__ import annotations

import torch

from dsv4.cache import write_slot
from dsv4.glue import rmsnorm
from dsv4.rope import apply_rope, cos_sin


def compress_step(kv_proj: torch.Tensor, gate_proj: torch.Tensor, ape: torch.Tensor,
                  norm_w: torch.Tensor, kv_stage: torch.Tensor, gate_stage: torch.Tensor,
                  pos: torch.Tensor, ratio: int, freqs: torch.Tensor,
                  rope_dim: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Stage token `pos` and pool its group.

    kv_proj / gate_proj: [B, d] bf16, the layer input's projections by the compressor's w_kv / w_gate
    (dsv4.weights.project), ape: [ratio, d] fp32,
    kv_stage / gate_stage: [B, ratio, d] fp32 (updated in place), pos: 0-d int64.
    Returns (entry [B, d] fp32 normed and rotated, complete 0-d bool, entry index 0-d int64).
    Only when `complete` is the entry a real new compressed entry.
    """
    slot = pos % ratio
    kv_new = kv_proj.float()  # [B, d]
    gate_new = gate_proj.float() + ape.index_select(0, slot.reshape(1))  # [B, d]
    write_slot(kv_stage, slot, kv_new)
    write_slot(gate_stage, slot, gate_new)
    weights = torch.softmax(gate_stage, dim=1)  # [B, ratio, d]: pooled per latent dimension
    entry = (weights * kv_stage).sum(dim=1)  # [B, d]
    entry = rmsnorm(entry, norm_w)
    group = pos // ratio
    cos, sin = cos_sin(group * ratio, freqs)  # rotate at the group's first token position
    entry = apply_rope(entry, cos, sin, rope_dim)
    complete = (pos + 1) % ratio == 0
    return entry, complete, group
