"""The batching scheduler of both runtimes: rank 0 of a data-parallel replica, and its followers.

``BatchingScheduler`` owns what every runtime does the same way. It binds a ROUTER socket (the
launch's private ``ipc://`` path ``ctx.endpoint(scheduler_endpoint_name(dp_rank))``; a replica
whose rank 0 runs on a node other than 0 binds TCP and announces the address in the launch's
store), reports ready (``wire.ReplicaReady``), and serves the HTTP child until ``ctx.stopping``
is set, then tells its followers to stop. Its loop is a step loop: each turn receives what
arrived (a ``Ping`` is answered with a ``Pong`` and the runtime's ``Stats``, a ``Cancel`` drops a
queued request or marks a running one, a request of another kind than the model's is refused
with a 400 naming both kinds, ``param="model"``, and any other request is checked and queued by
the runtime's ``admit``, an ``InputError`` answered with a 400 at once), then runs one unit of
work, ``step()``, when one is due.

Batch timing: a batch is due when the queue holds ``--max-batch-size`` requests, when it and the
running requests are every request the HTTP child has outstanding here (``inflight``: nothing
more is on the way, so a lone request never waits), or when the oldest has waited
``--batch-wait-ms``.

Fairness: a step is a bounded slice of work, and the requests under way share the steps, so a big
request delays a small one by a slice of its own work, not all of it. How a runtime slices is its
own (the text runtime's embeddings: at most ``--max-batch-size`` texts a step, taken from every
queued request in turn; images: one denoising step of one pipeline call, the calls under way
taking turns). A request cancelled (its client left, or its 504 fired) stops at its next step.

Failure policy, the same for both runtimes: when a step raises in a replica of several ranks
(tensor- or CFG-parallel), the process ends (the ranks are out of step after it; the supervisor
restarts or reports the replica, and the HTTP child repeats elsewhere what is safe to repeat);
in a replica of one rank every request of the failed step (``in_step``) gets a 500
``RequestFailed``, the platform's cache is emptied, and the scheduler goes on.

A runtime subclasses ``BatchingScheduler`` and says only what differs: ``admit`` (check one
request and make its queue entry), ``take_batch`` (which queued requests, or parts of them, form
the next batch; a request of which only a part was taken stays queued), ``execute`` (run a batch
and answer its requests) and ``stats``. By default a step is a batch (``step`` runs
``run_batch``); a runtime that works in other units overrides ``step``, keeps the requests it
works on in ``running`` (``begin``/``finish``) and says which of them a step works on
(``in_step``), and the loop takes in requests and cancellations between its steps. Work that
runs long inside one step calls ``poll()`` between its own iterations for the same.

``follow(ctx, run)`` is a rank > 0 of a replica: it reports ready and runs each piece of work
rank 0 broadcasts until rank 0 says stop.
"""

from __future__ import annotations

import logging
import os
import time
from abc import ABC, abstractmethod
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Generic, TypeVar

import msgspec
import zmq

from serving import wire
from serving.devices import visible_devices
from serving.errors import InputError

if TYPE_CHECKING:
    from torch.distributed import TCPStore

    from bootstrap import WorkerContext
    from launchspec.server_args import ServerArgs
    from platforms.device_mixin import DeviceMixin

log = logging.getLogger("sglang_launch.scheduler")

# Rank 0 broadcasts at least this often (a Tick when it has nothing else), so that a follower's
# wait for the next broadcast never reaches the group's timeout.
TICK_SECONDS = 1.0
_IDLE_WAIT_MS = 100


@dataclass(kw_only=True)
class Queued:
    """A request admitted to the queue: the HTTP child's socket ``identity`` to answer, the
    request, and when it arrived. A runtime's entry narrows ``request`` and adds what it
    computed on admission."""

    identity: bytes
    request: wire.Request
    arrived: float = field(default_factory=time.monotonic)

    @property
    def rid(self) -> str:
        return self.request.rid

    @property
    def started(self) -> bool:
        """Whether part of its work has run while it is still queued (a request that runs in
        several batches): cancelling it then counts as an abort."""
        return False


