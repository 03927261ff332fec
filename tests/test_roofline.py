"""Roofline bytes and FLOPs, checked against a hand count for `tiny` and against the built weights."""
from __future__ import annotations

import pytest

import dsv4
from dsv4.roofline import bytes_per_step, expected_active_experts, flops_per_step


def test_expected_active_experts():
    assert expected_active_experts(8, 2, 1) == pytest.approx(2.0)
    assert expected_active_experts(8, 2, 2) == pytest.approx(8 * (1 - 0.75 ** 2))  # 3.5
    assert expected_active_experts(256, 6, 10_000) == pytest.approx(256.0)


def test_tiny_by_hand():
    cfg = dsv4.preset("tiny")  # hidden 64, 4 layers: window, c128, c4, c128
    h, D, H, q, W = 64, 64, 8, 32, 4 * 64
    hc = 24 * W * 4 + 3 * 4 + 24 * 4  # hc_fn fp32 + scale + base
    attn = (hc + h * 4 + q * h * 2 + q * 4 + H * D * q * 2 + D * h * 2 + D * 4 + H * 4
            + 2 * 32 * (4 * 64) * 2 + h * 64 * 2)  # ... wo_a [2, 32, 256], wo_b [64, 64]
    comp = lambda r: 2 * D * h * 2 + r * D * 4 + D * 4  # noqa: E731  wkv, wgate, ape, norm
    idx = 4 * 32 * q * 2 + 4 * h * 2 + 2 * 32 * h * 2 + 4 * 32 * 4 + 32 * 4
    ffn = hc + h * 4 + 8 * h * 4 + 8 * 4 + 3 * 64 * h * 2  # router, bias, shared expert
    per_layer = [attn + ffn, attn + comp(32) + ffn, attn + comp(4) + idx + ffn, attn + comp(32) + ffn]
    B = 2
    glob = B * h * 2 + (4 * W * 4 + 4 + 4 * 4) + h * 4 + 256 * h * 2  # embed rows, hc_head, norm, lm
    hash_rows = B * 2 * 8  # tid2eid rows of layer 0
    got = bytes_per_step(cfg, B)
    assert got["dense_weights"] == glob + sum(per_layer) + hash_rows
    assert got["experts"] == pytest.approx(4 * 3.5 * 3 * 64 * h * 2)
    # KV per sequence: window 16 every layer; c128: 257 // 32 = 8 entries; c4: top 16 of
    # 257 // 4 = 64, plus 64 FP8 keys of 32 B + 4 B scale
    entries = 16 + (16 + 8) + (16 + 16) + (16 + 8)
    assert got["kv"] == B * (entries * D * 2 + 64 * (32 + 4))
    assert got["total"] == got["dense_weights"] + got["experts"] + got["kv"]


def test_bytes_match_built_weights():
    import torch
    from dsv4.weights import ModelWeights
    cfg = dsv4.preset("tiny")
    w = ModelWeights(cfg, torch.device("cpu"))
    B = cfg.vocab  # every table row read
    got = bytes_per_step(cfg, B)
    expert_bytes = sum(p[n].numel() * 2 for p in w.layers for n in ("w_gate", "w_up", "w_down"))
    assert got["dense_weights"] + expert_bytes == w.nbytes()
    assert got["experts"] == pytest.approx(expert_bytes, rel=1e-9)  # 256 tokens: all experts


def test_flops_tiny_and_scaling():
    cfg = dsv4.preset("tiny")
    f1, f4 = flops_per_step(cfg, 1), flops_per_step(cfg, 4)
    assert f4["total"] == pytest.approx(4 * f1["total"])  # decode FLOPs are per token
    assert f1["experts"] == 4 * 2 * 2 * 3 * 64 * 64  # layers x 2/MAC x topk x 3 mats
    assert f1["attention"] == 4 * 8 * (16 + 24 + 32 + 24) * 64  # 2 dots x 2 FLOPs x H x K x D
    assert f1["indexer"] == 2 * 4 * 32 * 64


def test_flash_slice_is_memory_bound_scale():
    cfg = dsv4.preset("flash-slice")
    b1, b64 = bytes_per_step(cfg, 1), bytes_per_step(cfg, 64)
    assert 10e9 < b64["total"] < 20e9  # ~2 GB embeddings/head + 6 layers of 32 bf16 experts
    assert b1["experts"] < b64["experts"] <= 6 * 32 * 3 * 2048 * 4096 * 2
    assert b64["kv"] == pytest.approx(64 * b1["kv"])
    ai = flops_per_step(cfg, 1)["total"] / b1["total"]
    assert ai < 2  # FLOPs per byte at batch 1: far below any GPU's ridge point
