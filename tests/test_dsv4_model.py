"""The DeepSeek-V4 decode step on `tiny` (CPU): ops against the dsv4.ref_ops references, cache
behaviour, reset, reconfigure restart classes, what_ran, device exclusions."""
from __future__ import annotations

import pytest
import torch

import dsv4
from dsv4 import attention, indexer, moe
from dsv4.mhc import mhc_mixes
from dsv4.ref_ops import (indexer_scores_ref, mhc_prenorm_ref, moe_experts_ref,
                          quantize_fp8_rowwise, sparse_mqa_decode_ref)
from dsv4.session import DecodeSession


pytestmark = pytest.mark.usefixtures("one_torch_thread")  # conftest: one torch thread


def tiny(**knobs):
    return dsv4.preset("tiny", **knobs)


# ---- ops against the references ----

def _attn_inputs(seed=0, B=3, H=8, S=40, K=24, D=64):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, H, D, generator=g).to(torch.bfloat16)
    kv = torch.randn(B, S, D, generator=g).to(torch.bfloat16)
    idx = torch.randint(0, S, (B, K), generator=g, dtype=torch.int32)
    idx[:, -5:] = -1  # empty slots
    idx[1, :] = -1  # a sequence with nothing selected: only the sink
    sink = torch.randn(H, generator=g)
    return q, kv, idx, sink, D ** -0.5


def test_attention_per_head_matches_ref():
    q, kv, idx, sink, scale = _attn_inputs()
    out = attention.sparse_mqa_per_head_torch(q, kv, idx, sink, scale)
    ref = sparse_mqa_decode_ref(q, kv, idx, sink, scale)
    torch.testing.assert_close(out.float(), ref.float(), atol=1e-2, rtol=1e-2)
    assert out[1].abs().max() == 0  # nothing selected: all weight on the sink, zero output


def test_attention_mma_matches_ref():
    q, kv, idx, sink, scale = _attn_inputs(seed=1)
    out = attention.sparse_mqa_mma_torch(q, kv, idx, sink, scale)
    ref = sparse_mqa_decode_ref(q, kv, idx, sink, scale)
    torch.testing.assert_close(out.float(), ref.float(), atol=2e-2, rtol=2e-2)


def test_attention_knob_dispatch_cpu():
    q, kv, idx, sink, scale = _attn_inputs()
    knobs = tiny().knobs()
    _, desc = attention.sparse_mqa(q, kv, idx, sink, scale, knobs)
    assert "per_head" in desc and "n/a on cpu" in desc
    _, desc = attention.sparse_mqa(q, kv, idx, sink, scale, {**knobs, "attention": "mma"})
    assert "mma" in desc


@pytest.mark.parametrize("mode", ["fp32", "bf16"])
def test_indexer_scores_match_ref(mode):
    g = torch.Generator().manual_seed(0)
    q8, qs = quantize_fp8_rowwise(torch.randn(2, 4, 32, generator=g))
    k8, ks = quantize_fp8_rowwise(torch.randn(2, 48, 32, generator=g))
    logits = indexer.score_logits(q8, k8, mode)  # [B, Hi, S] on the raw codes
    w = torch.randn(2, 4, generator=g)
    got = (logits.relu() * (w * qs.squeeze(-1))[:, :, None]).sum(1) * ks.squeeze(-1)
    ref = indexer_scores_ref(q8.float() * qs, k8.float() * ks, w,
                             torch.tensor([48, 48], dtype=torch.int32), mode="fp32")
    tol = 1e-5 if mode == "fp32" else 1e-2
    torch.testing.assert_close(got, ref, atol=tol * ref.abs().max().item(), rtol=tol)


def test_indexer_fp8_refuses_cpu():
    q8, _ = quantize_fp8_rowwise(torch.randn(1, 4, 32))
    with pytest.raises(RuntimeError, match="CUDA"):
        indexer.score_logits(q8, q8, "fp8")


@pytest.mark.parametrize("gemm,operand,weight", [
    ("fp32", "cast_from_fp32", "cast_per_call"), ("bf16", "cast_from_fp32", "cast_per_call"),
    ("bf16", "view_bf16_residual", "cast_per_call"), ("bf16", "view_bf16_residual", "cached")])
