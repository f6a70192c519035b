"""Which signals stop the ``sglang-launch`` process, which it shrugs off, and when.

A launcher is stopped by SIGINT, SIGTERM, SIGHUP (the terminal or ssh session went away) and
SIGQUIT, always the same way: a graceful stop that drains and exits 0. A second one of them while
the stop is under way cuts the grace period short. Every other signal whose default action would
end the process (SIGUSR1, SIGUSR2, SIGPIPE, SIGALRM, the real-time signals...) is caught and
logged, never fatal; the faults (SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGABRT, SIGTRAP, SIGSYS) keep
their default. Caught signals, unlike ignored ones, are back to their default in the children.

The command goes through three stages, and no signal finds the process without a handler:

1. ``install_early()`` (first thing of the serve command): a stop signal raises
   ``StopRequested`` wherever the main thread is; nothing has been started yet, so the command
   just exits 0.
2. ``defer()`` (once the supervisor exists): a stop signal is only recorded; the supervisor picks
   it up with ``take_pending()`` when its event loop installs its own handlers.
3. ``install_on_loop(loop, on_stop, on_other)``: the event loop's handlers; ``restore(loop)``
   hands back to recording handlers when the loop is done, with the signals blocked meanwhile.
"""

from __future__ import annotations

import logging
import signal
from collections.abc import Callable
from types import FrameType
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import asyncio

Handler = Callable[[int, FrameType | None], None]

log = logging.getLogger("launcher")

STOP_SIGNALS: tuple[signal.Signals, ...] = tuple(
    getattr(signal, name)
    for name in ("SIGINT", "SIGTERM", "SIGHUP", "SIGQUIT")
    if hasattr(signal, name)
)

# Default action "terminate" or "core dump", not raised by a fault of this very process.
_FATAL_NAMES = (
    "SIGUSR1",
    "SIGUSR2",
    "SIGPIPE",
    "SIGALRM",
    "SIGVTALRM",
    "SIGPROF",
    "SIGIO",
    "SIGPOLL",
    "SIGPWR",
    "SIGSTKFLT",
    "SIGXCPU",
    "SIGXFSZ",
    "SIGLOST",
    "SIGEMT",
)


def other_fatal_signals() -> tuple[int, ...]:
    """Signals that would end the process by default and are caught and logged instead."""
    found = {int(getattr(signal, name)) for name in _FATAL_NAMES if hasattr(signal, name)}
    if hasattr(signal, "SIGRTMIN"):
        found.update(range(int(signal.SIGRTMIN), int(signal.SIGRTMAX) + 1))
    return tuple(sorted(found - {int(s) for s in STOP_SIGNALS}))


def name(sig: int) -> str:
    """``"SIGTERM"``; ``"SIGRTMIN+3"`` for a real-time signal."""
    try:
        return signal.Signals(sig).name
    except ValueError:
        if hasattr(signal, "SIGRTMIN") and signal.SIGRTMIN <= sig <= signal.SIGRTMAX:
            return f"SIGRTMIN+{sig - signal.SIGRTMIN}"
        return f"signal {sig}"


class StopRequested(BaseException):
    """A stop signal arrived before the supervisor existed: nothing to stop, exit 0."""

    def __init__(self, signame: str) -> None:
        super().__init__(signame)
        self.signame = signame


_pending: list[str] = []


def _raise_stop(signum: int, frame: FrameType | None) -> None:
    raise StopRequested(name(signum))


def _record_stop(signum: int, frame: FrameType | None) -> None:
    _pending.append(name(signum))


def _note_other(signum: int, frame: FrameType | None) -> None:
    log.warning(
        "ignored %s (only SIGINT, SIGTERM, SIGHUP and SIGQUIT stop sglang-launch)", name(signum)
    )


def _set_all(stop_handler: Handler) -> None:
    for sig in STOP_SIGNALS:
        signal.signal(sig, stop_handler)
    for other in other_fatal_signals():
        try:
            signal.signal(other, _note_other)
        except (OSError, ValueError):
            pass


def install_early() -> None:
    """Stage 1: from now on a stop signal raises ``StopRequested`` (main thread only)."""
    _pending.clear()
    _set_all(_raise_stop)


def defer() -> None:
    """Stage 2: a stop signal is recorded for the supervisor to take."""
    for sig in STOP_SIGNALS:
        signal.signal(sig, _record_stop)


def take_pending() -> list[str]:
    """The stop signals recorded since ``defer()`` (cleared)."""
    taken = list(_pending)
    _pending.clear()
    return taken


def install_on_loop(
    loop: asyncio.AbstractEventLoop,
    on_stop: Callable[[str], None],
    on_other: Callable[[str], None] | None = None,
) -> None:
    """Stage 3: ``on_stop(name)`` for each stop signal, ``on_other(name)`` (default: a warning)
    for the other would-be-fatal signals, run by ``loop``."""
    for sig in STOP_SIGNALS:
        loop.add_signal_handler(sig, on_stop, name(sig))
    for other in other_fatal_signals():
        try:
            loop.add_signal_handler(other, on_other or _note_other_name, name(other))
        except (OSError, ValueError, RuntimeError):
            pass


def _note_other_name(signame: str) -> None:
    log.warning("ignored %s (only SIGINT, SIGTERM, SIGHUP and SIGQUIT stop sglang-launch)", signame)


def restore(loop: asyncio.AbstractEventLoop) -> None:
    """Take the loop's handlers back (the loop is about to close): stop signals are recorded,
    the others logged, with every one of them blocked while the handlers change hands."""
    sigs = {*STOP_SIGNALS, *other_fatal_signals()}
    blocked = (
        signal.pthread_sigmask(signal.SIG_BLOCK, sigs)
        if hasattr(signal, "pthread_sigmask")
        else None
    )
    try:
        for sig in sigs:
            try:
                loop.remove_signal_handler(sig)
            except (OSError, ValueError, RuntimeError):
                pass
        _set_all(_record_stop)
    finally:
        if blocked is not None:
            signal.pthread_sigmask(signal.SIG_SETMASK, blocked)
