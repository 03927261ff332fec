"""A minimal HTTP/1.1 client on asyncio streams, for streamed (server-sent events) JSON responses.

Why not httpx/aiohttp: neither is a dependency of autoopt (the venv has neither), and a load
generator's client should add as little time per token as it can: one keep-alive connection per
concurrent stream, bytes read as they arrive, events split on newlines. Plain http and https
(ssl.create_default_context) URLs; chunked, Content-Length and read-to-close bodies.
"""
from __future__ import annotations

import asyncio
import json
import ssl
from dataclasses import dataclass
from typing import AsyncIterator
from urllib.parse import urlsplit


class HTTPError(Exception):
    def __init__(self, status: int, body: str) -> None:
        super().__init__(f"HTTP {status}: {body[:400]}")
        self.status, self.body = status, body


@dataclass(frozen=True)
class Endpoint:
    scheme: str
    host: str
    port: int
    base_path: str  # the URL's path without a trailing slash ("" for the root)

    @classmethod
    def parse(cls, url: str) -> "Endpoint":
        parts = urlsplit(url if "://" in url else f"http://{url}")
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"expected an http(s)://HOST[:PORT] URL; got {url!r}")
        port = parts.port or (443 if parts.scheme == "https" else 80)
        return cls(parts.scheme, parts.hostname, port, parts.path.rstrip("/"))

    @property
    def url(self) -> str:
        return f"{self.scheme}://{self.host}:{self.port}{self.base_path}"


class Connection:
    """One keep-alive connection; `stream_post` yields the response body's bytes as they arrive."""

    def __init__(self, endpoint: Endpoint, headers: dict[str, str] | None = None) -> None:
        self.endpoint = endpoint
        self.headers = dict(headers or {})
        self._reader: asyncio.StreamReader | None = None
        self._writer: asyncio.StreamWriter | None = None

    async def _open(self) -> None:
        ctx = ssl.create_default_context() if self.endpoint.scheme == "https" else None
        self._reader, self._writer = await asyncio.open_connection(self.endpoint.host, self.endpoint.port,
                                                                   ssl=ctx)

    async def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
            try:
                await self._writer.wait_closed()
            except (ConnectionError, OSError):
                pass
        self._reader = self._writer = None

    async def stream_post(self, path: str, body: dict) -> AsyncIterator[bytes]:
        if self._writer is None or self._writer.is_closing():
            await self._open()
        assert self._reader is not None and self._writer is not None
        payload = json.dumps(body).encode()
        lines = [f"POST {self.endpoint.base_path}{path} HTTP/1.1",
                 f"Host: {self.endpoint.host}:{self.endpoint.port}", "Content-Type: application/json",
                 "Accept: text/event-stream", f"Content-Length: {len(payload)}",
                 *(f"{k}: {v}" for k, v in self.headers.items())]
        self._writer.write(("\r\n".join(lines) + "\r\n\r\n").encode() + payload)
        await self._writer.drain()
        status, headers = await self._read_head()
        body_iter = self._body(headers)
        if status != 200:
            rest = b"".join([piece async for piece in body_iter])
            raise HTTPError(status, rest.decode("utf-8", "replace"))
        async for piece in body_iter:
            yield piece
        if headers.get("connection", "").lower() == "close":
            await self.close()

    async def _read_head(self) -> tuple[int, dict[str, str]]:
        assert self._reader is not None
        status_line = await self._reader.readline()
        if not status_line:
            await self.close()
            raise ConnectionResetError("the server closed the connection before answering")
        try:
            status = int(status_line.split()[1])
        except (IndexError, ValueError):
            raise ConnectionError(f"not an HTTP response: {status_line[:80]!r}") from None
        headers: dict[str, str] = {}
        while True:
            line = await self._reader.readline()
            if line in (b"\r\n", b"\n", b""):
                break
            key, _, value = line.decode("latin-1").partition(":")
            headers[key.strip().lower()] = value.strip()
        return status, headers

    async def _body(self, headers: dict[str, str]) -> AsyncIterator[bytes]:
        reader = self._reader
        assert reader is not None
        if "chunked" in headers.get("transfer-encoding", "").lower():
            while True:
                size_line = await reader.readline()
                if not size_line:
                    raise ConnectionResetError("the server closed the connection mid-response")
                size = int(size_line.split(b";")[0].strip() or b"0", 16)
                if size == 0:
                    await reader.readline()  # the CRLF after the last chunk (no trailers expected)
                    return
                data = await reader.readexactly(size)
                await reader.readexactly(2)
                yield data
        elif "content-length" in headers:
            remaining = int(headers["content-length"])
            while remaining > 0:
                data = await reader.read(min(remaining, 65536))
                if not data:
                    raise ConnectionResetError("the server closed the connection mid-response")
                remaining -= len(data)
                yield data
        else:
            while data := await reader.read(65536):
                yield data
            await self.close()


async def sse_events(pieces: AsyncIterator[bytes]) -> AsyncIterator[dict | str]:
    """Server-sent events of a streamed completion: each `data:` line's JSON object, or "[DONE]"."""
    buffer = b""
    async for piece in pieces:
        buffer += piece
        while b"\n" in buffer:
            line, buffer = buffer.split(b"\n", 1)
            line = line.strip()
            if not line.startswith(b"data:"):
                continue
            data = line[5:].strip()
            if data == b"[DONE]":
                yield "[DONE]"
                continue
            try:
                yield json.loads(data)
            except json.JSONDecodeError:
                continue  # a keep-alive comment or a partial line the server split oddly
