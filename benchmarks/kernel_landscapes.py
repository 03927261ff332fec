"""The kernels `record_kernel_landscape.py` brute-forces: two of the decode path's Triton kernels
(`kernels/dsv4`) at the flash-slice decode shapes of C = 64, over their tile and launch parameters.

Each spec gives the tuning parameters (Kernel Tuner's `tune_params`), a restriction (combinations it
rejects are absent from the landscape, as in Kernel Tuner), the inputs, one call, and the reference
(`dsv4.ref_ops`) the call's output is checked against. `tiny=True` shapes run in seconds under
TRITON_INTERPRET=1 on a CPU, in fp32 (the interpreter mishandles bf16).
"""
from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from typing import Any, Callable

import torch

from dsv4 import ref_ops
from dsv4.triton_attention import sparse_mqa_decode
from dsv4.triton_moe import moe_grouped

Config = dict[str, Any]
Inputs = dict[str, Any]


@dataclass(frozen=True)
class KernelSpec:
    name: str                                   # the landscape's kernel_name
    params: dict[str, tuple[Any, ...]]          # tune_params, in key order
    allowed: Callable[[Config], bool]           # the restriction
    make_inputs: Callable[[str, bool], Inputs]  # (device, tiny) -> inputs, seeded
    call: Callable[[Inputs, Config], torch.Tensor]
    reference: Callable[[Inputs], torch.Tensor]
    problem: Callable[[bool], dict[str, int]]   # the shapes, for the file's problem_size

    def configs(self) -> list[Config]:
        keys = list(self.params)
        every = (dict(zip(keys, values)) for values in itertools.product(*self.params.values()))
        return [c for c in every if self.allowed(c)]


def config_key(spec: KernelSpec, config: Config) -> str:
    """Kernel Tuner's cache key: the values in tune_params order, joined by commas."""
    return ",".join(str(config[k]) for k in spec.params)


# ---- sparse MQA decode attention: q [B, H, D] over K selected entries of kv [B, S, D] ----

def _attention_problem(tiny: bool) -> dict[str, int]:
    # flash-slice: 64 heads of the 512-wide latent; K = window 128 + indexer top-512
    return (dict(B=2, H=16, D=32, S=64, K=24) if tiny
            else dict(B=64, H=64, D=512, S=1152, K=640))


def _attention_inputs(device: str, tiny: bool) -> Inputs:
    p = _attention_problem(tiny)
    gen = torch.Generator(device="cpu").manual_seed(0)
    dtype = torch.float32 if tiny else torch.bfloat16
    q = torch.randn(p["B"], p["H"], p["D"], generator=gen).to(device, dtype)
    kv = torch.randn(p["B"], p["S"], p["D"], generator=gen).to(device, dtype)
    idx = torch.stack([torch.randperm(p["S"], generator=gen)[:p["K"]] for _ in range(p["B"])])
    idx[:, -max(1, p["K"] // 10):] = -1  # a few empty slots, as a short sequence has
    return dict(q=q, kv=kv, idx=idx.to(device, torch.int32), scale=1.0 / math.sqrt(p["D"]),
                sink=torch.randn(p["H"], generator=gen).to(device, torch.float32))


def _attention_call(x: Inputs, c: Config) -> torch.Tensor:
    return sparse_mqa_decode(x["q"], x["kv"], x["idx"], x["sink"], x["scale"], mode=c["mode"],
                             block_kv=c["block_kv"], heads_per_tile=c["heads_per_tile"],
                             num_warps=c["num_warps"], num_stages=c["num_stages"],
                             split_k=c["split_k"])


ATTENTION = KernelSpec(
    name="sparse_mqa_decode",
    params={"mode": ("per_head", "mma"), "block_kv": (16, 32, 64, 128),
            "heads_per_tile": (16, 32, 64), "num_warps": (2, 4, 8), "num_stages": (1, 2, 3, 4),
            "split_k": (1, 2, 4, 8)},
    # per_head runs one head a program: heads_per_tile is not a parameter of it
    allowed=lambda c: c["mode"] == "mma" or c["heads_per_tile"] == 16,
    make_inputs=_attention_inputs,
    call=_attention_call,
    reference=lambda x: ref_ops.sparse_mqa_decode_ref(x["q"], x["kv"], x["idx"], x["sink"], x["scale"]),
    problem=_attention_problem,
)


# ---- routed experts as a grouped GEMM: T tokens x top-k of E experts ----

def _moe_problem(tiny: bool) -> dict[str, int]:
    # flash-slice: hidden 4096, expert inner 2048, 32 experts, top-6; T = 64 sequences
    return (dict(T=4, hidden=64, inner=32, E=4, topk=2) if tiny
            else dict(T=64, hidden=4096, inner=2048, E=32, topk=6))


def _moe_inputs(device: str, tiny: bool) -> Inputs:
    p = _moe_problem(tiny)
    gen = torch.Generator(device="cpu").manual_seed(0)
    dtype = torch.float32 if tiny else torch.bfloat16
    T, h, n, E, k = p["T"], p["hidden"], p["inner"], p["E"], p["topk"]
    w_scale = 1.0 / math.sqrt(h)  # keeps the SwiGLU inside its clamp, so the check sees the GEMMs
    ids = torch.stack([torch.randperm(E, generator=gen)[:k] for _ in range(T)]).to(torch.int32)
    weights = torch.softmax(torch.randn(T, k, generator=gen), dim=-1)
    return dict(x=torch.randn(T, h, generator=gen).to(device, dtype),
                w_gate=(torch.randn(E, n, h, generator=gen) * w_scale).to(device, dtype),
                w_up=(torch.randn(E, n, h, generator=gen) * w_scale).to(device, dtype),
                w_down=(torch.randn(E, h, n, generator=gen) / math.sqrt(n)).to(device, dtype),
                ids=ids.to(device), weights=weights.to(device, torch.float32))


def _moe_call(x: Inputs, c: Config) -> torch.Tensor:
    return moe_grouped(x["x"], x["w_gate"], x["w_up"], x["w_down"], x["ids"], x["weights"],
                       block_m=c["block_m"], block_n=c["block_n"], block_k=c["block_k"],
                       num_warps=c["num_warps"], num_stages=c["num_stages"])


MOE = KernelSpec(
    name="moe_grouped",
    params={"block_m": (16, 32, 64), "block_n": (32, 64, 128, 256), "block_k": (32, 64, 128, 256),
            "num_warps": (2, 4, 8), "num_stages": (1, 2, 3, 4)},
    allowed=lambda c: True,
    make_inputs=_moe_inputs,
    call=_moe_call,
    reference=lambda x: ref_ops.moe_experts_ref(x["x"], x["w_gate"], x["w_up"], x["w_down"],
                                                x["ids"], x["weights"]),
    problem=_moe_problem,
)

KERNELS = {"attention": ATTENTION, "moe": MOE}


def relative_error(out: torch.Tensor, ref: torch.Tensor) -> float:
    """max |out - ref| / max |ref|: one number per configuration, whatever the output's scale."""
    return float((out.float() - ref.float()).abs().max() / ref.float().abs().max().clamp_min(1e-30))


def tolerance(inputs: Inputs) -> float:
    """bf16 outputs carry ~3 significant digits; fp32 (the CPU check) must match closely."""
    dtypes = {t.dtype for t in inputs.values() if isinstance(t, torch.Tensor) and t.is_floating_point()}
    return 3e-2 if torch.bfloat16 in dtypes else 1e-4
