"""Shared test setup.

Without a CUDA GPU, Triton kernels run in Triton's interpreter (TRITON_INTERPRET=1) on the CPU; it
must be set before triton is imported, hence here. The interpreter has no bf16 (numpy has none), so
CPU tests of Triton kernels use fp32/fp16 and bf16 is tested on the GPU.
"""
from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def _has_cuda() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()


HAS_CUDA = _has_cuda()
if not HAS_CUDA:
    os.environ.setdefault("TRITON_INTERPRET", "1")

# Subprocesses started by tests (workers, CLI runs) must find the same packages.
os.environ.setdefault("PYTHONUNBUFFERED", "1")

_NO_CUDA = pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA GPU (none on this machine)")


def requires_cuda(test):
    """Skipped without CUDA, and marked `gpu` so that `pytest -m gpu` (README) runs it on a GPU machine."""
    return pytest.mark.gpu(_NO_CUDA(test))


@pytest.fixture
def repo_root() -> Path:
    return REPO


@pytest.fixture
def python_exe() -> str:
    return sys.executable


@pytest.fixture(scope="module")
def one_torch_thread():
    """Run a module's in-process decode steps on one torch thread (as the worker does on a CPU):
    on 2 shared cores, two threads fight and step times swing tenfold."""
    import torch

    old = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(old)
