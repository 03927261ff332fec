"""Ordered (regex -> bucket) rules that sort kernel and operator names into profile buckets.

The first rule that matches wins, so the order below is part of the meaning. Every rule carries a
`why`; `autoopt profile` totals per bucket and the agent reasons in these buckets ("the casts ate the
GEMM gain"), so the rules must be deliberate, not clever. tests/fixtures/traces/h200_kernel_names.tsv
pins the bucket of every real H200 kernel name we have seen.

Decisions (and why):
- gemm_simt vs gemm_tensorop is decided by the *kernel name* on the GPU (cutlass `simt`, cuBLAS
  `ffma` = CUDA cores; nvjet, `tensorop`, `s16816`, wgmma = tensor cores). On a CPU there are no
  tensor cores, so CPU GEMM ops (aten::mm, bmm, linear, ...) are bucketed by their operand dtype from
  the trace's "Input type" (recorded with record_shapes=True): bf16/fp16/fp8/int8 -> gemm_tensorop
  (what that GEMM becomes on the GPU), fp32/fp64 -> gemm_simt. Without dtypes they count as
  gemm_simt and the profile says so in its notes (never silently).
- GEMV kernels (gemv2T, gemvx, gemmSN) run on CUDA cores whatever the dtype: gemm_simt.
- cuBLAS helper kernels (splitKreduce, epilogue) belong to the GEMM that launched them: the parser
  gives them that GEMM's bucket (same launching op, else the previous GEMM kernel on the stream);
  only with neither does their own dtype decide (bf16/half -> tensorop, float -> simt). Likewise a
  memset launched by a GEMM's op (cuBLAS zeroing a split-K output) is GEMM time; others are copies.
- Attention is matched before the vendor GEMM rules because fused attention kernels embed
  `cutlass::gemm` in their template names; the *indexer* rule comes after them, so an indexer GEMM
  that runs through cuBLAS still counts as a GEMM while a Triton `*indexer*` kernel counts as
  attention (the notes treat the lightning indexer as part of sparse attention).
- The Triton mHC kernels of dsv4 (dsv4.triton_mhc) say their GEMM's precision in their names, because
  one kernel body serves both: `*_fp32_*` (fp32 operands, ieee products on CUDA cores) -> gemm_simt,
  `*_bf16_*` (tl.dot on 16-bit operands, tensor cores) -> gemm_tensorop. That covers the split-K
  pre-norm GEMM (mhc_prenorm_{fp32,bf16}_kernel), its split-K reduction
  (mhc_prenorm_{fp32,bf16}_combine_kernel: part of the GEMM it finishes, as cuBLAS's splitKreduce is)
  and the fused hc_post + next hc_pre (mhc_post_pre_{fp32,bf16}_kernel: the pre-norm GEMM with the
  hc_post as its prologue; a GEMM with a fused prologue/epilogue is still a GEMM, and fusing moves
  hc_post's elementwise time into it, which is what the mhc_fuse_post_pre knob is expected to do).
- The Triton mHC glue (glue=triton: mhc_pre_mix_kernel, mhc_post_kernel, mhc_head_mix_kernel) ->
  elementwise: each replaces a chain of eager pointwise ops and tiny row sums (mostly elementwise,
  where the mHC sections' host time goes too), so switching the knob moves time within and out of
  the same bucket rather than into norm or reduce. Their names carry no precision (no GEMM inside).
- softmax -> norm: like RMSNorm/LayerNorm it reads a row, takes a row statistic and rescales the
  row; keeping it out of `elementwise` keeps that bucket meaning pure pointwise glue.
- top-k and sorts -> reduce: a top-k is a row reduction that keeps k values (and `gatherTopK` must
  not fall into copy_cast for containing "gather").
- copy_cast is data movement without arithmetic: dtype casts, contiguous copies, cat, gather /
  scatter / index, fills and memcpy/memset. Quantize/dequantize kernels are casts too.

Code sections (CPU-only traces): the dsv4 decode step marks its parts with record_function scopes
named `dsv4::<section>` (dsv4.sections). On a CPU a large share of the eager step is Python /
dispatcher time *between* ops, which no op's self time covers; autoopt.profile.trace gives a section's
*host time* (its duration minus the ops and sub-sections inside it: the innermost section wins) to
the bucket SECTION_RULES names for it. That is host time of the code, not kernel time, and the
profile's notes say how much of each bucket it is. GPU traces ignore sections: there the buckets are
kernel time only. The section -> bucket choices (and why) are in SECTION_RULES below.
"""
from __future__ import annotations

