"""The HTTP child's parts against stand-ins for its schedulers and its supervisor, on real
ZeroMQ sockets (no model, no process):

- ``joined(endpoints, ...)``: a ``ReplicaPool``, its ``Dispatcher`` and its ``SupervisorLink``,
  connected as the server joins them (``server.connected``), until ``Parts.close()``;
- ``FakeReplica``: a scheduler's ROUTER socket that answers at once (or holds), its ``Pong``
  naming the kind it serves, and dies like a killed process;
- ``ReportingSupervisor``: the supervisor's query socket, keeping every report;
- the supervisor's events as it builds them (``restarting``, ``ready_again``, ``joining``,
  ``serving``, ``draining``, ``reload_started``, ``reload_finished``), and ``until`` to poll.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json

import msgspec

from launchspec import events
from launchspec.causes import RootCause
from serving import wire
from serving.http.dispatcher import Dispatcher
from serving.http.pool import ReplicaPool
from serving.http.server import connected
from serving.http.supervisor_link import QuerySocket, SupervisorLink


@dataclasses.dataclass
class Parts:
    """A pool, its dispatcher and its supervisor link, connected until ``close()``."""

    pool: ReplicaPool
    dispatcher: Dispatcher
    link: SupervisorLink
    running: contextlib.AsyncExitStack

    async def close(self) -> None:
        await self.running.aclose()


async def joined(
    endpoints,
    *,
    ops=None,
    query=None,
    heals=False,
    endpoint_of=None,
    wait_s=60.0,
    metrics=None,
    on_model_change=None,
    catch_up_s=None,
) -> Parts:
    """A pool of ``endpoints``, its dispatcher and its supervisor link, connected as the server
    joins them."""
    pool = ReplicaPool(endpoints, metrics=metrics, heals=heals, endpoint_of=endpoint_of)
    dispatcher = Dispatcher(pool, wait_s=wait_s)
    queries = QuerySocket(query)
    link = SupervisorLink(
        pool, dispatcher, queries, ops, metrics=metrics, on_model_change=on_model_change
    )
    if catch_up_s is not None:
        link.CATCH_UP_S = catch_up_s
    running = contextlib.AsyncExitStack()
    await running.enter_async_context(connected(pool, queries, link))
    return Parts(pool, dispatcher, link, running)


# The supervisor's events, as it builds them.
def restarting(dp: int, cause: str = "killed") -> events.ReplicaRestarting:
    return events.ReplicaRestarting(
        replica=f"scheduler dp={dp}",
        dp_rank=dp,
        workers=[f"scheduler.{dp}"],
        attempt=1,
        max_restarts=3,
        backoff_s=0.0,
        cause=cause,
        root_cause=RootCause(cause, worker=f"scheduler.{dp}"),
    )


def ready_again(dp: int) -> events.ReplicaReady:
    return events.ReplicaReady(
        replica=f"scheduler dp={dp}", dp_rank=dp, attempt=1, down_s=0.1, pids=[None]
    )


def server_ready() -> events.ServerReady:
    return events.ServerReady(url=None, node_rank=0, worker_count=2, startup_s=0.1)


def joining(dp: int, probe: bool = True) -> events.ReplicaJoining:
    return events.ReplicaJoining(
        replica=f"scheduler dp={dp}",
        dp_rank=dp,
        change="reload",
        pids=[None],
        startup_s=0.1,
        model_path="/m",
        served_name="m",
        probe=probe,
    )


def serving(dp: int) -> events.ReplicaServing:
    return events.ReplicaServing(
        replica=f"scheduler dp={dp}", dp_rank=dp, change="reload", probe_s=None
    )


def draining(dp: int, in_place: bool = False) -> events.ReplicaDraining:
    return events.ReplicaDraining(
        replica=f"scheduler dp={dp}", dp_rank=dp, change="reload", in_place=in_place
    )


def reload_started(model_path: str = "/m", served_name: str = "m") -> events.ReloadStarted:
    return events.ReloadStarted(
        id=1,
        reason="test",
        replicas=[0],
        surge=1,
        model_path=model_path,
        served_name=served_name,
        previous_model_path=None,
        previous_served_name=None,
        changes=[],
    )


def reload_finished(model_path: str = "/n", served_name: str = "n") -> events.ReloadFinished:
    return events.ReloadFinished(
        id=1, replicas=[2], model_path=model_path, served_name=served_name, seconds=1.0
    )


class FakeReplica:
    """A scheduler stand-in on a real ROUTER socket: answers pings (its ``Pong`` says ``kind``)
    and embeddings at once; a generation stream gets one chunk and then nothing; ``hold=True``:
    keeps requests unanswered (the process is busy when it dies). ``die()`` closes the socket the
    way a killed process does."""

    def __init__(
        self, zctx, endpoint: str, dp_rank: int, hold: bool = False, kind: str = "embedding"
    ) -> None:
        import zmq

        self.sock = zctx.socket(zmq.ROUTER)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.bind(endpoint)
        self.dp_rank, self.hold, self.kind = dp_rank, hold, kind
        self.received: list = []
        self.task = asyncio.ensure_future(self._serve())

    async def _serve(self) -> None:
        while True:
            identity, frame = await self.sock.recv_multipart()
            msg = wire.decode_to_scheduler(frame)
            if isinstance(msg, wire.Ping):
                reply = wire.Pong(msg.rid, self.dp_rank, 1, "fake", self.kind, 0)
            elif isinstance(msg, wire.Cancel):
                continue
            else:
                self.received.append(msg)
                if self.hold:
                    continue
                if isinstance(msg, wire.GenerateRequest) and msg.stream:
                    reply = wire.Generated(msg.rid, f"dp={self.dp_rank}", 1, 1, finished=False)
                elif isinstance(msg, wire.GenerateRequest):
                    reply = wire.Generated(msg.rid, f"from dp={self.dp_rank}", 1, 1)
                else:
                    reply = wire.Embeddings(msg.rid, b"\0\0\0\0", 1, 1)
            await self.sock.send_multipart([identity, wire.encode(reply)])

    async def die(self) -> None:
        self.task.cancel()
        await asyncio.gather(self.task, return_exceptions=True)
        self.sock.close(0)


async def until(condition, what: str, timeout: float = 10.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while not condition():
        assert asyncio.get_running_loop().time() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.01)


class ReportingSupervisor:
    """The supervisor's query socket on real ZeroMQ, keeping every report the client sends."""

    def __init__(self, zctx, folder) -> None:
        import zmq

        self.query = f"ipc://{folder}/query-reports.sock"
        self.rep = zctx.socket(zmq.REP)
        self.rep.bind(self.query)
        self.reports: list[dict] = []
        self.task = asyncio.ensure_future(self._answer())

    async def _answer(self) -> None:
        while True:
            request = json.loads(await self.rep.recv())
            if request["query"] != "events":
                self.reports.append(request)
            await self.rep.send(msgspec.json.encode({"ok": True, "events": []}))

    async def close(self) -> None:
        self.task.cancel()
        await asyncio.gather(self.task, return_exceptions=True)
        self.rep.close(0)
