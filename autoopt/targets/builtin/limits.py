"""Refuse a configuration the device cannot hold, before anything is built.

The estimate is dsv4.roofline.memory_bytes (weights + KV caches + the step's transient tensors at a
concurrency, from the same specs the weights are built from; on `tiny` it is within 10 % of the
measured growth per sequence, 147 vs 134 KB). A session that does not fit grows for minutes until
the kernel's OOM killer ends it (a CPU host without swap) or fails deep inside the CUDA allocator;
a figure computed in microseconds says the same thing up front.

What "the device has": on a CUDA device its total memory (the worker's device_info); on a CPU the
host's MemAvailable now, since the RAM is shared with every other process. Plain Python: the parent
(the CLI, the search loop) calls this without torch; the worker calls it again with the device it
measures on, so a run's trial fails with the reason even where the parent did not check.
"""
from __future__ import annotations

from typing import Any, Iterable

from autoopt.errors import UserError

GIB = 2 ** 30


class DoesNotFit(UserError):
    """The configuration's estimated memory exceeds the device's."""


def host_available_bytes() -> int | None:
    """MemAvailable of this host (Linux), else None: then nothing is refused."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def memory_refusal(model: Any, concurrency: Iterable[int], device: str,
                   device_bytes: int | None) -> str | None:
    """Why `model` (a dsv4 DecodeConfig) at the largest of `concurrency` cannot be held in
    `device_bytes`, or None when it fits (or when the device's memory is unknown)."""
    from dsv4.roofline import memory_bytes

    if device_bytes is None or not concurrency:
        return None
    worst = max(concurrency)
    need = memory_bytes(model, worst)
    if need["total"] <= device_bytes:
        return None
    where = "available on this host" if device == "cpu" else f"on {device}"
    return (f"concurrency {worst} needs about {need['total'] / GIB:.1f} GiB (weights "
            f"{need['weights'] / GIB:.1f}, KV caches {need['kv_cache'] / GIB:.1f}, activations "
            f"{need['activations'] / GIB:.1f}; dsv4.roofline.memory_bytes) but {device_bytes / GIB:.1f} "
            f"GiB are {where}; lower --concurrency or the shape")


def require_fit(target: Any, concurrency: Iterable[int]) -> None:
    """Raise DoesNotFit when the builtin `target` cannot hold `concurrency` on its device. On a
    CPU nothing is started; on a GPU the device's memory comes from the worker's describe."""
    device = target.device
    if device == "cpu":
        device_bytes = host_available_bytes()
    else:
        device_bytes = (target.describe().get("device_info") or {}).get("memory_bytes")
    reason = memory_refusal(target._model, tuple(concurrency), device, device_bytes)
    if reason is not None:
        raise DoesNotFit(reason)


def release_cached_memory(device: str) -> dict[str, int]:
    """Give the allocator's free cached blocks back to the driver after a measurement, and say how
    much this worker held. Replaced graphs and sessions leave their memory reserved in PyTorch's cache,
    which other processes cannot use: on the H200 a worker that had built twenty configurations held
    94 GiB, and the second measuring process of the run's confirmation ran out of memory beside it
    (live run 7). {} off CUDA."""
    if not device.startswith("cuda"):
        return {}
    import torch

    reserved = torch.cuda.memory_reserved(device)
    torch.cuda.empty_cache()
    return {"allocated_bytes": torch.cuda.memory_allocated(device), "reserved_bytes_before": reserved,
            "reserved_bytes_after": torch.cuda.memory_reserved(device)}


LEAK_MARGIN = 1.10  # allocated after a failure beyond this share of the last measurement's: kept by it


def memory_left_by_failure(device: str, held_after_last_measure: int | None) -> str | None:
    """Why a failed request's sessions must go, or None. A failure inside a switch can leave the old
    and the new build both referenced: on the H200 an attention tile beyond the shared memory failed
    with 94 GiB allocated in the worker, and the next trial, the incumbent again, ran out of memory
    beside the second measuring process (h200_live_10m_run8_resumed, trials 24-25). On CUDA: what is
    still allocated after a collection against what the worker held after its last measurement."""
    if not device.startswith("cuda") or not held_after_last_measure:
        return None
    import gc

    import torch

    gc.collect()
    return kept_by_failure(torch.cuda.memory_allocated(device), held_after_last_measure)


def kept_by_failure(now_bytes: int, held_bytes: int) -> str | None:
    """The verdict on the figures: more than LEAK_MARGIN x what the last measurement left allocated."""
    if now_bytes <= held_bytes * LEAK_MARGIN:
        return None
    return f"{now_bytes / 2**30:.1f} GiB allocated after the failure against {held_bytes / 2**30:.1f} GiB after the last measurement"
