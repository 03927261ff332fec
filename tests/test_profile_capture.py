"""Live capture: torch.profiler run on a real step (a mixed fp32/bf16 GEMM step, the tiny dsv4 decode
step) on the CPU, and on a CUDA GPU where there is one; the errors a person sees for bad devices."""
from __future__ import annotations

import pytest

from autoopt.errors import UserError
from autoopt.profile.trace import capture, profile_trace


def _has_cuda() -> bool:
    import torch
    return torch.cuda.is_available()


def _mixed_step(device: str):
    import torch
    x = torch.randn(32, 2048, device=device)  # [T, W] fp32
    w = torch.randn(24, 2048, device=device)  # [M, W]

    def step():
        simt = x @ w.T  # fp32 GEMM
        tensorop = (x.to(torch.bfloat16) @ w.to(torch.bfloat16).T).float()  # casts + bf16 GEMM
        return (simt - tensorop).abs().sum()
    return step


def test_capture_cpu_per_step_and_saved_trace(tmp_path):
    out = tmp_path / "sub" / "live.json.gz"
    p = capture(_mixed_step("cpu"), steps=3, device="cpu", trace_path=out)
    assert (p.source, p.steps, p.per_step, p.path) == ("cpu", 3, True, str(out))
    for bucket in ("gemm_simt", "gemm_tensorop", "copy_cast", "reduce"):
        assert p.buckets_ms[bucket] > 0, bucket
    fields = p.measurement_fields()  # what the worker copies into its Measurement
    assert fields["buckets_ms"] == {**p.buckets_ms, "host": p.host_bucket_ms}  # + the step's host time
    assert (fields["bucket_coverage"], fields["kernel_count"]) == (p.coverage, p.kernel_count)
    assert fields["host_ms"] == p.step_host_ms and fields["launches_per_step"] == p.launches
    mm = {b for n, b, _, _ in p.top_kernels if n == "aten::mm"}
    assert mm == {"gemm_simt", "gemm_tensorop"}  # one op name, two dtypes, two rows
    again = profile_trace(out)  # the raw trace was kept and reads back the same
    assert again.buckets_ms == pytest.approx(p.buckets_ms)
    assert capture(_mixed_step("cpu"), steps=1).path is None


def test_capture_tiny_decode_step_names_its_sections(tmp_path):
    """A real dsv4 step under the profiler opens every section the rules know; host time and op self
    time add up to at most the wall; without a profiler a section costs a shared null context."""
    import torch

    from autoopt.profile import rules as profile_rules
    from dsv4 import sections
    from dsv4.config import preset
    from dsv4.session import DecodeSession

    assert sections.section("attention") is sections._NULL  # nothing records: no record_function
    sess = DecodeSession(preset("tiny"), device="cpu", batch=2)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as the worker does on a CPU: 2 spin-waiting threads on a busy 2-core
    try:                      # machine stretch this step from ~50 ms to over a second
        p = capture(sess.step, steps=2, device="cpu")
    finally:
        torch.set_num_threads(threads)
    about = (p.host_sections_ms, p.buckets_ms, p.wall_ms, p.notes)
    seen = {name.removeprefix(sections.PREFIX) for name in p.host_sections_ms}
    # every section but the fused post+pre, which is CUDA (Triton) only
    assert seen == set(sections.SECTIONS) - {"mhc_post_pre"}, about
    assert not any("no rule" in n for n in p.notes), about
    assert all(profile_rules.section_bucket(n) for n in p.host_sections_ms)
    assert 0 < p.host_ms < p.total_ms <= p.wall_ms * 1.001, about  # additive: nothing counted twice
    assert p.buckets_ms["attention"] > 0 and p.buckets_ms["moe"] > 0, about  # their host time


def test_capture_rejects_bad_devices():
    with pytest.raises(UserError, match="'tpu'"):
        capture(lambda: None, steps=1, device="tpu")
    if not _has_cuda():
        with pytest.raises(UserError, match="cuda is not available"):
            capture(lambda: None, steps=1, device="cuda")
    with pytest.raises(ValueError):
        capture(lambda: None, steps=0)


@pytest.mark.gpu
def test_capture_cuda_buckets_kernels(tmp_path):
    if not _has_cuda():
        pytest.skip("needs a CUDA GPU (none on this machine)")
    p = capture(_mixed_step("cuda"), steps=3, device="cuda", trace_path=tmp_path / "gpu.json.gz")
    assert (p.source, p.steps, p.per_step) == ("gpu", 3, True)
    for bucket in ("gemm_simt", "gemm_tensorop", "copy_cast"):
        assert p.buckets_ms[bucket] > 0, (bucket, p.top_kernels)
    assert 0 < p.coverage <= 1
