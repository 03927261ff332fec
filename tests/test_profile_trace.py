"""Trace parsing: real torch.profiler traces (committed CPU fixtures),
synthetic GPU traces in Kineto's shape for chosen figures and corners, and the errors a person sees."""
from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any

import pytest

from autoopt.errors import UserError
from autoopt.profile.trace import BucketProfile, load_events, profile_trace, short_name

FIX = Path(__file__).parent / "fixtures" / "traces"
CPU_FP32, CPU_CAST, CPU_VIEW = (FIX / f"cpu_mhc_{v}.json.gz" for v in ("fp32", "bf16_cast", "bf16_view"))


# --- synthetic GPU traces in Kineto's shape --------------------------------------------------
# ProfilerStep spans as CPU user annotations, cudaLaunchKernel runtime events carrying a correlation
# id, GPU kernels on a stream with the same correlation and the launching op's External id. For
# figures a test chooses (the case study's 1004 -> 499 ms; test_diagnose and test_cli_profile import
# case_study_trace from here) and corners a real capture cannot show on demand.

GPU_PID, STREAM = 0, 7
CPU_PID, CPU_TID = 1000, 1000


class GpuTraceBuilder:
    def __init__(self) -> None:
        self.events: list[dict[str, Any]] = []
        self._corr = 0
        self.gpu_clock_us = 0.0

    def step(self, n: int, start_us: float, dur_us: float) -> None:
        self.events.append({"ph": "X", "cat": "user_annotation", "name": f"ProfilerStep#{n}",
                            "pid": CPU_PID, "tid": CPU_TID, "ts": start_us, "dur": dur_us, "args": {}})

    def kernel(self, name: str, dur_us: float, launch_us: float, start_us: float | None = None,
               stream: int = STREAM, external_id: int | None = None, cat: str = "kernel") -> None:
        """A launch at `launch_us` (CPU) and its kernel at `start_us` (default: right after the
        previous kernel on the GPU clock, never before its launch)."""
        self._corr += 1
        ext = external_id if external_id is not None else 10_000 + self._corr
        if start_us is None:
            start_us = max(self.gpu_clock_us, launch_us + 2.0)
        self.gpu_clock_us = max(self.gpu_clock_us, start_us + dur_us)
        self.events.append({"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel",
                            "pid": CPU_PID, "tid": CPU_TID, "ts": launch_us, "dur": 1.0,
                            "args": {"correlation": self._corr, "External id": ext}})
        self.events.append({"ph": "X", "cat": cat, "name": name, "pid": GPU_PID, "tid": stream,
                            "ts": start_us, "dur": dur_us,
                            "args": {"correlation": self._corr, "External id": ext, "stream": stream,
                                     "device": 0}})

    def cpu_op(self, name: str, ts: float, dur: float, types: list[str] | None = None) -> None:
        args = {"Input type": types} if types is not None else {}
        self.events.append({"ph": "X", "cat": "cpu_op", "name": name, "pid": CPU_PID, "tid": CPU_TID,
                            "ts": ts, "dur": dur, "args": args})

    def annotation(self, name: str, ts: float, dur: float, cat: str = "user_annotation") -> None:
        """A record_function scope (a dsv4:: code section when the name says so)."""
        self.events.append({"ph": "X", "cat": cat, "name": name, "pid": CPU_PID, "tid": CPU_TID,
                            "ts": ts, "dur": dur, "args": {}})

    def doc(self) -> dict[str, Any]:
        return {"schemaVersion": 1, "displayTimeUnit": "ms", "traceEvents": self.events}

    def write(self, path: Path) -> Path:
        data = json.dumps(self.doc()).encode()
        path.write_bytes(gzip.compress(data) if path.name.endswith(".gz") else data)
        return path


SIMT = "void cutlass::Kernel2<cutlass_80_simt_sgemm_64x64_8x5_tn_align1>" \
       "(cutlass_80_simt_sgemm_64x64_8x5_tn_align1::Params)"
TENSOROP = "void cutlass::Kernel2<cutlass_80_tensorop_bf16_s16816gemm_relu_bf16_64x64_64x4_tn_align8>" \
           "(cutlass_80_tensorop_bf16_s16816gemm_relu_bf16_64x64_64x4_tn_align8::Params)"
