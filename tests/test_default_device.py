"""Defaults that follow the machine (issue 12 item 8): `autoopt run` without --space tunes
dsv4_flash_decode where an NVIDIA GPU is visible and dsv4_tiny_cpu otherwise, `autoopt measure`
defaults to that device, and both say which they chose and why, found without importing torch.

The GPU branch reads a driver /proc tree in the format the NVIDIA driver writes (copied from an
H200 host) placed where the detector looks; the CPU branch runs on this machine as it is."""
from __future__ import annotations

import subprocess
import sys

import pytest

from autoopt.targets.builtin import devices
from cli_helpers import REPO, env, run_autoopt

H200_INFORMATION = """Model: \t\t NVIDIA H200
IRQ:   \t\t 180
GPU UUID: \t GPU-3f1c0a52-0000-0000-0000-000000000000
Video BIOS: \t 96.00.a5.00.01
Bus Type: \t PCIe
DMA Size: \t 52 bits
DMA Mask: \t 0xfffffffffffff
Bus Location: \t 0000:19:00.0
Device Minor: \t 0
GPU Excluded:\t No
"""


def test_a_visible_gpu_picks_the_flash_decode_space(tmp_path, monkeypatch):
    from autoopt.search.session import default_space

    (tmp_path / "0000:19:00.0").mkdir()
    (tmp_path / "0000:19:00.0" / "information").write_text(H200_INFORMATION)
    monkeypatch.setattr(devices, "PROC_GPUS", tmp_path)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    guess = devices.guess_device()
    assert guess.device == "cuda" and guess.gpus == ("NVIDIA H200",) and str(tmp_path) in guess.how
    name, why = default_space()
    assert name == "dsv4_flash_decode"
    assert "dsv4_flash_decode (the default on a GPU: found NVIDIA H200" in why
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    assert devices.guess_device().device == "cpu" and "hides every GPU" in devices.guess_device().how


@pytest.mark.skipif(devices.guess_device().device == "cuda", reason="checks the machine without a GPU")
def test_without_a_gpu_run_and_measure_say_they_chose_the_cpu(tmp_path):
    out = run_autoopt("run", "--db", str(tmp_path / "t.sqlite"), "--max-trials", "1", "--no-confirm",
                      "--plain", timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "space: dsv4_tiny_cpu (the default without a GPU: no NVIDIA GPU found" in out.stderr
    chosen = subprocess.run([sys.executable, "-c",
                             "import sys; from autoopt.targets.builtin.devices import guess_device; "
                             "from autoopt.search.session import default_space; default_space(); "
                             "assert 'torch' not in sys.modules, 'torch imported'"],
                            capture_output=True, text=True, env=env(), cwd=REPO)
    assert chosen.returncode == 0, chosen.stderr


@pytest.mark.skipif(devices.guess_device().device == "cuda", reason="checks the machine without a GPU")
def test_measure_defaults_to_the_machines_device():
    out = run_autoopt("measure", "--json", "--steps", "3", timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stderr.startswith("device: cpu (no NVIDIA GPU found")
