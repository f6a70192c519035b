"""The watchdog: a worker that stops sending heartbeats after it was ready is hung.

Every bootstrap child sends a heartbeat every ``heartbeat_interval(timeout)`` seconds from a
thread of its own (``bootstrap.reporter.Heartbeat``). A process that cannot run that thread any
more (stopped with SIGSTOP or by a debugger, frozen in the kernel, stuck in native code that holds
the GIL) goes quiet; once a ready worker has been quiet for ``timeout`` seconds the watchdog
calls ``on_hung(name, quiet_seconds)`` once for it. Start-up is left to ``--startup-timeout``:
loading a model may hold a process busy longer than any heartbeat period.
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

    def __init__(self, timeout: float, on_hung: Callable[[str, float], None]) -> None:
        self.timeout = timeout
        self._on_hung = on_hung
        self._last: dict[str, float] = {}
        self._watched: set[str] = set()
        self._reported: set[str] = set()

    def heard(self, name: str) -> None:
        """Any message from worker ``name`` counts as a sign of life."""
        self._last[name] = time.monotonic()

    def watch(self, name: str) -> None:
        """Start watching ``name`` (call when it is ready, again after a restart): it must be
        heard every ``timeout`` s."""
        self._last[name] = time.monotonic()
        self._watched.add(name)
        self._reported.discard(name)

    def forget(self, name: str) -> None:
        """Stop watching ``name`` (it exited, or is being stopped)."""
        self._watched.discard(name)

    async def run(self) -> None:
        """Check every ``timeout / 4`` seconds until cancelled."""
        if self.timeout <= 0:
            return
        while True:
            await asyncio.sleep(self.timeout / 4)
            now = time.monotonic()
            for name in sorted(self._watched - self._reported):
                quiet = now - self._last.get(name, now)
                if quiet > self.timeout:
                    self._reported.add(name)
                    self._on_hung(name, quiet)
