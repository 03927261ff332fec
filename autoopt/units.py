"""Durations as people write and read them: `--budget 1h30m` in, "1m35s" out (one parser, one
formatter for the whole CLI and every reason line)."""
from __future__ import annotations

import math
import re

from autoopt.errors import UserError

_UNITS_S = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
_DURATION_RE = re.compile(r"(\d+(?:\.\d+)?)\s*([smhd]?)")


def parse_duration(text: str | float | int, option: str = "--budget") -> float:
    """'90s', '2m', '2h', '1h30m', '1.5h', '45' (seconds) -> seconds. UserError on anything else."""
    if isinstance(text, (int, float)) and not isinstance(text, bool):
        if text <= 0:
            raise UserError(f"{option}: expected a positive duration, got {text!r}")
        return float(text)
    s = str(text).strip().lower().replace(" ", "")
    pos, total, parts = 0, 0.0, 0
    while pos < len(s):
        m = _DURATION_RE.match(s, pos)
        if not m or m.end() == pos:
            break
        unit = m.group(2) or "s"
        if not m.group(2) and (pos != 0 or m.end() != len(s)):
            break  # a bare number (seconds) only as the whole text: '1h30' is ambiguous
        total += float(m.group(1)) * _UNITS_S[unit]
        pos, parts = m.end(), parts + 1
    if pos != len(s) or parts == 0 or total <= 0:
        raise UserError(f"{option}: expected a duration like 90s, 2m, 2h or 1h30m, got {text!r}")
    return total


def format_duration(seconds: float) -> str:
    """Compact human form: 95 -> '1m35s', 5400 -> '1h30m', 12.3 -> '12.3s', inf -> '∞'."""
    if not math.isfinite(seconds):
        return "∞"
    if seconds < 60:
        return f"{seconds:.1f}s" if seconds < 10 else f"{seconds:.0f}s"
    m, s = divmod(int(round(seconds)), 60)
    h, m = divmod(m, 60)
    if h:
        return f"{h}h{m:02d}m"
    return f"{m}m{s:02d}s"
