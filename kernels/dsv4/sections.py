"""Named sections of the decode step, for torch.profiler: `with section("attention"): ...` marks the
code it encloses as `dsv4::attention` in a trace (a record_function user annotation).

Why: on a CPU the eager tiny step is ~9.4k small ops, and a large share of its wall time is Python /
dispatcher time *between* ops that no op's self time covers. autoopt.profile.trace attributes that host
time to the section that spent it (rules: autoopt.profile.rules.SECTION_RULES; innermost section
wins, so the indexer's host time is the indexer's, not the attention's around it). On a GPU the
buckets stay kernel time and the sections add none.

Sections (every name here has a rule in autoopt.profile.rules.SECTION_RULES; a test checks it):
  embed         token embedding gather and its broadcast into the hc residual streams
  mhc_pre       hc_pre: mixes GEMM, RMS statistic, sigmoids, Sinkhorn, collapse, sublayer RMSNorm
  attention     q / kv projections and norms, RoPE, cache write, compressor, index build, sparse MQA,
                inverse RoPE, grouped output projection
  indexer       (inside attention, c4 layers) indexer key compressor + FP8 keys, q8 scores, top-k
  mhc_post      hc_post: R_new = post * out + comb-mixed streams
  mhc_post_pre  mhc_fuse_post_pre=on: hc_post fused with the next hc_pre (Triton, CUDA)
  moe           router, routed experts, shared expert
  mhc_head      hc_head: the last collapse of the streams + final RMSNorm
  head          lm_head projection and fp32 logits
  sample        greedy sampling: logits kept, argmax -> next tokens

Cost: when no profiler is recording, `section` is one C call that returns a shared nullcontext
(~0.3 us), not a record_function (which goes through the dispatcher: ~10-25 us per scope on a
loaded 2-core CPU even when nothing records). During CUDA graph capture nothing records, so the
captured graph is the same; graph replay runs no Python, so a replayed step has no sections.
Under torch.compile (step_compile=inductor traces the whole step) `section` is a no-op: Dynamo cannot
trace the profiler check, and a graph break per section would cut the step into pieces Inductor
cannot fuse across. A compiled step's buckets are its kernels' (names) and have no section scopes.
"""
from __future__ import annotations

import contextlib
from typing import ContextManager

import torch
from torch.profiler import record_function

PREFIX = "dsv4::"
SECTIONS = ("embed", "mhc_pre", "attention", "indexer", "mhc_post", "mhc_post_pre", "moe",
            "mhc_head", "head", "sample")

_NULL = contextlib.nullcontext()  # stateless, so one shared instance serves every call
_profiler_enabled = torch._C._autograd._profiler_enabled


def section(name: str) -> ContextManager:
    """`dsv4::<name>` record_function scope while a profiler records; a no-op otherwise."""
    if torch.compiler.is_compiling():  # constant-folded by Dynamo: no graph break
        return _NULL
    if _profiler_enabled():
        return record_function(PREFIX + name)
    return _NULL
