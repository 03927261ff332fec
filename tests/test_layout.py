"""Layout guards: `kernels/` is a source root (never a package), and both an editable install and a
built wheel import `dsv4` and `autoopt` (PyPI's `kernels` must never be shadowed)."""
from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def test_kernels_is_not_a_package():
    assert not (REPO / "kernels" / "__init__.py").exists(), (
        "kernels/__init__.py would shadow PyPI's `kernels` package; kernels/ must stay a source root")
    assert (REPO / "kernels" / "dsv4" / "__init__.py").exists()


def test_top_level_layout():
    for name in ("pyproject.toml", "README.md", "autoopt", "kernels", "search_spaces", "db", "tests",
                 "benchmarks"):
        assert (REPO / name).exists(), f"missing top-level {name}"


def test_editable_install_imports_from_the_tree():
    import autoopt
    import dsv4

    assert Path(dsv4.__file__).resolve().is_relative_to(REPO / "kernels")
    assert Path(autoopt.__file__).resolve().is_relative_to(REPO / "autoopt")


@pytest.mark.slow
def test_built_wheel_imports_dsv4_and_autoopt(tmp_path):
    wheel_dir = tmp_path / "wheel"
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
                    "-w", str(wheel_dir), str(REPO)], check=True, capture_output=True, text=True)
    (wheel,) = wheel_dir.glob("autoopt-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert "dsv4/__init__.py" in names and "autoopt/__init__.py" in names
    assert not any(n.startswith("kernels/") for n in names), "the wheel must not ship a `kernels` package"
    assert any(n.startswith("autoopt/store/migrations/versions/") and n.endswith(".py") for n in names), \
        "alembic migrations must ship in the wheel"

    site = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "-q", "--target", str(site),
                    str(wheel)], check=True, capture_output=True, text=True)
    probe = ("import dsv4, autoopt, autoopt.cli; "
             "print(dsv4.__file__); print(autoopt.__file__); print(dsv4.preset('tiny').hidden)")
    env = dict(os.environ, PYTHONPATH=str(site))
    out = subprocess.run([sys.executable, "-c", probe], cwd=tmp_path, env=env, check=True,
                         capture_output=True, text=True).stdout.split()
    assert out[0].startswith(str(site)) and out[1].startswith(str(site)), out
    assert out[2] == "64"
