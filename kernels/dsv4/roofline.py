"""Roofline of one decode step: bytes it must read from memory and FLOPs it must do.

Decode is memory-bound, so the figure that matters is bytes: every dense weight once, the routed
experts the batch activates, and each sequence's KV reads. MBU = bytes_per_step / step_s / measured
bandwidth. Plain Python (no torch): counts come from dsv4.shapes, the same specs the weights are
built from, in the dtypes this implementation stores (bf16 weights, bf16 KV latents, FP8 indexer
keys; see dsv4.shapes and dsv4.cache for the checkpoint dtypes not reproduced).

Expected distinct experts for B tokens each picking k of E uniformly: E * (1 - (1 - k/E)^B). It holds
for the router (random weights: near-uniform) and for the hash layers (a uniform random table).
The KV state is the one at the first measured step (context_len tokens cached).
"""
from __future__ import annotations

from dsv4.config import DecodeConfig
from dsv4.shapes import ParamSpec, compress_ratio, global_param_specs, layer_param_specs

KV_BYTES = 2  # bf16 latent values
IDX_KEY_SCALE_BYTES = 4  # one fp32 scale per FP8 indexer key
NOT_MATMUL = {"comp_ape", "idx_comp_ape"}  # 2-D tables added, not multiplied


def expected_active_experts(n_experts: int, topk: int, batch: int) -> float:
    return n_experts * (1.0 - (1.0 - topk / n_experts) ** batch)


def _expert_bytes(cfg: DecodeConfig, layer: int) -> int:
    """Bytes of ONE routed expert (gate + up + down) in `layer`."""
    return sum(s.nbytes for s in layer_param_specs(cfg, layer) if s.kind == "experts") // cfg.n_experts


def kv_entries_read(cfg: DecodeConfig, layer: int) -> tuple[int, int]:
    """(latent entries attention reads, indexer keys scored) per sequence for `layer`."""
    cls = cfg.layer_class(layer)
    ctx = cfg.context_len
    window = min(cfg.window, ctx + 1)
    ratio = compress_ratio(cfg, cls)
    n_comp = (ctx + 1) // ratio if ratio else 0  # entries complete when this token is decoded
    if cls == "c4":
        return window + min(cfg.idx_topk, n_comp), n_comp
    return window + n_comp, 0


def bytes_per_step(config: DecodeConfig, batch: int) -> dict[str, float]:
    """{"dense_weights", "experts", "kv", "total"} bytes one decode step of `batch` sequences reads."""
    cfg = config
    rows = min(batch, cfg.vocab)  # lookup tables: one row per sequence (at most every row)

    def weight_bytes(specs: list[ParamSpec]) -> int:
        return sum(s.nbytes if s.kind == "dense" else s.row_bytes * rows
                   for s in specs if s.kind in ("dense", "rows"))

    dense = weight_bytes(global_param_specs(cfg))
    experts = 0.0
    kv = 0
    active = expected_active_experts(cfg.n_experts, cfg.topk_experts, batch)
    for layer in range(cfg.n_layers):
        dense += weight_bytes(layer_param_specs(cfg, layer))
        experts += active * _expert_bytes(cfg, layer)
        entries, keys = kv_entries_read(cfg, layer)
        kv += batch * (entries * cfg.head_dim * KV_BYTES + keys * (cfg.idx_dim + IDX_KEY_SCALE_BYTES))
    return {"dense_weights": float(dense), "experts": float(experts), "kv": float(kv),
            "total": float(dense + experts + kv), "active_experts_per_layer": active}


def flops_per_step(config: DecodeConfig, batch: int) -> dict[str, float]:
    """Multiply-add FLOPs (2 per MAC) of one decode step: {"dense", "experts", "attention",
    "indexer", "total"}."""
    cfg = config

    def matmul_params(specs: list[ParamSpec]) -> int:
        return sum(s.numel for s in specs
                   if s.kind == "dense" and len(s.shape) >= 2 and s.name not in NOT_MATMUL)

    dense = 2 * batch * matmul_params(global_param_specs(cfg))
    experts = attention = indexer = 0
    per_expert_macs = 3 * cfg.expert_inner * cfg.hidden
    for layer in range(cfg.n_layers):
        dense += 2 * batch * matmul_params(layer_param_specs(cfg, layer))
        experts += 2 * batch * cfg.topk_experts * per_expert_macs
        entries, keys = kv_entries_read(cfg, layer)
        attention += 2 * 2 * batch * cfg.n_heads * entries * cfg.head_dim  # QK^T and PV
        indexer += 2 * batch * cfg.idx_heads * cfg.idx_dim * keys
    total = dense + experts + attention + indexer
    return {"dense": float(dense), "experts": float(experts), "attention": float(attention),
            "indexer": float(indexer), "total": float(total)}
