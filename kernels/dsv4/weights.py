"""Seeded random weights, created directly on the device from the specs in `dsv4.shapes`.

Speed depends on shapes and dtypes, not on values, so random weights are faithful for timing. The
scales (std 1/sqrt(fan_in), unit norms) keep every activation O(1) so the logits are not degenerate
and the guard can tell a right variant from a wrong one. Router weights are random too: that gives a
near-uniform spread over experts, i.e. realistic activation counts per batch.

Checkpoint dtypes not reproduced (see dsv4.shapes): FP8 e4m3 block-scaled linears and MXFP4 experts
are stored bf16 here.
"""
from __future__ import annotations

import torch

from dsv4.config import DecodeConfig
from dsv4.shapes import ParamSpec, global_param_specs, layer_param_specs

TORCH_DTYPES = {"bf16": torch.bfloat16, "fp32": torch.float32, "int64": torch.int64}


class Params(dict):
    """name -> tensor, readable as attributes (`lw.wq_a`)."""

    def __getattr__(self, name: str) -> torch.Tensor:
        try:
            return self[name]
        except KeyError:
            raise AttributeError(name) from None


def _init(spec: ParamSpec, cfg: DecodeConfig, gen: torch.Generator, device: torch.device) -> torch.Tensor:
    dtype = TORCH_DTYPES[spec.dtype]
    if spec.init == "ones":
        return torch.ones(spec.shape, dtype=dtype, device=device)
    if spec.init == "zeros":
        return torch.zeros(spec.shape, dtype=dtype, device=device)
    if spec.init == "normal":
        t = torch.randn(spec.shape, generator=gen, dtype=dtype, device=device)
        return t.mul_(spec.std)
    if spec.init == "hash":
        # each token id gets topk distinct experts, uniformly at random (like a fixed hash)
        noise = torch.rand((cfg.vocab, cfg.n_experts), generator=gen, device=device)
        return noise.topk(cfg.topk_experts, dim=-1).indices.to(dtype)
    raise ValueError(f"unknown init {spec.init!r} for {spec.name}")


# Weights that read the same activation, row-stacked in one buffer: proj_gemms=stacked computes them
# with ONE GEMM (at C=1 each separate small GEMM costs a launch plus a split-K reduce for ~1-2 us of
# bytes). The Params entries are row views of the stack, so both variants read the same memory and
# switching is free. Names absent from a layer's class (no compressor on window layers) are skipped.
STACKS: dict[str, tuple[str, ...]] = {
    "attn_in": ("wq_a", "wkv", "comp_wkv", "comp_wgate", "idx_comp_wk", "idx_comp_wgate",
                "idx_wproj"),  # [B, hidden] attention input (the hc_attn-collapsed, normed x)
    "moe_in": ("s_gate", "s_up"),  # [B, hidden] MoE input: the shared expert's two up-projections
}
STACK_PREFIX = "stacked_"  # Params key of a stack; not counted again by nbytes


def _stack_rows(p: Params) -> None:
    for stack, names in STACKS.items():
        present = [n for n in names if n in p]
        buf = torch.cat([p[n] for n in present])  # [sum of rows, hidden]
        row = 0
        for n in present:
            rows = p[n].shape[0]
            p[n] = buf[row:row + rows]  # a contiguous row block: F.linear reads it as before
            row += rows
        p[STACK_PREFIX + stack] = buf


def project(x: torch.Tensor, p: Params, stack: str, mode: str) -> dict[str, torch.Tensor]:
    """x [B, hidden] -> {name: x @ p[name].T [B, rows]} for the weights of `stack` in this layer.
    mode: the proj_gemms knob ("separate": one GEMM each; "stacked": one GEMM, then column views)."""
    names = [n for n in STACKS[stack] if n in p]
    if mode == "separate":
        return {n: torch.nn.functional.linear(x, p[n]) for n in names}
    if mode != "stacked":
        raise ValueError(f"proj_gemms {mode!r}: expected separate or stacked")
    y = torch.nn.functional.linear(x, p[STACK_PREFIX + stack])  # [B, sum of rows]
    return dict(zip(names, y.split([p[n].shape[0] for n in names], dim=-1)))


class ModelWeights:
    """All weights of the decode step; `layers[i]` holds layer i's Params."""

    def __init__(self, cfg: DecodeConfig, device: torch.device):
        gen = torch.Generator(device=device)
        gen.manual_seed(cfg.seed)
        self.globals = Params({s.name: _init(s, cfg, gen, device) for s in global_param_specs(cfg)})
        self.layers = [Params({s.name: _init(s, cfg, gen, device) for s in layer_param_specs(cfg, i)})
                       for i in range(cfg.n_layers)]
        for p in self.layers:
            _stack_rows(p)
        # bf16 copies of the mHC weights, built only for layers whose hc_fn_weight knob is "cached"
        # (see sync_hc_cache); key (layer, "hc_attn" | "hc_ffn")
        self.hc_fn_bf16: dict[tuple[int, str], torch.Tensor] = {}

    def sync_hc_cache(self, wanted_layers: set[int]) -> bool:
        """Make the cached bf16 hc_fn copies exist exactly for `wanted_layers` (layer -1 = the
        hc_head collapse); True if any copy was built (the "rebuild" work of hc_fn_weight)."""
        built = False
        for key in list(self.hc_fn_bf16):
            if key[0] not in wanted_layers:
                del self.hc_fn_bf16[key]
        for layer in sorted(wanted_layers):
            if layer == -1:
                srcs = {"hc_head": self.globals.hc_head_fn}
            else:
                srcs = {pre: self.layers[layer][f"{pre}_fn"] for pre in ("hc_attn", "hc_ffn")}
            for prefix, fn in srcs.items():  # fn: [M, W] fp32
                if (layer, prefix) not in self.hc_fn_bf16:
                    self.hc_fn_bf16[(layer, prefix)] = fn.to(torch.bfloat16).contiguous()
                    built = True
        return built

    def nbytes(self) -> int:
        tensors = list(self.globals.values()) + [t for p in self.layers for k, t in p.items()
                                                 if not k.startswith(STACK_PREFIX)]
        tensors += list(self.hc_fn_bf16.values())
        return sum(t.numel() * t.element_size() for t in tensors)