R = TypeVar("R", bound=wire.Request)
Q = TypeVar("Q", bound=Queued)
S = TypeVar("S", bound=wire.SchedulerStats)


class BatchingScheduler(ABC, Generic[R, Q]):
    """Rank 0 of a replica: the request socket, the queue, the batch timing, the failure policy
    and the broadcasts to the replica's other ranks. ``R``: the requests the runtime serves;
    ``Q``: its queue entries."""

    def __init__(
        self,
        server_args: ServerArgs,
        ctx: WorkerContext,
        *,
        serves: tuple[type[R], ...],
        model: str,
        kind: str,
        ranks: int,
        platform: DeviceMixin,
        store: TCPStore | None = None,
    ) -> None:
        """``serves``: the request types the runtime admits; ``model``: the served name;
        ``kind``: the model's kind (requests of another ``kind`` are refused); ``ranks``: the
        replica's ranks (the followers are the others); ``store``: the launch's rendezvous
        store, given to a replica whose rank 0 runs on a node other than 0 (it binds TCP and
        announces the address there)."""
        self.server_args = server_args
        self.ctx = ctx
        self.dp_rank = ctx.dp_rank
        self.serves = serves
        self.served_name = model
        self.kind = kind
        self.ranks = ranks
        self.platform = platform
        self.store = store
        self.max_batch_size = server_args.max_batch_size
        self.batch_wait = server_args.batch_wait_ms / 1000.0
        self.queue: deque[Q] = deque()
        self.running: dict[str, Q] = {}
        self.cancelled: set[str] = set()
        self.batches = 0
        self.aborted = 0  # requests cancelled while they ran
        self.generated_tokens = 0
        self.last_broadcast = time.monotonic()
        self._zctx = zmq.Context()
        self.sock = self._zctx.socket(zmq.ROUTER)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.endpoint = (
            None if store is not None else ctx.endpoint(wire.scheduler_endpoint_name(self.dp_rank))
        )

    # ---- what a runtime says -----------------------------------------------------------------

    @abstractmethod
    def admit(self, identity: bytes, request: R) -> Q:
        """The queue entry of ``request`` (of the model's kind), or ``InputError`` naming the
        field to change (a 400 for that client alone)."""

    @abstractmethod
    def take_batch(self) -> list[Q]:
        """Remove the next batch from the queue (at least one request; the queue is not empty)."""

    @abstractmethod
    def execute(self, batch: list[Q]) -> None:
        """Run ``batch`` and answer each of its requests that is not cancelled."""

    @abstractmethod
    def stats(self) -> wire.Stats:
        """This scheduler's counters (``counted``), its model and its device's memory (for
        ``Pong`` and the ready report)."""

    def counted(self, stats: S) -> S:
        """``stats`` with the counters every scheduler keeps filled in."""
        stats.batches, stats.aborted = self.batches, self.aborted
        stats.generated_tokens = self.generated_tokens
        return stats

    # ---- lifecycle ---------------------------------------------------------------------------

    def serve(self) -> None:
        """Bind, report ready, and run the loop until ``ctx.stopping`` is set; then tell the
        followers to stop. A step that fails in a replica of several ranks ends the loop with
        its exception, without a word to the followers (they may be inside a collective)."""
        stopped = False
        try:
            endpoint = self.bind()
            stats = self.stats()
            ready = wire.ReplicaReady(
                dp_rank=self.dp_rank,
                endpoint=endpoint,
                pid=os.getpid(),
                model=stats.model,
                memory=stats.memory,
                devices=visible_devices(stats.model.device.partition(":")[0]),
            )
            self.ctx.ready(**msgspec.to_builtins(ready))
            log.info(
                "scheduler dp=%d serving %s (%s) at %s",
                self.dp_rank,
                self.served_name,
                self.kind,
                endpoint,
            )
            while not self.ctx.stopping.is_set():
                self.turn()
            stopped = True
        finally:
            if stopped and self.ranks > 1:
                self.broadcast(wire.Stop())
            self.sock.close(0)
            self._zctx.term()

    def bind(self) -> str:
        """Bind the request socket and return its address. One node: the private ``ipc://``
        path. A remote replica: TCP on this node's address on the route to node 0 (a free port),
        announced in the launch's store for the HTTP child."""
        if self.store is None:
            endpoint = self.ctx.endpoint(wire.scheduler_endpoint_name(self.dp_rank))
            self.sock.bind(endpoint)
        else:
            from serving.distributed import advertised_host, rendezvous_address, scheduler_key

            host = advertised_host(*rendezvous_address(self.server_args))
            if ":" in host:
                self.sock.setsockopt(zmq.IPV6, 1)
                host = f"[{host}]"
            self.sock.bind(f"tcp://{host}:*")
            endpoint = self.sock.getsockopt_string(zmq.LAST_ENDPOINT)
            self.store.set(scheduler_key(self.dp_rank), endpoint)
        self.endpoint = endpoint
        return endpoint

    def turn(self) -> None:
        """One turn of the loop: receive what arrived (waiting at most until work is due), then
        run one step when work is due, else keep the followers waiting."""
        if self.sock.poll(self.wait_ms()):
            self.drain()
        if self.work_due():
            self.run_step()
        else:
            self.tick_followers()

    def wait_ms(self) -> int:
        """How long the next turn may wait for messages: not at all while requests are running
        or a batch is due, until the oldest request's batch is due, or a while when idle."""
        if self.running:
            return 0
        if not self.queue:
            return _IDLE_WAIT_MS
        if self.batch_due():
            return 0
        due = self.queue[0].arrived + self.batch_wait
        return max(0, int((due - time.monotonic()) * 1000))

    def work_due(self) -> bool:
        return bool(self.running) or (bool(self.queue) and self.batch_due())

    def batch_due(self) -> bool:
        """Run now when the batch is full, when every request the HTTP child has outstanding
        here is already queued (nothing more is on the way), or when the oldest has waited
        ``batch_wait_ms``."""
        return (
            len(self.queue) >= self.max_batch_size
            or len(self.queue) + len(self.running) >= self.queue[-1].request.inflight
            or time.monotonic() >= self.queue[0].arrived + self.batch_wait
        )

    # ---- work --------------------------------------------------------------------------------

    def run_step(self) -> None:
        """``step()`` under the failure policy (the module's docstring)."""
        try:
            self.step()
        except Exception as exc:
            if self.ranks > 1:
                # The failure (often a peer rank gone, seen as a broken collective) leaves the
                # ranks out of step: the process ends, and the supervisor restarts the replica.
                raise
            failed = list(self.in_step())
            log.exception("a step of %d request(s) failed", len(failed))
            for item in failed:
                self.send(
                    item.identity,
                    wire.RequestFailed(
                        item.rid,
                        500,
                        f"the model failed on this batch: {type(exc).__name__}: {exc}",
                    ),
                )
            self.finish(failed)
            gone = {item.rid for item in failed}
            self.queue = deque(q for q in self.queue if q.rid not in gone)  # no later part runs
            self.platform.empty_cache()

    def step(self) -> None:
        """One unit of work: by default the next batch."""
        self.run_batch()

    def in_step(self) -> Iterable[Q]:
        """The requests the step under way works on (a failure answers them): by default every
        running request."""
        return self.running.values()

    def run_batch(self) -> None:
        """Take the next batch and run it to the end."""
        batch = self.take_batch()
        self.batches += 1
        self.begin(batch)
        self.execute(batch)
        self.finish(batch)

    def begin(self, items: Iterable[Q]) -> None:
        """``items`` are running: a cancellation of one is noted, and a failure answers them."""
        self.running.update((item.rid, item) for item in items)

    def finish(self, items: Iterable[Q]) -> None:
        """``items`` have been answered: they leave ``running`` (and ``cancelled``)."""
        for item in items:
            self.running.pop(item.rid, None)
            self.cancelled.discard(item.rid)

    def poll(self) -> set[str]:
        """Inside a step: take in what arrived without waiting (pings answered, requests
        queued, cancellations noted) and return the rids of the running requests cancelled."""
        self.drain()
        return self.cancelled

    # ---- receiving ---------------------------------------------------------------------------

    def drain(self) -> None:
        """Handle every message waiting on the socket, without blocking."""
        while True:
            try:
                frames = self.sock.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                return
            if len(frames) != 2:
                log.warning(
                    "dropped a message of %d frames (expected identity + body)", len(frames)
                )
                continue
            self.handle(frames[0], frames[1])

    def handle(self, identity: bytes, frame: bytes) -> None:
        try:
            msg = wire.decode_to_scheduler(frame)
        except msgspec.DecodeError as exc:
            log.warning("dropped an undecodable message: %s", exc)
            return
        if isinstance(msg, wire.Ping):
            self.send(identity, self.pong(msg.rid))
        elif isinstance(msg, wire.Cancel):
            self.cancel(msg.rid)
        else:
            self.take_in(identity, msg)

    def cancel(self, rid: str) -> None:
        """Drop ``rid`` from the queue, or note it cancelled when it is running."""
        dropped = [q for q in self.queue if q.rid == rid]
        if dropped:
            self.queue = deque(q for q in self.queue if q.rid != rid)
            self.aborted += sum(1 for q in dropped if q.started)
        elif rid in self.running:
            self.cancelled.add(rid)

    def take_in(self, identity: bytes, request: wire.Request) -> None:
        """Queue ``request`` (``admit``), or refuse it with a 400: a request of another kind
        than the model's (``param="model"``), or what ``admit`` finds wrong with it."""
        if request.kind != self.kind or not isinstance(request, self.serves):
            message = f"model {self.served_name!r} serves {self.kind}, not {request.kind}"
            self.send(identity, wire.RequestFailed(request.rid, 400, message, "model"))
            return
        try:
            item = self.admit(identity, request)
        except InputError as exc:
            self.send(identity, wire.RequestFailed(request.rid, 400, str(exc), exc.param))
            return
        self.queue.append(item)

    # ---- sending -----------------------------------------------------------------------------

    def send(self, identity: bytes, msg: msgspec.Struct) -> None:
        try:
            self.sock.send_multipart([identity, wire.encode(msg)], zmq.NOBLOCK)
        except zmq.ZMQError as exc:  # the client is gone or its queue is full
            log.debug("could not send %s: %s", type(msg).__name__, exc)

    def pong(self, rid: str) -> wire.Pong:
        return wire.Pong(
            rid,
            self.dp_rank,
            os.getpid(),
            self.served_name,
            self.kind,
            len(self.queue),
            self.stats(),
        )

    def broadcast(self, msg: wire.ToFollower) -> None:
        """``msg`` to every other rank of the replica (they receive it in ``follow``)."""
        from serving.distributed import broadcast_bytes

        broadcast_bytes(wire.encode(msg))
        self.last_broadcast = time.monotonic()

    def tick_followers(self) -> None:
        """A ``Tick`` to the followers when rank 0 has been silent for ``TICK_SECONDS``: also
        inside a step the followers take no part in."""
        if self.ranks > 1 and time.monotonic() - self.last_broadcast > TICK_SECONDS:
            self.broadcast(wire.Tick())


def follow(ctx: WorkerContext, run: Callable[[wire.FollowerWork], None]) -> None:
    """A rank > 0 of a replica: report ready, then ``run`` each piece of work rank 0 broadcasts,
    until it says stop. An exception from ``run`` ends the rank (the failure policy: the ranks
    are out of step), and the supervisor restarts or reports the replica."""
    from serving.distributed import broadcast_bytes

    ctx.ready(
        **msgspec.to_builtins(
            wire.RankReady(dp_rank=ctx.dp_rank, tp_rank=ctx.tp_rank, pid=os.getpid())
        )
    )
    while True:
        work = wire.decode_to_follower(broadcast_bytes(None))
        if isinstance(work, wire.Stop):
            # Rank 0 stops because the supervisor is stopping the group: wait for our own SIGTERM,
            # so that returning is not mistaken for a crash.
            ctx.stopping.wait(timeout=30)
            return
        if isinstance(work, wire.Tick):
            continue
        run(work)
