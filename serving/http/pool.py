"""The scheduler replicas the HTTP child talks to: their connections, liveness and membership, and
which one a request of a given kind goes to.

One DEALER socket per data-parallel replica connects to the scheduler's ROUTER. On one node both
sides compute the address from ``ctx.endpoint`` (no round trip); on several nodes a replica whose
rank 0 runs on another node announces its TCP address in the launch's store, and ``resolve`` (a
thread polls it) supplies it, after which the replica is connected like any other. Replies are read
by a reader callback on the socket's file descriptor, which hands each one straight to the request
it answers (``Replica.inflight``: no receiving task in between, so a reply reaches its handler
without an extra hop through the event loop).

Liveness has two sources, and a replica is dead as soon as either reports it gone:
- direct: a ZeroMQ socket monitor on each connection; a replica that was connected and
  disconnects has died (schedulers never close their socket while serving);
- the supervisor: its ops events, which ``supervisor_link.SupervisorLink`` turns into calls here.
A dead replica gets no new requests, and each request it held is told so (``ReplicaGone``: the
``dispatcher`` repeats it elsewhere or fails it). ``healthy`` turns false as soon as a serving
replica is dead, unless the launch ``heals`` (``--restart-policy on-failure``): then it stays true
while one replica lives, the dead ones are listed as ``restarting``, and ``revive`` connects a
fresh socket to the restarted replica and routes to it again.

Reloads and scales change the replicas while they serve: one that ``join``s gets no request until
it is told to ``serve`` (it answered its probe); one that ``drain``s gets no new request and is
forgotten once those it holds have ended (streams included). ``choose(kind)`` is the live replica
that serves ``kind`` with the fewest requests in flight: while a reload changes what the server
serves (embeddings to generation, say), each request goes to a replica of its own kind as long as
one exists (a replica says its kind in its ``Pong``).
"""

from __future__ import annotations

import asyncio
import bisect
import logging
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, cast

import msgspec
import zmq
import zmq.asyncio
from zmq.utils.monitor import recv_monitor_message

from serving import wire
from serving.http.replica import Deliver, Replica, ReplicaGone, SchedulerError, poll_addresses

if TYPE_CHECKING:
    from serving.http.metrics import Metrics

log = logging.getLogger("sglang_launch.http")

RETRY_AFTER_S = 5  # what a 503 says when no replica serves while a change is under way
# Plain ints for the per-reply reads: pyzmq's constants are enums, whose operators run Python code.
_EVENTS = int(zmq.EVENTS)
_POLLIN = int(zmq.POLLIN)
_NOBLOCK = int(zmq.NOBLOCK)


_WORK_DONE = (wire.Embeddings, wire.Images, wire.ImageProgress)


def is_progress(reply: wire.FromScheduler) -> bool:
    """Whether ``reply`` shows the model working: generated tokens (an abort without any is not),
    an embedding, images or a denoising step. Answers to pings and flushes are not: a scheduler
    answers those between steps even when its steps fail or hang (``/health_generate``)."""
    if isinstance(reply, wire.Generated):
        return reply.completion_tokens > 0 or reply.finish_reason != "abort"
    return isinstance(reply, _WORK_DONE)


