"""What a device can run, and what it is. The search space excludes knob values whose requirement
("cuda", "fp8", "triton"; see dsv4.knobs) the device does not meet, so this is the single place
that decides it.
"""
from __future__ import annotations

import importlib.util
import os
import platform

import torch

FP8_MIN_CAPABILITY = (8, 9)  # Ada / Hopper and newer have FP8 tensor cores


def _torch_device(device: str) -> torch.device:
    dev = torch.device(device)
    if dev.type == "cuda" and dev.index is None:
        dev = torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else dev
    return dev


def is_cuda(device: str) -> bool:
    return torch.device(device).type == "cuda" and torch.cuda.is_available()


def capabilities(device: str) -> dict[str, bool]:
    """{"cuda", "fp8", "triton"} for `device` ("cpu", "cuda", "cuda:1", ...)."""
    cuda = is_cuda(device)
    fp8 = cuda and torch.cuda.get_device_capability(_torch_device(device)) >= FP8_MIN_CAPABILITY
    triton = cuda and importlib.util.find_spec("triton") is not None
    return {"cuda": cuda, "fp8": bool(fp8), "triton": bool(triton)}


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _total_ram_bytes() -> int | None:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return None


def device_info(device: str) -> dict:
    """Name, compute capability ("9.0"), arch ("sm_90"), memory bytes; CPU model on the CPU."""
    info: dict = {"device": device, "torch": torch.__version__, "cpu_model": _cpu_model(),
                  "cpu_count": os.cpu_count()}
    if is_cuda(device):
        dev = _torch_device(device)
        props = torch.cuda.get_device_properties(dev)
        major, minor = props.major, props.minor
        info.update(type="cuda", name=props.name, capability=f"{major}.{minor}",
                    arch=f"sm_{major}{minor}", memory_bytes=int(props.total_memory),
                    multiprocessors=props.multi_processor_count, cuda_runtime=torch.version.cuda)
    else:
        info.update(type="cpu", name=info["cpu_model"], capability=None, arch=platform.machine(),
                    memory_bytes=_total_ram_bytes(), threads=torch.get_num_threads())
    info["capabilities"] = capabilities(device)
    return info
