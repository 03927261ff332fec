"""Whole decode steps with CUDA-only knob values run on the CPU through Triton's interpreter
(TRITON_INTERPRET=1), beside the baseline session: shared by the Triton variant and glue tests.
"""
from __future__ import annotations

import torch

import dsv4
from dsv4.model import make_plans
from dsv4.session import DecodeSession


def interpreted_session(**knobs) -> DecodeSession:
    """A tiny CPU session running `knobs` although they require CUDA: built as the baseline, then
    switched by hand (reconfigure would refuse). Test-only; real CPU sessions never do this."""
    cfg = dsv4.preset("tiny", **knobs)
    sess = DecodeSession(dsv4.preset("tiny"), batch=2, test_break="")
    sess.config = sess.state.cfg = cfg
    sess.state.plans = make_plans(cfg)
    sess.state.glue = sess._glue(cfg.glue)
    sess.weights.sync_hc_cache(DecodeSession._cached_hc_layers(cfg))
    return sess


def rel_errs(knobs: dict, steps: int = 3) -> tuple[list[float], dict]:
    """Per (step, sequence) ||a - b|| / ||b|| of the logits against the baseline, teacher-forced."""
    ref = DecodeSession(dsv4.preset("tiny"), batch=2, test_break="")
    var = interpreted_session(**knobs)
    errs, tokens = [], ref.tokens.clone()
    with torch.no_grad():
        for _ in range(steps):
            ref_next = ref.step_with_tokens(tokens)
            var.step_with_tokens(tokens)
            a, b = var.last_logits, ref.last_logits
            errs += (torch.linalg.vector_norm(a - b, dim=-1)
                     / torch.linalg.vector_norm(b, dim=-1)).tolist()
            tokens = ref_next
    return errs, var.what_ran()
