"""Bucket rules: every real H200 kernel name lands in its chosen bucket, and the order-sensitive cases
(the reasons the rules are ordered as they are) stay decided."""
from __future__ import annotations

from pathlib import Path

import pytest

from autoopt.profile import rules
from autoopt.profile.rules import BUCKETS, classify

TABLE = Path(__file__).parent / "fixtures" / "traces" / "h200_kernel_names.tsv"


def _table() -> list[tuple[str, str]]:
    rows = []
    for line in TABLE.read_text().splitlines():
        if line.startswith("#") or not line.strip():
            continue
        bucket, name = line.split("\t", 1)
        rows.append((bucket, name))
    return rows


def test_table_covers_every_real_h200_name_once():
    rows = _table()
    assert len(rows) == 54, "h200_kernel_names.tsv must hold all 54 names of h200-kernel-names.txt"
    assert len({name for _, name in rows}) == len(rows)
    assert {bucket for bucket, _ in rows} <= set(BUCKETS)
    # The table is a deliberate assignment, not "whatever the rules say": pin its make-up.
    counts = {b: sum(1 for x, _ in rows if x == b) for b in BUCKETS}
    assert counts == {"gemm_tensorop": 12, "gemm_simt": 5, "attention": 0, "moe": 0, "copy_cast": 8,
                      "elementwise": 19, "reduce": 7, "norm": 3, "communication": 0, "other": 0}


@pytest.mark.parametrize("bucket,name", _table(), ids=lambda v: v[:60] if len(v) > 20 else v)
def test_real_h200_kernel_name(bucket, name):
    assert classify(name) == bucket


@pytest.mark.parametrize("name,bucket", [
    ("cutlass_80_simt_sgemm_64x64_8x5_tn_align1", "gemm_simt"),
    ("void cutlass::Kernel2<cutlass_80_simt_sgemm_64x64_8x5_tn_align1>"
     "(cutlass_80_simt_sgemm_64x64_8x5_tn_align1::Params)", "gemm_simt"),
    ("sm80_xmma_gemm_f32f32_f32f32_f32_nn_n_tilesize32x32x8_stage3_warpsize1x2x1_ffma_aligna4_alignc4"
     "_execute_kernel__5x_cublas", "gemm_simt"),
    ("ampere_sgemm_128x64_tn", "gemm_simt"),
    ("void gemv2T_kernel_val<int, int, __nv_bfloat16, __nv_bfloat16, float, 128, 16, 4, 4>", "gemm_simt"),
    ("nvjet_sm90_tst_64x32_64x16_1x2_h_bz_NNT", "gemm_tensorop"),
    ("cutlass_80_tensorop_bf16_s16816gemm_relu_bf16_64x64_64x4_tn_align8", "gemm_tensorop"),
    ("void cutlass::Kernel2<cutlass_80_tensorop_bf16_s16816gemm_relu_bf16_64x64_64x4_tn_align8>"
     "(cutlass_80_tensorop_bf16_s16816gemm_relu_bf16_64x64_64x4_tn_align8::Params)", "gemm_tensorop"),
    ("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64_warpgroupsize1x1x1_execute_segment_k"
     "_off_kernel__5x_cublas", "gemm_tensorop"),
    ("triton_tem_fused_mm_0", "gemm_tensorop"),
    ("void at::native::elementwise_kernel<128, 4, at::native::gpu_kernel_impl_nocast<at::native::"
     "direct_copy_kernel_cuda(at::TensorIteratorBase&)::{lambda()#3}>", "copy_cast"),
    ("void at::native::vectorized_elementwise_kernel<8, at::native::bfloat16_copy_kernel_cuda("
     "at::TensorIteratorBase&)::{lambda(float)#1}, std::array<char*, 2ul> >", "copy_cast"),
    ("Memcpy DtoD (Device -> Device)", "copy_cast"),
    ("Memset (Device)", "copy_cast"),
    ("void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<float>, "
     "std::array<char*, 3ul> >(int, at::native::CUDAFunctor_add<float>, std::array<char*, 3ul>)",
     "elementwise"),
    ("void at::native::reduce_kernel<512, 1, at::native::ReduceOp<float, at::native::MeanOps<float, "
     "float, float, float>, unsigned int, float, 4, 4> >", "reduce"),
    ("sparse_mqa_decode_mma_kernel", "attention"),
    ("sparse_mqa_decode_per_head_kernel", "attention"),
    ("_fused_attention_kernel", "attention"),
    ("indexer_scores_kernel", "attention"),
    ("moe_grouped_gemm_kernel", "moe"),
    ("moe_grouped_swiglu", "moe"),
    ("void (anonymous namespace)::softmax_warp_forward<float, float, float, 10, false, false>", "norm"),
    ("ncclDevKernel_AllReduce_Sum_bf16_RING_LL(ncclDevKernelArgsStorage<4096ul>)", "communication"),
    ("cross_device_reduce_1stage<__nv_bfloat16, 8>", "communication"),
    ("triton_poi_fused_add_mul_0", "elementwise"),
    ("triton_red_fused_sum_1", "reduce"),
    ("some_kernel_nobody_named", "other"),
])
def test_named_kernels(name, bucket):
    assert classify(name) == bucket


