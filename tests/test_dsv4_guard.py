"""The correctness guard: the reference agrees with itself, precision classes, and a deliberately
broken op (DSV4_TEST_BREAK) is caught in every class."""
from __future__ import annotations

import pytest

import dsv4
from dsv4.guard import REFERENCE, TOLERANCES, check, precision_class
from dsv4.session import DecodeSession

BF16_ALL = dict(mhc_gemm="bf16", mhc_operand="view_bf16_residual", hc_fn_weight="cached",
                indexer_gemm="bf16", attention="mma", moe_experts="grouped")


pytestmark = pytest.mark.usefixtures("one_torch_thread")  # conftest: one torch thread


def test_reference_agrees_with_itself_exactly():
    r = check(dsv4.preset("tiny"), batch=2, steps=3)
    assert r["verdict"] == "ok"
    assert r["logits_rel_err"] == 0.0 and r["logits_rel_err_max"] == 0.0
    assert r["token_agreement"] == 1.0
    assert r["reference"] == REFERENCE and r["tolerance"]["class"] == "fp32"
    assert set(r) >= {"verdict", "logits_rel_err", "token_agreement", "tolerance", "steps"}


def test_precision_classes():
    assert precision_class(dsv4.preset("tiny")) == "fp32"
    assert precision_class(dsv4.preset("tiny", cuda_graphs="on")) == "fp32"  # same kernels
    assert precision_class(dsv4.preset("tiny", moe_experts="grouped")) == "bf16"  # other GEMMs
    assert precision_class(dsv4.preset("tiny", attn_split_k=4)) == "bf16"
    assert precision_class(dsv4.preset("tiny", attention="mma")) == "bf16"
    assert precision_class(dsv4.preset("tiny", glue="compile")) == "bf16"
    assert precision_class(dsv4.preset("tiny", layer_overrides=((2, "mhc_gemm", "bf16"),))) == "bf16"
    assert precision_class(dsv4.preset("tiny", indexer_gemm="fp8")) == "fp8"
    assert (TOLERANCES["fp32"]["logits_rel_err"] < TOLERANCES["bf16"]["logits_rel_err"]
            < TOLERANCES["fp8"]["logits_rel_err"])


def test_bf16_variant_has_small_nonzero_error():
    r = check(dsv4.preset("tiny", **BF16_ALL), batch=2, steps=3)
    assert r["verdict"] == "ok", r
    assert 0 < r["logits_rel_err"] < TOLERANCES["bf16"]["logits_rel_err"]


@pytest.mark.parametrize("op", ["attention", "indexer", "mhc", "moe"])
@pytest.mark.parametrize("knobs", [{}, BF16_ALL], ids=["fp32", "bf16"])
def test_broken_op_is_wrong(monkeypatch, op, knobs):
    monkeypatch.setenv("DSV4_TEST_BREAK", op)
    r = check(dsv4.preset("tiny", **knobs), batch=2, steps=3)
    assert r["verdict"] == "wrong", r
    assert r["logits_rel_err"] > 2 * r["tolerance"]["logits_rel_err"]
    assert op in r["what_ran"]["test_break"]


def test_break_hook_is_explicit(monkeypatch):
    monkeypatch.setenv("DSV4_TEST_BREAK", "attention")
    assert "test_break" in DecodeSession(dsv4.preset("tiny")).what_ran()
    assert "test_break" not in DecodeSession(dsv4.preset("tiny"), test_break="").what_ran()
    monkeypatch.setenv("DSV4_TEST_BREAK", "nonsense")
    with pytest.raises(ValueError, match="DSV4_TEST_BREAK"):
        DecodeSession(dsv4.preset("tiny"))


def test_guard_across_seeds_and_batches():
    for seed, batch in ((1, 1), (2, 3)):
        r = check(dsv4.preset("tiny", seed=seed, **BF16_ALL), batch=batch, steps=4)
        assert r["verdict"] == "ok", r