class ReplicaPool:
    """The scheduler replicas of one HTTP child, on its event loop.

    ``endpoints[i]`` is replica ``i``'s request address, or None when it is announced later:
    ``resolve(i)`` (blocking, run in a thread of its own) returns it once known, else None, and may
    raise when it can never be learned. ``heals``: the supervisor restarts a replica that dies (the
    launch goes on while one replica lives). ``endpoint_of(dp)`` is the address of a replica a
    change adds (one node only)."""

    def __init__(
        self,
        endpoints: list[str | None],
        *,
        metrics: Metrics | None = None,
        resolve: Callable[[int], str | None] | None = None,
        heals: bool = False,
        endpoint_of: Callable[[int], str] | None = None,
    ) -> None:
        self.replicas = [Replica(i, ep) for i, ep in enumerate(endpoints)]
        self.heals = heals
        self.metrics = metrics
        self.server_failure: str | None = None
        self.changing = False  # a reload or a scale is under way
        self._resolve = resolve
        self._endpoint_of = endpoint_of
        self.loop: asyncio.AbstractEventLoop | None = None  # the event loop, once started
        self._zctx: zmq.asyncio.Context | None = None
        self._closing = False
        self._changed = asyncio.Event()  # a replica began serving, or a change ended
        self._watchers: set[asyncio.Task[None]] = set()

    # ---- lifecycle -------------------------------------------------------------------------

    def start(self, zctx: zmq.asyncio.Context) -> None:
        """Connect every replica whose address is known (a thread learns the others'); called on
        the event loop."""
        self.loop = asyncio.get_running_loop()
        self._zctx = zctx
        for rep in self.replicas:
            if rep.endpoint:
                self._connect(rep, rep.endpoint)
        pending = [r for r in self.replicas if not r.endpoint]
        if not pending:
            return
        if self._resolve is None:
            raise ValueError(
                f"scheduler dp={[r.dp_rank for r in pending]} have no address and "
                f"no resolver was given"
            )
        threading.Thread(
            target=poll_addresses,
            args=(self.loop, self._resolve, pending, self._connect, lambda: self._closing),
            name="resolve-schedulers",
            daemon=True,
        ).start()

    async def close(self) -> None:
        """Close every connection (the context is its owner's to destroy)."""
        self._closing = True
        # Each monitor is stopped before its reader closes: libzmq's I/O thread sends monitor
        # events with a blocking send under the socket's monitor lock, so an event for a reader
        # that is already gone would stall that thread and, with it, disable_monitor() forever.
        for rep in self.replicas:
            self._disconnect(rep)
        watchers = list(self._watchers)
        await asyncio.gather(*watchers, return_exceptions=True)

    def _connect(self, rep: Replica, endpoint: str) -> None:
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
        self.loop.add_reader(rep.io.FD, self.read, rep)
        rep.watcher = asyncio.create_task(self._watch(rep, monitor))
        self._watchers.add(rep.watcher)
        rep.watcher.add_done_callback(self._watchers.discard)

    def _disconnect(self, rep: Replica) -> None:
        """Close ``rep``'s socket and its monitor (the replica is dead, or the pool closes)."""
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

    async def _watch(self, rep: Replica, monitor: zmq.asyncio.Socket) -> None:
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

    def fail(self, reason: str) -> None:
        """The server failed or stops (the supervisor said so): unhealthy, no more requests."""
        self.server_failure = reason
        self._changed.set()

    def set_heals(self, heals: bool) -> None:
        """Whether the supervisor restarts a replica that dies (a scale may change the policy)."""
        self.heals = heals

    def replica(self, dp_rank: int) -> Replica | None:
        """Replica ``dp_rank``, when the pool knows it."""
        return next((r for r in self.replicas if r.dp_rank == dp_rank), None)

    def mark_dead(self, rep: Replica, reason: str) -> None:
        """``rep`` is gone: every request it holds is told so, none goes to it any more."""
        if rep.dead_reason:
            return
        rep.dead_reason = reason
        log.error("scheduler dp=%d is gone: %s", rep.dp_rank, reason)
        after = "it is restarting" if self.heals else "the server is shutting down"
        self._tell_gone(rep, f"scheduler dp={rep.dp_rank} is gone ({reason}); {after}")
        if self.heals or not rep.serving:
            # Nothing more goes to the old process, and nothing queued reaches its successor.
            self._disconnect(rep)

    def revive(self, rep: Replica) -> None:
        """``rep`` was restarted and is ready: a fresh connection, and requests go to it again."""
        if not rep.dead_reason or self._closing or rep.endpoint is None:
            return
        self._disconnect(rep)
        rep.dead_reason = None
        self._connect(rep, rep.endpoint)
        log.warning("scheduler dp=%d is back: routing to it again", rep.dp_rank)

    def unanswered_reason(self, dp_ranks: list[int]) -> str:
        """Which replicas did not answer, and where they are (or why their address is unknown)."""
        parts = []
        for dp in dp_ranks:
            rep = self.replica(dp)
            where = "gone" if rep is None else rep.unreachable or rep.where
            parts.append(f"dp={dp} ({where})")
        return ", ".join(parts)

    # ---- replicas a reload or a scale adds and retires ------------------------------------

    def change_started(self) -> None:
        """A reload or a scale began: a request that finds no replica of its kind may wait."""
        self.changing = True

    def change_ended(self) -> None:
        """The reload or scale ended: requests waiting for a replica look again."""
        self.changing = False
        self._changed.set()

    def join(self, dp_rank: int) -> Replica | None:
        """Connect a replica a change started (ready, not yet serving: ``serve`` routes to it
        once it answered its probe); None when the pool has no address for it."""
        self.forget(dp_rank)
        endpoint = self._endpoint_of(dp_rank) if self._endpoint_of is not None else None
        if endpoint is None or self._closing:
            return None
        rep = Replica(dp_rank, None, serving=False)
        bisect.insort(self.replicas, rep, key=lambda r: r.dp_rank)
        self._connect(rep, endpoint)
        return rep

    def serve(self, dp_rank: int) -> None:
        """Route to replica ``dp_rank`` (it passed its probe, or there was none)."""
        rep = self.replica(dp_rank)
        if rep is None and self._endpoint_of is not None and not self._closing:
            rep = Replica(dp_rank, None)
            bisect.insort(self.replicas, rep, key=lambda r: r.dp_rank)
            self._connect(rep, self._endpoint_of(dp_rank))
        if rep is not None and not rep.serving and not rep.draining and not rep.dead_reason:
            rep.serving = True
            log.info("scheduler dp=%d serves", dp_rank)
        self._changed.set()

    def drain(self, dp_rank: int, in_place: bool) -> asyncio.Future[None]:
        """Route nothing more to replica ``dp_rank``; the future is done once it holds no request
        (and it is forgotten), cancelled when it is forgotten first. ``in_place``: its successor
        comes after it."""
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        rep = self.replica(dp_rank)
        if rep is None:
            done.set_result(None)
            return done
        rep.serving, rep.draining = False, True
        if rep.emptied is not None and not rep.emptied.done():
            rep.emptied.cancel()
        rep.emptied = done
        log.info(
            "scheduler dp=%d drains (%d request(s) in flight)%s",
            dp_rank,
            len(rep.inflight),
            "; requests wait for its successor" if in_place and not self._any_live() else "",
        )
        self._if_emptied(rep)
        return done

    def forget(self, dp_rank: int) -> None:
        """Replica ``dp_rank`` is gone for good (retired, failed before it served, or dead after
        its restarts); a live serving one (a successor that took the same dp rank) stays."""
        rep = self.replica(dp_rank)
        if rep is None or (rep.serving and not rep.draining and not rep.dead_reason):
            return
        self._tell_gone(rep, f"scheduler dp={dp_rank} is gone")
        self._remove(rep)
        if rep.emptied is not None and not rep.emptied.done():
            rep.emptied.cancel()

    def _if_emptied(self, rep: Replica) -> None:
        if rep.draining and not rep.inflight and rep in self.replicas:
            self._remove(rep)
            if rep.emptied is not None and not rep.emptied.done():
                rep.emptied.set_result(None)

    def _remove(self, rep: Replica) -> None:
        self._disconnect(rep)
        self.replicas.remove(rep)
        if self.metrics is not None:
            self.metrics.set_queue_depth(rep.dp_rank, 0)

    def _tell_gone(self, rep: Replica, message: str) -> None:
        for deliver in list(rep.inflight.values()):
            deliver(ReplicaGone(message))

    # ---- which replica a request goes to ---------------------------------------------------

    def choose(self, kind: str | None) -> Replica | None:
        """The live replica that serves ``kind`` (None: any) with the fewest requests in flight
        (ties: a connected one, then the lowest dp rank); None when no live one serves it."""
        best: Replica | None = None
        for rep in self.replicas:
            if rep.live and rep.may_serve(kind):
                if best is None or (len(rep.inflight), not rep.connected) < (
                    len(best.inflight),
                    not best.connected,
                ):
                    best = rep
        return best

    def coming(self, kind: str | None) -> bool:
        """A request of ``kind`` that no live replica serves may wait: a change is under way and
        either no replica serves at all or one that may serve ``kind`` is joining."""
        if not self.changing or self.server_failure:
            return False
        if not self._any_live():
            return True
        return any(
            not r.serving and not r.draining and not r.dead_reason and r.may_serve(kind)
            for r in self.replicas
        )

    def refusal(self, kind: str | None) -> SchedulerError:
        """Why a request of ``kind`` that no live replica serves is refused now."""
        if self.server_failure:
            return SchedulerError(503, self.server_failure)
        live = [r for r in self.replicas if r.live]
        if live and kind is not None:  # live replicas, all of other kinds
            kinds = sorted({r.kind for r in live if r.kind})
            models = sorted({r.model for r in live if r.model})
            name = f"model {models[0]!r}" if len(models) == 1 else "this server"
            return SchedulerError(400, f"{name} serves {' and '.join(kinds)}, not {kind}", "model")
        if self.changing:
            return SchedulerError(
                503,
                "no scheduler replica serves while a reload or a scale changes them; retry shortly",
                retry_after=RETRY_AFTER_S,
            )
        return SchedulerError(
            503,
            self.unhealthy_reason
            or "no scheduler is reachable yet: "
            + self.unanswered_reason([r.dp_rank for r in self.replicas]),
        )

    async def changed(self, timeout: float) -> None:
        """Wait (at most ``timeout`` seconds) until a replica begins serving or a change ends."""
        self._changed.clear()
        try:
            await asyncio.wait_for(self._changed.wait(), timeout)
        except TimeoutError:
            pass

    def describe(self, rep: Replica, kind: str, model: str) -> None:
        """``rep`` said it serves ``kind`` requests of ``model`` (its ``Pong``)."""
        if (rep.kind, rep.model) != (kind, model):
            rep.kind, rep.model = kind, model
            self._changed.set()  # a request waiting for its kind may go, or be refused, now

    def _any_live(self) -> bool:
        return any(r.live for r in self.replicas)

    # ---- the requests each replica holds ---------------------------------------------------

    def read(self, rep: Replica) -> None:
        """The reader callback of ``rep``'s socket: hand every waiting reply to its request."""
        io = rep.io
        if io is None or io.closed:
            return
        inflight = rep.inflight
        while True:
            try:
                # The events say whether a reply waits (a zmq.Again per read costs an exception).
                if not cast(int, io.getsockopt(_EVENTS)) & _POLLIN:
                    return
                frame = io.recv(_NOBLOCK)
            except zmq.Again:
                return
            except zmq.ZMQError as exc:  # the socket is closing with the server
                log.debug("reading scheduler dp=%d stopped: %s", rep.dp_rank, exc)
                return
            try:
                reply = wire.decode_from_scheduler(frame)
            except msgspec.DecodeError as exc:
                log.warning("dropped an undecodable reply from dp=%d: %s", rep.dp_rank, exc)
                continue
            if is_progress(reply):
                rep.progressed()
            deliver = inflight.get(reply.rid)
            if deliver is not None:
                deliver(reply)

    def admit(self, rep: Replica, rid: str, deliver: Deliver) -> None:
        """``rep`` holds request ``rid`` now; its replies go to ``deliver``."""
        rep.inflight[rid] = deliver
        if self.metrics is not None:
            self.metrics.set_queue_depth(rep.dp_rank, len(rep.inflight))

    def release(self, rep: Replica, rid: str) -> None:
        """``rep`` no longer holds ``rid`` (answered, failed or cancelled)."""
        rep.inflight.pop(rid, None)
        if self.metrics is not None:
            self.metrics.set_queue_depth(rep.dp_rank, len(rep.inflight))
        if rep.draining:
            self._if_emptied(rep)
