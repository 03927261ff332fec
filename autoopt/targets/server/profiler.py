"""Profiles from servers that can take them (vLLM, SGLang): `POST /start_profile`, a short run of
requests, `POST /stop_profile`, then the newest Chrome trace (*.json.gz / *.json) the server wrote
into its trace directory, bucketed by autoopt.profile.trace. The profiled run is never the measured
one: a profiler slows the server down, so its figures would not compare.

vLLM writes traces only when started with a trace directory (VLLM_TORCH_PROFILER_DIR, or
--profiler-config on newer versions); SGLang takes SGLANG_TORCH_PROFILER_DIR or an `output_dir` in the
start request. The space's `server.profile.trace_dir_env` names the variable, set at each start.
A server without the endpoints (`transformers serve`) raises ProfileUnavailable: the trial is
measured without buckets and says so.
"""
from __future__ import annotations

import asyncio
import http.client
import json
import time
from pathlib import Path
from typing import Any

from autoopt.targets.server.http_stream import Endpoint
from autoopt.targets.server.loadgen import LengthPlan, LoadGenerator, Workload

TRACE_SUFFIXES = (".json.gz", ".json")


class ProfileUnavailable(Exception):
    """The server cannot be profiled (no endpoint, no trace written)."""


def _post(base_url: str, path: str, body: dict[str, Any] | None, timeout_s: float) -> tuple[int, str]:
    ep = Endpoint.parse(base_url)
    cls = http.client.HTTPSConnection if ep.scheme == "https" else http.client.HTTPConnection
    conn = cls(ep.host, ep.port, timeout=timeout_s)
    try:
        payload = json.dumps(body or {}).encode()
        conn.request("POST", ep.base_path + path, body=payload, headers={"Content-Type": "application/json"})
        resp = conn.getresponse()
        return resp.status, resp.read().decode("utf-8", "replace")[:300]
    except (OSError, http.client.HTTPException) as exc:
        raise ProfileUnavailable(f"POST {path} failed: {exc}") from None
    finally:
        conn.close()


def trace_files(folder: Path) -> dict[Path, float]:
    """Chrome traces under `folder` (recursively) -> modification time."""
    if not folder.is_dir():
        return {}
    return {p: p.stat().st_mtime for p in folder.rglob("*")
            if p.is_file() and p.name.endswith(TRACE_SUFFIXES)}


def wait_for_new_trace(folder: Path, before: dict[Path, float], timeout_s: float) -> Path:
    """The newest trace written after `before` was taken, once its size stops changing."""
    deadline = time.monotonic() + timeout_s
    last_size = -1
    while time.monotonic() < deadline:
        new = [p for p, m in trace_files(folder).items() if before.get(p) != m]
        if new:
            newest = max(new, key=lambda p: p.stat().st_mtime)
            size = newest.stat().st_size
            if size == last_size and size > 0:
                return newest
            last_size = size
        time.sleep(0.5)
    raise ProfileUnavailable(f"no trace appeared in {folder} within {timeout_s:g} s after {len(before)} "
                             f"existing ones (is the server's trace directory set?)")


def capture(base_url: str, cfg: dict[str, Any], workload: Workload, lengths: LengthPlan | None,
            trace_dir: Path, concurrency: int) -> Any:
    """A short profiled run -> autoopt.profile.trace.BucketProfile of the trace it produced."""
    from autoopt.profile.trace import profile_trace

    before = trace_files(trace_dir)
    status, text = _post(base_url, cfg["start"], {"output_dir": str(trace_dir)}, 30.0)
    if status in (404, 405):
        raise ProfileUnavailable(f"the server has no {cfg['start']} endpoint (HTTP {status})")
    if status >= 400:
        # SGLang and vLLM take an empty body on some versions and reject unknown fields on others
        status, text = _post(base_url, cfg["start"], None, 30.0)
    if status >= 400:
        raise ProfileUnavailable(f"POST {cfg['start']}: HTTP {status}: {text}")
    gen = LoadGenerator(base_url, workload)
    if lengths is not None:
        gen.lengths = lengths
    try:
        asyncio.run(asyncio.wait_for(gen.run(concurrency, int(cfg["requests"]), index_base=20_000_000),
                                     cfg["timeout_s"]))
    except asyncio.TimeoutError:
        raise ProfileUnavailable(f"the profiled run did not finish within {cfg['timeout_s']:g} s") from None
    finally:
        _post(base_url, cfg["stop"], None, 60.0)
    path = wait_for_new_trace(trace_dir, before, cfg["timeout_s"])
    return profile_trace(path)
