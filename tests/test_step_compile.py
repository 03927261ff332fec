"""step_compile=inductor: torch.compile of the whole decode step (the torch code between the Triton
kernels fused by Inductor, the Triton kernels opaque).

CPU: one real compile of `tiny` (about 1.5 min on a 2-core machine): reconfiguring to it is a
recompile, the compiled step matches the fp32 reference within the bf16 tolerance, Dynamo traced the
step as ONE graph (a `section` or anything else breaking the graph would show as a break), and
what_ran says it. The expert loop is refused with a reason before anything is built.
GPU (marked gpu, run on an H200 by the lead): with every Triton kernel (graph breaks around them)
and CUDA graphs on flash-slice, it passes the guard and replays what the eager compiled step computes.
"""
from __future__ import annotations

import pytest
import torch
from torch._dynamo.utils import counters

import dsv4
from dsv4.guard import TOLERANCES, precision_class
from dsv4.session import DecodeSession

HAS_CUDA = torch.cuda.is_available()
needs_cuda = pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA GPU")
CPU_KNOBS = dict(moe_experts="grouped", attention="mma", mhc_gemm="bf16",
                 mhc_operand="view_bf16_residual", hc_fn_weight="cached")
ALL_FAST = dict(attention="mma", attn_split_k=4, indexer_kernel="triton_fused", indexer_gemm="bf16",
                mhc_kernel="triton_splitk", mhc_gemm="bf16", mhc_operand="view_bf16_residual",
                hc_fn_weight="cached", mhc_fuse_post_pre="on", moe_experts="triton_grouped",
                glue="triton")


def test_step_compile_refuses_the_expert_loop_before_building_anything():
    cfg = dsv4.preset("tiny", step_compile="inductor")  # moe_experts=loop is the baseline
    with pytest.raises(ValueError, match=r"step_compile=inductor cannot compile moe_experts=loop "
                                         r"\(layers \[0, 1, 2, 3\]\)"):
        DecodeSession(cfg, batch=2, test_break="")
    sess = DecodeSession(dsv4.preset("tiny", moe_experts="grouped"), batch=2, test_break="")
    loop_in_one_layer = sess.config.with_knobs(step_compile="inductor",
                                               layer_overrides=((2, "moe_experts", "loop"),))
    with pytest.raises(ValueError, match=r"moe_experts=loop \(layers \[2\]\)"):
        sess.reconfigure(loop_in_one_layer)
    assert sess.config.step_compile == "off"  # the refused switch left the session as it was


def test_compiled_step_is_one_graph_and_matches_the_reference():
    counters.clear()
    plain = dsv4.preset("tiny", **CPU_KNOBS)
    ref = DecodeSession(dsv4.preset("tiny"), batch=2, test_break="")  # fp32 reference, eager
    sess = DecodeSession(plain, batch=2, test_break="")
    assert sess.reconfigure(plain.with_knobs(step_compile="inductor")) == "recompile"
    assert counters["stats"]["unique_graphs"] == 1, dict(counters["stats"])
    assert sum(counters["graph_break"].values()) == 0, dict(counters["graph_break"])
    errs = []
    tokens = ref.tokens.clone()
    with torch.no_grad():
        for _ in range(3):
            nxt = ref.step_with_tokens(tokens)
            sess.step_with_tokens(tokens)
            a, b = sess.last_logits, ref.last_logits
            norm = torch.linalg.vector_norm
            errs += (norm(a - b, dim=-1) / norm(b, dim=-1)).tolist()
            tokens = nxt
    errs.sort()
    assert errs[len(errs) // 2] <= TOLERANCES["bf16"]["logits_rel_err"], errs
    assert counters["stats"]["unique_graphs"] == 1  # the steps after the warm-up compiled nothing
    assert precision_class(sess.config) == "bf16"
    assert sess.what_ran()["step_compile"].startswith("torch.compile(decode_and_sample)")
    assert sess.reconfigure(plain) == "none"  # back to eager: a Python switch


@pytest.mark.gpu
@needs_cuda
def test_gpu_compiled_step_with_triton_kernels_and_cuda_graphs_passes_guard():
    from dsv4.guard import check

    cfg = dsv4.preset("flash-slice", context_len=1024, **ALL_FAST, step_compile="inductor",
                      cuda_graphs="on")
    r = check(cfg, device="cuda", batch=4, steps=3)
    assert r["verdict"] == "ok", r
    assert r["what_ran"]["step_compile"].startswith("torch.compile")
    eager = DecodeSession(cfg.with_knobs(cuda_graphs="off"), device="cuda", batch=4)
    graph = DecodeSession(cfg, device="cuda", batch=4)
    for _ in range(3):  # the captured compiled step computes what the compiled step computes
        assert torch.equal(graph.step(), eager.step())
        torch.testing.assert_close(graph.last_logits, eager.last_logits, atol=1e-3, rtol=1e-3)


@pytest.mark.parametrize("vocab", [129280, 1000, 100, 257])
def test_greedy_tokens_is_argmax_including_ties(vocab):
    from dsv4.session import greedy_tokens

    gen = torch.Generator().manual_seed(vocab)
    logits = torch.randn(5, vocab, generator=gen)
    logits[1, vocab // 3] = logits[1, vocab - 1] = 50.0  # a tie across chunks: the first wins
    logits[2] = 0.0  # all equal: index 0
    logits[3, -1] = float("inf")
    assert torch.equal(greedy_tokens(logits), logits.argmax(dim=-1))


def _int_placeholders_after_two_calls(pin: bool) -> list[str]:
    """Compile one frame, call it with two values of an int argument -> the SymInt inputs of the
    graphs Dynamo built. Under config.patch: the process-wide setting comes back as it was (a
    monkeypatch undo would delete the key, which hides it from every later compile)."""
    with torch._dynamo.config.patch(specialize_int=False):  # Dynamo's default
        if pin:
            from dsv4.glue import specialize_int_inputs

            specialize_int_inputs()
        return _symints_of_a_frame_called_twice()


def _symints_of_a_frame_called_twice() -> list[str]:
    seen: list[str] = []

    def backend(gm, example_inputs):
        seen.extend(str(n.meta["example_value"]) for n in gm.graph.nodes
                    if n.op == "placeholder" and isinstance(n.meta.get("example_value"), torch.SymInt))
        return gm.forward

    def tile_step(x, block):  # like a Triton launch whose tile differs per layer class
        return x * block

    torch._dynamo.reset()
    try:
        f = torch.compile(tile_step, backend=backend)
        f(torch.ones(3), 16)
        f(torch.ones(3), 64)
    finally:
        torch._dynamo.reset()
    return seen


def test_specialize_int_inputs_keeps_a_frames_ints_constant():
    """The live H200 run lost 24 trials to a SymInt tile at a Triton launch: with Dynamo's default a
    frame's int argument that changes becomes symbolic; step_function pins ints so it stays a constant
    (one graph per value) — and the default really does make it symbolic (the test can fail)."""
    before = torch._dynamo.config.specialize_int
    assert _int_placeholders_after_two_calls(pin=False), \
        "Dynamo's default no longer makes a changed int symbolic: the pin may be unnecessary"
    assert _int_placeholders_after_two_calls(pin=True) == []
    assert torch._dynamo.config.specialize_int == before  # nothing leaks into later tests
