"""The HTTP child's side of the scheduler sockets: routing, results, and liveness.

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
- the supervisor: its ops events (``launcher.events``) on its PUB socket (``ctx.ops_endpoint``):
  a scheduler rank's ``WORKER_GONE`` events (failed, stopped, exited), ``replica.<dp>.restarting``
  and ``server.failed`` / ``server.stopping``.
A dead replica gets no new requests. Requests in flight on it are sent once more to a live replica
when nothing of their answer was delivered yet (every request but a stream that has produced
output), else they fail with 503. ``healthy`` turns false as soon as a replica is dead, unless the
launch ``heals`` (``--restart-policy on-failure``): then it stays true while one replica lives, the
dead ones are listed as ``restarting``, and ``replica.<dp>.ready`` from the supervisor (all its
ranks are ready again) connects a fresh socket to the restarted replica and routes to it again.

A lost event must not keep a restarted replica out of routing: while a replica restarts, every
``CATCH_UP_S`` seconds the client asks the supervisor's query socket (``ctx.query_endpoint``) for
the events numbered above the last one it applied, and applies them in order. (The numbers skip
anyway between the topics it subscribes to, so a skip alone proves no loss.)
"""

from __future__ import annotations

import asyncio
import itertools
import json
import logging
import os
import threading
import time
from collections.abc import AsyncGenerator, Callable
from typing import TYPE_CHECKING, Any

import msgspec

from launcher import events as ops
from serving import wire as messages
from serving.http.replica import Replica

if TYPE_CHECKING:
    import zmq.asyncio

    from serving.http.metrics import Metrics

# Builds the request for a fresh request id.
MakeRequest = Callable[[str], msgspec.Struct]

log = logging.getLogger("sglang_launch.http")

OPS_TOPICS = ("worker.scheduler.", "server.", "replica.")  # the supervisor events the client uses


class _ReplicaGone:
    """Delivered to a request in flight on a replica that died: repeat it elsewhere, or fail."""

    def __init__(self, message: str) -> None:
        self.message = message


