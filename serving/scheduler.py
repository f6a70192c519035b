"""The batching scheduler of both runtimes: rank 0 of a data-parallel replica, and its followers.

``BatchingScheduler`` owns what every runtime does the same way. It binds a ROUTER socket (the
launch's private ``ipc://`` path ``ctx.endpoint(scheduler_endpoint_name(dp_rank))``; a replica
whose rank 0 runs on a node other than 0 binds TCP and announces the address in the launch's
store), reports ready (``wire.ReplicaReady``), and serves the HTTP child until ``ctx.stopping``
is set, then tells its followers to stop.

The loop has SGLang's shape. Each turn receives what arrived (a ``Ping`` is answered with a
``Pong`` and the runtime's ``Stats``, a ``FlushCache`` with a ``FlushCacheResult`` from
``flush_cache()``, a ``Cancel`` drops a waiting request or marks a running one, a request of another kind than the model's is refused with a 400 naming both kinds,
``param="model"``, and any other request is checked and appended to ``waiting_queue`` by the
runtime's ``admit``, an ``InputError`` answered with a 400 at once); then, when work is due, one
step:

1. ``get_next_batch_to_run()`` decides what runs: it admits waiting requests (the runtime's
   policy) and returns the batch of this step, an object whose ``reqs`` are its requests, or
   None to run nothing this turn;
2. ``run_batch(batch)`` runs the step through the model worker and returns its result;
3. ``process_batch_result(batch, result)`` sends what the step produced and releases what
   finished.

Work is due when requests are running (``running``), or when requests wait and their batch is
due: the queue holds ``--max-batch-size`` requests, or it and the running requests are every
request the HTTP child has outstanding here (``inflight``: nothing more is on the way, so a lone
request never waits), or the oldest has waited ``--batch-wait-ms``.

Fairness: a step is a bounded slice of work, and the requests under way share the steps, so a big
request delays a small one by a slice of its own work, not all of it. How a runtime slices is its
own (text: one step of the running generation batch, or at most ``--max-batch-size`` embedding
texts; images: one denoising step of one pipeline call, the calls under way taking turns). A
request cancelled (its client left, or its 504 fired) stops at its next step.

Failure policy, the same for both runtimes: when a step raises in a replica of several ranks
(tensor- or CFG-parallel), the process ends (the ranks are out of step after it; the supervisor
restarts or reports the replica, and the HTTP child repeats elsewhere what is safe to repeat);
in a replica of one rank every request of the failed step (``in_step``; when it failed before a
batch was made, in ``get_next_batch_to_run``, the waiting requests too: admission was their step)
gets a 500 ``RequestFailed`` naming who failed (a plugin's hook, or the model:
``serving.step_failures``), the runtime drops what the step left behind (``recover``), the
platform's cache is emptied, and the scheduler goes on after a backoff. After
``FAILED_STEPS_LIMIT`` consecutive failed steps it gives up (``give_up``): every request it holds
gets a 503 naming the failure, so does every request that arrives after, and the failure is
reported to the supervisor (``ctx.report_failure``), which restarts the replica or stops the
launch. While a step runs, ``ctx.busy_since`` says since when (the heartbeat carries it: the
supervisor's watchdog ends a step stuck past ``--watchdog-timeout``).

A runtime subclasses ``BatchingScheduler`` and says only what differs: ``admit`` (check one
request and make its queue entry), the three steps above, and ``stats``. It keeps the requests
it works on in ``running`` (``begin``/``finish``), so that a cancellation finds them and a
failure answers them.

``follow(ctx, run)`` is a rank > 0 of a replica: it reports ready and runs each piece of work
rank 0 broadcasts until rank 0 says stop.
"""

from __future__ import annotations

import logging
import os
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Generic, Protocol, TypeVar, cast

import msgspec
import zmq

