"""The MoE sublayer: fp32 router, sqrt-softplus scores, top-k with a selection-only bias (or a fixed
token-hash table on the first n_hash_layers), weights normalised and scaled by 1.5, clamped-SwiGLU
routed experts plus one always-on shared expert.

The `moe_experts` knob:
  loop     Python loop over the experts this batch activates. Finding them needs their counts on the
           host (.tolist(): a device -> host sync), so this variant cannot be captured in a CUDA graph.
  grouped  no host sync: token-slots sorted by expert on the device, per-expert row offsets from a
           scatter-add (torch.bincount would sync), then one torch._grouped_mm per projection that
           reads each *active* expert's weights once. Where torch has no _grouped_mm, a dense
           batched matmul over all E experts (zero routing weight for tokens not routed there);
           what_ran says which ran.
  triton_grouped  (CUDA) dsv4.triton_moe.moe_grouped: expert-sorted row blocks found on the device,
           gate/up GEMMs with the clamped SwiGLU fused, down GEMM times the routing weight, a fixed-
           order reduce over the k slots; no host sync, every launch shape fixed by (B, k, E), so it
           can be captured in a CUDA graph. Its output is bf16 (the routed sum rounded once before
           the shared expert is added, where the torch variants add in fp32).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from dsv4.weights import Params, project

ROUTE_SCALE = 1.5
SWIGLU_LIMIT = 10.0
BREAK_MOE_FACTOR = 1.25  # DSV4_TEST_BREAK=moe scales the routed experts' output by this


def swiglu(gate: torch.Tensor, up: torch.Tensor, limit: float | None = SWIGLU_LIMIT) -> torch.Tensor:
    """silu(gate) * up, with DeepSeek-V4's clamp on the routed experts (fp32 math, input dtype out)."""
    g, u = gate.float(), up.float()
    if limit is not None:
        g, u = g.clamp(max=limit), u.clamp(-limit, limit)
    return (F.silu(g) * u).to(gate.dtype)


