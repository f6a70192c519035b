"""Pipeline calls that take turns on one device, a denoising step at a time.

``SteppedCall(run)`` runs ``run(step)`` in a thread of its own, which holds the turn only while
the caller's ``advance()`` waits for it: ``run`` calls ``step(done, total)`` after each of its
steps, which hands the turn back to the caller and returns when the caller next calls
``advance()``. So several calls can be under way at once while exactly one thread computes at any
moment, and the caller (the scheduler's loop, the one thread that touches its sockets) decides
between two steps which call goes on. ``step`` returns the ``stop`` the caller passed to that
``advance``: True asks ``run`` to end at this step (the runner raises ``DenoiseStopped``).

A ``run`` that never calls ``step`` (a replaced pipeline call) runs to its end in one turn.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Generic, TypeVar

T = TypeVar("T")

# After each denoising step: ``(done, total)``, the steps finished so far and the steps of the
# call; the return value True ends the call at this step.
StepCallback = Callable[[int, int], bool]


class DenoiseStopped(Exception):
    """A pipeline call ended at a step because its step callback asked it to (every request of
    the call was cancelled): it has no images."""


class SteppedCall(Generic[T]):
    """``run(step)`` in a thread of its own that runs only inside ``advance()``.

    After ``advance()`` returns, ``done``/``total`` are the steps reached so far, and once
    ``finished`` is true either ``result`` is ``run``'s value or ``error`` the exception it
    raised (``DenoiseStopped`` after a stop)."""

    def __init__(self, run: Callable[[StepCallback], T], name: str) -> None:
        self._run = run
        self._name = name
        self._thread: threading.Thread | None = None
        self._resume = threading.Semaphore(0)
        self._paused = threading.Semaphore(0)
        self._stop = False
        self.done = 0
        self.total = 0
        self.finished = False
        self.result: T | None = None
        self.error: BaseException | None = None

    @property
    def started(self) -> bool:
        return self._thread is not None

    def advance(self, stop: bool = False) -> bool:
        """Let the call run to its next step, or to its end; True once it has ended. With
        ``stop``, a call that is under way ends at the step it is paused at."""
        if self.finished:
            return True
        self._stop = stop
        if self._thread is None:
            if stop:  # never started: nothing to end
                self.finished, self.error = True, DenoiseStopped("stopped before its first step")
                return True
            self._thread = threading.Thread(target=self._main, name=self._name, daemon=True)
            self._thread.start()
        else:
            self._resume.release()
        self._paused.acquire()
        return self.finished

    def _step(self, done: int, total: int) -> bool:
        self.done, self.total = done, total
        self._paused.release()
        self._resume.acquire()
        return self._stop

    def _main(self) -> None:
        try:
            self.result = self._run(self._step)
        except BaseException as exc:  # noqa: BLE001 - handed to the caller of advance()
            self.error = exc
        finally:
            self.finished = True
            self._paused.release()