COPY = "void at::native::unrolled_elementwise_kernel<at::native::direct_copy_kernel_cuda(" \
       "at::TensorIteratorBase&)::{lambda()#3}::operator()() const::{lambda()#12}::operator()() const" \
       "::{lambda(c10::BFloat16)#1}, std::array<char*, 2ul>, 4>"
ADD = "void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<float>, " \
      "std::array<char*, 3ul> >(int, at::native::CUDAFunctor_add<float>, std::array<char*, 3ul>)"
ATTN = "sparse_mqa_decode_mma_kernel"


def case_study_trace(after: bool, steps: int = 2) -> GpuTraceBuilder:
    """Per step: before = SIMT GEMM 1004 ms, copies 400 ms; after = tensor-core GEMM 499 ms,
    copies 710 ms (+310). Attention 900 ms and elementwise 1500 ms in both. Each figure is split over
    several launches, as a real step's are."""
    plan = [(ATTN, 900_000.0, 3), (ADD, 1_500_000.0, 5)]
    plan += [(TENSOROP, 499_000.0, 2), (COPY, 710_000.0, 2)] if after else \
        [(SIMT, 1_004_000.0, 4), (COPY, 400_000.0, 2)]
    b = GpuTraceBuilder()
    t = 0.0
    for n in range(steps):
        step_start = t
        launch = step_start + 10.0
        for name, total_us, launches in plan:
            for _ in range(launches):
                b.kernel(name, total_us / launches, launch)
                launch += 5.0
        t = b.gpu_clock_us + 50.0  # the step ends after a synchronize
        b.step(n + 1, step_start, t - step_start)
    return b


# --- committed CPU fixtures (real torch.profiler captures of the mHC GEMM model) ---------------

@pytest.mark.parametrize("path", [CPU_FP32, CPU_CAST, CPU_VIEW], ids=lambda p: p.name)
def test_cpu_fixture_is_small_and_per_step(path):
    assert path.stat().st_size < 200 * 1024
    p = profile_trace(path)
    assert isinstance(p, BucketProfile)
    assert (p.source, p.steps, p.per_step) == ("cpu", 6, True)
    assert 0.5 < p.coverage <= 1.0
    assert p.total_ms == pytest.approx(sum(p.buckets_ms.values()))
    assert p.covered_ms == pytest.approx(p.total_ms - p.buckets_ms["other"])
    assert p.total_ms <= p.wall_ms * 1.001  # self times of one thread never exceed the wall
    assert p.notes == []  # record_shapes was on: every GEMM had its dtype


def test_cpu_self_time_adds_up_to_the_outermost_ops():
    """Self time must count each microsecond once: the bucketed total equals the summed durations
    of the outermost ops (computed here independently) inside the steps."""
    events = load_events(CPU_CAST)
    steps = [e for e in events if str(e.get("name", "")).startswith("ProfilerStep#")]
    ops = sorted((e for e in events if e.get("cat") == "cpu_op"), key=lambda e: (e["ts"], -e["dur"]))
    outer_us, end = 0.0, -1.0
    for e in ops:
        inside = any(s["ts"] <= e["ts"] <= s["ts"] + s["dur"] for s in steps)
        if inside and e["ts"] >= end:
            outer_us += e["dur"]
            end = e["ts"] + e["dur"]
    p = profile_trace(CPU_CAST)
    assert p.total_ms * len(steps) == pytest.approx(outer_us / 1e3, rel=1e-6)


def test_cpu_fixtures_tell_the_gemm_flip_by_dtype():
    before, cast, view = profile_trace(CPU_FP32), profile_trace(CPU_CAST), profile_trace(CPU_VIEW)
    assert before.buckets_ms["gemm_simt"] > 0 and before.buckets_ms["gemm_tensorop"] == 0
    for after in (cast, view):
        assert after.buckets_ms["gemm_tensorop"] > 0 and after.buckets_ms["gemm_simt"] == 0

    def copies_per_step(p):  # structure, not timing: how many aten::copy_ run per step
        return next(c for n, b, ms, c in p.top_kernels if n == "aten::copy_")

    # 4 layers: the upcast in all; + x round trip and weight cast per layer; the view skips x's.
    assert copies_per_step(cast) > copies_per_step(view) > copies_per_step(before)
    assert cast.buckets_ms["copy_cast"] > before.buckets_ms["copy_cast"]


# --- committed H200 fixtures (real torch.profiler captures of the same model on an H200) --------

