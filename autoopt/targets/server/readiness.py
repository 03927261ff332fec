"""Is the server up, and is it warm? Readiness by polling a health URL; warm-up by real requests.

"Ready" is not "warm": a server answers /health as soon as it listens, but its first requests may
allocate caches, compile graphs or capture CUDA graphs (a continuous-batching `transformers serve`'s
first request on a CPU takes about 8 s, a steady one 0.1 s). The server target times the two apart:
`ready` (launch -> the health URL answers 200) and `warm` (warm-up requests, never measured).
"""
from __future__ import annotations

import http.client
import time
from dataclasses import dataclass
from typing import Any

from autoopt.targets.server.http_stream import Endpoint

DEFAULT_HEALTH_PATHS = ("/health", "/v1/models")


@dataclass
class NotReady(Exception):
    kind: str  # crash (the process ended) | hang (no answer within the timeout)
    reason: str
    log_tail: str = ""

    def __str__(self) -> str:
        return self.reason


def _get_status(endpoint: Endpoint, path: str, timeout_s: float) -> int | None:
    """The HTTP status of GET path, or None when nothing answers (refused, reset, timed out)."""
    cls = http.client.HTTPSConnection if endpoint.scheme == "https" else http.client.HTTPConnection
    conn = cls(endpoint.host, endpoint.port, timeout=timeout_s)
    try:
        conn.request("GET", endpoint.base_path + path)
        resp = conn.getresponse()
        resp.read()
        return resp.status
    except (OSError, http.client.HTTPException):
        return None
    finally:
        conn.close()


def wait_ready(base_url: str, process: Any, timeout_s: float,
               health_paths: tuple[str, ...] = DEFAULT_HEALTH_PATHS, poll_s: float = 0.25) -> str:
    """Poll until one of `health_paths` answers 200 (a 404/405 path is dropped: the server has no
    such route); returns the path that answered. Raises NotReady at once when `process` ends, or
    when `timeout_s` passes, with the server log's tail."""
    endpoint = Endpoint.parse(base_url)
    paths = list(health_paths)
    deadline = time.monotonic() + timeout_s
    while True:
        if not process.alive():
            raise NotReady("crash", f"{process.exit_description()} before it became ready "
                                    f"(log: {process.log_path})", process.log_tail())
        for path in list(paths):
            status = _get_status(endpoint, path, timeout_s=min(5.0, max(0.5, poll_s * 8)))
            if status == 200:
                if not process.alive():  # something else answers on that port
                    break
                return path
            if status in (404, 405) and len(paths) > 1:
                paths.remove(path)
            if status is None:
                break  # not listening yet: no point asking the next path
        if time.monotonic() >= deadline:
            raise NotReady("hang", f"not ready after {timeout_s:g} s (polled {endpoint.url}"
                                   f"{' or '.join(paths)}; log: {process.log_path})", process.log_tail())
        time.sleep(poll_s)