def test_mhc_mixes_variants(gemm, operand, weight):
    g = torch.Generator().manual_seed(0)
    R = torch.randn(3, 4, 64, generator=g).to(torch.bfloat16)
    hc_fn = torch.randn(24, 256, generator=g) / 16
    x_flat = R.view(3, -1).float()
    mixes, desc = mhc_mixes(x_flat, R, hc_fn, hc_fn.to(torch.bfloat16), gemm, operand, weight)
    r = torch.rsqrt(x_flat.pow(2).mean(-1, keepdim=True) + 1e-6)
    ref = mhc_prenorm_ref(x_flat, hc_fn)
    tol = 1e-5 if gemm == "fp32" else 2e-2
    torch.testing.assert_close(mixes * r, ref, atol=tol * ref.abs().max().item(), rtol=tol)
    assert ("inert" in desc) == (gemm == "fp32")
    if gemm == "bf16":
        assert operand in desc and weight in desc


def test_view_operand_is_a_view_and_cast_is_a_copy():
    R = torch.randn(2, 4, 64).to(torch.bfloat16)
    x_flat = R.view(2, -1).float()
    assert R.view(2, -1).data_ptr() == R.data_ptr()
    assert torch.equal(x_flat.to(torch.bfloat16), R.view(2, -1))  # same values: lossless round trip


@pytest.mark.parametrize("mode", ["loop", "grouped"])
def test_moe_experts_match_ref(mode):
    cfg = tiny()
    sess = DecodeSession(cfg, batch=4)
    p = sess.weights.layers[2]  # a router-routed layer
    g = torch.Generator().manual_seed(3)
    x = torch.randn(4, cfg.hidden, generator=g).to(torch.bfloat16)
    ids, w = moe.route(x, sess.tokens, p, cfg.topk_experts, hash_routed=False)
    assert torch.allclose(w.sum(-1), torch.full((4,), moe.ROUTE_SCALE))
    if mode == "loop":
        out = moe.experts_loop(x, ids, w, p)
    else:
        out, desc = moe.experts_grouped(x, ids, w, p)
        assert "no host sync" in desc
    ref = moe_experts_ref(x, p.w_gate, p.w_up, p.w_down, ids, w, moe.SWIGLU_LIMIT)
    torch.testing.assert_close(out.to(torch.bfloat16).float(), ref.float(), atol=3e-2, rtol=3e-2)


def test_hash_layers_route_by_token():
    cfg = tiny()
    sess = DecodeSession(cfg, batch=2)
    p = sess.weights.layers[0]
    x = torch.randn(2, cfg.hidden).to(torch.bfloat16)
    tokens = torch.tensor([5, 5])
    ids, _ = moe.route(x, tokens, p, cfg.topk_experts, hash_routed=True)
    assert torch.equal(ids[0], p.tid2eid[5]) and torch.equal(ids[1], p.tid2eid[5])
    assert len(set(p.tid2eid[5].tolist())) == cfg.topk_experts  # distinct experts


# ---- the session ----

@pytest.mark.parametrize("batch", [1, 4])
def test_step_shapes_and_determinism(batch):
    a = DecodeSession(tiny(), batch=batch)
    b = DecodeSession(tiny(), batch=batch)
    ta, tb = a.step(), b.step()
    assert ta.shape == (batch,) and ta.dtype == torch.int64
    assert a.last_logits.shape == (batch, 256) and a.last_logits.dtype == torch.float32
    assert torch.equal(ta, tb) and torch.equal(a.last_logits, b.last_logits)
    assert a.last_logits.std() > 0.3  # not degenerate
    assert torch.isfinite(a.last_logits).all()


def test_seed_changes_weights():
    a = DecodeSession(tiny(seed=0))
    b = DecodeSession(tiny(seed=1))
    a.step(), b.step()
    assert not torch.equal(a.last_logits, b.last_logits)


def test_caches_grow_and_reset_restores():
    cfg = tiny()
    sess = DecodeSession(cfg, batch=2)
    c4 = cfg.layers_of_class("c4")[0]
    lc = sess.cache.layers[c4]
    W, ctx = cfg.window, cfg.context_len
    n0 = ctx // cfg.c4_ratio  # compressed entries after the prefill
    kv0, k80 = lc.kv.clone(), lc.idx_k8.clone()
    assert lc.kv[:, W + n0].abs().sum() == 0  # first free compressed slot
    for _ in range(cfg.c4_ratio):  # one full group: exactly one new compressed entry
        sess.step()
    assert int(sess.cache.pos) == ctx + cfg.c4_ratio
    assert lc.kv[:, W + n0].abs().sum() > 0
    assert lc.kv[:, W + n0 + 1].abs().sum() == 0
    assert lc.idx_k8[:, n0].any() and not lc.idx_k8[:, n0 + 1].any()
    ring = [(ctx + i) % W for i in range(cfg.c4_ratio)]
    assert not torch.equal(lc.kv[:, ring], kv0[:, ring])  # window ring overwritten
    sess.reset()
    assert int(sess.cache.pos) == ctx
    assert torch.equal(lc.kv, kv0) and torch.equal(lc.idx_k8, k80)


