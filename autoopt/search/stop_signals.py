"""The signals that stop `autoopt run` cleanly: Ctrl-C (SIGINT), SIGTERM (a supervisor, `kill`,
`timeout`) and SIGHUP (the terminal closed). The loop handles all three alike and exits with
128 + the signal's number (130, 143, 129)."""
from __future__ import annotations

import signal
from typing import Any, Callable

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


def install(on_signal: Callable[[signal.Signals], None]) -> dict[int, Any]:
    """Route every stop signal to `on_signal`; returns the handlers it replaced (for `restore`)."""
    return {s: signal.signal(s, lambda signum, _frame: on_signal(signal.Signals(signum))) for s in STOP_SIGNALS}


def restore(old: dict[int, Any] | None) -> None:
    for signum, handler in (old or {}).items():
        signal.signal(signum, handler)


def signal_text(sig: signal.Signals | None) -> str:
    return "Ctrl-C (SIGINT)" if sig in (None, signal.SIGINT) else sig.name


def exit_code(sig: signal.Signals | None, default: int) -> int:
    """128 + the signal's number (130, 143, 129); `default` when no signal is known."""
    return 128 + int(sig) if sig is not None else default