H200_FP32, H200_CAST, H200_VIEW = (FIX / f"h200_mhc_{v}.json.gz" for v in ("fp32", "bf16_cast", "bf16_view"))


def test_h200_fixtures_bucket_real_kernels():
    fp32, cast, view = (profile_trace(p) for p in (H200_FP32, H200_CAST, H200_VIEW))
    for p in (fp32, cast, view):
        assert (p.source, p.steps, p.per_step) == ("gpu", 6, True)
        assert p.buckets_ms["other"] == 0.0 and 0.2 < p.coverage < 1.0
        assert p.notes == []  # Kineto mirrors ProfilerStep as gpu_user_annotation: not a 2nd step
    top = {name: bucket for name, bucket, _, _ in fp32.top_kernels}
    assert top["sm80_xmma_gemm_f32f32_f32f32_f32_tn_n_tilesize32x32x8_stage3_warpsize1x2x1_ffma_"
               "aligna4_alignc4_execute_kernel__5x_cublas"] == "gemm_simt"
    # cuBLAS zeroes the fp32 split-K output with a memset launched by the same aten::mm: GEMM time
    assert top["Memset (Device)"] == "gemm_simt"
    top = {name: bucket for name, bucket, _, _ in cast.top_kernels}
    assert top["nvjet_sm90_tst_24x64_64x16_1x4_h_bz_splitK_TNN"] == "gemm_tensorop"
    assert [b for n, b in top.items() if "splitKreduce" in n] == ["gemm_tensorop"]
    assert fp32.buckets_ms["gemm_tensorop"] == 0 and cast.buckets_ms["gemm_simt"] == 0
    # the round-trip cast doubles the direct_copy launches and adds bfloat16_copy ones
    assert cast.buckets_ms["copy_cast"] > view.buckets_ms["copy_cast"] > fp32.buckets_ms["copy_cast"]


# --- synthetic GPU traces: chosen figures and corners -------------------------------------------

@pytest.mark.parametrize("suffix", [".json", ".json.gz"])
def test_case_study_figures_per_step(tmp_path, suffix):
    before = profile_trace(case_study_trace(after=False).write(tmp_path / f"before{suffix}"))
    after = profile_trace(case_study_trace(after=True).write(tmp_path / f"after{suffix}"))
    assert (before.source, before.steps, before.per_step) == ("gpu", 2, True)
    assert before.buckets_ms["gemm_simt"] == pytest.approx(1004.0)
    assert after.buckets_ms["gemm_tensorop"] == pytest.approx(499.0)
    assert after.buckets_ms["copy_cast"] - before.buckets_ms["copy_cast"] == pytest.approx(310.0)
    assert before.kernel_count == 3 + 5 + 4 + 2
    assert before.top_kernels[0][:2] == (ADD, "elementwise")
    assert before.coverage == pytest.approx(1.0, abs=1e-3)  # back-to-back kernels fill the step


def test_gpu_step_assignment_by_launch_and_union_coverage(tmp_path):
    b = GpuTraceBuilder()
    b.step(1, 0.0, 1000.0)
    b.kernel(COPY, 100.0, launch_us=-50.0, start_us=-40.0)  # launched before any step: left out
    b.kernel(SIMT, 400.0, launch_us=10.0, start_us=100.0)
    b.kernel(ADD, 400.0, launch_us=20.0, start_us=300.0, stream=8)  # overlaps on another stream
    b.kernel(TENSOROP, 300.0, launch_us=990.0, start_us=1200.0)  # runs after the step ended
    b.kernel("Memcpy DtoD (Device -> Device)", 50.0, launch_us=995.0, start_us=1500.0, cat="gpu_memcpy")
    b.cpu_op("aten::mm", 5.0, 900.0, ["float", "float"])  # CPU ops are ignored in a GPU trace
    p = profile_trace(b.write(tmp_path / "t.json"))
    assert p.kernel_count == 4
    assert p.buckets_ms == pytest.approx({"gemm_tensorop": 0.3, "gemm_simt": 0.4, "attention": 0.0,
                                          "moe": 0.0, "copy_cast": 0.05, "elementwise": 0.4,
                                          "reduce": 0.0, "norm": 0.0, "communication": 0.0,
                                          "other": 0.0})
    # union of [100,500] [300,700] [1200,1500] [1500,1550] = 950 us over a 1000 us step
    assert p.coverage == pytest.approx(0.95)
    assert any("1 of 5 gpu events fall outside" in n for n in p.notes)


