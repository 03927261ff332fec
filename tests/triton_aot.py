"""Compiling Triton kernels for sm_90 without a GPU (Triton's bundled ptxas), in a subprocess
without TRITON_INTERPRET: the GPU code paths that the interpreter tests never compile.

`compile_for_sm90(body)` runs PREAMBLE + body; the body calls `comp(kernel, signature, constexprs)`
(which returns the PTX) and prints "compiled" at the end.
"""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

PREAMBLE = textwrap.dedent("""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
    C = "constexpr"
    def comp(fn, sig, consts):
        k = triton.compile(ASTSource(fn=fn, signature=sig, constexprs=consts),
                           target=GPUTarget("cuda", 90, 64))
        assert k.metadata.name == fn.__name__, k.metadata.name
        return k.asm["ptx"]
""")


def compile_for_sm90(body: str) -> None:
    pytest.importorskip("triton.backends.nvidia")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    proc = subprocess.run([sys.executable, "-c", PREAMBLE + textwrap.dedent(body)], env=env,
                          capture_output=True, text=True, timeout=280)
    if proc.returncode and "ptxas" in proc.stderr and "not found" in proc.stderr.lower():
        pytest.skip("Triton's ptxas is not available here")
    assert proc.returncode == 0 and "compiled" in proc.stdout, proc.stderr[-3000:]
