"""Which signals stop the ``sglang-launch`` process, which change it, which it shrugs off, and when.

A launcher is stopped by SIGINT, SIGTERM and SIGQUIT, always the same way: a graceful stop that
drains and exits 0. A second one of them while the stop is under way cuts the grace period short.
SIGHUP stops it the same way until the server is ready; from then on it reloads (fresh replicas,
one at a time, as systemd's ``ExecReload=kill -HUP $MAINPID`` expects), unless the terminal the
launcher runs in has just gone away (``terminal_hung_up``): the hang-up a closed terminal or ssh
session sends still stops it. SIGTTIN and SIGTTOU add and remove one replica once the server is
ready (``CHANGE_SIGNALS``). Every other signal whose default action would end the process
(SIGUSR1, SIGUSR2, SIGPIPE, SIGALRM, the real-time signals...) is caught and logged, never fatal;
the faults (SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGABRT, SIGTRAP, SIGSYS) keep their default. Caught
signals, unlike ignored ones, are back to their default in the children.

The command goes through three stages, and no signal finds the process without a handler:

1. ``install_early()`` (first thing of the serve command): a stop signal raises
   ``StopRequested`` wherever the main thread is; nothing has been started yet, so the command
   just exits 0.
2. ``defer()`` (once the supervisor exists): a stop signal is only recorded; the supervisor picks
   it up with ``take_pending()`` when its event loop installs its own handlers.
3. ``install_on_loop(loop, on_stop, on_other, on_change)``: the event loop's handlers;
   ``restore(loop)`` hands back to recording handlers when the loop is done, with the signals
   blocked meanwhile (SIGTTIN and SIGTTOU are ignored from then on).
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
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

# Once the server is ready: SIGHUP reloads, SIGTTIN adds a replica, SIGTTOU removes one.
CHANGE_SIGNALS: tuple[signal.Signals, ...] = tuple(
    getattr(signal, name) for name in ("SIGHUP", "SIGTTIN", "SIGTTOU") if hasattr(signal, name)
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
    on_change: Callable[[str], None] | None = None,
) -> None:
    """Stage 3: ``on_stop(name)`` for each stop signal, ``on_other(name)`` (default: a warning)
    for the other would-be-fatal signals, run by ``loop``; with ``on_change``, SIGHUP, SIGTTIN
    and SIGTTOU go to ``on_change(name)`` instead (it decides whether a SIGHUP stops)."""
    remember_terminal()
    for sig in STOP_SIGNALS:
        handler = on_change if on_change is not None and sig in CHANGE_SIGNALS else on_stop
        loop.add_signal_handler(sig, handler, name(sig))
    if on_change is not None:
        for sig in CHANGE_SIGNALS:
            if sig not in STOP_SIGNALS:
                loop.add_signal_handler(sig, on_change, name(sig))
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
    sigs = {*STOP_SIGNALS, *CHANGE_SIGNALS, *other_fatal_signals()}
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
        for sig in CHANGE_SIGNALS:
            if sig not in STOP_SIGNALS:
                signal.signal(sig, signal.SIG_IGN)
    finally:
        if blocked is not None:
            signal.pthread_sigmask(signal.SIG_SETMASK, blocked)


# -- the terminal: a SIGHUP it sends, and the SIGTTOU it sends ----------------------------------
_terminal_fds: list[int] = []  # this process's fds 0-2 that were a terminal when it started
_had_tty = False  # it had a controlling terminal then


def remember_terminal() -> None:
    """Note which of fds 0, 1 and 2 are a terminal, and whether there is a controlling
    terminal, so that ``terminal_hung_up`` can tell later whether it went away."""
    global _had_tty
    _terminal_fds[:] = [fd for fd in (0, 1, 2) if _isatty(fd)]
    _had_tty = _controlling_terminal() is not None


def terminal_hung_up() -> bool:
    """Whether the terminal this launcher started in went away (a closed terminal window or ssh
    session: the kernel hangs the terminal up and sends SIGHUP), as opposed to a SIGHUP sent on
    purpose (``kill -HUP``, systemd's reload) while the terminal, if any, is still there. A
    hung-up terminal answers every request with EIO, and the session loses it."""
    for fd in _terminal_fds:
        if _hung_up(fd):
            return True
    if _had_tty:
        tty = _controlling_terminal()
        if tty is None:
            return True
        try:
            return _hung_up(tty)
        finally:
            os.close(tty)
    return False


def silence_terminal() -> None:
    """Point this process's fds 0-2 that were the hung-up terminal at /dev/null, so that the
    stop's last lines (and the interpreter's final flush) do not fail on it."""
    devnull = os.open(os.devnull, os.O_RDWR)
    try:
        for fd in _terminal_fds:
            if _hung_up(fd):
                with contextlib.suppress(OSError):
                    os.dup2(devnull, fd)
    finally:
        os.close(devnull)


def terminal_sends_sigttou() -> bool:
    """Whether the terminal itself may send this process SIGTTOU: it runs in the background
    of its controlling terminal with ``stty tostop`` set, so each write to the terminal raises
    SIGTTOU (and is retried after the handler, which would never end unless it is ignored)."""
    fd = _controlling_terminal()
    if fd is None:
        return False
    try:
        import termios

        background = os.tcgetpgrp(fd) != os.getpgrp()
        return background and bool(termios.tcgetattr(fd)[3] & termios.TOSTOP)
    except (OSError, ImportError):
        return False
    finally:
        os.close(fd)


def _isatty(fd: int) -> bool:
    try:
        return os.isatty(fd)
    except OSError:
        return False


def _hung_up(fd: int) -> bool:
    try:
        import termios
    except ImportError:  # not a POSIX system: no terminal to tell apart
        return False
    try:
        termios.tcgetattr(fd)
    except termios.error as exc:
        return bool(exc.args) and exc.args[0] in (errno.EIO, errno.ENXIO)
    except OSError as exc:
        return exc.errno in (errno.EIO, errno.ENXIO)
    return False


def _controlling_terminal() -> int | None:
    """An fd of the controlling terminal, or None when there is none (any more)."""
    try:
        return os.open("/dev/tty", os.O_RDWR | os.O_NOCTTY | os.O_NONBLOCK)
    except OSError:
        return None