import functools
import re
from dataclasses import dataclass
from typing import Iterable

BUCKETS: tuple[str, ...] = ("gemm_tensorop", "gemm_simt", "attention", "moe", "copy_cast",
                            "elementwise", "reduce", "norm", "communication", "other")

# Rules may name these markers instead of a bucket; `classify` resolves them.
BY_DTYPE = "@gemm_by_dtype"  # CPU GEMM op: operand dtype decides simt vs tensorop
OF_GEMM = "@gemm_of_launch"  # cuBLAS helper: the bucket of the GEMM it belongs to

# Operand dtypes (as torch.profiler writes them in "Input type") that run on tensor cores on a GPU.
LOW_PRECISION_TYPES = ("c10::BFloat16", "c10::Half", "c10::Float8_e4m3fn", "c10::Float8_e5m2",
                       "c10::Float8_e4m3fnuz", "c10::Float8_e5m2fnuz", "c10::Float8_e8m0fnu",
                       "signed char", "unsigned char", "c10::qint8", "c10::quint8")
FULL_PRECISION_TYPES = ("float", "double")


@dataclass(frozen=True)
class Rule:
    bucket: str  # one of BUCKETS, or a marker above
    pattern: str  # searched (not anchored unless it says so), case-insensitive
    scope: str  # "kernel" (GPU kernel/memcpy/memset names), "cpu_op" (aten:: ops) or "any"
    why: str

    def __post_init__(self) -> None:
        object.__setattr__(self, "regex", re.compile(self.pattern, re.IGNORECASE))


_GEMM_OPS = (r"^aten::(mm|bmm|addmm|addbmm|baddbmm|matmul|linear|_int_mm|_scaled_mm|_addmm_activation"
             r"|mv|addmv|dot|vdot|einsum|tensordot|mkldnn_linear|_mkl_linear|_weight_int\d+pack_mm)$")

