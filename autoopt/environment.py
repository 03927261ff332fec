"""Where a measurement happened: a fingerprint of the machine and the software that ran it.

`fingerprint()` is meant to run inside the worker (where torch is already imported): asking the parent
would either import torch into the CLI or describe a different process. The parent only compares
fingerprints with `same_machine()`.

Figures from two fingerprints are comparable when the hardware and the speed-relevant software agree
(GPU, driver, CUDA, torch, triton, python). The autoopt version and git sha are recorded for
provenance but are not "the machine": re-running an old study after a commit must not look like a
machine change.
"""
from __future__ import annotations

import os
import platform
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import autoopt

# Keys that decide whether two measurements are comparable (hardware + speed-relevant software).
MACHINE_KEYS = ("hostname", "cpu", "cpu_count", "device", "gpu_name", "gpu_capability", "gpu_arch",
                "gpu_count", "driver", "cuda", "torch", "triton", "python")


def _cpu_model() -> str:
    # platform.processor() is often empty on Linux; /proc/cpuinfo has the marketing name.
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.lower().startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _git_sha() -> str | None:
    """sha of the checkout autoopt runs from (+ '-dirty' when it has local changes); None when not a
    git checkout (an installed wheel)."""
    root = Path(autoopt.__file__).resolve().parents[1]
    if not (root / ".git").exists():
        return None
    try:
        sha = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True,
                             text=True, timeout=5, check=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=5).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return sha + ("-dirty" if dirty else "")


def _nvidia_driver() -> str | None:
    # torch does not expose the driver version; nvidia-smi does when present. pynvml is not a
    # dependency, so no import of it here.
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    lines = out.stdout.strip().splitlines()
    return lines[0].strip() if out.returncode == 0 and lines else None


def _module_version(name: str) -> str | None:
    mod = sys.modules.get(name)
    if mod is None:
        try:
            mod = __import__(name)
        except Exception as exc:  # noqa: BLE001 - a broken optional install is recorded, not fatal
            return f"unavailable ({type(exc).__name__})"
    return getattr(mod, "__version__", None)


def fingerprint(device: str = "cpu") -> dict[str, Any]:
    """Machine + software fingerprint for measurements made on `device` ("cpu", "cuda", "cuda:1")."""
    env: dict[str, Any] = {
        "hostname": socket.gethostname(),
        "cpu": _cpu_model(),
        "cpu_count": os.cpu_count(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "autoopt_version": autoopt.__version__,
        "git_sha": _git_sha(),
        "device": "cuda" if device.startswith("cuda") else device,
        "torch": None, "triton": _module_version("triton"), "cuda": None,
        "gpu_name": None, "gpu_capability": None, "gpu_arch": None, "gpu_count": 0, "driver": None,
    }
    try:
        import torch
    except ImportError:
        return env
    env["torch"] = torch.__version__
    env["cuda"] = torch.version.cuda
    if device.startswith("cuda") and torch.cuda.is_available():
        idx = torch.device(device).index or 0
        props = torch.cuda.get_device_properties(idx)
        env["gpu_name"] = props.name
        env["gpu_capability"] = f"{props.major}.{props.minor}"
        env["gpu_arch"] = f"sm_{props.major}{props.minor}"
        env["gpu_count"] = torch.cuda.device_count()
        env["gpu_memory_bytes"] = int(props.total_memory)
        env["driver"] = _nvidia_driver()
    return env


def same_machine(a: dict[str, Any], b: dict[str, Any]) -> tuple[bool, list[str]]:
    """Whether measurements under fingerprints `a` and `b` are comparable, and every difference as
    "key: a -> b". A key missing from both is not a difference; missing from one side is."""
    diffs = []
    for key in MACHINE_KEYS:
        va, vb = a.get(key), b.get(key)
        if va != vb:
            diffs.append(f"{key}: {va!r} -> {vb!r}")
    return (not diffs, diffs)