def test_reset_reproduces_the_same_tokens():
    sess = DecodeSession(tiny(), batch=3)
    first = [sess.step() for _ in range(5)]
    logits = sess.last_logits.clone()
    sess.reset()
    again = [sess.step() for _ in range(5)]
    assert all(torch.equal(x, y) for x, y in zip(first, again))
    assert torch.equal(logits, sess.last_logits)


def test_capacity_is_enforced():
    sess = DecodeSession(tiny(), batch=1, max_new_tokens=3)
    for _ in range(3):
        sess.step()
    with pytest.raises(RuntimeError, match="cache full"):
        sess.step()
    sess.reset()
    sess.step()


def test_step_with_tokens_teacher_forces():
    a = DecodeSession(tiny(), batch=2)
    b = DecodeSession(tiny(), batch=2)
    forced = torch.tensor([7, 9])
    a.step_with_tokens(forced)
    b.tokens.copy_(forced)
    b.step()
    assert torch.equal(a.last_logits, b.last_logits)


def test_what_ran_reflects_knobs():
    base = DecodeSession(tiny(), batch=1)
    assert "glue" in base.what_ran()  # static facts before any step
    base.step()
    wr = base.what_ran()
    for cls in ("window", "c4", "c128"):
        assert "per_head" in wr[f"attention[{cls}]"]
        assert "fp32" in wr[f"mhc_gemm[{cls}]"] and "inert" in wr[f"mhc_gemm[{cls}]"]
        assert "loop" in wr[f"moe[{cls}]"]
    assert "fp32" in wr["indexer[c4]"] and "indexer[c128]" not in wr
    assert wr["glue"] == "eager" and "n/a on cpu" in wr["cuda_graphs"] and "off" in wr["tf32"]
    assert "hash-routed" in wr["moe[window]"]
    var = DecodeSession(tiny(mhc_gemm="bf16", mhc_operand="view_bf16_residual",
                             hc_fn_weight="cached", indexer_gemm="bf16", attention="mma",
                             moe_experts="grouped"), batch=1)
    var.step()
    wr = var.what_ran()
    assert "view_bf16_residual" in wr["mhc_gemm[c4]"] and "cached" in wr["mhc_gemm[c4]"]
    assert "bf16" in wr["indexer[c4]"] and "mma" in wr["attention[c128]"]
    assert "grouped" in wr["moe[c4]"]


def test_what_ran_shows_per_layer_overrides():
    cfg = tiny(layer_overrides=((2, "attention", "mma"),))
    sess = DecodeSession(cfg)
    sess.step()
    wr = sess.what_ran()
    assert "mma" in wr["attention[c4]"] and "per_head" in wr["attention[c128]"]


def test_reconfigure_restart_classes():
    sess = DecodeSession(tiny(), batch=2)
    assert sess.reconfigure(tiny()) == "none"
    assert sess.reconfigure(tiny(mhc_gemm="bf16")) == "none"
    assert sess.reconfigure(tiny(mhc_gemm="bf16", hc_fn_weight="cached")) == "rebuild"
    assert sess.weights.hc_fn_bf16  # the copies exist
    assert sess.reconfigure(tiny(mhc_gemm="bf16", hc_fn_weight="cached", attention="mma")) == "none"
    assert sess.reconfigure(tiny(moe_experts="grouped")) == "none"  # drops the copies
    assert not sess.weights.hc_fn_bf16
    sess.step()
    assert "grouped" in sess.what_ran()["moe[c4]"]
    assert sess.reconfigure(tiny(attn_block_kv=32)) == "none"  # tile knobs: n/a on cpu


def test_reconfigure_refuses_shape_change():
    sess = DecodeSession(tiny())
    with pytest.raises(ValueError, match="context_len"):
        sess.reconfigure(tiny(context_len=128))
    with pytest.raises(ValueError, match="seed"):
        sess.reconfigure(tiny(seed=3))


