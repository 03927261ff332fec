"""Reading Chrome trace files (torch.profiler's export, a serving process's dump): the event list.

Two readers with one contract. `load_events` parses the whole document (small traces, tests).
`iter_events` streams: it decompresses and decodes the `traceEvents` array a few MB at a time (runs
of whole events, each parsed by one json.loads), so a 1M-event trace never exists as one 260 MB
string plus a million parsed dicts at once; the caller
keeps what it needs (autoopt.profile.trace keeps the counted events, their args cut to what it reads).
On a 2-core CPU where memory is the cost (page faults dominated: 4.8 s of system time in json.loads
of a 1M-event trace), streaming is what brings `autoopt profile` of such a trace under 10 s.

Any trace the streaming reader cannot follow (not JSON, truncated, an unusual layout) is read again
by `load_events` (`read_events` does both), whose error names the file and the line and column, or
which parses it after all.
"""
from __future__ import annotations

import gzip
import io
import json
import re
import zlib
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, TypeVar

from autoopt.errors import UserError

EXPECTED = "expected a Chrome trace (.json or .json.gz) from torch.profiler"
CHUNK_CHARS = 1 << 22  # text decoded per read: large enough that boundaries are rare
_WS = " \t\n\r"
T = TypeVar("T")


def _check_path(p: Path) -> None:
    if not p.exists():
        raise UserError(f"{p}: no such file; {EXPECTED}")
    if p.is_dir():
        raise UserError(f"{p}: is a directory; {EXPECTED}")


def load_events(path: str | Path) -> list[dict[str, Any]]:
    """The event list of a Chrome trace (.json, or gzip whatever the suffix); UserError naming the
    file when it is missing, unreadable, not JSON or not a trace."""
    p = Path(path)
    _check_path(p)
    try:
        raw = p.read_bytes()
        if raw[:2] == b"\x1f\x8b":  # gzip magic: trust the bytes, not the suffix
            raw = gzip.decompress(raw)
        doc = json.loads(raw)
    except (OSError, EOFError, zlib.error) as exc:
        raise UserError(f"{p}: cannot read ({exc}); {EXPECTED}") from None
    except UnicodeDecodeError:
        raise UserError(f"{p}: not UTF-8 JSON text; {EXPECTED}") from None
    except json.JSONDecodeError as exc:
        raise UserError(f"{p}: not valid JSON (line {exc.lineno}, column {exc.colno}); {EXPECTED}") \
            from None
    except RecursionError:
        raise UserError(f"{p}: JSON nested too deeply to be a trace; {EXPECTED}") from None
    events = doc.get("traceEvents") if isinstance(doc, dict) else doc
    if not isinstance(events, list):
        raise UserError(f"{p}: not a Chrome trace: expected a JSON object with a 'traceEvents' list")
    return [e for e in events if isinstance(e, dict)]


class Unfollowable(Exception):
    """The streaming reader gives up; load_events reads the file instead."""


