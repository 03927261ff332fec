"""Roofline of one decode step: bytes it must read from memory and FLOPs it must do.

Decode is memory-bound, so the figure that matters is bytes: every dense weight once, the routed
experts the batch activates, and each sequence's KV reads. MBU = bytes_per_step / step_s / measured
bandwidth. Plain Python (no torch): counts come from dsv4.shapes, the same specs the weights are
built from, in the dtypes this implementation stores (bf16 weights, bf16 KV latents, FP8 indexer
keys; see dsv4.shapes and dsv4.cache for the checkpoint dtypes not reproduced).

Expected distinct experts for B tokens each picking k of E uniformly: E * (1 - (1 - k/E)^B). It holds
for the router (random weights: near-uniform) and for the hash layers (a uniform random table).
The KV state is the one at the first measured step (context_len tokens cached).

`memory_bytes` is the other budget: what a session at a concurrency holds (weights, KV caches sized
like dsv4.cache, the step's largest transient tensors), so a caller can refuse a configuration the
device cannot hold before building it.
"""
from __future__ import annotations

from dsv4.config import DecodeConfig
from dsv4.shapes import (ParamSpec, compress_ratio, global_param_specs, layer_param_specs,
                         n_comp_slots)

KV_BYTES = 2  # bf16 latent values
IDX_KEY_SCALE_BYTES = 4  # one fp32 scale per FP8 indexer key
NOT_MATMUL = {"comp_ape", "idx_comp_ape"}  # 2-D tables added, not multiplied
FP32_BYTES = 4
MAX_NEW_TOKENS = 128  # cache capacity past the prefill: dsv4.session.DEFAULT_MAX_NEW_TOKENS


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


def _cache_bytes_per_sequence(cfg: DecodeConfig, capacity_tokens: int) -> int:
    """One sequence's share of dsv4.cache.DecodeCache: the bf16 latents, the fp32 staging groups,
    the FP8 indexer keys with their fp32 scales."""
    total = 0
    for layer in range(cfg.n_layers):
        cls = cfg.layer_class(layer)
        ratio, slots = compress_ratio(cfg, cls), n_comp_slots(cfg, cls, capacity_tokens)
        total += (cfg.window + slots) * cfg.head_dim * KV_BYTES
        if ratio:
            total += 2 * ratio * cfg.head_dim * FP32_BYTES  # comp_kv_stage, comp_gate_stage
        if cls == "c4":
            total += slots * (cfg.idx_dim + FP32_BYTES) + 2 * ratio * cfg.idx_dim * FP32_BYTES
    return total


def _step_transients_per_sequence(cfg: DecodeConfig) -> int:
    """The largest tensors one decode step allocates per sequence (live at once at worst): the
    logits (bf16 GEMM out, its fp32 copy, last_logits), the 4-stream residual with its fp32 upcast,
    one layer's attention (gathered bf16 latents and their fp32 upcast, fp32 scores and softmax)
    and indexer scores over every compressed key, and the routed experts' hidden activations."""
    entries = max(kv_entries_read(cfg, layer)[0] for layer in range(cfg.n_layers))
    keys = max(kv_entries_read(cfg, layer)[1] for layer in range(cfg.n_layers))
    logits = cfg.vocab * (KV_BYTES + 2 * FP32_BYTES)
    residual = cfg.hc_mult * cfg.hidden * (2 * KV_BYTES + 2 * FP32_BYTES)
    attention = entries * (cfg.head_dim * (KV_BYTES + FP32_BYTES) + 2 * cfg.n_heads * FP32_BYTES)
    indexer = 2 * keys * cfg.idx_heads * FP32_BYTES
    experts = 3 * (cfg.topk_experts + cfg.n_shared_experts) * cfg.expert_inner * KV_BYTES
    return logits + residual + attention + indexer + experts


def memory_bytes(config: DecodeConfig, concurrency: int,
                 max_new_tokens: int = MAX_NEW_TOKENS) -> dict[str, float]:
    """{"weights", "kv_cache", "activations", "total"} bytes a DecodeSession of `concurrency`
    sequences holds. The cache is counted twice: DecodeCache keeps a copy of its prefilled state
    to restore in place. A lower bound for the allocator's view (no fragmentation, no workspace)."""
    cfg = config
    weights = sum(s.nbytes for s in global_param_specs(cfg))
    weights += sum(s.nbytes for layer in range(cfg.n_layers) for s in layer_param_specs(cfg, layer))
    kv = 2 * concurrency * _cache_bytes_per_sequence(cfg, cfg.context_len + max_new_tokens)
    activations = concurrency * _step_transients_per_sequence(cfg)
    return {"weights": float(weights), "kv_cache": float(kv), "activations": float(activations),
            "total": float(weights + kv + activations)}