RULES: tuple[Rule, ...] = (
    Rule("communication", r"nccl|c10d::|all_?reduce|all_?gather|reduce_scatter|all_?to_?all"
         r"|cross_device_reduce|custom_ar|multimem", "any",
         "collectives first: NCCL kernels are named AllReduce/ReduceScatter and must not land in reduce"),
    Rule("attention", r"attn|attention|flash|fmha|sdpa|xformers|(^|[^a-z])mqa|(^|[^a-z])mla"
         r"|BatchDecode|BatchPrefill", "any",
         "fused attention kernels embed cutlass::gemm / gemm in their names: match them before GEMMs"),
    Rule("moe", r"moe|expert|grouped_?gemm|group_gemm|grouped_mm", "any",
         "MoE grouped GEMMs and routing kernels (moe_grouped*, fused_moe, moe_align) are their own cost"),
    Rule(OF_GEMM, r"splitKreduce|splitK_reduce|cublasLt::epilogue", "kernel",
         "cuBLAS split-K reduction / epilogue kernels are part of the GEMM that launched them"),
    Rule("gemm_simt", r"cutlass_\d+_simt|simt_[sdhcz]?gemm|xmma_gemm.*ffma|(ampere|volta|turing|maxwell"
         r"|kepler|sm\d+)_[sd]gemm|(^|[^a-z])[sd]gemm_\d+x\d+|gemv|gemmSN|gemmk1|magma_[sd]gemm",
         "kernel", "fp32/fp64 GEMMs on CUDA cores (cutlass simt, cuBLAS ffma) and every GEMV"),
    Rule("gemm_tensorop", r"nvjet|tensorop|[hsi]\d{4,5}gemm|xmma_gemm|hmma|imma|wgmma|gmma"
         r"|cutlass::gemm|cutlass3x|deep_?gemm|marlin|machete|cublasLt", "kernel",
         "tensor-core GEMMs: cuBLAS nvjet (Hopper), cutlass tensorop, xmma without ffma, wgmma"),
    Rule("gemm_simt", r"mhc\w*(simt|fp32|ieee)", "kernel",
         "Triton mHC GEMMs with fp32 operands (ieee FMA): mhc_prenorm_fp32_kernel, its split-K "
         "combine, mhc_post_pre_fp32_kernel (hc_post fused as the GEMM's prologue)"),
    Rule("gemm_tensorop", r"mhc\w*(tensor|_tc|bf16|fp16)", "kernel",
         "Triton mHC GEMMs on tensor cores: mhc_prenorm_bf16_kernel, its split-K combine, "
         "mhc_post_pre_bf16_kernel (hc_post fused as the GEMM's prologue)"),
    Rule("elementwise", r"mhc_(pre_mix|post|head_mix)_kernel", "kernel",
         "the Triton mHC glue (glue=triton, dsv4.triton_glue): sigmoids, 4x4 Sinkhorn, stream "
         "collapse and RMSNorm / hc_post's mix, fused; no GEMM, so no precision in the name, and "
         "the bucket the eager glue's pointwise chain lands in (see section dsv4::mhc_pre)"),
    Rule("attention", r"indexer|lightning_index", "any",
         "the DSA lightning indexer is part of sparse attention; after the vendor GEMM rules so its "
         "GEMM, when it runs through cuBLAS, still counts as a GEMM"),
    Rule(BY_DTYPE, _GEMM_OPS, "cpu_op",
         "CPU GEMM ops: no tensor cores on a CPU, so the operand dtype says which GEMM this becomes"),
    Rule("gemm_tensorop", r"gemm|matmul|(^|_)b?mm(_|$)|addmm", "kernel",
         "other GEMM kernels (Triton tl.dot, inductor templates) use tensor cores (bf16, or tf32 "
         "for fp32 by default)"),
    Rule("reduce", r"topk|sort|radix|bitonic|arg_?max|arg_?min", "any",
         "top-k and sorts are row reductions; before copy_cast because of `gatherTopK`"),
    Rule("copy_cast", r"copy|memcpy|memset|CatArray|(?<!pre)fill|gather|scatter|index_?select|indexSelect"
         r"|index_put|embedding|quant|(?<![a-z])cast|convert|transpose_kernel|permute_kernel", "kernel",
         "data movement without arithmetic: casts (direct_copy, bfloat16_copy), cat, gather, fills"),
    Rule("copy_cast", r"^aten::(copy_|_to_copy|to|clone|contiguous|cat|_cat|stack|index_select|gather"
         r"|scatter_?|scatter_add_?|index|index_put_|_index_put_impl_|index_copy_?|index_add_?"
         r"|masked_select|take|embedding"
         r"|narrow_copy|repeat|_copy_from|_copy_from_and_resize|fill_|zero_|zeros|zeros_like|ones"
         r"|ones_like|full|full_like|new_zeros|new_ones|new_full)$", "cpu_op",
         "CPU copies, casts, gathers, scatters (index_copy_: the KV cache write; index_add_: the "
         "MoE combine, a scatter-add like scatter_add_) and fills (self time: aten::to's work shows "
         "up in aten::copy_)"),
    Rule("norm", r"layer_?norm|rms_?norm|group_?norm|batch_?norm|instance_?norm|softmax", "any",
         "normalisations, and softmax (a row statistic then a rescale, the same cost shape)"),
    Rule("reduce", r"reduce|triton_red_|triton_per_|cumsum|cumprod|scan|logsumexp", "kernel",
         "reductions: ATen reduce_kernel, inductor reduction kernels, scans"),
    Rule("reduce", r"^aten::(sum|mean|amax|amin|max|min|prod|norm|linalg_vector_norm|var|std|var_mean"
         r"|std_mean|all|any|count_nonzero|nonzero|cumsum|cumprod|logsumexp|aminmax|bincount|histc)$",
         "cpu_op", "CPU reductions (aten::norm is a vector norm, a reduction, not a norm layer; "
         "bincount counts per bin, a reduction)"),
    Rule("elementwise", r"elementwise|functor|triton_poi_|pointwise|act_and_mul|silu|gelu|relu|sigmoid"
         r"|softplus|rotary|(^|_)rope|clamp|distribution", "kernel",
         "pointwise kernels: ATen (vectorized_/unrolled_)elementwise_kernel, inductor pointwise"),
    Rule("elementwise", r"^aten::(add|add_|sub|sub_|mul|mul_|div|div_|neg|abs|exp|exp2|expm1|log|log2"
         r"|log1p|sqrt|rsqrt|pow|reciprocal|sign|relu|relu_|silu|silu_|gelu|sigmoid|tanh|softplus|erf"
         r"|floor_divide|floor_divide_"
         r"|sin|cos|clamp|clamp_|clamp_min|clamp_max|clamp_min_|clamp_max_|maximum|minimum|where"
         r"|masked_fill|masked_fill_|addcmul|addcdiv|lerp|floor|ceil|round|trunc|fmod|remainder"
         r"|eq|ne|lt|le|gt|ge|logical_and|logical_or|logical_not|bitwise_and|bitwise_or|bitwise_not"
         r"|isinf|isnan|nan_to_num|triu|tril|arange|randn|rand|normal_|uniform_|bernoulli_"
         r"|exponential_|_foreach_\w+)$", "cpu_op",
         "CPU pointwise arithmetic; view/metadata ops (view, t, empty) stay in `other`"),
)

