"""The CLI and read-only commands never import torch or triton: `autoopt --help` and `history` must be
fast on a laptop. (How fast is measured by benchmarks/cli_startup.py, not asserted here.)"""
from __future__ import annotations

import subprocess
import sys


def _modules_after(import_stmt: str) -> set[str]:
    code = f"{import_stmt}; import sys; print(' '.join(sorted(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True)
    return set(out.stdout.split())


def test_cli_imports_neither_torch_nor_triton():
    mods = _modules_after("import autoopt.cli")
    assert "torch" not in mods
    assert "triton" not in mods


def test_dsv4_config_is_light():
    mods = _modules_after("import dsv4; dsv4.preset('tiny')")
    assert "torch" not in mods


def test_help_lists_commands_without_torch():
    code = ("import sys, runpy; sys.argv=['autoopt','--help']\n"
            "from autoopt.cli import main\n"
            "try:\n    main()\nexcept SystemExit as e:\n    assert e.code == 0, e.code\n"
            "assert 'torch' not in sys.modules")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    for cmd in ("measure", "profile", "run", "best", "history", "show", "diff", "spaces", "bench-search"):
        assert cmd in out.stdout, f"`autoopt --help` does not list {cmd}"
