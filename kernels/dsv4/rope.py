"""Rotary position embedding on the last `rope_dim` dims of a head (DeepSeek-V4 keeps 448 of 512
latent dims position-free). Positions come in as device tensors so a captured CUDA graph keeps
rotating by the *current* position at every replay (a Python int would be frozen into the graph).
"""
from __future__ import annotations

import torch

ROPE_BASE = 10000.0


def inv_freq(rope_dim: int, device: torch.device) -> torch.Tensor:
    """[rope_dim / 2] fp32 angular frequency per rotated pair."""
    exps = torch.arange(0, rope_dim, 2, dtype=torch.float32, device=device) / rope_dim
    return ROPE_BASE ** -exps


def cos_sin(pos: torch.Tensor, freqs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """pos: int tensor of any shape P -> (cos, sin) each [*P, rope_dim / 2] fp32."""
    angle = pos.to(torch.float32)[..., None] * freqs
    return torch.cos(angle), torch.sin(angle)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, rope_dim: int,
               inverse: bool = False) -> torch.Tensor:
    """Rotate the last `rope_dim` dims of x (rotate-half pairing), in fp32, returned in x.dtype.

    x: [..., D]; cos/sin broadcastable to [..., rope_dim / 2]. inverse=True undoes the rotation
    (used on the attention output: V carries the keys' rotation, DeepSeek-V4 removes it).
    """
    nope, rot = x[..., :-rope_dim], x[..., -rope_dim:].float()
    x1, x2 = rot.chunk(2, dim=-1)  # each [..., rope_dim / 2]
    s = -sin if inverse else sin
    rotated = torch.cat([x1 * cos - x2 * s, x2 * cos + x1 * s], dim=-1)
    return torch.cat([nope, rotated.to(x.dtype)], dim=-1)