_MARKER_BUCKETS = {BY_DTYPE, OF_GEMM}
for _rule in RULES:
    assert _rule.bucket in BUCKETS or _rule.bucket in _MARKER_BUCKETS, _rule
    assert _rule.scope in ("kernel", "cpu_op", "any"), _rule


# A trace repeats a few dozen distinct names a million times, and one search of a long templated
# kernel name through every rule costs ~60 us: the first rule is remembered per (name, scope).
MATCH_CACHE_NAMES = 1 << 16


@functools.lru_cache(maxsize=MATCH_CACHE_NAMES)
def match(name: str, scope: str = "kernel") -> Rule | None:
    """The first rule of `scope` (or "any") whose pattern is found in `name`; None if none is."""
    for rule in RULES:
        if (rule.scope == "any" or rule.scope == scope) and rule.regex.search(name):
            return rule
    return None


def gemm_bucket_for_types(input_types: Iterable[str] | None) -> str | None:
    """gemm_tensorop if any tensor operand is low precision, gemm_simt if they are fp32/fp64,
    None when no dtype is known (record_shapes was off, or only scalars were recorded)."""
    types = [t for t in (input_types or ()) if t]
    if any(t in LOW_PRECISION_TYPES for t in types):
        return "gemm_tensorop"
    if any(t in FULL_PRECISION_TYPES for t in types):
        return "gemm_simt"
    return None


def gemm_bucket_from_name(name: str) -> str:
    """Last resort for a cuBLAS helper kernel with no GEMM to follow: its own template dtypes."""
    if re.search(r"bfloat16|__half|half|fp8|e4m3|e5m2", name, re.IGNORECASE):
        return "gemm_tensorop"
    return "gemm_simt"