def test_reconfigure_resets_state():
    sess = DecodeSession(tiny())
    t0 = sess.step()
    sess.step()
    sess.reconfigure(tiny(moe_experts="grouped"))
    assert torch.equal(sess.step(), t0)


def test_gpu_only_values_refused_on_cpu():
    with pytest.raises(ValueError, match="indexer_gemm=fp8"):
        DecodeSession(tiny(indexer_gemm="fp8"))
    with pytest.raises(ValueError, match="cuda_graphs=on"):
        DecodeSession(tiny(cuda_graphs="on"))
    sess = DecodeSession(tiny())
    with pytest.raises(ValueError, match="fp8"):
        sess.reconfigure(tiny(layer_overrides=((2, "indexer_gemm", "fp8"),)))


def test_capabilities_and_device_info_cpu():
    from dsv4.device import capabilities, device_info
    assert capabilities("cpu") == {"cuda": False, "fp8": False, "triton": False}
    info = device_info("cpu")
    assert info["type"] == "cpu" and info["cpu_model"] and info["memory_bytes"] > 0


def test_presets_construct_shape_math_only():
    """flash-slice / pro-slice are GPU-sized: check their cache and roofline math, no allocation."""
    from dsv4.cache import n_comp_slots
    from dsv4.roofline import bytes_per_step
    for name in ("flash-slice", "pro-slice"):
        cfg = dsv4.preset(name)
        cap = cfg.context_len + 128
        assert n_comp_slots(cfg, "c4", cap) % 16 == 0 and n_comp_slots(cfg, "c4", cap) >= cap // 4
        assert n_comp_slots(cfg, "c128", cap) == cap // 128 + 1
        assert cfg.residual_width in (16384, 28672)
        assert bytes_per_step(cfg, 1)["total"] > 1e9


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_capabilities_and_device_info_cuda():
    from dsv4.device import capabilities, device_info
    caps = capabilities("cuda")
    assert caps["cuda"] and caps["triton"]
    info = device_info("cuda")
    major, minor = torch.cuda.get_device_capability()
    assert info["capability"] == f"{major}.{minor}" and info["arch"] == f"sm_{major}{minor}"
    assert caps["fp8"] == ((major, minor) >= (8, 9))
    assert info["memory_bytes"] > 1e9 and info["name"]


def test_reconfigure_back_from_cached_bf16_hc_fn_to_baseline():
    """Regression: the hc_head collapse read stale global knobs after reconfigure, so going from
    {mhc_gemm=bf16, hc_fn_weight=cached} back to the baseline dropped the cached weight it still used."""
    import torch

    from dsv4.config import preset
    from dsv4.session import DecodeSession

    torch.manual_seed(0)
    base = preset("tiny")
    sess = DecodeSession(base.with_knobs(mhc_gemm="bf16", hc_fn_weight="cached"), batch=2)
    sess.step()
    assert sess.reconfigure(base) in ("none", "recompile", "rebuild")
    sess.step()  # raised "hc_fn_weight=cached but no cached bf16 hc_fn was built" before the fix
    ref = DecodeSession(base, batch=2)
    ref.step()
    assert torch.equal(sess.last_logits, ref.last_logits)


def test_stacked_projections_are_views_and_compute_the_separate_ones():
    from dsv4.weights import STACK_PREFIX, ModelWeights, project

    cfg = dsv4.preset("tiny")
    w = ModelWeights(cfg, torch.device("cpu"))
    x = torch.randn(3, cfg.hidden).to(torch.bfloat16)
    for i in range(cfg.n_layers):
        p = w.layers[i]
        for stack, names in (("attn_in", 7 if cfg.layer_class(i) == "c4" else None), ("moe_in", 2)):
            buf = p[STACK_PREFIX + stack]
            sep, stk = project(x, p, stack, "separate"), project(x, p, stack, "stacked")
            assert list(sep) == list(stk) and (names is None or len(sep) == names)
            for name in sep:  # each weight is a row block of the stack: one copy in memory
                assert p[name].untyped_storage().data_ptr() == buf.untyped_storage().data_ptr()
                torch.testing.assert_close(stk[name], sep[name], rtol=1e-2, atol=1e-2)
    assert {"wq_a", "wkv"} <= set(project(x, w.layers[0], "attn_in", "separate"))
    assert "comp_wkv" not in project(x, w.layers[0], "attn_in", "separate")  # window layer
    with pytest.raises(ValueError, match="proj_gemms 'fused': expected separate or stacked"):
        project(x, w.layers[0], "attn_in", "fused")
