"""The Triton specialisations a layer's knob values launch: what the worker JIT-compiles, keyed the
way Triton keys them (a kernel and its operand dtype). Torch-free, so the parent process can predict
a switch's compile without building anything (autoopt.targets.builtin.transitions), and the worker
(dsv4.session) asks the same function what it must compile before it captures.

A knob that only picks an operand dtype (mhc_gemm, indexer_gemm) is a Python branch in eager code,
but under a Triton kernel that reads the operand (mhc_kernel=triton_splitk, mhc_fuse_post_pre=on,
indexer_kernel=triton_fused) a new dtype is a new specialisation of that kernel: its first use
compiles it (on the H100 the first mhc_gemm=bf16 under mhc_kernel=triton_splitk took 2.6-3.7 s where
switches that compile nothing took 0.4-1.5 s: benchmarks/results/h100_live_*).
"""
from __future__ import annotations

from typing import Any, Mapping

# the kernel of each specialisation kind -> the knob that turns the kernel on (whose build a new
# specialisation redoes though that knob keeps its value)
KERNEL_KNOB = {"indexer_fused": "indexer_kernel", "mhc_prenorm": "mhc_kernel",
               "mhc_post_pre": "mhc_fuse_post_pre", "moe": "moe_experts"}


def layer_triton_keys(knobs: Mapping[str, Any], layer_class: str,
                      next_knobs: Mapping[str, Any] | None) -> set[tuple]:
    """The (kernel, operand) specialisations one layer launches, from its knob values, its class and
    the next layer's knob values (a fused hc_post feeds the next layer's hc_pre)."""
    keys: set[tuple] = set()
    if layer_class == "c4" and knobs["indexer_kernel"] == "triton_fused":
        keys.add(("indexer_fused", knobs["indexer_gemm"]))
    if knobs["mhc_kernel"] == "triton_splitk":
        keys.add(("mhc_prenorm", knobs["mhc_gemm"]))
    if knobs["mhc_fuse_post_pre"] == "on":
        keys.add(("mhc_post_pre", knobs["mhc_gemm"]))
        if next_knobs is not None:
            keys.add(("mhc_post_pre", next_knobs["mhc_gemm"]))
    if knobs["moe_experts"] == "triton_grouped":
        keys.add(("moe", "triton_grouped"))
    return keys


def head_triton_keys(global_knobs: Mapping[str, Any]) -> set[tuple]:
    """hc_head's specialisation: it follows the global values (after the last layer)."""
    if global_knobs["mhc_kernel"] == "triton_splitk":
        return {("mhc_prenorm", global_knobs["mhc_gemm"])}
    return set()


def model_triton_keys(layers: list[tuple[str, Mapping[str, Any]]],
                      global_knobs: Mapping[str, Any]) -> set[tuple]:
    """Every specialisation of a model whose layers are `(class, knob values)`, hc_head included."""
    keys = head_triton_keys(global_knobs)
    for i, (cls, knobs) in enumerate(layers):
        keys |= layer_triton_keys(knobs, cls, layers[i + 1][1] if i + 1 < len(layers) else None)
    return keys