def classify(name: str, scope: str = "kernel", input_types: Iterable[str] | None = None,
             gemm_of_launch: str | None = None) -> str:
    """Bucket of one kernel (scope "kernel") or CPU operator (scope "cpu_op").

    input_types: the op's "Input type" trace arg (CPU GEMMs are bucketed by it; without it they
    count as gemm_simt). gemm_of_launch: the bucket of the GEMM a cuBLAS helper kernel belongs to,
    when the caller knows it.
    """
    rule = match(name, scope)
    if rule is None:
        return "other"
    if rule.bucket == BY_DTYPE:
        return gemm_bucket_for_types(input_types) or "gemm_simt"
    if rule.bucket == OF_GEMM:
        return gemm_of_launch or gemm_bucket_from_name(name)
    return rule.bucket


def is_gemm_bucket(bucket: str) -> bool:
    return bucket.startswith("gemm")


# ---------------------------------------------------------------- code sections (CPU host time)

SECTION_PREFIX = "dsv4::"  # record_function scopes of the decode step (dsv4.sections)


@dataclass(frozen=True)
class SectionRule:
    section: str  # full annotation name, e.g. "dsv4::attention"
    bucket: str  # one of BUCKETS
    why: str


SECTION_RULES: tuple[SectionRule, ...] = (
    SectionRule("dsv4::attention", "attention",
                "the attention sublayer (q/kv projections and norms, RoPE, cache write, compressor, "
                "index build, sparse MQA, output projection): its host time is attention's, as its "
                "fused kernel is on a GPU"),
    SectionRule("dsv4::indexer", "attention",
                "the lightning indexer (nested in dsv4::attention) is part of sparse attention, as "
                "the `indexer` kernel rule says"),
    SectionRule("dsv4::moe", "moe",
                "router, routed experts (the Python loop over active experts with moe_experts=loop) "
                "and the shared expert: the MoE's own cost"),
    SectionRule("dsv4::mhc_pre", "elementwise",
                "the mHC glue (RMS statistic, sigmoids, Sinkhorn, collapse, sublayer RMSNorm around "
                "one tiny-N GEMM): in eager mode mostly pointwise ops (tiny CPU step: 61% of its "
                "ops elementwise, 27% small row sums, 1% the GEMM), thousands of tiny launches on a "
                "GPU that the `glue` knob fuses; its host time is that elementwise chain's overhead"),
    SectionRule("dsv4::mhc_post", "elementwise",
                "hc_post, post * out + comb-mixed streams: pointwise glue (see dsv4::mhc_pre)"),
    SectionRule("dsv4::mhc_post_pre", "elementwise",
                "hc_post fused with the next hc_pre (Triton, CUDA): the same glue as dsv4::mhc_pre"),
    SectionRule("dsv4::mhc_head", "elementwise",
                "hc_head, the last collapse of the streams + final RMSNorm: the same glue as "
                "dsv4::mhc_pre"),
    SectionRule("dsv4::embed", "copy_cast",
                "the embedding gather and its broadcast copy into the hc streams: data movement"),
    SectionRule("dsv4::head", "gemm_tensorop",
                "the lm_head projection: one bf16 GEMM (dsv4.shapes declares lm_head bf16, so its "
                "ops are gemm_tensorop on a CPU too) and the fp32 upcast of its logits"),
    SectionRule("dsv4::sample", "reduce",
                "greedy sampling: an argmax over the vocabulary (a row reduction) and two small "
                "copies into the session's static buffers"),
)
_SECTION_BUCKET = {r.section: r.bucket for r in SECTION_RULES}
for _srule in SECTION_RULES:
    assert _srule.bucket in BUCKETS and _srule.section.startswith(SECTION_PREFIX), _srule


def is_section(name: str) -> bool:
    """A user annotation that autoopt.profile.trace treats as a code section (dsv4::...)."""
    return name.startswith(SECTION_PREFIX)


def section_bucket(name: str) -> str | None:
    """The bucket of a code section's host time; None for a `dsv4::` name with no rule (its host
    time then goes to `other`, and the profile's notes name it)."""
    return _SECTION_BUCKET.get(name)
