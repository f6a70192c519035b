"""The HTTP child's side of the scheduler sockets: routing, results, liveness, and the replicas
a reload or a scale adds and retires.

One DEALER socket per data-parallel replica connects to the scheduler's ROUTER. On one node both
sides compute the address from ``ctx.endpoint`` (no round trip); on several nodes a replica whose
rank 0 runs on another node announces its TCP address in the launch's store, and ``resolve`` (a
thread polls it) supplies it, after which the replica is connected like any other. A request
goes to the live, connected replica with the fewest unanswered requests; its results come back by
``rid`` to the waiting handler. Replies are read by a reader callback on the socket's file
descriptor, which hands each one straight to its request (no receiving task in between, so a
reply reaches its handler without an extra hop through the event loop).

Liveness has two sources, and a replica is dead as soon as either reports it gone:
- direct: a ZeroMQ socket monitor on each connection; a replica that was connected and
  disconnects has died (schedulers never close their socket while serving);
- the supervisor: its ops events (``serving.http.follow.SupervisorLink`` follows them).
A dead replica gets no new requests. Requests in flight on it are sent once more to a live replica
when nothing of their answer was delivered yet (every request but a stream that has produced
output), else they fail with 503. ``healthy`` turns false as soon as a serving replica is dead,
unless the launch ``heals`` (``--restart-policy on-failure``): then it stays true while one
replica lives, the dead ones are listed as ``restarting``, and ``replica.<dp>.ready`` from the
supervisor (all its ranks are ready again) connects a fresh socket to the restarted replica and
routes to it again.

Reloads and scales change the replicas while they serve: one that ``join``s gets no request
until it answered its probe (``SupervisorLink``), then ``serve``s; one that ``drain``s gets no new
request and is forgotten once those it holds have ended (streams included). A request finding no
replica serving during a change waits up to ``wait_s``, then gets a 503 with ``Retry-After``.
"""

from __future__ import annotations

import asyncio
import bisect
import itertools
import logging
import os
import threading
import time
from collections.abc import AsyncGenerator, Callable
from typing import TYPE_CHECKING, Any

import msgspec

from serving import wire as messages
from serving.http.follow import SupervisorLink
from serving.http.replica import Replica, ReplicaGone, SchedulerError, poll_addresses

__all__ = ["MakeRequest", "Replica", "SchedulerClient", "SchedulerError"]

if TYPE_CHECKING:
    import zmq.asyncio

    from serving.http.metrics import Metrics

# Builds the request for a fresh request id.
MakeRequest = Callable[[str], msgspec.Struct]

log = logging.getLogger("sglang_launch.http")

RETRY_AFTER_S = 5  # what a 503 says when no replica serves while a change is under way