def route(x: torch.Tensor, tokens: torch.Tensor, p: Params, topk: int,
          hash_routed: bool, fused: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """x: [B, hidden] bf16 normed, tokens: [B] int64 -> (ids [B, k] int64, weights [B, k] fp32).
    fused (moe_experts=triton_grouped, top-k layers): everything after the router GEMM in one
    Triton launch (dsv4.triton_moe.router_topk; ids int32)."""
    logits = x.float() @ p.gate.T  # [B, E] fp32 router
    if fused and not hash_routed:
        from dsv4.triton_moe import router_topk

        return router_topk(logits, p.gate_bias, topk, ROUTE_SCALE)
    scores = torch.sqrt(F.softplus(logits))
    if hash_routed:
        ids = p.tid2eid[tokens]  # [B, k] fixed per token id
    else:
        ids = (scores + p.gate_bias).topk(topk, dim=-1).indices  # bias steers selection only
    w = scores.gather(1, ids)
    return ids, w / w.sum(dim=-1, keepdim=True) * ROUTE_SCALE


def experts_loop(x: torch.Tensor, ids: torch.Tensor, w: torch.Tensor, p: Params) -> torch.Tensor:
    """Loop over the active experts (host sync). x [B, hidden] bf16 -> [B, hidden] fp32."""
    B, k = ids.shape
    E = p.w_gate.shape[0]
    flat = ids.reshape(-1)  # [B*k] expert of each token-slot
    order = torch.argsort(flat, stable=True)
    counts = torch.bincount(flat, minlength=E).tolist()  # host sync: the loop needs the counts
    out = torch.zeros(B, x.shape[1], dtype=torch.float32, device=x.device)
    start = 0
    for e, n in enumerate(counts):
        if n == 0:
            continue
        slots = order[start:start + n]  # token-slots routed to e
        start += n
        tok = slots // k
        xs = x[tok]  # [n, hidden]
        h = swiglu(xs @ p.w_gate[e].T, xs @ p.w_up[e].T)  # [n, inner]
        y = (h @ p.w_down[e].T).float() * w.reshape(-1)[slots, None]  # [n, hidden]
        out.index_add_(0, tok, y)
    return out


def has_grouped_mm(device: torch.device) -> bool:
    return hasattr(torch, "_grouped_mm") and (device.type == "cpu" or
                                               torch.cuda.get_device_capability(device) >= (9, 0))


def experts_grouped(x: torch.Tensor, ids: torch.Tensor, w: torch.Tensor,
                    p: Params) -> tuple[torch.Tensor, str]:
    """No host sync. x [B, hidden] bf16 -> ([B, hidden] fp32, what ran)."""
    B, k = ids.shape
    E = p.w_gate.shape[0]
    if has_grouped_mm(x.device):
        flat = ids.reshape(-1)  # [B*k]
        order = torch.argsort(flat, stable=True)  # token-slots grouped by expert
        counts = torch.zeros(E, dtype=torch.int32, device=x.device)
        counts.scatter_add_(0, flat, torch.ones_like(flat, dtype=torch.int32))
        offs = torch.cumsum(counts, dim=0, dtype=torch.int32)  # [E] end row of each expert
        tok = order // k
        xs = x[tok]  # [B*k, hidden] sorted by expert
        gate = torch._grouped_mm(xs, p.w_gate.transpose(1, 2), offs=offs)  # [B*k, inner]
        up = torch._grouped_mm(xs, p.w_up.transpose(1, 2), offs=offs)
        y = torch._grouped_mm(swiglu(gate, up), p.w_down.transpose(1, 2), offs=offs)  # [B*k, hidden]
        y = y.float() * w.reshape(-1)[order, None]
        out = torch.zeros(B, x.shape[1], dtype=torch.float32, device=x.device)
        out.index_add_(0, tok, y)
        return out, "grouped: torch._grouped_mm bf16 over active experts, no host sync"
    # dense fallback of the same math: every expert on every token, unrouted pairs weighted 0
    dense_w = torch.zeros(B, E, dtype=torch.float32, device=x.device).scatter(1, ids, w)  # [B, E]
    xe = x[None].expand(E, B, x.shape[1])  # [E, B, hidden]
    h = swiglu(torch.bmm(xe, p.w_gate.transpose(1, 2)), torch.bmm(xe, p.w_up.transpose(1, 2)))
    y = torch.bmm(h, p.w_down.transpose(1, 2)).float()  # [E, B, hidden]
    out = (y * dense_w.T[:, :, None]).sum(dim=0)
    return out, "grouped: dense bmm over all experts (no torch._grouped_mm here), no host sync"


def experts_triton(x: torch.Tensor, ids: torch.Tensor, w: torch.Tensor,
                   p: Params) -> tuple[torch.Tensor, str]:
    """moe_experts=triton_grouped. x [B, hidden] bf16 -> ([B, hidden] fp32, what ran)."""
    from dsv4.triton_moe import moe_grouped, route_path

    out = moe_grouped(x, p.w_gate, p.w_up, p.w_down, ids, w.contiguous(), swiglu_limit=SWIGLU_LIMIT)
    return out.float(), ("triton_grouped: dsv4.triton_moe grouped GEMM (fused clamped SwiGLU), bf16, "
                         f"no host sync, {route_path(ids.numel())}")


def moe_block(x: torch.Tensor, tokens: torch.Tensor, p: Params, topk: int, hash_routed: bool,
              mode: str, break_op: bool = False,
              proj_gemms: str = "separate") -> tuple[torch.Tensor, str]:
    """x: [B, hidden] bf16 normed MoE input -> ([B, hidden] bf16, what ran)."""
    fused_router = mode == "triton_grouped" and not hash_routed
    ids, w = route(x, tokens, p, topk, hash_routed, fused_router)
    if mode == "loop":
        routed, desc = experts_loop(x, ids, w, p), "loop over active experts, bf16 (host sync)"
    elif mode == "grouped":
        routed, desc = experts_grouped(x, ids, w, p)
    elif mode == "triton_grouped":
        routed, desc = experts_triton(x, ids, w, p)
    else:
        raise ValueError(f"moe_experts {mode!r}: expected loop, grouped or triton_grouped")
    if break_op:
        routed = routed * BREAK_MOE_FACTOR
    up = project(x, p, "moe_in", proj_gemms)  # the shared expert's gate / up projections
    shared = F.linear(swiglu(up["s_gate"], up["s_up"], None), p.s_down)
    routing = ("hash-routed" if hash_routed else
               "router top-k (triton moe_router_topk_kernel)" if fused_router else "router top-k")
    return (routed + shared.float()).to(torch.bfloat16), f"{desc}; {routing}"
