"""One DeepSeek-V4 decode step for a batch of sequences (one new token each):

    embedding -> R [B, hc, hidden] (the token's embedding in every stream)
    per layer:  hc_pre -> attention -> hc_post -> hc_pre -> MoE -> hc_post
    hc_head (collapse the streams) -> RMSNorm -> lm_head -> logits [B, vocab] fp32

With mhc_fuse_post_pre=on for layer i, both hc_posts of layer i run fused with the hc_pre that
follows (dsv4.mhc.hc_post_pre): after attention with layer i's hc_pre before the MoE, after the MoE
with layer i+1's hc_pre before attention (that hc_pre's GEMM knobs and weights are layer i+1's).
The last layer's hc_post before hc_head stays unfused. what_ran: ("mhc_gemm", i) describes layer
i's hc_pre before attention (fused or not), ("mhc_post_pre", i) layer i's fused posts.

Each part runs inside a profiler section (dsv4.sections: dsv4::embed, mhc_pre, attention, mhc_post,
mhc_post_pre, moe, mhc_head, head), so a CPU profile can attribute the host time between ops to the
part that spent it; no cost when no profiler records.

Knob values are resolved per layer once (LayerPlan) when the session is (re)configured, not looked
up at every step. The step does no host synchronisation except where a variant needs one
(moe_experts=loop), so it can be captured in a CUDA graph.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from dsv4.attention import attention_block
from dsv4.cache import DecodeCache
from dsv4.config import DecodeConfig
from dsv4.glue import Glue
from dsv4.knobs import KNOBS
from dsv4.mhc import hc_head, hc_post, hc_post_pre, hc_pre
from dsv4.moe import moe_block
from dsv4.rope import cos_sin, inv_freq
from dsv4.sections import section
from dsv4.weights import ModelWeights

BREAKABLE_OPS = ("attention", "indexer", "mhc", "moe")
BREAK_MHC_FACTOR = 1.25  # DSV4_TEST_BREAK=mhc scales the post (stream write-back) weights by this


@dataclass(frozen=True)
class LayerPlan:
    layer: int
    cls: str  # "window" | "c4" | "c128"
    hash_routed: bool
    knobs: dict = field(hash=False)  # knob name -> value in effect for this layer


def make_plans(cfg: DecodeConfig) -> list[LayerPlan]:
    return [LayerPlan(i, cfg.layer_class(i), i < cfg.n_hash_layers,
                      {k.name: cfg.knob(k.name, i) for k in KNOBS}) for i in range(cfg.n_layers)]


@dataclass
class ModelState:
    """Everything a step reads or writes; the session owns it."""
    cfg: DecodeConfig
    weights: ModelWeights
    cache: DecodeCache
    plans: list[LayerPlan]
    glue: Glue
    breaks: frozenset[str] = frozenset()  # test hook ops (DSV4_TEST_BREAK)
    freqs: torch.Tensor | None = None  # [rope_dim / 2] fp32

    def __post_init__(self) -> None:
        if self.freqs is None:
            self.freqs = inv_freq(self.cfg.rope_dim, self.cache.pos.device)


def _pre(st: ModelState, R: torch.Tensor, pending: tuple | None, p, prefix: str,
         norm_w: torch.Tensor, layer: int, knobs: dict):
    """Layer `layer`'s hc_pre `prefix`, fused with the pending hc_post (out, post, comb) of the
    sublayer before when there is one. -> (x, post, comb, R (new when fused), what ran)"""
    cached = st.weights.hc_fn_bf16.get((layer, prefix))
    if pending is not None:
        out, post, comb = pending
        with section("mhc_post_pre"):
            R, x, post, comb, desc = hc_post_pre(out, R, post, comb, p, prefix, norm_w, cached,
                                                 knobs, st.glue)
    else:
        with section("mhc_pre"):
            x, post, comb, desc = hc_pre(R, p, prefix, norm_w, cached, knobs, st.glue)
    if "mhc" in st.breaks:
        post = post * BREAK_MHC_FACTOR
    return x, post, comb, R, desc


def decode_forward(st: ModelState, tokens: torch.Tensor) -> tuple[torch.Tensor, dict]:
    """tokens: [B] int64 on the device -> (logits [B, vocab] fp32, {(op, layer): what ran}).
    Appends the tokens to every layer's cache and advances cache.pos by one."""
    cfg, w, cache = st.cfg, st.weights, st.cache
    B = tokens.shape[0]
    pos = cache.pos  # 0-d int64: position of these tokens
    cos, sin = cos_sin(pos, st.freqs)  # [rope_dim / 2] each
    rope = (st.freqs, cos, sin)
    ran: dict[tuple[str, int], str] = {}

    with section("embed"):
        x = w.globals.embed[tokens]  # [B, hidden] bf16
        R = x[:, None, :].expand(B, cfg.hc_mult, cfg.hidden).contiguous()  # [B, hc, hidden] bf16
    pending = None  # (out, post, comb) of the previous layer's MoE hc_post, left to be fused
    for plan, p, lc in zip(st.plans, w.layers, cache.layers):
        i, knobs = plan.layer, plan.knobs
        fuse = knobs["mhc_fuse_post_pre"] == "on"
        x, post, comb, R, ran[("mhc_gemm", i)] = _pre(st, R, pending, p, "hc_attn", p.attn_norm, i,
                                                      knobs)
        with section("attention"):
            out, ran_attn = attention_block(x, p, lc, pos, rope, cfg, knobs, st.breaks)
        for op, desc in ran_attn.items():
            ran[(op, i)] = desc
        if fuse:
            x, post, comb, R, desc = _pre(st, R, (out, post, comb), p, "hc_ffn", p.ffn_norm, i, knobs)
        else:
            with section("mhc_post"):
                R = hc_post(out, R, post, comb, st.glue)
            x, post, comb, R, _ = _pre(st, R, None, p, "hc_ffn", p.ffn_norm, i, knobs)
        with section("moe"):
            out, ran[("moe", i)] = moe_block(x, tokens, p, cfg.topk_experts, plan.hash_routed,
                                             knobs["moe_experts"], "moe" in st.breaks,
                                             knobs["proj_gemms"])
        last = i == len(st.plans) - 1
        if fuse:
            ran[("mhc_post_pre", i)] = desc + ("; the MoE's hc_post unfused (last layer: hc_head "
                                               "follows)" if last else "; the MoE's hc_post fused "
                                               "with the next layer's hc_pre")
        if fuse and not last:
            pending = (out, post, comb)
        else:
            with section("mhc_post"):
                R, pending = hc_post(out, R, post, comb, st.glue), None

    with section("mhc_head"):
        y, ran[("mhc_gemm", -1)] = hc_head(R, w.globals, cfg.knobs(), st.glue,
                                           w.hc_fn_bf16.get((-1, "hc_head")))
    with section("head"):
        logits = F.linear(y, w.globals.lm_head).float()  # [B, vocab]
    cache.pos.add_(1)
    return logits, ran