def test_splitk_reduce_takes_the_bucket_of_its_gemm(tmp_path):
    f32_reduce = "void cublasLt::splitKreduce_kernel<32, 16, int, float, float, float, float, false>"
    bf16_reduce = "void cublasLt::splitKreduce_kernel<32, 16, int, float, __nv_bfloat16, float>"
    b = GpuTraceBuilder()
    b.step(1, 0.0, 10_000.0)
    b.kernel("nvjet_sm90_tst_64x16_64x16_4x1_v_bz_splitK_TNT", 100.0, 10.0, external_id=1)
    b.kernel(f32_reduce, 10.0, 11.0, external_id=1)  # same launching op as the nvjet GEMM
    b.kernel("sm80_xmma_gemm_f32f32_f32f32_f32_nn_n_tilesize32x32x8_ffma_aligna4", 200.0, 12.0,
             external_id=2)
    b.kernel(bf16_reduce, 20.0, 13.0, external_id=99)  # unknown op: the stream's last GEMM decides
    p = profile_trace(b.write(tmp_path / "splitk.json"))
    assert p.buckets_ms["gemm_tensorop"] == pytest.approx(0.110)
    assert p.buckets_ms["gemm_simt"] == pytest.approx(0.220)


def test_trace_without_steps_reports_totals(tmp_path):
    b = GpuTraceBuilder()
    b.kernel(SIMT, 1000.0, 0.0, start_us=0.0)
    b.kernel(COPY, 1000.0, 1.0, start_us=3000.0)
    p = profile_trace(b.write(tmp_path / "nosteps.json"))
    assert (p.steps, p.per_step) == (0, False)
    assert p.wall_ms == pytest.approx(4.0) and p.coverage == pytest.approx(0.5)


def test_bare_event_list_and_untyped_cpu_gemm_note(tmp_path):
    b = GpuTraceBuilder()
    b.cpu_op("aten::mm", 0.0, 100.0)  # recorded without record_shapes
    b.cpu_op("aten::bmm", 200.0, 50.0, ["c10::BFloat16", "c10::BFloat16"])
    path = tmp_path / "list.json"
    path.write_text(json.dumps(b.events))  # Chrome's plain-array form
    p = profile_trace(path)
    assert p.source == "cpu"
    assert p.buckets_ms["gemm_simt"] == pytest.approx(0.1)
    assert p.buckets_ms["gemm_tensorop"] == pytest.approx(0.05)
    assert any("1 CPU GEMM ops carry no 'Input type'" in n for n in p.notes)


# --- CPU code sections: host time between ops, attributed to the dsv4:: section that spent it ----

BF16 = ["c10::BFloat16", "c10::BFloat16"]


def _sectioned_cpu_trace() -> GpuTraceBuilder:
    b = GpuTraceBuilder()
    b.step(1, 0.0, 1000.0)
    b.annotation("dsv4::attention", 100.0, 500.0)
    b.cpu_op("aten::mul", 110.0, 50.0)
    b.annotation("dsv4::indexer", 200.0, 200.0)  # nested: its own gaps are the indexer's
    b.cpu_op("aten::topk", 220.0, 40.0)
    b.cpu_op("aten::bmm", 450.0, 100.0, BF16)
    b.annotation("dsv4::moe", 650.0, 200.0)
    b.annotation("dsv4::moe_inner_scope_without_rule", 700.0, 100.0)
    b.cpu_op("aten::mm", 700.0, 50.0, BF16)
    b.annotation("dsv4::head", 870.0, 20.0)  # starts and ends with its op: the section encloses it
    b.cpu_op("aten::mm", 870.0, 20.0, BF16)
    b.annotation("my_scope", 895.0, 30.0)  # not a dsv4:: section: no time of its own is counted
    b.cpu_op("aten::add", 900.0, 10.0)
    return b


