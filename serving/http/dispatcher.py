"""How the HTTP child's requests reach the schedulers and their answers come back.

``Dispatcher.one(make)`` sends ``make(rid)`` to the replica the ``pool.ReplicaPool`` chooses for
the request's kind (``wire`` requests carry it: ``EmbedRequest.kind``) and returns the final
answer; ``call(make)`` yields every answer of a streamed request. Answers come back by ``rid``: the
pool's reader hands each one to the request it answers.

A request in flight on a replica that dies is sent once more to a live replica when nothing of
its answer was delivered yet (every request but a stream that has produced output), else it
fails with 503. A request finding no replica of its kind while a reload or a scale may bring one
waits up to ``wait_s``, then gets a 503 with ``Retry-After``; one whose kind no replica serves and
none is coming is a 400 naming both kinds. ``end_all`` answers everything in flight at the end
of the drain. ``ping`` is how the HTTP child learns what a replica serves (its ``Pong``).
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import os
from collections.abc import AsyncGenerator, Callable
from typing import Any

import msgspec
import zmq

from serving import wire
from serving.http.pool import RETRY_AFTER_S, ReplicaPool
from serving.http.replica import Deliver, Replica, ReplicaGone, SchedulerError

# Builds the request for a fresh request id.
MakeRequest = Callable[[str], msgspec.Struct]

log = logging.getLogger("sglang_launch.http")


class Dispatcher:
    """Sends requests to the replicas of ``pool`` and delivers their answers, on the HTTP child's
    event loop. ``wait_s``: how long a request waits for a replica of its kind while a change may
    bring one."""

    def __init__(self, pool: ReplicaPool, wait_s: float = 60.0) -> None:
        self.pool = pool
        self.wait_s = wait_s
        self._ended: str | None = None  # why no more requests are taken (end_all)
        self._ids = itertools.count()
        self._prefix = f"{os.getpid():x}-"

    def new_rid(self) -> str:
        return f"{self._prefix}{next(self._ids)}"

    # ---- requests --------------------------------------------------------------------------

    async def call(
        self, make: MakeRequest, rep: Replica | None = None
    ) -> AsyncGenerator[Any, None]:
        """Send ``make(rid)`` and yield every message answering it until a final one.

        Raises ``SchedulerError`` for a ``RequestFailed`` answer. A replica that dies before the
        first message is yielded gets the request once more on another replica (unless ``rep``
        was given); after that, its death is a 503. Leaving the iteration early (the client
        went away) sends ``Cancel``."""
        for attempt in range(1 if rep is not None else 2):
            queue: asyncio.Queue[object] = asyncio.Queue()
            rid, used = await self._open(make, rep, queue.put_nowait)
            finished = yielded = False
            try:
                while True:
                    reply = await queue.get()
                    if isinstance(reply, ReplicaGone):
                        finished = True
                        if yielded or attempt or rep is not None:
                            raise SchedulerError(503, reply.message)
                        log.warning("%s: sending request %s to another replica", reply.message, rid)
                        break
                    if isinstance(reply, wire.RequestFailed):
                        finished = True
                        raise SchedulerError(reply.status, reply.message, reply.param)
                    done = getattr(reply, "finished", True)
                    finished, yielded = done, True
                    yield reply
                    if done:
                        return
            finally:
                self._close(rid, used, finished)

    async def one(self, make: MakeRequest, rep: Replica | None = None) -> Any:
        """The single final answer to ``make(rid)`` (a request that is not streamed). Raises
        ``SchedulerError`` for a ``RequestFailed`` answer; a replica that dies first gets the
        request once more on another replica (unless ``rep`` was given), else it is a 503.
        Cancelling the wait sends ``Cancel``."""
        for attempt in range(1 if rep is not None else 2):
            answer = asyncio.get_running_loop().create_future()

            def deliver(reply: object, answer: asyncio.Future[object] = answer) -> None:
                if not answer.done():
                    answer.set_result(reply)

            rid, used = await self._open(make, rep, deliver)
            try:
                reply = await answer
            finally:  # a cancelled wait cancels ``answer`` too: only a result means it finished
                self._close(rid, used, finished=answer.done() and not answer.cancelled())
            if isinstance(reply, ReplicaGone):
                if attempt or rep is not None:
                    raise SchedulerError(503, reply.message)
                log.warning("%s: sending request %s to another replica", reply.message, rid)
                continue
            if isinstance(reply, wire.RequestFailed):
                raise SchedulerError(reply.status, reply.message, reply.param)
            return reply
        raise AssertionError("unreachable: the last attempt returns or raises")

    async def _open(
        self, make: MakeRequest, rep: Replica | None, deliver: Deliver
    ) -> tuple[str, Replica]:
        """Send ``make(rid)`` to ``rep``, or to the replica chosen for its kind; its replies go to
        ``deliver`` until ``_close(rid)``."""
        rid = self.new_rid()
        msg = make(rid)
        if rep is None:
            rep = await self._replica_for(getattr(msg, "kind", None))
        if hasattr(msg, "inflight"):
            msg.inflight = len(rep.inflight) + 1
        try:
            frame = wire.encode(msg)
        except (
            msgspec.EncodeError,
            OverflowError,
            UnicodeEncodeError,
            TypeError,
            ValueError,
        ) as exc:
            raise SchedulerError(
                400,
                f"the request cannot be encoded: {exc}; send plain UTF-8 text "
                f"and integers within 64 bits",
            ) from None
        self.pool.admit(rep, rid, deliver)
        try:
            self._send(rep, frame)
        except BaseException:
            self._close(rid, rep, finished=True)
            raise
        return rid, rep

    async def _replica_for(self, kind: str | None) -> Replica:
        """The replica a request of ``kind`` goes to; while a reload or a scale may bring one
        that serves it, wait for it (``wait_s`` at most, then a 503 with ``Retry-After``)."""
        pool = self.pool
        deadline: float | None = None
        while True:
            if self._ended:
                raise SchedulerError(503, self._ended)
            rep = None if pool.server_failure else pool.choose(kind)
            if rep is not None:
                return rep
            if not pool.coming(kind):
                raise pool.refusal(kind)
            loop = asyncio.get_running_loop()
            if deadline is None:
                deadline = loop.time() + self.wait_s
            remaining = deadline - loop.time()
            if remaining <= 0:
                raise SchedulerError(
                    503,
                    f"no scheduler replica serves {kind or 'requests'} while a reload replaces "
                    f"it (waited {self.wait_s:g}s); retry shortly",
                    retry_after=RETRY_AFTER_S,
                )
            await pool.changed(remaining)

    def _close(self, rid: str, rep: Replica, finished: bool) -> None:
        """Stop delivering ``rid``; one that did not finish is cancelled at the scheduler."""
        self.pool.release(rep, rid)
        if not finished:
            self._cancel(rep, rid)

    def _cancel(self, rep: Replica, rid: str) -> None:
        if rep.io is not None and not rep.dead_reason:
            try:
                self._send(rep, wire.encode(wire.Cancel(rid)))
            except Exception:  # noqa: BLE001 - best effort: the scheduler drops answers nobody awaits
                pass

    def _send(self, rep: Replica, frame: bytes) -> None:
        try:
            rep.io.send(frame, zmq.NOBLOCK)
        except zmq.Again:
            raise SchedulerError(
                503,
                f"scheduler dp={rep.dp_rank} has too many requests queued "
                f"({rep.io.getsockopt(zmq.SNDHWM)}); retry shortly",
            ) from None
        # The socket's descriptor signals edges, and a send can take in a waiting reply's edge
        # on the way: read what is there on the next turn of the loop.
        if rep.io.getsockopt(zmq.EVENTS) & zmq.POLLIN:
            asyncio.get_running_loop().call_soon(self.pool.read, rep)

    def end_all(self, message: str) -> int:
        """Answer every request in flight with a 503 ``message`` (a stream: its error event),
        cancel each at its scheduler, and refuse new ones with it; how many there were."""
        self._ended = message
        count = 0
        for rep in list(self.pool.replicas):
            for rid, deliver in list(rep.inflight.items()):
                self._cancel(rep, rid)
                deliver(wire.RequestFailed(rid, 503, message))
                count += 1
        return count

    # ---- pings: who a replica is and what it serves ----------------------------------------

    async def pong(self, rep: Replica, timeout: float) -> wire.Pong:
        """``rep``'s answer to a ping, which also tells the pool what the replica serves;
        ``SchedulerError`` when it cannot answer, ``TimeoutError`` after ``timeout``."""
        pong: wire.Pong = await asyncio.wait_for(self.one(wire.Ping, rep), timeout)
        self.pool.describe(rep, pong.kind, pong.model)
        return pong

    async def ping(self, rep: Replica, timeout: float = 1.0) -> wire.Pong | None:
        """``pong(rep, timeout)``, or None when it did not answer."""
        if rep.dead_reason or rep.io is None:
            return None
        try:
            return await self.pong(rep, timeout)
        except (TimeoutError, SchedulerError):
            return None

    async def ping_serving(self, timeout: float = 1.0) -> list[tuple[Replica, wire.Pong | None]]:
        """Each serving replica with its ``Pong`` (None: it did not answer within ``timeout``)."""
        serving = [r for r in self.pool.replicas if r.serving]
        pongs = await asyncio.gather(*(self.ping(r, timeout) for r in serving))
        return list(zip(serving, pongs, strict=True))

    async def ping_all(self, timeout: float = 1.0) -> list[wire.Pong | None]:
        """Each replica's ``Pong`` (None for one that did not answer within ``timeout``), in the
        order of the pool's replicas."""
        return list(await asyncio.gather(*(self.ping(r, timeout) for r in self.pool.replicas)))