@pytest.mark.parametrize("name,bucket", [
    # dsv4's Triton kernels (dsv4.triton_*): the mHC ones carry their GEMM's operand precision
    ("mhc_prenorm_fp32_kernel", "gemm_simt"), ("mhc_prenorm_bf16_kernel", "gemm_tensorop"),
    ("mhc_prenorm_fp32_combine_kernel", "gemm_simt"),  # split-K reduction: its GEMM's bucket
    ("mhc_prenorm_bf16_combine_kernel", "gemm_tensorop"),
    ("mhc_post_pre_fp32_kernel", "gemm_simt"),  # hc_post fused as the pre-norm GEMM's prologue
    ("mhc_post_pre_bf16_kernel", "gemm_tensorop"),
    # the Triton mHC glue (glue=triton): fused pointwise chains + tiny row sums, no GEMM
    ("mhc_pre_mix_kernel", "elementwise"), ("mhc_post_kernel", "elementwise"),
    ("mhc_head_mix_kernel", "elementwise"),
    ("indexer_scores_kernel", "attention"), ("sparse_mqa_decode_combine_kernel", "attention"),
    ("moe_gate_up_kernel", "moe"), ("moe_down_kernel", "moe"), ("moe_reduce_kernel", "moe"),
    ("moe_route_kernel", "moe"), ("moe_router_topk_kernel", "moe"),
])
def test_dsv4_triton_kernels(name, bucket):
    assert classify(name) == bucket
    # decided by the name alone: no launch context (External id, previous GEMM) can move them
    assert classify(name, gemm_of_launch="gemm_tensorop" if bucket == "gemm_simt"
                    else "gemm_simt") == bucket


def test_mhc_kernels_without_a_precision_in_their_name_are_not_guessed():
    # the old single-body names could be either GEMM; the rules do not pick one silently
    assert classify("mhc_prenorm_kernel") == "other"
    assert classify("mhc_post_pre_kernel") == "other"


def test_order_attention_before_vendor_gemm_but_indexer_after():
    # Fused attention embeds cutlass::gemm in its template name: attention must win.
    fa3 = "void cutlass::device_kernel<flash::enable_sm90_or_later<flash::FlashAttnFwdSm90<cutlass::gemm::" \
          "collective::CollectiveMma<...>>>>"
    assert classify(fa3) == "attention"
    # The indexer's GEMM through cuBLAS has a cuBLAS name: a GEMM, not attention.
    assert classify("nvjet_sm90_tst_256x16_64x6_2x1_v_bz_TNT") == "gemm_tensorop"
    assert rules.RULES.index(rules.match("indexer_scores_kernel")) > \
        rules.RULES.index(rules.match("nvjet_sm90_tst_256x16_64x6_2x1_v_bz_TNT"))


def test_order_traps():
    assert classify("void at::native::sbtopk::gatherTopK<float, unsigned int, 2, false>") == "reduce"
    # `gpu_kernel_impl_nocast` is not a cast; `broadcast` is not a cast; `normal` is not a norm.
    assert classify("void at::native::elementwise_kernel<128, 2, at::native::gpu_kernel_impl_nocast<"
                    "at::native::BinaryFunctor<float, float, float, MulFunctor<float> > >") == "elementwise"
    assert classify("broadcast_bias_kernel") == "other"
    assert classify("void distribution_elementwise_grid_stride_kernel<float, 4, normal_and_transform"
                    "<float, float>>") == "elementwise"
    assert classify("ncclDevKernel_ReduceScatter_Sum_f32_RING_LL") == "communication"


