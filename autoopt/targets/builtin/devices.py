"""Which device this machine offers, found without importing torch (the CLI process must not: it
takes seconds and, on a GPU host, a CUDA context): the NVIDIA driver's /proc entries, else
`nvidia-smi -L`. What the worker then finds (torch.cuda) is what runs, and it is recorded there."""
from __future__ import annotations

import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

PROC_GPUS = Path("/proc/driver/nvidia/gpus")


@dataclass(frozen=True)
class DeviceGuess:
    device: str  # "cuda" or "cpu"
    gpus: tuple[str, ...]  # GPU names, as the driver reports them
    how: str  # one line: how this was found (shown by `run` and `measure`)


def _from_proc() -> tuple[str, ...]:
    names = []
    for info in sorted(PROC_GPUS.glob("*/information")):
        model = next((ln.split(":", 1)[1].strip() for ln in info.read_text(errors="replace").splitlines()
                      if ln.startswith("Model:")), "NVIDIA GPU")
        names.append(model)
    return tuple(names)


def _from_nvidia_smi() -> tuple[str, ...]:
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return ()
    try:
        out = subprocess.run([exe, "-L"], capture_output=True, text=True, timeout=15).stdout
    except (OSError, subprocess.TimeoutExpired):
        return ()
    return tuple(ln.split(":", 1)[1].split("(UUID")[0].strip() for ln in out.splitlines()
                 if ln.startswith("GPU ") and ":" in ln)


def guess_device() -> DeviceGuess:
    """cuda when an NVIDIA GPU is visible to this process, else cpu, with how that was decided."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None and visible.strip() in ("", "-1"):
        return DeviceGuess("cpu", (), f"CUDA_VISIBLE_DEVICES={visible!r} hides every GPU")
    try:
        gpus = _from_proc() if PROC_GPUS.is_dir() else ()
    except OSError:
        gpus = ()
    how = f"{PROC_GPUS}"
    if not gpus:
        gpus, how = _from_nvidia_smi(), "nvidia-smi -L"
    if gpus:
        more = f" (+{len(gpus) - 1} more)" if len(gpus) > 1 else ""
        return DeviceGuess("cuda", gpus, f"found {gpus[0]}{more} via {how}")
    return DeviceGuess("cpu", (), f"no NVIDIA GPU found ({PROC_GPUS} absent, nvidia-smi "
                                   f"{'lists none' if shutil.which('nvidia-smi') else 'not installed'})")
