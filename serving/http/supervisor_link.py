"""The HTTP child's link to its supervisor: the events it listens to, those it missed, the reports
it sends back.

``SupervisorLink`` subscribes to the supervisor's ops events (``launchspec.events``, topics
``OPS_TOPICS``) and applies each to the ``pool.ReplicaPool``:

- a scheduler rank's ``WORKER_GONE`` events, ``replica.<dp>.restarting`` and ``server.failed`` /
  ``server.stopping`` mark replicas (or the server) gone; ``replica.<dp>.ready`` brings a
  restarted replica back;
- a reload's or a scale's ``replica.<dp>.joining`` connects the new replica and probes it with
  one request of the kind it says it serves (through the ``dispatcher.Dispatcher``), which
  ``replica.probed`` reports to the supervisor; ``replica.<dp>.serving`` routes to it (when there
  was no probe); ``replica.<dp>.draining`` routes nothing more to a replica and
  ``replica.drained`` reports it once it holds no request; ``replica.<dp>.replaced`` /
  ``removed`` forget it; ``reload.*`` / ``scale.*`` say a change is under way (a request that
  finds no replica of its kind then waits for one) and ``reload.finished`` names the model served
  from then on: ``on_model_change(model_path, served_name)`` runs in a task of its own (the work
  it awaits runs off the event loop), a newer change cancelling one still running;
  ``reload.started`` calls ``on_model_coming`` with the same arguments, to read the model ahead.

Reports go to the supervisor's query socket (``QuerySocket``: ``ctx.query_endpoint``, a REQ per
question), which the routes ask too (``/get_server_info``'s workers). A lost
event must not keep a replica out of routing: while a replica restarts or a change is under way,
every ``CATCH_UP_S`` seconds the link asks the query socket for the events numbered above the
last one it applied, and applies them in order. (The numbers skip anyway between the topics it
subscribes to, so a skip alone proves no loss.)
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable, Coroutine
from typing import TYPE_CHECKING, Any

import zmq
import zmq.asyncio

from launchspec import events
from serving.http.probes import PROBED_KINDS, probe_problem, probe_request
from serving.http.replica import Replica, SchedulerError

if TYPE_CHECKING:
    from serving.http.dispatcher import Dispatcher
    from serving.http.metrics import Metrics
    from serving.http.pool import ReplicaPool

log = logging.getLogger("sglang_launch.http")

# The supervisor events the HTTP child uses.
OPS_TOPICS = ("worker.scheduler.", "server.", "replica.", "reload.", "scale.")

# What a finished reload calls with (model_path, served_name).
ModelChange = Callable[[str | None, str | None], Coroutine[Any, Any, None]]


class SupervisorLink:
    """Listens to the supervisor at ``ops_endpoint`` (None: nothing to listen to) for ``pool``,
    and asks and reports to it through ``queries``.
    ``tp_size`` maps a scheduler rank in an ops topic to its replica; ``probe_timeout_s`` bounds
    a joining replica's probe; ``on_model_change`` is what a finished reload runs,
    ``on_model_coming`` (same arguments, not awaited) what a starting one calls."""

    CATCH_UP_S = 2.0  # while a replica restarts or a change runs: how often to ask for events

    def __init__(
        self,
        pool: ReplicaPool,
        dispatcher: Dispatcher,
        queries: QuerySocket,
        ops_endpoint: str | None = None,
        *,
        tp_size: int = 1,
        metrics: Metrics | None = None,
        probe_timeout_s: float = 60.0,
        on_model_change: ModelChange | None = None,
        on_model_coming: Callable[[str | None, str | None], None] | None = None,
    ) -> None:
        self.pool = pool
        self.dispatcher = dispatcher
        self.queries = queries
        self.ops_endpoint = ops_endpoint or None
        self.tp_size = max(tp_size, 1)
        self.metrics = metrics
        self.probe_timeout_s = probe_timeout_s
        self.on_model_change = on_model_change
        self.on_model_coming = on_model_coming
        self.seq = 0  # the last supervisor event applied
        self._tasks: set[asyncio.Task[Any]] = set()
        self._model_change: asyncio.Task[None] | None = None

    def start(self, zctx: zmq.asyncio.Context) -> None:
        """Subscribe and start listening (on the event loop); ``close`` ends it."""
        if self.ops_endpoint:
            sub = zctx.socket(zmq.SUB)
            sub.setsockopt(zmq.LINGER, 0)
            for prefix in OPS_TOPICS:
                sub.setsockopt(zmq.SUBSCRIBE, prefix.encode())
            sub.connect(self.ops_endpoint)
            self._start(self._listen(sub))
        if self.queries.endpoint:
            self._start(self._catch_up_while_waiting())

    async def close(self) -> None:
        """Stop listening, and cancel the probes, reports and model change still running."""
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    def _start(self, work: Coroutine[Any, Any, Any]) -> asyncio.Task[Any]:
        """Run ``work`` in a task of the link's (cancelled with the others on close)."""
        task = asyncio.ensure_future(work)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    async def _listen(self, sub: zmq.asyncio.Socket) -> None:
        try:
            while True:
                frames = await sub.recv_multipart()
                try:
                    event = events.decode(frames[-1])
                except events.EventError as exc:
                    log.warning("ignored a frame on the ops subscription: %s", exc)
                    continue
                if event.seq <= self.seq:
                    continue  # applied already, by a catch-up
                self.seq = event.seq
                self.apply(event)
        except asyncio.CancelledError:
            raise
        except Exception:  # noqa: BLE001
            log.exception("ops subscription stopped")
        finally:
            sub.close(0)

    async def _catch_up_while_waiting(self) -> None:
        """While a replica restarts or a change runs, ask every ``CATCH_UP_S`` for the events
        not seen: a lost ``replica.<dp>.ready`` or ``replica.<dp>.joining`` would otherwise
        keep a replica out of routing for good."""
        while True:
            await asyncio.sleep(self.CATCH_UP_S)
            pool = self.pool
            if pool.changing or (pool.heals and any(r.dead_reason for r in pool.replicas)):
                await self.catch_up()

    async def catch_up(self) -> None:
        """Apply, in order, the supervisor's events numbered above the last one applied."""
        reply = await self.queries.ask({"query": "events", "after": self.seq})
        entries = reply.get("events") if reply is not None else None
        if not isinstance(entries, list):
            return
        try:
            missed = [events.from_dict(entry) for entry in entries]
        except events.EventError as exc:
            log.warning("could not read the supervisor's missed events: %s", exc)
            return
        for event in missed:
            if event.seq > self.seq:
                self.seq = event.seq
                if event.topic.startswith(OPS_TOPICS):  # what the subscription would have delivered
                    self.apply(event)

    # ---- what each event means -------------------------------------------------------------

    def apply(self, event: events.Event) -> None:
        """Apply one supervisor event to the pool."""
        pool = self.pool
        match event:
            case events.ServerFailed():
                pool.fail(f"the supervisor reported {event.topic}: {event.root_cause.summary}")
            case events.ServerStopping():
                pool.fail(f"the supervisor reported {event.topic}: {event.reason}")
            case events.ReplicaRestarting():
                rep = pool.replica(event.dp_rank)
                if rep is not None:
                    if self.metrics is not None:
                        self.metrics.count_restart(rep.dp_rank)
                    pool.mark_dead(rep, f"restarting: {event.cause or 'it failed'}")
            case events.ReplicaReady():
                rep = pool.replica(event.dp_rank)
                if rep is not None:
                    pool.revive(rep)
                    self._start(self.dispatcher.ping(rep, self.probe_timeout_s))  # its kind
            case events.ReplicaJoining():
                rep = pool.join(event.dp_rank)
                if event.probe:
                    self._start(self._probe(event.dp_rank, rep))
            case events.ReplicaServing():
                pool.serve(event.dp_rank)
                rep = pool.replica(event.dp_rank)
                if rep is not None and rep.kind is None:
                    self._start(self.dispatcher.ping(rep, self.probe_timeout_s))
            case events.ReplicaDraining():
                emptied = pool.drain(event.dp_rank, in_place=event.in_place)
                self._start(self._report_drained(event.dp_rank, emptied))
            case events.ReplicaReplaced() | events.ReplicaRemoved():
                pool.forget(event.dp_rank)
            case events.ReloadStarted() | events.ScaleStarted():
                pool.change_started()
                if isinstance(event, events.ReloadStarted) and self.on_model_coming is not None:
                    self.on_model_coming(event.model_path, event.served_name)
                if isinstance(event, events.ScaleStarted):
                    pool.set_heals(event.restart_policy == "on-failure")
            case events.ReloadFinished():
                log.info("serving %s (%s) from now on", event.served_name, event.model_path)
                if self.on_model_change is not None:
                    if self._model_change is not None:
                        self._model_change.cancel()  # a newer model replaces it
                    change = self.on_model_change(event.model_path, event.served_name)
                    self._model_change = self._start(change)
                pool.change_ended()
            case events.ReloadFailed():
                pool.change_ended()
            case events.ScaleFinished() | events.ScaleFailed():
                pool.set_heals(event.restart_policy == "on-failure")
                pool.change_ended()
            case events.WorkerFailed() | events.WorkerStopped() | events.WorkerExited():
                if event.role == "scheduler":
                    rep = pool.replica(event.rank // self.tp_size)
                    if rep is not None and not rep.draining:
                        why = f"the supervisor reported {event.topic}"
                        if isinstance(event, events.WorkerFailed):  # its error says who failed
                            why += f": {event.error.type.rsplit('.', 1)[-1]}: {event.error.message}"
                        pool.mark_dead(rep, why)

    # ---- a joining replica's probe, a draining replica's end ------------------------------

    async def _probe(self, dp_rank: int, rep: Replica | None) -> None:
        """Ask ``rep`` what it serves, send it one request of that kind, route to it when it
        answered, and report how it went (``replica.probed``)."""
        error: str | None = "the HTTP child has no address for it" if rep is None else None
        timeout = self.probe_timeout_s
        try:
            if rep is not None:
                pong = await self.dispatcher.pong(rep, timeout)
                if pong.kind in PROBED_KINDS:
                    make = probe_request(pong.kind)
                    answer = await asyncio.wait_for(self.dispatcher.one(make, rep), timeout)
                    error = probe_problem(answer)
        except SchedulerError as exc:
            error = exc.message
        except TimeoutError:
            error = f"no answer within {timeout:g}s"
        if error is None:
            log.info("scheduler dp=%d answered its probe", dp_rank)
            self.pool.serve(dp_rank)
        else:
            log.error("scheduler dp=%d failed its probe: %s", dp_rank, error)
            self.pool.forget(dp_rank)
        await self.queries.report(
            {"query": "replica.probed", "dp_rank": dp_rank, "ok": error is None, "error": error}
        )

    async def _report_drained(self, dp_rank: int, emptied: asyncio.Future[None]) -> None:
        await emptied  # cancelled (and so is this) when the replica is forgotten first
        await self.queries.report({"query": "replica.drained", "dp_rank": dp_rank})


class QuerySocket:
    """The supervisor's query socket at ``endpoint`` (``ctx.query_endpoint``; None: there is
    none), as the HTTP child asks it: a REQ socket per question."""

    def __init__(self, endpoint: str | None) -> None:
        self.endpoint = endpoint or None
        self._zctx: zmq.asyncio.Context | None = None

    def start(self, zctx: zmq.asyncio.Context) -> None:
        """Ask through sockets of ``zctx`` from now on."""
        self._zctx = zctx

    async def report(self, request: dict[str, object]) -> bool:
        """Tell the supervisor ``request`` (``replica.probed``, ``replica.drained``); whether
        it took it."""
        reply = await self.ask(request)
        return bool(reply and reply.get("ok"))

    async def query(self, request: dict[str, object], timeout: float = 5.0) -> dict[str, Any]:
        """The supervisor's answer to ``request`` on its query socket (``{"query": "snapshot"}``,
        ``{"query": "events", "after": N}``); ``LookupError`` when it did not answer within
        ``timeout``, could not be asked or refused."""
        if not self.endpoint or self._zctx is None:
            raise LookupError("this HTTP child knows no supervisor query socket")
        sock = self._zctx.socket(zmq.REQ)
        sock.setsockopt(zmq.LINGER, 0)
        try:
            sock.connect(self.endpoint)
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

    async def ask(self, request: dict[str, object]) -> dict[str, Any] | None:
        """``query(request)``, or None (logged) when there was no answer."""
        try:
            return await self.query(request)
        except LookupError as exc:
            log.warning("%s", exc)
            return None