from launchspec.causes import WorkerUnhealthy
from serving import wire
from serving.devices import visible_devices
from serving.errors import InputError
from serving.plugin_metrics import plugin_metrics_page
from serving.step_failures import StepFailures, check_batch, describe

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
_SEND_MORE = int(zmq.SNDMORE | zmq.NOBLOCK)
_SEND_LAST = int(zmq.NOBLOCK)
# Plain ints: pyzmq's constants are enums, whose operators run Python code on every use.
_EVENTS = int(zmq.EVENTS)
_POLLIN = int(zmq.POLLIN)


@dataclass(kw_only=True, eq=False)
class Queued:
    """A request admitted to the waiting queue: the HTTP child's socket ``identity`` to answer,
    the request, and when it arrived. A runtime's entry narrows ``request`` and adds what it
    computed on admission. Entries compare by identity."""

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
B = TypeVar("B", bound="Batch")
T = TypeVar("T")
S = TypeVar("S", bound=wire.SchedulerStats)


class Batch(Protocol):
    """What ``get_next_batch_to_run`` returns: a step's work, ``reqs`` its requests."""

    @property
    def reqs(self) -> Sequence[Queued]: ...


class BatchingScheduler(ABC, Generic[R, Q, B, T]):
    """Rank 0 of a replica: the request socket, the waiting queue, the batch timing, the step
    loop, the failure policy and the broadcasts to the replica's other ranks. ``R``: the
    requests the runtime serves; ``Q``: its queue entries; ``B``: its batches; ``T``: what
    ``run_batch`` returns."""

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
        self.waiting_queue: list[Q] = []  # oldest first (a policy may reorder it in place)
        self.running: dict[str, Q] = {}  # rid -> the requests under way
        self.cancelled: set[str] = set()  # running rids whose client left
        self.current: B | None = None  # the batch of the step under way
        self.declined = False  # the last get_next_batch_to_run ran nothing though work was due
        self.batches = 0
        self.aborted = 0  # requests cancelled while they ran
        self.generated_tokens = 0
        self.last_broadcast = time.monotonic()
        self.failures = StepFailures(log)  # the failed-step policy (serving.step_failures)
        self.unhealthy: str | None = None  # why it gave up (``give_up``); None while healthy
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
    def get_next_batch_to_run(self) -> B | None:
        """Decide what this step runs (work is due: see the module docstring): admit waiting
        requests and return the step's batch, or None to run nothing this turn."""

    @abstractmethod
    def run_batch(self, batch: B) -> T:
        """Run one step of ``batch`` through the model worker and return what it produced."""

    @abstractmethod
    def process_batch_result(self, batch: B, result: T) -> None:
        """Send what ``result`` holds to the requests of ``batch`` that wait for it (not the
        cancelled ones) and release the requests that finished (``finish``)."""

    @abstractmethod
    def stats(self) -> wire.Stats:
        """This scheduler's counters (``counted``), its model and its device's memory (for
        ``Pong`` and the ready report)."""

    def flush_cache(self) -> tuple[bool, str]:
        """Empty the prefix cache (``wire.FlushCache``, ``POST /flush_cache``): ``(True, "")``
        when it is now empty, else ``(False, why)``. A runtime with a prefix cache overrides this
        (SGLang's rule: flush only when no request is running or waiting, else refuse, and the
        caller may retry); by default there is none to flush."""
        return False, "this runtime has no prefix cache"

    def recover(self) -> None:
        """After a failed step (in a replica of one rank, its requests already answered): drop
        what the step left behind. By default nothing."""

    def counted(self, stats: S) -> S:
        """``stats`` with the counters every scheduler keeps filled in."""
        stats.batches, stats.aborted = self.batches, self.aborted
        stats.generated_tokens = self.generated_tokens
        stats.plugin_metrics = plugin_metrics_page()
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
        run one step when work is due, else keep the followers waiting. After a failed step, and
        once the scheduler gave up, it only receives (until the backoff's end, for ever)."""
        if self.unhealthy is not None or (self.failures.retry_at and not self.failures.due()):
            wait = _IDLE_WAIT_MS if self.unhealthy else int(self.failures.wait_s() * 1000) + 1
            if self.sock.poll(min(wait, _IDLE_WAIT_MS)):
                self.drain()
            self.tick_followers()
            return
        if self.running and not self.declined:
            # Requests are running: a step is due whatever arrives (nothing received ends one).
            if cast(int, self.sock.getsockopt(_EVENTS)) & _POLLIN:
                self.drain()
            self.run_step()
            return
        wait = self.wait_ms()
        # With no wait, a look at the socket's events: Socket.poll builds a Poller every call.
        if wait == 0:
            arrived = bool(cast(int, self.sock.getsockopt(_EVENTS)) & _POLLIN)
        else:
            arrived = bool(self.sock.poll(wait))
        if arrived:
            self.drain()
        if self.work_due():
            self.run_step()
        else:
            self.tick_followers()

    def wait_ms(self) -> int:
        """How long the next turn may wait for messages: not at all while a step is due, until
        the oldest request's batch is due, or a while when idle (or when the last step ran
        nothing: a message, or the wait, brings the next try)."""
        if self.declined:
            return _IDLE_WAIT_MS
        if self.running:
            return 0
        if not self.waiting_queue:
            return _IDLE_WAIT_MS
        if self.batch_due():
            return 0
        due = self.waiting_queue[0].arrived + self.batch_wait
        return max(0, int((due - time.monotonic()) * 1000))

    def work_due(self) -> bool:
        return bool(self.running) or (bool(self.waiting_queue) and self.batch_due())

    def batch_due(self) -> bool:
        """Run now when the batch is full, when every request the HTTP child has outstanding
        here is already queued (nothing more is on the way), or when the oldest has waited
        ``batch_wait_ms``."""
        queue = self.waiting_queue
        return (
            len(queue) >= self.max_batch_size
            or len(queue) + len(self.running) >= queue[-1].request.inflight
            or time.monotonic() >= queue[0].arrived + self.batch_wait
        )

    # ---- work --------------------------------------------------------------------------------

    def run_step(self) -> None:
        """One step, ``get_next_batch_to_run`` -> ``run_batch`` -> ``process_batch_result``,
        under the failure policy (the module's docstring). ``ctx.busy_since`` is the step's
        start while it runs."""
        ctx = self.ctx
        ctx.busy_since = time.monotonic()
        try:
            batch = self.get_next_batch_to_run()
            check_batch(batch, type(self))
            self.declined = batch is None
            if batch is None:
                self.tick_followers()
                return
            self.current = batch
            self.process_batch_result(batch, self.run_batch(batch))
            if self.failures.consecutive:
                self.failures.succeeded()
        except Exception as exc:
            if self.ranks > 1:
                # The failure (often a peer rank gone, seen as a broken collective) leaves the
                # ranks out of step: the process ends, and the supervisor restarts the replica.
                exc.add_note(describe(exc).message)
                raise
            self.fail_step(exc)
        finally:
            self.current = None
            ctx.busy_since = None

    def fail_step(self, exc: Exception) -> None:
        """Answer every request of the failed step with a 500 naming who failed and let them
        go (``serving.step_failures``: the message, the log, the backoff); give up after too many
        failed steps in a row."""
        failed = {id(item): item for item in self.in_step()}
        if self.current is None:  # admission failed: the waiting requests were its subject
            failed.update((id(item), item) for item in self.waiting_queue)
        items = list(failed.values())
        failure = self.failures.failed(exc, len(items))
        for item in items:
            self.send(item.identity, wire.RequestFailed(item.rid, 500, failure.message))
        self.finish(items)
        gone = {item.rid for item in items}
        self.waiting_queue[:] = [q for q in self.waiting_queue if q.rid not in gone]
        self.recover()
        self.platform.empty_cache()
        if self.failures.exhausted:
            self.give_up(exc)

    def give_up(self, exc: Exception) -> None:
        """Too many steps in a row failed: answer every request held with a 503 naming the
        failure (every later one too: ``take_in``), and report it to the supervisor, which
        restarts the replica or stops the launch; the loop only receives from now on."""
        reason = self.failures.reason
        self.unhealthy = f"scheduler dp={self.dp_rank} is unhealthy: {reason}"
        self.failures.close()
        log.error(
            "%s; it answers every request with a 503 until the supervisor restarts or stops it",
            self.unhealthy,
        )
        held = {id(item): item for item in [*self.running.values(), *self.waiting_queue]}
        for item in held.values():
            self.send(item.identity, wire.RequestFailed(item.rid, 503, self.unhealthy))
        self.finish(list(held.values()))
        self.waiting_queue.clear()
        self.recover()
        report = getattr(self.ctx, "report_failure", None)
        if report is not None:
            error = WorkerUnhealthy(reason)
            error.__cause__ = exc
            report(error)

    def in_step(self) -> Iterable[Q]:
        """The requests the step under way works on (a failure answers them): the batch's, or
        every running request when no batch was made yet."""
        if self.current is not None:
            return cast("Sequence[Q]", self.current.reqs)
        return self.running.values()

    def begin(self, items: Iterable[Q]) -> None:
        """``items`` are running: a cancellation of one is noted, and a failure answers them."""
        self.running.update((item.rid, item) for item in items)

    def finish(self, items: Iterable[Q]) -> None:
        """``items`` have been answered: they leave ``running`` (and ``cancelled``)."""
        for item in items:
            self.running.pop(item.rid, None)
            self.cancelled.discard(item.rid)

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
        elif isinstance(msg, wire.FlushCache):
            ok, message = self.flush_cache()
            busy = not ok and bool(self.waiting_queue or self.running)
            self.send(identity, wire.FlushCacheResult(msg.rid, ok, message, busy))
        elif isinstance(msg, wire.Cancel):
            self.cancel(msg.rid)
        else:
            self.take_in(identity, msg)

    def cancel(self, rid: str) -> None:
        """Drop ``rid`` from the waiting queue, or note it cancelled when it is running."""
        dropped = [q for q in self.waiting_queue if q.rid == rid]
        if dropped:
            self.waiting_queue[:] = [q for q in self.waiting_queue if q.rid != rid]
            self.aborted += sum(1 for q in dropped if q.started)
        elif rid in self.running:
            self.cancelled.add(rid)

    def take_in(self, identity: bytes, request: wire.Request) -> None:
        """Queue ``request`` (``admit``), or refuse it with a 400: a request of another kind
        than the model's (``param="model"``), or what ``admit`` finds wrong with it; with a 503
        once the scheduler gave up (``give_up``)."""
        if self.unhealthy is not None:
            self.send(identity, wire.RequestFailed(request.rid, 503, self.unhealthy))
            return
        if request.kind != self.kind or not isinstance(request, self.serves):
            message = f"model {self.served_name!r} serves {self.kind}, not {request.kind}"
            self.send(identity, wire.RequestFailed(request.rid, 400, message, "model"))
            return
        try:
            item = self.admit(identity, request)
        except InputError as exc:
            self.send(identity, wire.RequestFailed(request.rid, 400, str(exc), exc.param))
            return
        self.waiting_queue.append(item)
        self.declined = False

    # ---- sending -----------------------------------------------------------------------------

    def send(self, identity: bytes, msg: msgspec.Struct) -> None:
        frame = wire.encode(msg)
        try:  # two plain sends: what send_multipart does, without its per-call checks
            self.sock.send(identity, _SEND_MORE)
            self.sock.send(frame, _SEND_LAST)
        except zmq.ZMQError as exc:  # the client is gone or its queue is full
            log.debug("could not send %s: %s", type(msg).__name__, exc)

    def pong(self, rid: str) -> wire.Pong:
        return wire.Pong(
            rid,
            self.dp_rank,
            os.getpid(),
            self.served_name,
            self.kind,
            len(self.waiting_queue),
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
