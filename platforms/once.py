"""``ProcessOnce``: run an activation phase at most once per process.

The contract of every activation phase (backend initialization here; plugin registration and
hook application in ``hooks``): the first caller runs it behind a lock; a re-entrant call from
the same thread (a callback calling back in) returns at once and lets the outer call finish;
another thread waits for the outcome; a failure is terminal and re-raised to every later caller;
a child made by ``fork`` starts over (it is a new process whose phase has not run).
"""

from __future__ import annotations

import os
import threading
import weakref
from collections.abc import Callable
from typing import Any

_PENDING, _RUNNING, _DONE, _FAILED = "pending", "running", "done", "failed"

_instances: weakref.WeakSet[ProcessOnce] = weakref.WeakSet()


class ProcessOnce:
    """One once-per-process phase called ``name``."""

    def __init__(self, name: str) -> None:
        self.name = name
        self._reset()
        _instances.add(self)

    def _reset(self) -> None:
        self._cond = threading.Condition(threading.Lock())
        self._state = _PENDING
        self._owner: int | None = None
        self._error: BaseException | None = None

    @property
    def done(self) -> bool:
        """True once the phase has completed successfully in this process."""
        return self._state == _DONE

    def run(self, fn: Callable[..., object], *args: Any, **kwargs: Any) -> bool:
        """Run ``fn(*args, **kwargs)`` unless this phase already ran; True if this call ran it.

        Raises the phase's original exception if it failed, now or in an earlier call.
        """
        me = threading.get_ident()
        with self._cond:
            while self._state == _RUNNING:
                if self._owner == me:
                    return False  # re-entrant: the outer call finishes the phase
                self._cond.wait()
            if self._state == _DONE:
                return False
            if self._state == _FAILED:
                raise self._error  # type: ignore[misc]
            self._state, self._owner = _RUNNING, me
        try:
            fn(*args, **kwargs)
        except BaseException as exc:
            with self._cond:
                self._state, self._error, self._owner = _FAILED, exc, None
                self._cond.notify_all()
            raise
        with self._cond:
            self._state, self._owner = _DONE, None
            self._cond.notify_all()
        return True


def _after_fork_in_child() -> None:
    for once in list(_instances):
        once._reset()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)