class _Stream:
    """Decoded text of a (possibly gzip) file, consumed from the front through `buf[pos:]`."""

    def __init__(self, f: io.TextIOBase) -> None:
        self.f, self.buf, self.pos, self.eof = f, "", 0, False
        self.decoder = json.JSONDecoder()

    def more(self) -> None:
        chunk = self.f.read(CHUNK_CHARS)
        if not chunk:
            if self.eof:
                raise Unfollowable("truncated")
            self.eof = True
        self.buf, self.pos = self.buf[self.pos:] + chunk, 0

    def peek(self) -> str:
        while True:
            while self.pos < len(self.buf) and self.buf[self.pos] in _WS:
                self.pos += 1
            if self.pos < len(self.buf):
                return self.buf[self.pos]
            self.more()

    def value(self) -> Any:
        if self.pos >= len(self.buf) or self.buf[self.pos] in _WS:
            self.peek()
        while True:
            try:
                obj, end = self.decoder.raw_decode(self.buf, self.pos)
            except json.JSONDecodeError:
                if self.eof:
                    raise Unfollowable("bad JSON") from None
                self.more()  # an element cut by the chunk boundary: read on, decode again
                continue
            except RecursionError:
                raise Unfollowable("too deep") from None
            if end == len(self.buf) and not self.eof:  # a number may go on in the next chunk
                self.more()
                continue
            self.pos = end
            return obj

    def bulk(self) -> list[Any] | None:
        """The next run of whole array elements, parsed by one json.loads: the text up to the last
        `}, {"` of the buffer, tried as an array. A candidate inside a string (kernel names hold
        "}, ") leaves the run ending inside that string, which never parses, so a run that parses
        ends on an element boundary. None when no candidate parses (the caller goes on element by
        element)."""
        while len(self.buf) - self.pos < CHUNK_CHARS and not self.eof:
            self.more()
        end = len(self.buf)
        for _attempt in range(4):
            window = max(self.pos, end - BOUNDARY_WINDOW)
            cuts = [m.start() for m in _BOUNDARY.finditer(self.buf, window, end)]
            if not cuts:
                return None
            cut = cuts[-1]
            try:
                items = json.loads("[" + self.buf[self.pos:cut + 1] + "]")
            except json.JSONDecodeError:
                end = cut
                continue
            except RecursionError:
                raise Unfollowable("too deep") from None
            self.pos = cut + 1
            self.pos = self.buf.index(",", self.pos) + 1
            return items
        return None

    def expect(self, ch: str) -> None:
        if self.peek() != ch:
            raise Unfollowable(f"expected {ch!r}")
        self.pos += 1


_BOUNDARY = re.compile(r'\}[ \t\n\r]*,[ \t\n\r]*\{"')  # where one event object ends, the next begins
BOUNDARY_WINDOW = 1 << 16  # the tail of the buffer searched for the last boundary
_SEP = re.compile(r"[ \t\n\r]*([,\]])[ \t\n\r]*")  # between two elements of an array


def _array(s: _Stream) -> Iterator[Any]:
    s.expect("[")
    while (run := s.bulk()) is not None:
        yield from run
    if s.peek() == "]":
        s.pos += 1
        return
    while True:
        yield s.value()
        m = _SEP.match(s.buf, s.pos)
        while m is None or (m.end() == len(s.buf) and not s.eof):  # cut by the chunk boundary
            if s.pos < len(s.buf) and s.buf[s.pos] not in _WS + ",]":
                raise Unfollowable("expected , or ]")
            s.more()
            m = _SEP.match(s.buf, s.pos)
        s.pos = m.end()
        if m.group(1) == "]":
            return


def _trace_events(s: _Stream) -> Iterator[Any]:
    """The elements of the top-level list, or of the object's "traceEvents" list."""
    if s.peek() == "[":
        yield from _array(s)
        return
    s.expect("{")
    while s.peek() != "}":
        key = s.value()
        s.expect(":")
        if key == "traceEvents" and s.peek() == "[":
            yield from _array(s)
            return  # the keys after it are metadata the profile does not read
        s.value()
        if s.peek() == ",":
            s.pos += 1
    raise Unfollowable("no traceEvents list")


def iter_events(path: str | Path) -> Iterator[dict[str, Any]]:
    """The events of a Chrome trace one by one (dicts only), streamed. Raises Unfollowable (possibly
    after some events) where this reader cannot go on: `read_events` then starts over with
    load_events, which names the problem."""
    p = Path(path)
    _check_path(p)
    try:
        with open(p, "rb") as raw:
            gz = raw.read(2) == b"\x1f\x8b"
        binary = gzip.open(p, "rb") if gz else open(p, "rb")
        with io.TextIOWrapper(binary, encoding="utf-8") as f:
            for event in _trace_events(_Stream(f)):
                if isinstance(event, dict):
                    yield event
    except (OSError, EOFError, zlib.error, UnicodeDecodeError) as exc:
        raise Unfollowable(str(exc)) from None


def read_events(path: str | Path, build: Callable[[Iterable[dict[str, Any]]], T]) -> T:
    """build(the trace's events), streamed; over again from load_events where streaming stops."""
    try:
        return build(iter_events(path))
    except Unfollowable:
        return build(load_events(path))
