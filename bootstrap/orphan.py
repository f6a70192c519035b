"""Orphan protection: a child must not outlive its supervisor, even a SIGKILLed one.

``arm(parent_pid)`` sets up two independent lines of defence:

1. Linux: ``prctl(PR_SET_PDEATHSIG, SIGKILL)``, so the kernel kills this process when its parent
   dies. The parent may already have died before the call, so the parent pid is checked right
   after it and the process exits at once (``EXIT_PARENT_GONE``) if it changed.
   Caveat (kernel semantics): the signal fires when the parent *thread* that forked this process
   ends, so a supervisor must spawn from a thread that lives as long as it does.
2. Everywhere: a daemon thread that watches the parent and SIGKILLs this process when it goes.
   It waits on a pidfd (Linux) or a kqueue process-exit event (macOS, BSD) without polling, and
   falls back to checking ``os.getppid()`` twice a second elsewhere.

Standard library only.
"""

from __future__ import annotations

import ctypes
import os
import select
import signal
import sys
import threading
import time

from bootstrap.phases import EXIT_PARENT_GONE

_PR_SET_PDEATHSIG = 1
_POLL_SECONDS = 0.5


def _die() -> None:
    # SIGKILL, the same end PDEATHSIG gives, so both lines look alike to anyone watching.
    os.kill(os.getpid(), getattr(signal, "SIGKILL", signal.SIGTERM))


def set_parent_death_signal() -> bool:
    """Ask the kernel to SIGKILL this process when its parent dies; False where unsupported."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0) != 0:
            return False
    except (OSError, AttributeError):
        return False
    return True


def _wait_pidfd(parent_pid: int) -> bool:
    """Block until ``parent_pid`` exits; False if a pidfd cannot be had."""
    if not hasattr(os, "pidfd_open"):
        return False
    try:
        fd = os.pidfd_open(parent_pid)
    except OSError:
        return False
    try:
        if os.getppid() != parent_pid:  # died (and maybe reused) before the pidfd was opened
            return True
        poller = select.poll()
        poller.register(fd, select.POLLIN)
        while not poller.poll():
            pass
        return True
    finally:
        os.close(fd)


def _wait_kqueue(parent_pid: int) -> bool:
    """Block until ``parent_pid`` exits (macOS, BSD); False if kqueue cannot watch it."""
    if sys.platform == "linux" or not hasattr(select, "kqueue"):
        return False
    try:
        kq = select.kqueue()
        event = select.kevent(
            parent_pid,
            filter=select.KQ_FILTER_PROC,
            flags=select.KQ_EV_ADD | select.KQ_EV_ONESHOT,
            fflags=select.KQ_NOTE_EXIT,
        )
        kq.control([event], 0, 0)
    except OSError:
        return False
    try:
        if os.getppid() != parent_pid:
            return True
        while not kq.control(None, 1, None):
            pass
        return True
    finally:
        kq.close()


def _wait_polling(parent_pid: int) -> bool:
    while os.getppid() == parent_pid:
        time.sleep(_POLL_SECONDS)
    return True


def _watch(parent_pid: int) -> None:
    for wait in (_wait_pidfd, _wait_kqueue, _wait_polling):
        if wait(parent_pid):
            _die()
            return


def watch_parent(parent_pid: int) -> threading.Thread:
    """Start the daemon thread that kills this process when ``parent_pid`` exits."""
    thread = threading.Thread(
        target=_watch, args=(parent_pid,), name="bootstrap-parent-watch", daemon=True
    )
    thread.start()
    return thread


def arm(parent_pid: int | None = None, *, death_signal: bool = True) -> dict[str, bool]:
    """Arm both lines of orphan protection for a process whose parent is ``parent_pid``.

    Exits the process at once with ``EXIT_PARENT_GONE`` when the parent is no longer
    ``parent_pid``. ``death_signal=False`` leaves out PR_SET_PDEATHSIG (tests of the watch thread).
    Returns which lines are armed.
    """
    expected = os.getppid() if parent_pid is None else parent_pid
    armed = {"death_signal": death_signal and set_parent_death_signal()}
    if os.getppid() != expected:
        os._exit(EXIT_PARENT_GONE)
    watch_parent(expected)
    armed["watch_thread"] = True
    return armed
