"""The HTTP child's link to its supervisor: the events it follows, those it missed, the reports
it sends back.

``SupervisorLink`` subscribes to the supervisor's ops events (``launchspec.events``, topics
``OPS_TOPICS``) and applies each to the ``SchedulerClient``:

- a scheduler rank's ``WORKER_GONE`` events, ``replica.<dp>.restarting`` and ``server.failed`` /
  ``server.stopping`` mark replicas (or the server) gone; ``replica.<dp>.ready`` brings a
  restarted replica back;
- a reload's or a scale's ``replica.<dp>.joining`` connects the new replica and probes it with
  one request, which ``replica.probed`` reports to the supervisor; ``replica.<dp>.serving`` routes
  to it (when there was no probe); ``replica.<dp>.draining`` routes nothing more to a replica
  and ``replica.drained`` reports it once it holds no request; ``replica.<dp>.replaced`` /
  ``removed`` forget it; ``reload.*`` / ``scale.*`` say a change is under way (a request that
  finds no replica serving then waits for one) and ``reload.finished`` names the model served
  from then on.

Reports go to the supervisor's query socket (``ctx.query_endpoint``), a REQ per report. A lost
event must not keep a replica out of routing: while a replica restarts or a change is under way,
every ``CATCH_UP_S`` seconds the link asks the query socket for the events numbered above the
last one it applied, and applies them in order. (The numbers skip anyway between the topics it
subscribes to, so a skip alone proves no loss.)
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from launchspec import events
from serving import wire as messages

if TYPE_CHECKING:
    import zmq.asyncio

    from serving.http.client import MakeRequest, Replica, SchedulerClient

log = logging.getLogger("sglang_launch.http")

# The supervisor events the client uses.
OPS_TOPICS = ("worker.scheduler.", "server.", "replica.", "reload.", "scale.")
PROBE_TEXT = "reload probe"
PROBED_KINDS = ("embedding", "generation", "image")  # the kinds that have a probe request


class SupervisorLink:
    """Follows the supervisor at ``ops_endpoint`` for ``client`` and reports to it at
    ``query_endpoint`` (either may be None: nothing to follow, nowhere to report)."""

    CATCH_UP_S = 2.0  # while a replica restarts or a change runs: how often to ask for events

    def __init__(
        self, client: SchedulerClient, ops_endpoint: str | None, query_endpoint: str | None
    ) -> None:
        self.client = client
        self.ops_endpoint = ops_endpoint or None
        self.query_endpoint = query_endpoint or None
        self.seq = 0  # the last supervisor event applied
        self.changing = False  # a reload or a scale is under way
        self._zctx: zmq.asyncio.Context | None = None
        self._tasks: list[asyncio.Task[None]] = []
        client.on_drained = self._drained
        # Called with (model_path, served_name) when a reload changed the model served.
        self.on_model_change: Callable[[str | None, str | None], None] | None = None

    def start(self, zctx: zmq.asyncio.Context) -> list[asyncio.Task[None]]:
        """Subscribe and start following; the tasks to cancel on close."""
        import zmq

        self._zctx = zctx
        tasks = []
        if self.ops_endpoint:
            sub = zctx.socket(zmq.SUB)
            sub.setsockopt(zmq.LINGER, 0)
            for prefix in OPS_TOPICS:
                sub.setsockopt(zmq.SUBSCRIBE, prefix.encode())
            sub.connect(self.ops_endpoint)
            tasks.append(asyncio.create_task(self._follow(sub)))
        if self.query_endpoint:
            tasks.append(asyncio.create_task(self._catch_up_while_waiting()))
        self._tasks = tasks
        return tasks

    def _start(self, work: Awaitable[object]) -> None:
        """Run ``work`` in a task of the link's (cancelled with the others on close)."""

        async def run() -> None:
            await work

        self._tasks[:] = [t for t in self._tasks if not t.done()]
        self._tasks.append(asyncio.ensure_future(run()))

    async def _follow(self, sub: zmq.asyncio.Socket) -> None:
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

    async def _catch_up_while_waiting(self) -> None:
        """While a replica restarts or a change runs, ask every ``CATCH_UP_S`` for the events
        not seen: a lost ``replica.<dp>.ready`` or ``replica.<dp>.joining`` would otherwise
        keep a replica out of routing for good."""
        while True:
            await asyncio.sleep(self.CATCH_UP_S)
            client = self.client
            if self.changing or (client.heals and any(r.dead_reason for r in client.replicas)):
                await self.catch_up()

    async def catch_up(self) -> None:
        """Apply, in order, the supervisor's events numbered above the last one applied."""
        reply = await self._ask({"query": "events", "after": self.seq})
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

    async def report(self, request: dict[str, object]) -> bool:
        """Tell the supervisor ``request`` (``replica.probed``, ``replica.drained``); whether
        it took it."""
        reply = await self._ask(request)
        return bool(reply and reply.get("ok"))

    async def query(self, request: dict[str, object], timeout: float = 5.0) -> dict[str, Any]:
        """The supervisor's answer to ``request`` on its query socket; ``LookupError`` when it
        did not answer within ``timeout``, could not be asked or refused."""
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

    async def _ask(self, request: dict[str, object]) -> dict[str, Any] | None:
        """``query(request)``, or None (logged) when there was no answer."""
        try:
            return await self.query(request)
        except LookupError as exc:
            log.warning("%s", exc)
            return None

    # ---- what each event means -------------------------------------------------------------

    def apply(self, event: events.Event) -> None:
        """Apply one supervisor event to the client."""
        client = self.client
        match event:
            case events.ServerFailed():
                client.server_failure = (
                    f"the supervisor reported {event.topic}: {event.root_cause.summary}"
                )
                client.wake_waiters()
            case events.ServerStopping():
                client.server_failure = f"the supervisor reported {event.topic}: {event.reason}"
                client.wake_waiters()
            case events.ReplicaRestarting():
                rep = client.replica(event.dp_rank)
                if rep is not None:
                    if client.metrics is not None:
                        client.metrics.count_restart(rep.dp_rank)
                    client.mark_dead(rep, f"restarting: {event.cause or 'it failed'}")
            case events.ReplicaReady():
                rep = client.replica(event.dp_rank)
                if rep is not None:
                    client.revive(rep)
            case events.ReplicaJoining():
                rep = client.join(event.dp_rank)
                if event.probe:
                    self._start(self._probe(event.dp_rank, rep))
            case events.ReplicaServing():
                client.serve(event.dp_rank)
            case events.ReplicaDraining():
                client.drain(event.dp_rank, in_place=event.in_place)
            case events.ReplicaReplaced() | events.ReplicaRemoved():
                client.forget(event.dp_rank)
            case events.ReloadStarted() | events.ScaleStarted():
                self.changing = True
                if isinstance(event, events.ScaleStarted):
                    client.heals = event.restart_policy == "on-failure"
            case events.ReloadFinished():
                self.changing = False
                log.info("serving %s (%s) from now on", event.served_name, event.model_path)
                if self.on_model_change is not None:
                    self.on_model_change(event.model_path, event.served_name)
                client.wake_waiters()
            case events.ReloadFailed():
                self.changing = False
                client.wake_waiters()
            case events.ScaleFinished() | events.ScaleFailed():
                self.changing = False
                client.heals = event.restart_policy == "on-failure"
                client.wake_waiters()
            case events.WorkerFailed() | events.WorkerStopped() | events.WorkerExited():
                if event.role == "scheduler":
                    rep = client.replica(event.rank // client.tp_size)
                    if rep is not None and not rep.draining:
                        client.mark_dead(rep, f"the supervisor reported {event.topic}")

    # ---- a joining replica's probe, a draining replica's end ------------------------------

    async def _probe(self, dp_rank: int, rep: Replica | None) -> None:
        """Send ``rep`` one request of its model's kind, route to it when it answered, and
        report how it went (``replica.probed``)."""
        from serving.http.client import SchedulerError

        client = self.client
        error: str | None = "the HTTP child has no address for it" if rep is None else None
        timeout = client.probe_timeout_s
        try:
            if rep is not None:
                pong = await asyncio.wait_for(client.one(messages.Ping, rep), timeout)
                if pong.kind in PROBED_KINDS:
                    make = probe_request(pong.kind)
                    error = probe_problem(await asyncio.wait_for(client.one(make, rep), timeout))
        except SchedulerError as exc:
            error = exc.message
        except TimeoutError:
            error = f"no answer within {timeout:g}s"
        if error is None:
            log.info("scheduler dp=%d answered its probe", dp_rank)
            client.serve(dp_rank)
        else:
            log.error("scheduler dp=%d failed its probe: %s", dp_rank, error)
            client.forget(dp_rank)
        await self.report(
            {"query": "replica.probed", "dp_rank": dp_rank, "ok": error is None, "error": error}
        )

    def _drained(self, dp_rank: int) -> None:
        self._start(self.report({"query": "replica.drained", "dp_rank": dp_rank}))


def probe_request(kind: str | None, purpose: str = PROBE_TEXT) -> MakeRequest:
    """The smallest request of a model of ``kind``: one vector, one greedy token, one denoising
    step; a ping for a kind the HTTP child has no request of. ``purpose`` is its text (and its
    fairness group), so that a scheduler's log tells a probe from a user's request."""
    if kind == "embedding":
        return lambda rid: messages.EmbedRequest(rid, [purpose])
    if kind == "generation":
        params = messages.SamplingParams(max_new_tokens=1, temperature=0.0, ignore_eos=True)
        return lambda rid: messages.GenerateRequest(rid, purpose, params, group=purpose)
    if kind == "image":
        return lambda rid: messages.ImageRequest(rid, purpose, steps=1)
    return messages.Ping


def probe_problem(reply: object) -> str | None:
    """What is wrong with a probe's answer (None: it is one)."""
    if isinstance(reply, messages.Embeddings):
        return None if reply.dim > 0 and reply.vectors else "it answered an empty embedding"
    if isinstance(reply, messages.Generated):
        return None
    if isinstance(reply, messages.Images):
        return None if reply.images else "it answered no image"
    return f"it answered {type(reply).__name__}, not a result"