class SchedulerClient:
    """Talks to every scheduler replica from the HTTP child's event loop.

    ``endpoints[i]`` is replica ``i``'s request address, or None when it is announced later:
    ``resolve(i)`` (blocking, run in a thread of its own) returns it once known, else None, and
    may raise when it can never be learned. ``ops_endpoint`` (optional) is the supervisor's PUB
    socket and ``query_endpoint`` its query socket (missed events are fetched there, reports go
    there: ``link``); ``tp_size`` maps a scheduler rank in an ops topic to its replica.
    ``heals``: the supervisor restarts a replica that dies (the launch goes on while one replica
    lives). ``endpoint_of(dp)`` is the address of a replica a change adds (one node only);
    ``probe_timeout_s`` bounds its probe; ``wait_s`` how long a request waits for a replica while
    none serves during a change.
    """

    def __init__(
        self,
        endpoints: list[str | None],
        ops_endpoint: str | None = None,
        tp_size: int = 1,
        metrics: Metrics | None = None,
        resolve: Callable[[int], str | None] | None = None,
        heals: bool = False,
        query_endpoint: str | None = None,
        endpoint_of: Callable[[int], str] | None = None,
        probe_timeout_s: float = 60.0,
        wait_s: float = 60.0,
    ) -> None:
        self.replicas = [Replica(i, ep) for i, ep in enumerate(endpoints)]
        self.on_drained: Callable[[int], None] | None = None  # a draining replica is empty
        self.link = SupervisorLink(self, ops_endpoint, query_endpoint)
        self.heals = heals
        self.resolve = resolve
        self.endpoint_of = endpoint_of
        self.probe_timeout_s = probe_timeout_s
        self.wait_s = wait_s
        self.loop: asyncio.AbstractEventLoop | None = None
        self._closing = False
        self.tp_size = max(tp_size, 1)
        self.metrics = metrics
        self.server_failure: str | None = None
        self._serving_changed = asyncio.Event()  # a replica began serving, or a change ended
        self._pending: dict[str, Callable[[object], None]] = {}  # rid -> deliver(reply)
        self._ended: str | None = None  # why no more requests are taken (end_all)
        self._owner: dict[str, Replica] = {}
        self._ids = itertools.count()
        self._prefix = f"{os.getpid():x}-"
        self._tasks: list[asyncio.Task[None]] = []
        self._zctx: zmq.asyncio.Context | None = None

    # ---- lifecycle -------------------------------------------------------------------------

    async def start(self) -> None:
        import zmq
        import zmq.asyncio

        self.loop = asyncio.get_running_loop()
        zctx = self._zctx = zmq.asyncio.Context()
        for rep in self.replicas:
            if rep.endpoint:
                self._connect(rep, rep.endpoint)
        pending = [r for r in self.replicas if not r.endpoint]
        if pending:
            if self.resolve is None:
                raise ValueError(
                    f"scheduler dp={[r.dp_rank for r in pending]} have no address and "
                    f"no resolver was given"
                )
            threading.Thread(
                target=poll_addresses,
                args=(self.loop, self.resolve, pending, self._connect, lambda: self._closing),
                name="resolve-schedulers",
                daemon=True,
            ).start()
        self._tasks.extend(self.link.start(zctx))

    def _connect(self, rep: Replica, endpoint: str) -> None:
        import zmq

        if self._closing or self._zctx is None or self.loop is None:
            return
        sock = self._zctx.socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        if endpoint.startswith("tcp://["):
            sock.setsockopt(zmq.IPV6, 1)
        monitor = sock.get_monitor_socket(zmq.EVENT_CONNECTED | zmq.EVENT_DISCONNECTED)
        sock.connect(endpoint)
        rep.endpoint, rep.sock, rep.io = endpoint, sock, zmq.Socket.shadow(sock.underlying)
        log.info("scheduler dp=%d at %s", rep.dp_rank, endpoint)
        self.loop.add_reader(rep.io.FD, self._drain, rep)
        rep.watcher = asyncio.create_task(self._watch(rep, monitor))
        self._tasks = [t for t in self._tasks if not t.done()]
        self._tasks.append(rep.watcher)

    def _disconnect(self, rep: Replica) -> None:
        """Close ``rep``'s socket and its monitor (the replica is dead, or the client closes)."""
        if rep.watcher is not None:
            rep.watcher.cancel()
            rep.watcher = None
        if rep.sock is not None:
            if self.loop is not None and rep.io is not None:
                self.loop.remove_reader(rep.io.FD)
            rep.io = None
            rep.sock.disable_monitor()
            rep.sock.close(0)
            rep.sock = None
        rep.connected = False

    def replica(self, dp_rank: int) -> Replica | None:
        """Replica ``dp_rank``, when the client knows it."""
        return next((r for r in self.replicas if r.dp_rank == dp_rank), None)

    def revive(self, rep: Replica) -> None:
        """``rep`` was restarted and is ready: a fresh connection, and requests go to it again."""
        if not rep.dead_reason or self._closing or rep.endpoint is None:
            return
        self._disconnect(rep)
        rep.dead_reason = None
        self._connect(rep, rep.endpoint)
        log.warning("scheduler dp=%d is back: routing to it again", rep.dp_rank)

    async def close(self) -> None:
        self._closing = True
        # Each monitor is stopped before its reader closes: libzmq's I/O thread sends monitor
        # events with a blocking send under the socket's monitor lock, so an event for a reader
        # that is already gone would stall that thread and, with it, disable_monitor() forever.
        for rep in self.replicas:
            self._disconnect(rep)
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks.clear()
        if self._zctx is not None:
            self._zctx.destroy(0)
            self._zctx = None

    # ---- health ----------------------------------------------------------------------------

    @property
    def healthy(self) -> bool:
        return self.unhealthy_reason is None

    @property
    def unhealthy_reason(self) -> str | None:
        """Why the server is not healthy: the supervisor reported failure or a stop, or a replica
        is dead (when the launch heals: every replica is dead); None when it is."""
        if self.server_failure:
            return self.server_failure
        dead = [
            f"scheduler dp={r.dp_rank}: {r.dead_reason}"
            for r in self.replicas
            if r.dead_reason and r.serving
        ]
        if self.heals and len(dead) < len([r for r in self.replicas if r.serving]):
            return None
        return "; ".join(dead) or None

    @property
    def restarting(self) -> list[int]:
        """The dp ranks of dead replicas the supervisor restarts (empty unless ``heals``)."""
        if not self.heals or self.server_failure:
            return []
        return [r.dp_rank for r in self.replicas if r.dead_reason and r.serving]

    def mark_dead(self, rep: Replica, reason: str) -> None:
        if rep.dead_reason:
            return
        rep.dead_reason = reason
        log.error("scheduler dp=%d is gone: %s", rep.dp_rank, reason)
        after = "it is restarting" if self.heals else "the server is shutting down"
        for rid in list(rep.inflight):
            deliver = self._pending.get(rid)
            if deliver is not None:
                deliver(ReplicaGone(f"scheduler dp={rep.dp_rank} is gone ({reason}); {after}"))
        if self.heals or not rep.serving:
            # Nothing more goes to the old process, and nothing queued reaches its successor.
            self._disconnect(rep)

    async def _watch(self, rep: Replica, monitor: zmq.asyncio.Socket) -> None:
        import zmq
        from zmq.utils.monitor import recv_monitor_message

        try:
            while True:
                event = await recv_monitor_message(monitor)
                if event["event"] == zmq.EVENT_CONNECTED:
                    rep.connected = True
                elif event["event"] == zmq.EVENT_DISCONNECTED and rep.connected:
                    self.mark_dead(rep, "its connection closed (the process exited)")
        except asyncio.CancelledError:
            raise
        except Exception:  # noqa: BLE001 - a monitor failure must not take the server down
            log.exception("socket monitor of scheduler dp=%d stopped", rep.dp_rank)
            if rep.sock is not None:  # no more events for a reader about to close (see close())
                rep.sock.disable_monitor()
        finally:
            monitor.close(0)

    # ---- replicas a reload or a scale adds and retires ------------------------------------

    def join(self, dp_rank: int) -> Replica | None:
        """Connect a replica a change started (ready, not yet serving: ``serve`` routes to it
        once it answered its probe); None when the client has no address for it."""
        self.forget(dp_rank)
        endpoint = self.endpoint_of(dp_rank) if self.endpoint_of is not None else None
        if endpoint is None or self._closing:
            return None
        rep = Replica(dp_rank, None, serving=False)
        bisect.insort(self.replicas, rep, key=lambda r: r.dp_rank)
        self._connect(rep, endpoint)
        return rep

    def serve(self, dp_rank: int) -> None:
        """Route to replica ``dp_rank`` (it passed its probe, or there was none)."""
        rep = self.replica(dp_rank)
        if rep is None and self.endpoint_of is not None and not self._closing:
            rep = Replica(dp_rank, None)
            bisect.insort(self.replicas, rep, key=lambda r: r.dp_rank)
            self._connect(rep, self.endpoint_of(dp_rank))
        if rep is not None and not rep.serving and not rep.draining and not rep.dead_reason:
            rep.serving = True
            log.info("scheduler dp=%d serves", dp_rank)
        self.wake_waiters()

    def drain(self, dp_rank: int, in_place: bool) -> None:
        """Route nothing more to replica ``dp_rank``; once it holds no request it is forgotten
        and ``on_drained(dp_rank)`` called. ``in_place``: its successor comes after it."""
        rep = self.replica(dp_rank)
        if rep is None:
            if self.on_drained is not None:
                self.on_drained(dp_rank)
            return
        rep.serving, rep.draining = False, True
        log.info(
            "scheduler dp=%d drains (%d request(s) in flight)%s",
            dp_rank,
            len(rep.inflight),
            "; requests wait for its successor" if in_place and not self._live() else "",
        )
        self._if_drained(rep)

    def forget(self, dp_rank: int) -> None:
        """Replica ``dp_rank`` is gone for good (retired, failed before it served, or dead after
        its restarts); a live serving one (a successor that took the same dp rank) stays."""
        rep = self.replica(dp_rank)
        if rep is None or (rep.serving and not rep.draining and not rep.dead_reason):
            return
        for rid in list(rep.inflight):
            deliver = self._pending.get(rid)
            if deliver is not None:
                deliver(ReplicaGone(f"scheduler dp={dp_rank} is gone"))
        self._remove(rep)

    def wake_waiters(self) -> None:
        """Requests waiting for a replica look again (one serves, or a change ended)."""
        self._serving_changed.set()

    def _if_drained(self, rep: Replica) -> None:
        if rep.draining and not rep.inflight and rep in self.replicas:
            self._remove(rep)
            if self.on_drained is not None:
                self.on_drained(rep.dp_rank)

    def _remove(self, rep: Replica) -> None:
        self._disconnect(rep)
        self.replicas.remove(rep)
        if self.metrics is not None:
            self.metrics.set_queue_depth(rep.dp_rank, 0)

    def _live(self) -> list[Replica]:
        return [r for r in self.replicas if r.serving and not r.dead_reason and r.io is not None]

    async def _until_one_serves(self) -> None:
        """While a change is under way and no replica serves, wait for one (``wait_s`` at
        most, then a 503 with ``Retry-After``)."""
        if self._live() or self.server_failure or not self.link.changing:
            return
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.wait_s
        while not self._live() and self.link.changing and not self.server_failure:
            remaining = deadline - loop.time()
            if remaining <= 0:
                raise SchedulerError(
                    503,
                    f"no scheduler replica serves while a reload replaces it (waited "
                    f"{self.wait_s:g}s); retry shortly",
                    retry_after=RETRY_AFTER_S,
                )
            self._serving_changed.clear()
            try:
                await asyncio.wait_for(self._serving_changed.wait(), remaining)
            except TimeoutError:
                pass

    # ---- requests --------------------------------------------------------------------------

    def new_rid(self) -> str:
        return f"{self._prefix}{next(self._ids)}"

    def end_all(self, message: str) -> int:
        """Answer every request in flight with a 503 ``message`` (a stream: its error event),
        cancel each at its scheduler, and refuse new ones with it; how many there were."""
        self._ended = message
        pending = list(self._pending.items())
        for rid, deliver in pending:
            self._cancel(self._owner[rid], rid)
            deliver(messages.RequestFailed(rid, 503, message))
        return len(pending)

    async def query(self, request: dict[str, object], timeout: float = 5.0) -> dict[str, Any]:
        """The supervisor's answer to ``request`` on its query socket (``{"query": "snapshot"}``,
        ``{"query": "events", "after": N}``); ``LookupError`` when there is none in time."""
        return await self.link.query(request, timeout)

    def pick(self) -> Replica:
        """The live replica with the fewest unanswered requests (ties: lowest dp rank)."""
        live = self._live()
        if self._ended:
            raise SchedulerError(503, self._ended)
        if not live or self.server_failure:
            if self.link.changing and not self.server_failure:
                raise SchedulerError(
                    503,
                    "no scheduler replica serves while a reload or a scale changes them; "
                    "retry shortly",
                    retry_after=RETRY_AFTER_S,
                )
            raise SchedulerError(
                503,
                self.unhealthy_reason
                or "no scheduler is reachable yet: "
                + self.unanswered_reason([r.dp_rank for r in self.replicas]),
            )
        return min(live, key=lambda r: (len(r.inflight), not r.connected, r.dp_rank))

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
            if rep is None:
                await self._until_one_serves()
            rid, used = self._open(make, rep, queue.put_nowait)
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
                    if isinstance(reply, messages.RequestFailed):
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

            if rep is None:
                await self._until_one_serves()
            rid, used = self._open(make, rep, deliver)
            try:
                reply = await answer
            finally:  # a cancelled wait cancels ``answer`` too: only a result means it finished
                self._close(rid, used, finished=answer.done() and not answer.cancelled())
            if isinstance(reply, ReplicaGone):
                if attempt or rep is not None:
                    raise SchedulerError(503, reply.message)
                log.warning("%s: sending request %s to another replica", reply.message, rid)
                continue
            if isinstance(reply, messages.RequestFailed):
                raise SchedulerError(reply.status, reply.message, reply.param)
            return reply
        raise AssertionError("unreachable: the last attempt returns or raises")

    def _open(
        self, make: MakeRequest, rep: Replica | None, deliver: Callable[[object], None]
    ) -> tuple[str, Replica]:
        """Pick a replica (unless given), send it ``make(rid)``; its replies go to ``deliver``
        until ``_close(rid)``."""
        rep = rep or self.pick()
        rid = self.new_rid()
        msg = make(rid)
        if hasattr(msg, "inflight"):
            msg.inflight = len(rep.inflight) + 1
        try:
            frame = messages.encode(msg)
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
        self._pending[rid] = deliver
        self._owner[rid] = rep
        rep.inflight.add(rid)
        self._depth(rep)
        try:
            self._send(rep, frame)
        except BaseException:
            self._close(rid, rep, finished=True)
            raise
        return rid, rep

    def _close(self, rid: str, rep: Replica, finished: bool) -> None:
        """Stop delivering ``rid``; one that did not finish is cancelled at the scheduler."""
        self._pending.pop(rid, None)
        self._owner.pop(rid, None)
        rep.inflight.discard(rid)
        self._depth(rep)
        if not finished:
            self._cancel(rep, rid)
        if rep.draining:
            self._if_drained(rep)

    def _cancel(self, rep: Replica, rid: str) -> None:
        if rep.io is not None and not rep.dead_reason:
            try:
                self._send(rep, messages.encode(messages.Cancel(rid)))
            except Exception:  # noqa: BLE001 - best effort: the scheduler drops answers nobody awaits
                pass

    def _send(self, rep: Replica, frame: bytes) -> None:
        import zmq

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
        if rep.io.getsockopt(zmq.EVENTS) & zmq.POLLIN and self.loop is not None:
            self.loop.call_soon(self._drain, rep)

    async def ping_serving(
        self, timeout: float = 1.0
    ) -> list[tuple[Replica, messages.Pong | None]]:
        """Each serving replica with its ``Pong`` (None: it did not answer within ``timeout``)."""
        serving = [r for r in self.replicas if r.serving]
        pongs = await self._ping(serving, timeout)
        return list(zip(serving, pongs, strict=True))

    async def ping_all(self, timeout: float = 1.0) -> list[messages.Pong | None]:
        """Each replica's ``Pong`` (None for one that did not answer within ``timeout``), in the
        order of ``replicas``."""
        return await self._ping(list(self.replicas), timeout)

    async def _ping(self, replicas: list[Replica], timeout: float) -> list[messages.Pong | None]:

        async def ping(rep: Replica) -> messages.Pong | None:
            if rep.dead_reason or rep.io is None:
                return None
            try:
                return await asyncio.wait_for(
                    self.one(lambda rid: messages.Ping(rid), rep), timeout
                )
            except (TimeoutError, SchedulerError):
                return None

        return list(await asyncio.gather(*(ping(r) for r in replicas)))

    def unanswered_reason(self, dp_ranks: list[int]) -> str:
        """Which replicas did not answer, and where they are (or why their address is unknown)."""
        parts = []
        for dp in dp_ranks:
            rep = self.replica(dp)
            where = "gone" if rep is None else rep.unreachable or rep.where
            parts.append(f"dp={dp} ({where})")
        return ", ".join(parts)

    def _drain(self, rep: Replica) -> None:
        """The reader callback of ``rep``'s socket: hand every waiting reply to its request."""
        import zmq

        io = rep.io
        if io is None or io.closed:
            return
        while True:
            try:
                frame = io.recv(zmq.NOBLOCK)
            except zmq.Again:
                return
            except zmq.ZMQError as exc:  # the socket is closing with the server
                log.debug("reading scheduler dp=%d stopped: %s", rep.dp_rank, exc)
                return
            try:
                reply = messages.decode_from_scheduler(frame)
            except msgspec.DecodeError as exc:
                log.warning("dropped an undecodable reply from dp=%d: %s", rep.dp_rank, exc)
                continue
            rep.last_reply = time.monotonic()
            deliver = self._pending.get(reply.rid)
            if deliver is not None:
                deliver(reply)

    def _depth(self, rep: Replica) -> None:
        if self.metrics is not None:
            self.metrics.set_queue_depth(rep.dp_rank, len(rep.inflight))