def test_splitk_reduce_follows_its_gemm():
    bf16 = ("void cublasLt::splitKreduce_kernel<32, 16, int, float, __nv_bfloat16, float, __nv_bfloat16, "
            "false, float, __nv_bfloat16, __nv_bfloat16, true, false, false, false>")
    f32 = ("void cublasLt::splitKreduce_kernel<32, 16, int, float, float, float, float, false, float, "
           "float, float, true, false, false, false>")
    assert classify(bf16) == "gemm_tensorop"  # alone: its own dtype decides
    assert classify(f32) == "gemm_simt"
    assert classify(f32, gemm_of_launch="gemm_tensorop") == "gemm_tensorop"  # its GEMM decides


@pytest.mark.parametrize("op", ["aten::mm", "aten::bmm", "aten::addmm", "aten::linear", "aten::matmul"])
@pytest.mark.parametrize("types,bucket", [
    (["c10::BFloat16", "c10::BFloat16"], "gemm_tensorop"),
    (["c10::Half", "c10::Half"], "gemm_tensorop"),
    (["c10::Float8_e4m3fn", "c10::Float8_e4m3fn", "float", "float"], "gemm_tensorop"),
    (["float", "float"], "gemm_simt"),
    (["double", "double"], "gemm_simt"),
    (None, "gemm_simt"),  # no record_shapes: assumed fp32 (the profile notes it)
])
def test_cpu_gemm_by_operand_dtype(op, types, bucket):
    assert classify(op, "cpu_op", input_types=types) == bucket


@pytest.mark.parametrize("op,bucket", [
    ("aten::copy_", "copy_cast"), ("aten::_to_copy", "copy_cast"), ("aten::to", "copy_cast"),
    ("aten::cat", "copy_cast"), ("aten::index_select", "copy_cast"), ("aten::fill_", "copy_cast"),
    ("aten::add", "elementwise"), ("aten::mul", "elementwise"), ("aten::rsqrt", "elementwise"),
    ("aten::pow", "elementwise"), ("aten::sum", "reduce"), ("aten::mean", "reduce"),
    ("aten::topk", "reduce"), ("aten::norm", "reduce"), ("aten::layer_norm", "norm"),
    ("aten::rms_norm", "norm"), ("aten::_softmax", "norm"),
    ("aten::index_copy_", "copy_cast"), ("aten::index_add_", "copy_cast"), ("aten::bincount", "reduce"),
    ("aten::floor_divide", "elementwise"), ("aten::argsort", "reduce"),
    ("aten::scaled_dot_product_attention", "attention"), ("c10d::allreduce_", "communication"),
    ("aten::view", "other"), ("aten::empty", "other"), ("aten::t", "other"),
])
def test_cpu_ops(op, bucket):
    assert classify(op, "cpu_op") == bucket


def test_cpu_and_kernel_scopes_do_not_leak():
    # aten:: rules must not catch GPU kernel names and vice versa.
    assert classify("aten::mm", "kernel") == "other"
    assert classify("void at::native::reduce_kernel<512, 1>", "cpu_op") == "other"


def test_rules_are_well_formed():
    assert {"gemm_tensorop", "gemm_simt", "attention", "moe", "copy_cast", "elementwise", "reduce",
            "norm", "communication", "other"} <= set(BUCKETS)
    for rule in rules.RULES:
        assert rule.why and len(rule.why) > 20, rule
        assert rule.bucket in BUCKETS or rule.bucket in (rules.BY_DTYPE, rules.OF_GEMM)


def test_every_dsv4_section_has_exactly_one_rule_in_a_named_bucket():
    """The decode step's code sections (dsv4.sections) and the rules that bucket their host time
    must name the same sections: a section without a rule would silently count as `other`."""
    from dsv4.sections import PREFIX, SECTIONS

    assert PREFIX == rules.SECTION_PREFIX
    names = [r.section for r in rules.SECTION_RULES]
    assert len(names) == len(set(names))
    assert set(names) == {PREFIX + s for s in SECTIONS}
    for r in rules.SECTION_RULES:
        assert r.bucket in BUCKETS and r.bucket != "other" and r.why, r
        assert rules.section_bucket(r.section) == r.bucket and rules.is_section(r.section)
    assert rules.section_bucket("dsv4::attention") == "attention"
    assert rules.section_bucket("dsv4::indexer") == "attention"  # nested in attention, same bucket
    assert rules.section_bucket("dsv4::mhc_pre") == "elementwise"
    assert rules.section_bucket("dsv4::unknown") is None and not rules.is_section("ProfilerStep#1")
