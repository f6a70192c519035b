"""The watchdog: a worker that stops sending heartbeats after it was ready is hung, and so is one
whose step runs too long.

Every bootstrap child sends a heartbeat every ``heartbeat_interval(timeout)`` seconds from a
thread of its own (``bootstrap.reporter.Heartbeat``). A process that cannot run that thread any
more (stopped with SIGSTOP or by a debugger, frozen in the kernel, stuck in native code that holds
the GIL) goes quiet; once a ready worker has been quiet for ``timeout`` seconds the watchdog
calls ``on_hung(name, quiet_seconds)`` once for it. Start-up is left to ``--startup-timeout``:
loading a model may hold a process busy longer than any heartbeat period.

A heartbeat also says how long the worker's current unit of work has run (``busy_s``: a
scheduler's step, from ``ctx.busy_since``). The heartbeat thread keeps beating while the main
thread is stuck in Python code (a plugin's hook waiting for ever, a step in a loop), so a quiet
heartbeat cannot see that: once a ready worker's step has run for more than ``timeout`` seconds
the watchdog calls ``on_stuck(name, step_seconds)`` once for it (SGLang's watchdog acts on a
batch that runs past ``--watchdog-timeout`` the same way).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable


def heartbeat_interval(timeout: float) -> float:
    """Seconds between a worker's heartbeats for a watchdog ``timeout`` (0: no heartbeats)."""
    if timeout <= 0:
        return 0.0
    return max(0.05, min(1.0, timeout / 5))


class Watchdog:
    """Tracks when each worker was last heard from; ``run()`` reports the ones gone quiet."""

    def __init__(
        self,
        timeout: float,
        on_hung: Callable[[str, float], None],
        on_stuck: Callable[[str, float], None] | None = None,
    ) -> None:
        self.timeout = timeout
        self._on_hung = on_hung
        self._on_stuck = on_stuck or on_hung
        self._last: dict[str, float] = {}
        self._busy_since: dict[str, float] = {}  # when each worker's current step began
        self._watched: set[str] = set()
        self._reported: set[str] = set()

    def heard(self, name: str) -> None:
        """Any message from worker ``name`` counts as a sign of life."""
        self._last[name] = time.monotonic()

    def busy(self, name: str, seconds: float) -> None:
        """Worker ``name``'s heartbeat says its current step has run ``seconds`` (0: none runs)."""
        if seconds > 0:
            self._busy_since[name] = time.monotonic() - seconds
        else:
            self._busy_since.pop(name, None)

    def watch(self, name: str) -> None:
        """Start watching ``name`` (call when it is ready, again after a restart): it must be
        heard every ``timeout`` s."""
        self._last[name] = time.monotonic()
        self._busy_since.pop(name, None)
        self._watched.add(name)
        self._reported.discard(name)

    def forget(self, name: str) -> None:
        """Stop watching ``name`` (it exited, or is being stopped)."""
        self._watched.discard(name)
        self._busy_since.pop(name, None)

    async def run(self) -> None:
        """Check every ``timeout / 4`` seconds until cancelled."""
        if self.timeout <= 0:
            return
        while True:
            await asyncio.sleep(self.timeout / 4)
            now = time.monotonic()
            for name in sorted(self._watched - self._reported):
                quiet = now - self._last.get(name, now)
                busy = now - self._busy_since.get(name, now)
                if quiet > self.timeout:
                    self._reported.add(name)
                    self._on_hung(name, quiet)
                elif busy > self.timeout:
                    self._reported.add(name)
                    self._on_stuck(name, busy)