class SchedulerError(Exception):
    """A request could not be answered: ``status``, ``message`` and ``param`` (the request field
    to change, in the scheduler's terms: ``input``, ``input[i]``, ``max_new_tokens``, ``model``)
    go to the client."""

    def __init__(self, status: int, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param


class SchedulerClient:
    """Talks to every scheduler replica from the HTTP child's event loop.

    ``endpoints[i]`` is replica ``i``'s request address, or None when it is announced later:
    ``resolve(i)`` (blocking, run in a thread of its own) returns it once known, else None, and
    may raise when it can never be learned. ``ops_endpoint`` (optional) is the supervisor's PUB
    socket and ``query_endpoint`` its query socket (missed events are fetched there); ``tp_size``
    maps a scheduler rank in an ops topic to its replica. ``heals``: the supervisor restarts a
    replica that dies (the launch goes on while one replica lives).
    """

    CATCH_UP_S = 2.0  # while a replica restarts: how often to ask for events not seen

    def __init__(
        self,
        endpoints: list[str | None],
        ops_endpoint: str | None = None,
        tp_size: int = 1,
        metrics: Metrics | None = None,
        resolve: Callable[[int], str | None] | None = None,
        heals: bool = False,
        query_endpoint: str | None = None,
    ) -> None:
        self.replicas = [Replica(i, ep) for i, ep in enumerate(endpoints)]
        self.query_endpoint = query_endpoint or None
        self._ops_seq = 0  # the last supervisor event applied
        self.heals = heals
        self.resolve = resolve
        self.loop: asyncio.AbstractEventLoop | None = None
        self._closing = False
        self.ops_endpoint = ops_endpoint or None
        self.tp_size = max(tp_size, 1)
        self.metrics = metrics
        self.server_failure: str | None = None
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
                target=self._resolve_all, args=(pending,), name="resolve-schedulers", daemon=True
            ).start()
        if self.ops_endpoint:
            sub = zctx.socket(zmq.SUB)
            sub.setsockopt(zmq.LINGER, 0)
            for prefix in OPS_TOPICS:
                sub.setsockopt(zmq.SUBSCRIBE, prefix.encode())
            sub.connect(self.ops_endpoint)
            self._tasks.append(asyncio.create_task(self._follow_ops(sub)))
        if self.query_endpoint and self.heals:
            self._tasks.append(asyncio.create_task(self._catch_up_while_restarting()))

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

    def _revive(self, rep: Replica) -> None:
        """``rep`` was restarted and is ready: a fresh connection, and requests go to it again."""
        if not rep.dead_reason or self._closing or rep.endpoint is None:
            return
        self._disconnect(rep)
        rep.dead_reason = None
        self._connect(rep, rep.endpoint)
        log.warning("scheduler dp=%d is back: routing to it again", rep.dp_rank)

    def _resolve_all(self, pending: list[Replica]) -> None:
        """Poll ``resolve`` for each replica without an address until all are known (thread)."""
        loop, resolve = self.loop, self.resolve
        if loop is None or resolve is None:  # start() sets both before this thread runs
            return

        def deliver(fn: Callable[..., object], *args: object) -> bool:
            try:
                loop.call_soon_threadsafe(fn, *args)
                return True
            except RuntimeError:  # the loop is closed: the server is gone
                return False

        while pending and not self._closing:
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
                    if not deliver(self._connect, rep, endpoint):
                        return
            if pending:
                time.sleep(0.2)

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
            f"scheduler dp={r.dp_rank}: {r.dead_reason}" for r in self.replicas if r.dead_reason
        ]
        if self.heals and len(dead) < len(self.replicas):
            return None
        return "; ".join(dead) or None

    @property
    def restarting(self) -> list[int]:
        """The dp ranks of dead replicas the supervisor restarts (empty unless ``heals``)."""
        if not self.heals or self.server_failure:
            return []
        return [r.dp_rank for r in self.replicas if r.dead_reason]

    def _mark_dead(self, rep: Replica, reason: str) -> None:
        if rep.dead_reason:
            return
        rep.dead_reason = reason
        log.error("scheduler dp=%d is gone: %s", rep.dp_rank, reason)
        after = "it is restarting" if self.heals else "the server is shutting down"
        for rid in list(rep.inflight):
            deliver = self._pending.get(rid)
            if deliver is not None:
                deliver(_ReplicaGone(f"scheduler dp={rep.dp_rank} is gone ({reason}); {after}"))
        if self.heals:
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
                    self._mark_dead(rep, "its connection closed (the process exited)")
        except asyncio.CancelledError:
            raise
        except Exception:  # noqa: BLE001 - a monitor failure must not take the server down
            log.exception("socket monitor of scheduler dp=%d stopped", rep.dp_rank)
            if rep.sock is not None:  # no more events for a reader about to close (see close())
                rep.sock.disable_monitor()
        finally:
            monitor.close(0)

    async def _follow_ops(self, sub: zmq.asyncio.Socket) -> None:
        try:
            while True:
                frames = await sub.recv_multipart()
                try:
                    event = ops.decode(frames[-1])
                except ops.EventError as exc:
                    log.warning("ignored a frame on the ops subscription: %s", exc)
                    continue
                if event.seq <= self._ops_seq:
                    continue  # applied already, by a catch-up
                self._ops_seq = event.seq
                self._on_ops_event(event)
        except asyncio.CancelledError:
            raise
        except Exception:  # noqa: BLE001
            log.exception("ops subscription stopped")

    async def _catch_up_while_restarting(self) -> None:
        """While a replica restarts, ask every ``CATCH_UP_S`` for events not seen: a lost
        ``replica.<dp>.ready`` would otherwise keep it out of routing for good."""
        while True:
            await asyncio.sleep(self.CATCH_UP_S)
            if any(r.dead_reason for r in self.replicas):
                await self._catch_up()

    async def query(self, request: dict[str, object], timeout: float = 5.0) -> dict[str, Any]:
        """The supervisor's answer to ``request`` on its query socket (``{"query": "snapshot"}``,
        ``{"query": "events", "after": N}``); ``LookupError`` when there is none in time."""
        import zmq

        if not self.query_endpoint or self._zctx is None:
            raise LookupError("this HTTP child knows no supervisor query socket")
        sock = self._zctx.socket(zmq.REQ)
        sock.setsockopt(zmq.LINGER, 0)
        try:
            sock.connect(self.query_endpoint)
            await sock.send(json.dumps(request).encode())
            if not await sock.poll(int(timeout * 1000)):
                raise LookupError(f"the supervisor did not answer {request} within {timeout:g}s")
            reply = json.loads(await sock.recv())
        except (zmq.ZMQError, ValueError) as exc:
            raise LookupError(f"could not ask the supervisor {request}: {exc}") from exc
        finally:
            sock.close(0)
        if not isinstance(reply, dict) or not reply.get("ok"):
            raise LookupError(f"the supervisor refused {request}: {reply}")
        return reply

    async def _catch_up(self) -> None:
        """Apply, in order, the supervisor's events numbered above the last one applied."""
        try:
            reply = await self.query({"query": "events", "after": self._ops_seq})
            missed = [ops.from_dict(entry) for entry in reply.get("events") or []]
        except (LookupError, ValueError, AttributeError) as exc:
            log.warning("could not ask the supervisor for missed events: %s", exc)
            return
        for event in missed:
            if event.seq > self._ops_seq:
                self._ops_seq = event.seq
                if event.topic.startswith(OPS_TOPICS):  # what the subscription would have delivered
                    self._on_ops_event(event)

    def _on_ops_event(self, event: ops.Event) -> None:
        if isinstance(event, ops.ServerFailed):
            self.server_failure = (
                f"the supervisor reported {event.topic}: {event.root_cause.summary}"
            )
        elif isinstance(event, ops.ServerStopping):
            self.server_failure = f"the supervisor reported {event.topic}: {event.reason}"
        elif isinstance(event, (ops.ReplicaRestarting, ops.ReplicaReady)):
            if not 0 <= event.dp_rank < len(self.replicas):
                return
            rep = self.replicas[event.dp_rank]
            if isinstance(event, ops.ReplicaRestarting):
                if self.metrics is not None:
                    self.metrics.count_restart(rep.dp_rank)
                self._mark_dead(rep, f"restarting: {event.cause or 'it failed'}")
            else:
                self._revive(rep)
        elif isinstance(event, ops.WORKER_GONE) and event.role == "scheduler":
            dp = event.rank // self.tp_size
            if 0 <= dp < len(self.replicas):
                self._mark_dead(self.replicas[dp], f"the supervisor reported {event.topic}")

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

    def pick(self) -> Replica:
        """The live replica with the fewest unanswered requests (ties: lowest dp rank)."""
        live = [r for r in self.replicas if not r.dead_reason and r.io is not None]
        if not live or self.server_failure or self._ended:
            raise SchedulerError(
                503,
                self._ended
                or self.unhealthy_reason
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
            rid, used = self._open(make, rep, queue.put_nowait)
            finished = yielded = False
            try:
                while True:
                    reply = await queue.get()
                    if isinstance(reply, _ReplicaGone):
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

            rid, used = self._open(make, rep, deliver)
            try:
                reply = await answer
            finally:  # a cancelled wait cancels ``answer`` too: only a result means it finished
                self._close(rid, used, finished=answer.done() and not answer.cancelled())
            if isinstance(reply, _ReplicaGone):
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

    async def ping_all(self, timeout: float = 1.0) -> list[messages.Pong | None]:
        """Each replica's ``Pong`` (None for one that did not answer within ``timeout``)."""

        async def ping(rep: Replica) -> messages.Pong | None:
            if rep.dead_reason or rep.io is None:
                return None
            try:
                return await asyncio.wait_for(
                    self.one(lambda rid: messages.Ping(rid), rep), timeout
                )
            except (TimeoutError, SchedulerError):
                return None

        return list(await asyncio.gather(*(ping(r) for r in self.replicas)))

    def unanswered_reason(self, dp_ranks: list[int]) -> str:
        """Which replicas did not answer, and where they are (or why their address is unknown)."""
        parts = []
        for dp in dp_ranks:
            rep = self.replicas[dp]
            parts.append(f"dp={dp} ({rep.unreachable or rep.where})")
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
