"""dsv4: a faithful, randomly initialised DeepSeek-V4 decode step with switchable variants.

Importing the package is cheap (no torch): `dsv4.knobs` and `dsv4.config` are plain Python. The
model (`DecodeSession`), the guard and the kernels import torch when first used.
"""
from __future__ import annotations

from typing import Any

from dsv4.config import PRESET_NAMES, DecodeConfig, preset
from dsv4.knobs import KNOB_BY_NAME, KNOBS, baseline_knobs

__all__ = ["DecodeConfig", "preset", "PRESET_NAMES", "KNOBS", "KNOB_BY_NAME", "baseline_knobs",
           "DecodeSession", "capabilities"]


def __getattr__(name: str) -> Any:  # lazy: keep `import dsv4` free of torch
    if name == "DecodeSession":
        from dsv4.session import DecodeSession
        return DecodeSession
    if name == "capabilities":
        from dsv4.device import capabilities
        return capabilities
    raise AttributeError(f"module 'dsv4' has no attribute {name!r}")