def test_cpu_section_host_time_goes_to_its_bucket_innermost_wins(tmp_path):
    p = profile_trace(_sectioned_cpu_trace().write(tmp_path / "sections.json"))
    assert (p.source, p.steps) == ("cpu", 1)
    assert p.kernel_count == 6  # ops only: sections are not ops
    # attention: 500 - mul 50 - indexer 200 - bmm 100 = 150 us; indexer: 200 - topk 40 = 160 us
    assert p.host_sections_ms == pytest.approx({"dsv4::attention": 0.15, "dsv4::indexer": 0.16,
                                                "dsv4::moe": 0.1,
                                                "dsv4::moe_inner_scope_without_rule": 0.05,
                                                "dsv4::head": 0.0})
    assert p.host_buckets_ms == pytest.approx({"attention": 0.31, "moe": 0.1, "other": 0.05,
                                               "gemm_tensorop": 0.0})
    assert p.host_ms == pytest.approx(0.46)
    assert p.buckets_ms == pytest.approx({"gemm_tensorop": 0.17, "gemm_simt": 0.0, "attention": 0.31,
                                          "moe": 0.1, "copy_cast": 0.0, "elementwise": 0.06,
                                          "reduce": 0.04, "norm": 0.0, "communication": 0.0,
                                          "other": 0.05})
    assert p.total_ms == pytest.approx(0.46 + 0.27)  # section host time + op self time
    assert p.coverage == pytest.approx(0.68)  # (0.73 - 0.05 other) / 1.0 ms wall
    host_note = next(n for n in p.notes if "host time of dsv4:: code sections" in n)
    assert "not kernel time" in host_note and "attention 0.31" in host_note
    assert any("no rule" in n and "dsv4::moe_inner_scope_without_rule" in n for n in p.notes)
    assert ("dsv4::indexer", "attention", pytest.approx(0.16), 1) in p.top_kernels
    d = p.to_dict()  # the split travels with the profile
    assert d["host_ms"] == pytest.approx(0.46) and d["host_buckets_ms"]["attention"] == pytest.approx(0.31)


def test_gpu_trace_ignores_sections(tmp_path):
    """On a GPU the buckets are kernel time: dsv4:: scopes (and Kineto's GPU mirrors of them) add
    nothing, and the figures are exactly those of the same trace without them."""
    plain = profile_trace(case_study_trace(after=False).write(tmp_path / "plain.json"))
    b = case_study_trace(after=False)
    for cat in ("user_annotation", "gpu_user_annotation"):
        b.annotation("dsv4::attention", 0.0, 900.0, cat=cat)
        b.annotation("dsv4::mhc_pre", 5.0, 100.0, cat=cat)
    b.cpu_op("aten::mm", 10.0, 50.0, BF16)
    annotated = profile_trace(b.write(tmp_path / "annotated.json"))
    assert annotated.to_dict() | {"path": None} == plain.to_dict() | {"path": None}
    assert annotated.host_ms == 0.0 and annotated.host_sections_ms == {}


def test_short_name_keeps_the_functor():
    s = short_name(ADD)
    assert s == "vectorized_elementwise_kernel<4, CUDAFunctor_add<float>, array<char*, 3ul> >"
    assert len(short_name(COPY, width=40)) == 40


# --- errors: one line naming the file and what was expected ------------------------------------

def _bad_files(tmp_path: Path) -> dict[str, Path]:
    files = {"missing": tmp_path / "nope.json", "directory": tmp_path}
    (tmp_path / "truncated.json.gz").write_bytes(gzip.compress(b'{"traceEvents": []}' * 50)[:30])
    (tmp_path / "notjson.json").write_text("this is not json")
    (tmp_path / "other.json").write_text('{"model": "dsv4"}')
    (tmp_path / "empty.json").write_text('{"traceEvents": [{"ph": "M", "name": "process_name"}]}')
    (tmp_path / "binary.json").write_bytes(b"\xff\xfe\x00\x01garbage")
    files.update({p.stem.split(".")[0]: p for p in tmp_path.iterdir() if p.is_file()})
    return files


@pytest.mark.parametrize("kind,expected", [
    ("missing", "no such file"), ("directory", "is a directory"), ("truncated", "cannot read"),
    ("notjson", "not valid JSON"), ("other", "'traceEvents' list"), ("empty", "nothing to bucket"),
    ("binary", "not UTF-8"),
])
def test_unusable_files_raise_a_user_error_naming_the_file(tmp_path, kind, expected):
    path = _bad_files(tmp_path)[kind]
    with pytest.raises(UserError) as err:
        profile_trace(path)
    msg = str(err.value)
    assert msg.startswith(str(path)) and expected in msg and "\n" not in msg
    assert err.value.exit_code == 2
