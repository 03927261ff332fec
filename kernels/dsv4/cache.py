"""KV caches of the decode step: fixed capacity, preallocated, prefilled as if `context_len` tokens
had already been decoded, restorable to that state in place (so a captured CUDA graph stays valid).

Per layer, one latent buffer `kv [B, window + n_comp, D]` bf16 serves as K and V (MQA):
  slots [0, window)            the sliding-window ring; token t lives in slot t % window
  slots [window, window+n_comp) compressed entries (c4 / c128 layers); entry e pools tokens
                               [e*ratio, (e+1)*ratio) and is written when the last of them arrives
Attention reads it through int32 indices into this one buffer (dsv4.ref_ops contract).

c4 layers also hold the lightning indexer's keys: one idx_dim key per compressed entry, stored as
FP8 e4m3 bits (uint8: CPU torch cannot index_copy float8) with a power-of-two fp32 scale per entry,
as the real engines store them. The compressors' staging buffers keep the partial group.

Deviation from DeepSeek-V4: a real KV entry is 448 FP8 + 64 bf16 RoPE values + scales (~584 B);
here it is 512 bf16 values (1024 B). Attention reads ~1.75x the bytes the checkpoint's cache would.

`pos` is a 0-d int64 device tensor (tokens already cached = position of the next token): every
write index derives from it on the device, so no step needs a host synchronisation.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from dsv4.config import DecodeConfig
from dsv4.ref_ops import quantize_fp8_rowwise
from dsv4.shapes import FP8_ALIGN, compress_ratio, n_comp_slots  # noqa: F401 (re-exported)


@dataclass
class LayerCache:
    cls: str
    ratio: int  # tokens per compressed entry (0 on window layers)
    kv: torch.Tensor  # [B, window + n_comp, D] bf16
    comp_kv_stage: torch.Tensor | None = None  # [B, ratio, D] fp32: projected latents of the group
    comp_gate_stage: torch.Tensor | None = None  # [B, ratio, D] fp32: their pooling logits
    idx_k8: torch.Tensor | None = None  # [B, n_comp, idx_dim] uint8 (fp8 e4m3 bits)
    idx_kscale: torch.Tensor | None = None  # [B, n_comp] fp32
    idx_kv_stage: torch.Tensor | None = None  # [B, ratio, idx_dim] fp32
    idx_gate_stage: torch.Tensor | None = None  # [B, ratio, idx_dim] fp32

    def tensors(self) -> list[torch.Tensor]:
        return [t for t in (self.kv, self.comp_kv_stage, self.comp_gate_stage, self.idx_k8,
                            self.idx_kscale, self.idx_kv_stage, self.idx_gate_stage) if t is not None]

    @property
    def n_comp(self) -> int:
        return self.idx_k8.shape[1] if self.idx_k8 is not None else 0


class DecodeCache:
    def __init__(self, cfg: DecodeConfig, batch: int, capacity_tokens: int, device: torch.device):
        if capacity_tokens < cfg.context_len:
            raise ValueError("cache capacity smaller than the prefilled context")
        self.cfg, self.batch, self.capacity_tokens = cfg, batch, capacity_tokens
        gen = torch.Generator(device=device)
        gen.manual_seed(cfg.seed + 1)  # prefill content: independent of the weights' stream
        self.layers = [self._prefilled_layer(cfg.layer_class(i), gen, device)
                       for i in range(cfg.n_layers)]
        self.pos = torch.tensor(cfg.context_len, dtype=torch.int64, device=device)
        self._initial = [t.clone() for t in self.tensors()]

    def _prefilled_layer(self, cls: str, gen: torch.Generator, device: torch.device) -> LayerCache:
        cfg, B, ctx = self.cfg, self.batch, self.cfg.context_len
        D, W = cfg.head_dim, cfg.window
        ratio = compress_ratio(cfg, cls)
        n_comp = n_comp_slots(cfg, cls, self.capacity_tokens)

        def randn(*shape: int) -> torch.Tensor:  # unit RMS, like the kv_norm output
            return torch.randn(shape, generator=gen, device=device)

        kv = torch.zeros(B, W + n_comp, D, dtype=torch.bfloat16, device=device)
        kv[:, :min(ctx, W)] = randn(B, min(ctx, W), D).to(torch.bfloat16)
        lc = LayerCache(cls, ratio, kv)
        if not ratio:
            return lc
        n_full, n_part = ctx // ratio, ctx % ratio  # complete groups; tokens of the open group
        kv[:, W:W + n_full] = randn(B, n_full, D).to(torch.bfloat16)
        lc.comp_kv_stage = torch.zeros(B, ratio, D, device=device)
        lc.comp_gate_stage = torch.zeros(B, ratio, D, device=device)
        lc.comp_kv_stage[:, :n_part] = randn(B, n_part, D)
        lc.comp_gate_stage[:, :n_part] = randn(B, n_part, D)
        if cls == "c4":
            Di = cfg.idx_dim
            keys = torch.zeros(B, n_comp, Di, device=device)
            keys[:, :n_full] = randn(B, n_full, Di)
            k8, kscale = quantize_fp8_rowwise(keys)  # [B, n_comp, Di] fp8, [B, n_comp, 1] fp32
            lc.idx_k8 = k8.view(torch.uint8)
            lc.idx_kscale = kscale.squeeze(-1).contiguous()
            lc.idx_kv_stage = torch.zeros(B, ratio, Di, device=device)
            lc.idx_gate_stage = torch.zeros(B, ratio, Di, device=device)
            lc.idx_kv_stage[:, :n_part] = randn(B, n_part, Di)
            lc.idx_gate_stage[:, :n_part] = randn(B, n_part, Di)
        return lc

    def tensors(self) -> list[torch.Tensor]:
        return [t for lc in self.layers for t in lc.tensors()]

    def restore(self) -> None:
        """Back to the prefilled state, in place (same storage: captured graphs stay valid)."""
        for t, t0 in zip(self.tensors(), self._initial):
            t.copy_(t0)
        self.pos.fill_(self.cfg.context_len)

    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.tensors())


def write_slot(buf: torch.Tensor, slot: torch.Tensor, value: torch.Tensor,
               enabled: torch.Tensor | None = None) -> None:
    """buf[:, slot] = value (optionally only where `enabled`), with the slot a device tensor.

    buf: [B, S, ...], slot: 0-d int64, value: [B, ...], enabled: 0-d bool. No host sync: the
    conditional write keeps the old row when disabled instead of branching in Python.
    """
    idx = slot.reshape(1)
    new = value.unsqueeze(1).to(buf.dtype)  # [B, 1, ...]
    if enabled is not None:
        new = torch.where(enabled, new, buf.index_select(1, idx))
    buf.index_copy_(1, idx, new)
