"""One scheduler replica as the HTTP child sees it (``pool.ReplicaPool`` keeps them), the errors a
request through it ends with, and how the address of a replica on another node is learned."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import Any

log = logging.getLogger("sglang_launch.http")


class ReplicaGone:
    """Delivered to a request in flight on a replica that died: repeat it elsewhere, or fail."""

    def __init__(self, message: str) -> None:
        self.message = message


class SchedulerError(Exception):
    """A request could not be answered: ``status``, ``message`` and ``param`` (the request field
    to change, in the scheduler's terms: ``input``, ``input[i]``, ``max_new_tokens``, ``model``)
    go to the client."""

    def __init__(
        self, status: int, message: str, param: str | None = None, retry_after: int | None = None
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.retry_after = retry_after  # seconds, for a Retry-After header


# Where the replies to one request go (a request's own queue or future).
Deliver = Callable[[object], None]


class Replica:
    """One scheduler replica as the HTTP child sees it. ``serving``: requests are routed to it (a
    replica a change adds serves once it answered its probe); ``draining``: it takes no new
    request and is forgotten once it holds none (``emptied`` is then done). ``inflight``: the
    requests it holds, each with where its replies go. ``kind`` and ``model``: what it said it
    serves in its last ``Pong`` (None until it answered one)."""

    def __init__(self, dp_rank: int, endpoint: str | None, serving: bool = True) -> None:
        self.dp_rank = dp_rank
        self.endpoint = endpoint
        self.serving = serving
        self.draining = False
        self.emptied: asyncio.Future[None] | None = None  # set while it drains
        self.sock: Any = None  # the asyncio socket (its monitor is awaited)
        self.io: Any = None  # a plain shadow of it: requests are sent and replies read through this
        self.inflight: dict[str, Deliver] = {}
        self.kind: str | None = None
        self.model: str | None = None
        self.connected = False
        self.watcher: asyncio.Task[None] | None = None  # its socket monitor
        self.dead_reason: str | None = None
        self.unreachable: str | None = None  # why its address could not be learned
        # time.monotonic() of its last progress: an answer that carries the model's work (a
        # token, an embedding, an image or a denoising step), never one to a ping or a flush.
        self.last_progress = float("-inf")
        self.progress_waiters: list[asyncio.Future[None]] = []  # told at its next progress

    def progressed(self) -> None:
        """It answered with the model's work just now: note when, and wake who waits for it."""
        self.last_progress = time.monotonic()
        waiters, self.progress_waiters = self.progress_waiters, []
        for waiter in waiters:
            if not waiter.done():
                waiter.set_result(None)

    @property
    def live(self) -> bool:
        """Requests may go to it: it serves, is not dead, and has a connection."""
        return self.serving and not self.dead_reason and self.io is not None

    def may_serve(self, kind: str | None) -> bool:
        """It serves requests of ``kind`` (None: any request), or has not said what it serves."""
        return kind is None or self.kind is None or self.kind == kind

    @property
    def where(self) -> str:
        return self.endpoint or "address not announced yet"


def poll_addresses(
    loop: asyncio.AbstractEventLoop,
    resolve: Callable[[int], str | None],
    pending: list[Replica],
    connect: Callable[[Replica, str], None],
    closing: Callable[[], bool],
) -> None:
    """Poll ``resolve(dp)`` for each replica in ``pending`` (they have no address yet) until
    all are known, and ``connect`` each on ``loop`` once its address is (a thread of its own).
    A ``resolve`` that raises makes them all ``unreachable``, with why."""

    def deliver(fn: Callable[..., object], *args: object) -> bool:
        try:
            loop.call_soon_threadsafe(fn, *args)
            return True
        except RuntimeError:  # the loop is closed: the server is gone
            return False

    while pending and not closing():
        for rep in list(pending):
            try:
                endpoint = resolve(rep.dp_rank)
            except Exception as exc:  # noqa: BLE001 - reported through /ready and start-up
                reason = f"{type(exc).__name__}: {exc}"
                for r in pending:
                    deliver(setattr, r, "unreachable", reason)
                log.error(
                    "cannot learn the address of scheduler(s) dp=%s: %s",
                    [r.dp_rank for r in pending],
                    reason,
                )
                return
            if endpoint:
                pending.remove(rep)
                if not deliver(connect, rep, endpoint):
                    return
        if pending:
            time.sleep(0.2)
