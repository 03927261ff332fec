"""Every parameter of the decode step as data: name, shape, dtype, how it is initialised, and what it
counts as for the roofline. Plain Python (no torch), so `dsv4.roofline` can count bytes without torch
and `dsv4.weights` builds exactly the tensors counted here.

Dtypes are the ones this re-implementation stores, not the checkpoint's: DeepSeek-V4 ships its linear
layers as FP8 e4m3 with 128x128 block scales and its routed experts as MXFP4. Here both are bf16 (a
bf16 GEMM is what every device in our matrix can run; FP8/MXFP4 weight GEMMs are not reproduced), so
weight bytes per step are ~2x (dense) and ~4x (experts) the checkpoint's. mHC, router and sinks are
fp32 as in the checkpoint.
"""
from __future__ import annotations

from dataclasses import dataclass

from dsv4.config import DecodeConfig

DTYPE_BYTES = {"bf16": 2, "fp32": 4, "int64": 8}
N_MIXES_PER_STREAM = 6  # hc_fn rows = hc_mult * (1 pre + 1 post + hc_mult comb) = 24 for hc_mult 4


@dataclass(frozen=True)
class ParamSpec:
    name: str
    shape: tuple[int, ...]
    dtype: str  # "bf16" | "fp32" | "int64"
    init: str  # "normal" (std below) | "ones" | "zeros" | "hash" (token -> experts table)
    std: float = 0.0
    # roofline category: "dense" (read once per step), "experts" (read when activated),
    # "rows" (a lookup table: one row per sequence is read)
    kind: str = "dense"

    @property
    def numel(self) -> int:
        n = 1
        for d in self.shape:
            n *= d
        return n

    @property
    def nbytes(self) -> int:
        return self.numel * DTYPE_BYTES[self.dtype]

    @property
    def row_bytes(self) -> int:
        return self.nbytes // self.shape[0]


def n_mixes(cfg: DecodeConfig) -> int:
    """Rows of hc_fn: pre (hc), post (hc) and the hc x hc comb matrix."""
    return 2 * cfg.hc_mult + cfg.hc_mult * cfg.hc_mult


def compress_ratio(cfg: DecodeConfig, cls: str) -> int:
    return {"window": 0, "c4": cfg.c4_ratio, "c128": cfg.c128_ratio}[cls]


FP8_ALIGN = 16  # torch._scaled_mm wants every dim a multiple of 16


def n_comp_slots(cfg: DecodeConfig, cls: str, capacity_tokens: int) -> int:
    """Compressed entries a layer of class `cls` can hold for `capacity_tokens` tokens."""
    ratio = compress_ratio(cfg, cls)
    if not ratio:
        return 0
    # +1: the open (incomplete) group has a slot too, since its masked write still indexes it
    n = capacity_tokens // ratio + 1
    if cls == "c4":  # the indexer's key GEMM runs over all slots: keep it fp8-GEMM aligned
        n = -(-n // FP8_ALIGN) * FP8_ALIGN
    return n


def _linear(name: str, out_f: int, in_f: int, dtype: str = "bf16", kind: str = "dense") -> ParamSpec:
    # std 1/sqrt(fan_in) keeps activations O(1) through every linear of the random model
    return ParamSpec(name, (out_f, in_f), dtype, "normal", in_f ** -0.5, kind)


def _vec(name: str, n: int, init: str = "ones", std: float = 0.0) -> ParamSpec:
    return ParamSpec(name, (n,), "fp32", init, std)


def _hc(prefix: str, cfg: DecodeConfig, rows: int, n_scales: int) -> list[ParamSpec]:
    width = cfg.residual_width
    return [ParamSpec(f"{prefix}_fn", (rows, width), "fp32", "normal", width ** -0.5),
            _vec(f"{prefix}_scale", n_scales, "ones"),
            _vec(f"{prefix}_base", rows, "normal", 0.5)]


def layer_param_specs(cfg: DecodeConfig, layer: int) -> list[ParamSpec]:
    """Parameters of one transformer layer (attention + MoE + its two mHC blocks)."""
    cls = cfg.layer_class(layer)
    H, D, h = cfg.n_heads, cfg.head_dim, cfg.hidden
    group_in = H // cfg.o_groups * D
    specs = [
        *_hc("hc_attn", cfg, n_mixes(cfg), 3),
        _vec("attn_norm", h),
        _linear("wq_a", cfg.q_rank, h),
        _vec("q_norm", cfg.q_rank),
        _linear("wq_b", H * D, cfg.q_rank),
        _linear("wkv", D, h),
        _vec("kv_norm", D),
        _vec("sink", H, "normal", 1.0),
        ParamSpec("wo_a", (cfg.o_groups, cfg.o_rank, group_in), "bf16", "normal", group_in ** -0.5),
        _linear("wo_b", h, cfg.o_groups * cfg.o_rank),
    ]
    ratio = compress_ratio(cfg, cls)
    if ratio:  # the KV compressor: gated pooling of `ratio` tokens into one latent entry
        specs += [_linear("comp_wkv", D, h), _linear("comp_wgate", D, h),
                  ParamSpec("comp_ape", (ratio, D), "fp32", "normal", 0.1), _vec("comp_norm", D)]
    if cls == "c4":  # lightning indexer: query heads, head weights, and its own key compressor
        Hi, Di = cfg.idx_heads, cfg.idx_dim
        specs += [_linear("idx_wq", Hi * Di, cfg.q_rank), _linear("idx_wproj", Hi, h),
                  _linear("idx_comp_wk", Di, h), _linear("idx_comp_wgate", Di, h),
                  ParamSpec("idx_comp_ape", (ratio, Di), "fp32", "normal", 0.1),
                  _vec("idx_comp_norm", Di)]
    E, inner = cfg.n_experts, cfg.expert_inner
    shared_inner = cfg.n_shared_experts * inner
    specs += [
        *_hc("hc_ffn", cfg, n_mixes(cfg), 3),
        _vec("ffn_norm", h),
        _linear("gate", E, h, dtype="fp32"),
        _vec("gate_bias", E, "normal", 0.01),  # selection-only bias (load balancing)
        ParamSpec("w_gate", (E, inner, h), "bf16", "normal", h ** -0.5, "experts"),
        ParamSpec("w_up", (E, inner, h), "bf16", "normal", h ** -0.5, "experts"),
        ParamSpec("w_down", (E, h, inner), "bf16", "normal", inner ** -0.5, "experts"),
        _linear("s_gate", shared_inner, h),
        _linear("s_up", shared_inner, h),
        _linear("s_down", h, shared_inner),
    ]
    if layer < cfg.n_hash_layers:  # token id -> its fixed top-k experts
        specs.append(ParamSpec("tid2eid", (cfg.vocab, cfg.topk_experts), "int64", "hash",
                               kind="rows"))
    return specs


def global_param_specs(cfg: DecodeConfig) -> list[ParamSpec]:
    """Embedding, the final hyper-connection collapse, the final norm and the LM head."""
    h = cfg.hidden
    return [
        ParamSpec("embed", (cfg.vocab, h), "bf16", "normal", 1.0, "rows"),
        *_hc("hc_head", cfg, cfg.hc_mult, 1),
        _vec("norm", h),
        _linear("lm_head", cfg.vocab, h),
    ]
