"""What every benchmark result records beside its figures: machine, versions, date."""
from __future__ import annotations

import datetime as _dt
import json
import platform
import subprocess
import sys
from pathlib import Path
from typing import Any


def machine_meta() -> dict[str, Any]:
    meta: dict[str, Any] = {
        "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "host": platform.node(),
        "platform": platform.platform(),
        "processor": platform.processor() or platform.machine(),
        "python": sys.version.split()[0],
    }
    for mod in ("torch", "triton", "optuna", "sqlalchemy"):
        try:
            meta[mod] = str(__import__(mod).__version__)
        except ImportError:
            meta[mod] = None
    try:
        import os
        meta["cpu_count"] = os.cpu_count()
        import torch
        if torch.cuda.is_available():
            p = torch.cuda.get_device_properties(0)
            meta["gpu"] = p.name
            meta["gpu_capability"] = f"{p.major}.{p.minor}"
            meta["cuda"] = torch.version.cuda
            drv = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                                 capture_output=True, text=True)
            meta["driver"] = drv.stdout.strip() or None
    except ImportError:
        pass
    try:
        sha = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                             cwd=Path(__file__).parent).stdout.strip()
        meta["git_sha"] = sha or None
    except OSError:
        meta["git_sha"] = None
    return meta


def write_result(path: str | Path, payload: dict[str, Any]) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(payload, indent=2, sort_keys=True) + "\n")
    return path
