"""The child's end of the status wire: a ZeroMQ PUSH socket to the supervisor.

``Reporter`` imports zmq and ``bootstrap.messages`` (msgspec) when it is created, inside
``bootstrap.run``, never at import time. Sends are serialized by a re-entrant lock, because the
worker may report from its own threads and a signal handler may interrupt a send in progress.
``close()`` waits up to ``linger`` seconds for queued messages to reach the supervisor, so a
``failed`` report is delivered before the process exits.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable


class Reporter:
    """Sends ``bootstrap.messages`` for one worker id to ``endpoint``."""

    def __init__(self, endpoint: str, worker: str, *, linger: float = 5.0) -> None:
        import zmq

        from bootstrap import messages

        self._messages = messages
        self.worker = worker
        self.pid = os.getpid()
        self._lock = threading.RLock()
        self._linger_ms = int(linger * 1000)
        self._context = zmq.Context(1)
        self._socket = self._context.socket(zmq.PUSH)
        self._socket.setsockopt(zmq.LINGER, self._linger_ms)
        # deliver() sends zero-copy however small, so its tracker is done when libzmq let go.
        self._socket.copy_threshold = 0
        self._socket.connect(endpoint)
        self._closed = False

    def send(self, kind: str, **fields: object) -> None:
        """Send one message of ``kind`` (a ``bootstrap.messages`` Struct name, e.g. ``"Phase"``)."""
        message = getattr(self._messages, kind)(worker=self.worker, pid=self.pid, **fields)
        data = self._messages.encode(message)
        with self._lock:
            if not self._closed:
                self._socket.send(data, copy=True)

    def deliver(self, kind: str, timeout: float = 5.0, **fields: object) -> None:
        """``send``, and return only once ZeroMQ is done with the message, which it then has
        written out to the supervisor's socket (``timeout`` seconds at most): a process that
        dies the next instant does not take the message with it."""
        import zmq

        message = getattr(self._messages, kind)(worker=self.worker, pid=self.pid, **fields)
        data = self._messages.encode(message)
        with self._lock:
            if self._closed:
                return
            tracker = self._socket.send(data, copy=False, track=True)
        if tracker is not None:
            try:
                tracker.wait(timeout)
            except zmq.NotDone:
                pass  # the supervisor is not reading: nothing to wait for

    def close(self) -> None:
        """Flush what is queued (up to the linger time) and release the socket."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self._socket.close(linger=self._linger_ms)
            self._context.term()


class Heartbeat:
    """A daemon thread sending a heartbeat with the current phase every ``interval`` seconds,
    and ``busy()``: how long the worker's current unit of work has run (0: none runs)."""

    def __init__(
        self,
        reporter: Reporter,
        interval: float,
        phase: Callable[[], str],
        started: float,
        busy: Callable[[], float] = lambda: 0.0,
    ) -> None:
        self._stop = threading.Event()
        self._thread = threading.Thread(
            target=self._beat,
            args=(reporter, interval, phase, started, busy),
            name="bootstrap-heartbeat",
            daemon=True,
        )
        self._thread.start()

    def _beat(
        self,
        reporter: Reporter,
        interval: float,
        phase: Callable[[], str],
        started: float,
        busy: Callable[[], float],
    ) -> None:
        while not self._stop.wait(interval):
            try:
                reporter.send(
                    "Heartbeat",
                    phase=phase(),
                    elapsed=time.monotonic() - started,
                    busy_s=busy(),
                )
            except Exception:  # noqa: BLE001 - a closed socket at exit ends the beat, nothing more
                return

    def stop(self) -> None:
        self._stop.set()
