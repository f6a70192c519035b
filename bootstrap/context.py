"""``WorkerContext``: the small API a worker target is handed as ``target(server_args, ctx)``.

The worker uses it to learn who it is (role, ranks, world size), to compute the private IPC
addresses every process of one launch agrees on, to report its own phases and ``ready`` once, and
to notice a stop request (``ctx.stopping`` is set on SIGTERM; the worker decides how to wind down
and then returns).
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

# sockaddr_un.sun_path holds 108 bytes on Linux (104 on macOS), terminator included.
_MAX_IPC_PATH = 103


class StopEvent(threading.Event):
    """``ctx.stopping``: a ``threading.Event`` that a SIGTERM handler can raise without its lock.

    ``request()`` is one attribute store, safe in a signal handler (which runs on the main thread
    between two bytecodes, perhaps while that thread holds the event's lock inside ``wait()``);
    from then on ``is_set()`` and ``wait()`` answer True. A thread still calls ``set()`` to wake
    the threads blocked in ``wait()``: a main thread that polls ``wait(0)`` in a tight loop takes
    the lock so often that such a thread can wait for it indefinitely on a busy machine, and the
    request is seen on the next poll all the same."""

    def __init__(self) -> None:
        super().__init__()
        self.requested = False

    def request(self) -> None:
        self.requested = True

    def is_set(self) -> bool:
        return self.requested or super().is_set()

    def wait(self, timeout: float | None = None) -> bool:
        return True if self.requested else super().wait(timeout)


@dataclass
class WorkerContext:
    """Identity, addresses and reporting for one worker process.

    ``rank`` is the global rank; ``tp_rank = rank % tp_size`` and ``dp_rank = rank // tp_size``.
    ``endpoint(name)`` is ``"ipc://<runtime_dir>/<name>"``. ``phase(name)`` reports a custom
    phase with the time since the previous one; ``ready(**info)`` reports ready (once; ``info``
    must be JSON-able and lands in the supervisor's status snapshot). ``stopping`` is set when the
    supervisor asks the process to stop (SIGTERM); ``stopped(**info)`` says what the worker wants
    its ``stopped`` report to carry (JSON-able; the last call before it returns wins).
    ``busy_since`` is the ``time.monotonic()`` at which the worker's current unit of work began
    (a scheduler's step), None while none runs: the heartbeat reports how long it has run, and
    the supervisor's watchdog ends a worker whose unit of work runs past ``--watchdog-timeout``.
    ``report_failure(error)`` reports a failure while the worker keeps running.
    """

    role: str
    rank: int
    local_rank: int
    world_size: int
    tp_size: int
    dp_size: int
    runtime_dir: str
    ops_endpoint: str
    query_endpoint: str
    platform: str
    stopping: threading.Event = field(default_factory=StopEvent)
    busy_since: float | None = None
    _report: Callable[..., None] | None = field(default=None, repr=False)
    _report_failure: Callable[[BaseException], None] | None = field(default=None, repr=False)
    _ready: threading.Event = field(default_factory=threading.Event, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)
    _mark: float = field(default_factory=time.monotonic, repr=False)
    stop_info: dict[str, object] = field(default_factory=dict, repr=False)

    @property
    def worker_id(self) -> str:
        return f"{self.role}.{self.rank}"

    @property
    def tp_rank(self) -> int:
        return self.rank % max(self.tp_size, 1)

    @property
    def dp_rank(self) -> int:
        return self.rank // max(self.tp_size, 1)

    @property
    def is_ready(self) -> bool:
        return self._ready.is_set()

    def endpoint(self, name: str) -> str:
        """The private IPC address ``name`` of this launch, the same in every process of it."""
        if not name or "/" in name or name in (".", ".."):
            raise ValueError(
                f"endpoint name {name!r} must be a plain file name such as 'scheduler.0'"
            )
        if not self.runtime_dir:
            raise RuntimeError(
                "this worker has no runtime directory (ProcessSpec.runtime_dir is empty); "
                "the supervisor must create one and put it in the spec"
            )
        path = os.path.join(self.runtime_dir, name)
        if len(path.encode()) > _MAX_IPC_PATH:
            raise ValueError(
                f"IPC path {path!r} is {len(path.encode())} bytes, longer than the {_MAX_IPC_PATH} "
                "a Unix socket allows; use a shorter runtime directory (set TMPDIR or "
                "XDG_RUNTIME_DIR to a short path) or a shorter endpoint name"
            )
        return f"ipc://{path}"

    def phase(self, name: str) -> None:
        """Report that the worker reached its own phase ``name`` (e.g. ``"model_loaded"``)."""
        if not name or not isinstance(name, str):
            raise ValueError("a phase name must be a non-empty string")
        with self._lock:
            now = time.monotonic()
            duration, self._mark = now - self._mark, now
        if self._report is not None:
            self._report("phase", name, duration, None)

    def ready(self, **info: object) -> None:
        """Report that this worker is ready; ``info`` (JSON-able) goes into the status snapshot.

        Returns once the report has left this process, so a worker that dies right after it is
        still known to have been ready."""
        try:
            json.dumps(info)
        except (TypeError, ValueError) as exc:
            raise TypeError(f"ctx.ready() info must be JSON-able: {exc}") from None
        with self._lock:
            if self._ready.is_set():
                raise RuntimeError(
                    f"{self.worker_id} already reported ready; call ctx.ready() once"
                )
            self._ready.set()
            now = time.monotonic()
            duration, self._mark = now - self._mark, now
        if self._report is not None:
            self._report("ready", "ready", duration, info)

    def report_failure(self, error: BaseException) -> None:
        """Report ``error`` as this worker's failure while it goes on running: the supervisor
        handles it as a failure of this worker (it restarts the worker's replica, or stops the
        launch) and then stops or ends the process. The worker keeps answering what reaches it
        (refusing work it can no longer do) until ``stopping`` is set, and then returns."""
        if self._report_failure is not None:
            self._report_failure(error)

    def stopped(self, **info: object) -> None:
        """What the ``stopped`` report of this worker carries once it returns after a stop
        request (``info`` must be JSON-able)."""
        try:
            json.dumps(info)
        except (TypeError, ValueError) as exc:
            raise TypeError(f"ctx.stopped() info must be JSON-able: {exc}") from None
        self.stop_info = dict(info)
