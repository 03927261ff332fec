"""DecodeConfig: the model's shape plus every variant knob, frozen; and the presets.

Shapes follow DeepSeek-V4 (see the decode notes): one shared 512-d latent K=V per token (MQA),
4-way hyper-connection residual, 4:1 compressed layers with a lightning indexer, 128:1 compressed
layers without one, MoE with one shared expert. Presets shrink layer and expert counts, never the
per-op shapes (except `tiny`, which shrinks everything so one step runs in milliseconds on a CPU).
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from dsv4.knobs import KNOB_BY_NAME, KNOBS, LAYER_CLASSES, check_value

# Epsilons of the model's RMSNorms and of mHC's sigmoid/Sinkhorn normalisations; every implementation
# (eager glue, compiled glue, the Triton glue kernels) reads them from here.
NORM_EPS = 1e-6
HC_EPS = 1e-6


@dataclass(frozen=True)
class DecodeConfig:
    preset: str
    # ---- model shape ----
    hidden: int
    n_layers: int
    n_window_layers: int  # layers [0, n_window_layers) are sliding-window only
    n_heads: int  # query heads, all sharing one latent K=V (MQA)
    head_dim: int  # = nope_dim + rope_dim
    rope_dim: int
    q_rank: int  # low-rank query bottleneck
    o_groups: int  # grouped output projection: wo_a [o_groups, heads/o_groups*head_dim, o_rank]
    o_rank: int
    window: int  # sliding-window KV entries per token
    c4_ratio: int  # tokens per compressed entry on "c4" layers (with indexer)
    c128_ratio: int  # tokens per compressed entry on "c128" layers
    hc_mult: int  # residual streams R [T, hc_mult, hidden]
    sinkhorn_iters: int
    idx_heads: int
    idx_dim: int
    idx_topk: int  # compressed entries the indexer selects on c4 layers
    n_experts: int
    topk_experts: int
    expert_inner: int
    n_shared_experts: int
    n_hash_layers: int  # first layers route by token hash instead of the router
    vocab: int
    context_len: int  # tokens already in each sequence's KV cache before the first measured step
    seed: int = 0
    # ---- variant knobs (global values; names and allowed values in dsv4.knobs) ----
    indexer_gemm: str = "fp32"
    mhc_gemm: str = "fp32"
    mhc_operand: str = "cast_from_fp32"
    hc_fn_weight: str = "cast_per_call"
    attention: str = "per_head"
    attn_block_kv: int = 64
    attn_heads_per_tile: int = 16
    attn_num_warps: int = 4
    attn_num_stages: int = 2
    attn_split_k: int = 1
    moe_experts: str = "loop"
    indexer_kernel: str = "torch"
    mhc_kernel: str = "torch"
    mhc_fuse_post_pre: str = "off"
    glue: str = "eager"
    proj_gemms: str = "separate"
    step_compile: str = "off"
    cuda_graphs: str = "off"
    # Per-layer choices, expanded to layer indices: ((layer, knob, value), ...). A later entry wins.
    layer_overrides: tuple[tuple[int, str, Any], ...] = field(default=())

    def __post_init__(self) -> None:
        for knob in KNOBS:
            check_value(knob, getattr(self, knob.name))  # raises ValueError naming the knob
        if self.head_dim <= self.rope_dim:
            raise ValueError("head_dim must exceed rope_dim")
        if self.n_heads % self.o_groups:
            raise ValueError("n_heads must be divisible by o_groups")
        for layer, name, value in self.layer_overrides:
            if not 0 <= layer < self.n_layers:
                raise ValueError(f"layer override for layer {layer}: model has {self.n_layers} layers")
            knob = KNOB_BY_NAME.get(name)
            if knob is None:
                raise ValueError(f"layer override names unknown knob {name!r}")
            if "layer" not in knob.scopes and "layer_class" not in knob.scopes:
                raise ValueError(f"knob {name!r} is global only; it cannot be set per layer")
            check_value(knob, value)

    # ---- layer structure ----
    def layer_class(self, layer: int) -> str:
        if layer < self.n_window_layers:
            return "window"
        # after the window layers DeepSeek-V4 alternates: even -> c4 (indexer), odd -> c128
        return "c4" if layer % 2 == 0 else "c128"

    def layers_of_class(self, cls: str) -> list[int]:
        if cls not in LAYER_CLASSES:
            raise ValueError(f"unknown layer class {cls!r} (expected one of {LAYER_CLASSES})")
        return [i for i in range(self.n_layers) if self.layer_class(i) == cls]

    def knob(self, name: str, layer: int | None = None) -> Any:
        """The value of knob `name` in effect for `layer` (global value when layer is None)."""
        value = getattr(self, name)
        if layer is not None:
            for lyr, knob_name, v in self.layer_overrides:
                if lyr == layer and knob_name == name:
                    value = v
        return value

    def knobs(self) -> dict[str, Any]:
        return {k.name: getattr(self, k.name) for k in KNOBS}

    @property
    def residual_width(self) -> int:
        return self.hc_mult * self.hidden

    @property
    def nope_dim(self) -> int:
        return self.head_dim - self.rope_dim

    def with_knobs(self, **changes: Any) -> "DecodeConfig":
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["layer_overrides"] = [list(t) for t in self.layer_overrides]
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "DecodeConfig":
        d = dict(d)
        d["layer_overrides"] = tuple(tuple(t) for t in d.get("layer_overrides", ()))
        return cls(**d)


_PRESETS: dict[str, dict[str, Any]] = {
    # Every layer type present, hc_mult 4, MoE with a shared expert; milliseconds per step on a CPU.
    "tiny": dict(hidden=64, n_layers=4, n_window_layers=1, n_heads=8, head_dim=64, rope_dim=16,
                 q_rank=32, o_groups=2, o_rank=32, window=16, c4_ratio=4, c128_ratio=32, hc_mult=4,
                 sinkhorn_iters=20, idx_heads=4, idx_dim=32, idx_topk=16, n_experts=8,
                 topk_experts=2, expert_inner=64, n_shared_experts=1, n_hash_layers=1, vocab=256,
                 context_len=256),
    # V4-Flash per-op shapes; fewer layers and experts so it fits one GPU.
    "flash-slice": dict(hidden=4096, n_layers=6, n_window_layers=2, n_heads=64, head_dim=512,
                        rope_dim=64, q_rank=1024, o_groups=8, o_rank=1024, window=128, c4_ratio=4,
                        c128_ratio=128, hc_mult=4, sinkhorn_iters=20, idx_heads=64, idx_dim=128,
                        idx_topk=512, n_experts=32, topk_experts=6, expert_inner=2048,
                        n_shared_experts=1, n_hash_layers=1, vocab=129280, context_len=4096),
    # V4-Pro widths: hidden 7168, residual 4x7168 = 28672 (the case study's tensor).
    "pro-slice": dict(hidden=7168, n_layers=4, n_window_layers=2, n_heads=128, head_dim=512,
                      rope_dim=64, q_rank=1536, o_groups=16, o_rank=1024, window=128, c4_ratio=4,
                      c128_ratio=128, hc_mult=4, sinkhorn_iters=20, idx_heads=64, idx_dim=128,
                      idx_topk=512, n_experts=16, topk_experts=6, expert_inner=3072,
                      n_shared_experts=1, n_hash_layers=1, vocab=129280, context_len=4096),
}

PRESET_NAMES = tuple(_PRESETS)


def preset(name: str, **overrides: Any) -> DecodeConfig:
    """A preset's config; `overrides` may change shape fields (e.g. context_len) or knobs."""
    if name not in _PRESETS:
        raise ValueError(f"unknown preset {name!r} (expected one of: {', '.join(_PRESETS)})")
    fields = dict(_PRESETS[name])
    fields.update(overrides)
    return DecodeConfig(preset=name, **fields)
