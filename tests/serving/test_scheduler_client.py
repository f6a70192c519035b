"""The HTTP child's scheduler client on real ZeroMQ sockets, without a model behind them."""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path

import msgspec
import pytest

from launchspec import events
from launchspec.causes import RootCause
from serving import wire as messages
from serving.http.client import SchedulerClient, SchedulerError

ROOT = Path(__file__).resolve().parents[2]


# The supervisor's events, as it builds them.
def _restarting(dp: int, cause: str = "killed") -> events.ReplicaRestarting:
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


def _ready_again(dp: int) -> events.ReplicaReady:
    return events.ReplicaReady(
        replica=f"scheduler dp={dp}", dp_rank=dp, attempt=1, down_s=0.1, pids=[None]
    )


def _server_ready() -> events.ServerReady:
    return events.ServerReady(url=None, node_rank=0, worker_count=2, startup_s=0.1)


def test_a_replica_that_stops_reading_gets_a_503_once_its_queue_is_full(tmp_path):
    """Nothing reads the replica's socket (bound, never served): requests queue in ZeroMQ up to its
    high-water mark, and the next one is refused at once with a 503 naming the replica, rather
    than waiting without end. Requests still queued are cancelled cleanly."""
    import zmq

    endpoint = f"ipc://{tmp_path}/stuck.sock"
    zctx = zmq.Context()
    stuck = zctx.socket(zmq.ROUTER)
    stuck.setsockopt(zmq.LINGER, 0)
    stuck.setsockopt(zmq.RCVHWM, 1)
    stuck.bind(endpoint)

    async def scenario():
        client = SchedulerClient([endpoint])
        await client.start()
        waiting = []
        try:
            for _ in range(100_000):
                task = asyncio.ensure_future(
                    client.one(lambda rid: messages.EmbedRequest(rid, ["x"]))
                )
                waiting.append(task)
                await asyncio.sleep(0)  # let it send
                if task.done():
                    break
            refused = waiting.pop()
            with pytest.raises(SchedulerError) as info:
                refused.result()
            assert info.value.status == 503 and "dp=0" in info.value.message, info.value.message
            assert "retry" in info.value.message
            assert all(not t.done() for t in waiting) and len(waiting) >= 100
            assert len(client.replicas[0].inflight) == len(waiting)
        finally:
            for task in waiting:
                task.cancel()
            await asyncio.gather(*waiting, return_exceptions=True)
            assert client.replicas[0].inflight == set()
            await client.close()

    try:
        asyncio.run(scenario())
    finally:
        stuck.close(0)
        zctx.term()


# -- a replica that dies and comes back ----------------------------------------------------------
class FakeReplica:
    """A scheduler stand-in on a real ROUTER socket: answers pings and embeddings at once; a
    generation stream gets one chunk and then nothing; ``hold=True``: keeps requests unanswered
    (the process is busy when it dies). ``die()`` closes the socket the way a killed process does."""

    def __init__(self, zctx, endpoint: str, dp_rank: int, hold: bool = False) -> None:
        import zmq

        self.sock = zctx.socket(zmq.ROUTER)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.bind(endpoint)
        self.dp_rank, self.hold = dp_rank, hold
        self.received: list = []
        self.task = asyncio.ensure_future(self._serve())

    async def _serve(self) -> None:
        while True:
            identity, frame = await self.sock.recv_multipart()
            msg = messages.decode_to_scheduler(frame)
            if isinstance(msg, messages.Ping):
                reply = messages.Pong(msg.rid, self.dp_rank, 1, "fake", "embedding", 0)
            elif isinstance(msg, messages.Cancel):
                continue
            else:
                self.received.append(msg)
                if self.hold:
                    continue
                if isinstance(msg, messages.GenerateRequest) and msg.stream:
                    reply = messages.Generated(msg.rid, f"dp={self.dp_rank}", 1, 1, finished=False)
                elif isinstance(msg, messages.GenerateRequest):
                    reply = messages.Generated(msg.rid, f"from dp={self.dp_rank}", 1, 1)
                else:
                    reply = messages.Embeddings(msg.rid, b"\0\0\0\0", 1, 1)
            await self.sock.send_multipart([identity, messages.encode(reply)])

    async def die(self) -> None:
        self.task.cancel()
        await asyncio.gather(self.task, return_exceptions=True)
        self.sock.close(0)


async def _until(condition, what: str, timeout: float = 10.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while not condition():
        assert asyncio.get_running_loop().time() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.01)


def test_in_flight_requests_on_a_dying_replica_are_answered_by_another_then_it_is_routed_to_again(
    tmp_path,
):
    """``heals``: replica 0 dies holding an embedding and a non-streamed generation; both are
    answered by replica 1, the client stays healthy and names dp=0 as restarting; after the
    supervisor's ``replica.0.ready`` a fresh process at the same address gets requests again."""
    import zmq.asyncio

    from serving.http.metrics import Metrics

    eps = [f"ipc://{tmp_path}/r0.sock", f"ipc://{tmp_path}/r1.sock"]

    async def scenario():
        zctx = zmq.asyncio.Context()
        dying = FakeReplica(zctx, eps[0], 0, hold=True)
        other = FakeReplica(zctx, eps[1], 1, hold=True)
        metrics = Metrics()
        client = SchedulerClient(eps, heals=True, metrics=metrics)
        await client.start()
        try:
            await _until(lambda: all(r.connected for r in client.replicas), "both connections")

            def embed(text):
                return asyncio.ensure_future(
                    client.one(lambda rid: messages.EmbedRequest(rid, [text]), None)
                )

            first, held = embed("a"), embed("b")  # one each: dp=0, then dp=1
            await _until(lambda: len(other.received) == 1, "one request at replica 1")
            params = messages.SamplingParams()
            gen = asyncio.ensure_future(
                client.one(lambda rid: messages.GenerateRequest(rid, "hi", params), None)
            )
            await _until(lambda: len(dying.received) == 2, "two requests at replica 0")
            other.hold = False
            await dying.die()
            assert isinstance(await first, messages.Embeddings)
            assert (await gen).text == "from dp=1"
            assert client.healthy and client.restarting == [0]
            assert len(other.received) == 3
            held.cancel()

            client.link.apply(_restarting(0, "killed"))  # the supervisor's
            assert (
                'sglang_launch_replica_restarts_total{dp="0"} 1.0' in metrics.render()[0].decode()
            )
            reborn = FakeReplica(zctx, eps[0], 0)
            client.link.apply(_ready_again(0))
            assert client.restarting == [] and client.healthy
            await _until(lambda: client.replicas[0].connected, "dp=0 connected again")
            pongs = await client.ping_all(timeout=5)
            assert [p.dp_rank for p in pongs if p] == [0, 1]
            await client.one(lambda rid: messages.EmbedRequest(rid, ["y"]), None)
            assert len(reborn.received) == 1  # least loaded, lowest rank: the restarted one
            await reborn.die()
            await other.die()
        finally:
            await client.close()
            zctx.destroy(0)

    asyncio.run(scenario())


def test_a_stream_that_sent_output_fails_when_its_replica_dies_one_that_sent_none_moves(tmp_path):
    import zmq.asyncio

    eps = [f"ipc://{tmp_path}/s0.sock", f"ipc://{tmp_path}/s1.sock"]
    params = messages.SamplingParams()

    def stream(rid):
        return messages.GenerateRequest(rid, "hi", params, True)

    async def scenario():
        zctx = zmq.asyncio.Context()
        dying = FakeReplica(zctx, eps[0], 0)
        quiet = FakeReplica(zctx, eps[1], 1, hold=True)
        client = SchedulerClient(eps, heals=True)
        await client.start()
        try:
            await _until(lambda: all(r.connected for r in client.replicas), "both connections")
            started = client.call(stream)
            first = await started.__anext__()  # one chunk reached the client from replica 0
            assert first.text == "dp=0"
            await dying.die()
            with pytest.raises(SchedulerError) as info:
                await started.__anext__()
            assert info.value.status == 503 and "dp=0" in info.value.message
            await started.aclose()

            # Replica 1 dies before its stream produced anything: the stream moves to dp=0's
            # successor, and the client sees only that one's output.
            reborn = FakeReplica(zctx, eps[0], 0, hold=True)
            client.link.apply(_ready_again(0))
            # Ties go to a connected replica: once dp=0's fresh connection is up it is the pick.
            await _until(lambda: client.replicas[0].connected, "dp=0 connected again")
            filler = asyncio.ensure_future(client.one(stream))  # keeps dp=0 the busier one
            await _until(lambda: len(reborn.received) == 1, "a request at dp=0")
            waiting = client.call(stream, None)
            moving = asyncio.ensure_future(waiting.__anext__())
            await _until(lambda: len(quiet.received) == 1, "the stream at replica 1")
            reborn.hold = False
            await quiet.die()
            assert (await moving).text == "dp=0" and len(reborn.received) == 2
            await waiting.aclose()
            filler.cancel()
        finally:
            await client.close()
            zctx.destroy(0)

    asyncio.run(scenario())


class FakeSupervisor:
    """The supervisor's ops sockets on real ZeroMQ: a PUB that publishes only what ``publish``
    is given (so a test can lose an event) and a query REP answering ``events`` from the whole
    ``history``, as the launcher's does."""

    def __init__(self, zctx, folder) -> None:
        import zmq

        self.ops, self.query = f"ipc://{folder}/ops.sock", f"ipc://{folder}/query.sock"
        self.pub = zctx.socket(zmq.PUB)
        self.pub.bind(self.ops)
        self.rep = zctx.socket(zmq.REP)
        self.rep.bind(self.query)
        self.history: list[events.Event] = []
        self.queries = 0
        self.task = asyncio.ensure_future(self._answer())

    def emit(self, event: events.Event, publish: bool = True) -> None:
        event = msgspec.structs.replace(event, seq=len(self.history) + 1)
        self.history.append(event)
        if publish:
            self.pub.send_multipart([event.topic.encode(), events.encode(event)])

    async def _answer(self) -> None:
        while True:
            request = json.loads(await self.rep.recv())
            self.queries += 1
            missed = [e for e in self.history if e.seq > request["after"]]
            await self.rep.send(msgspec.json.encode({"ok": True, "events": missed}))

    async def close(self) -> None:
        self.task.cancel()
        await asyncio.gather(self.task, return_exceptions=True)
        self.pub.close(0)
        self.rep.close(0)


def test_a_lost_ready_event_is_fetched_from_the_supervisor(tmp_path):
    """The supervisor's ``replica.0.ready`` never reaches the client's subscription (PUB/SUB
    drops what it cannot deliver): while dp=0 restarts, the client asks the query socket for the
    events it has not seen, applies them, and routes to the restarted replica again."""
    import zmq.asyncio

    eps = [f"ipc://{tmp_path}/q0.sock", f"ipc://{tmp_path}/q1.sock"]

    async def scenario():
        zctx = zmq.asyncio.Context()
        sup = FakeSupervisor(zctx, tmp_path)
        dying, other = FakeReplica(zctx, eps[0], 0), FakeReplica(zctx, eps[1], 1)
        client = SchedulerClient(eps, ops_endpoint=sup.ops, query_endpoint=sup.query, heals=True)
        client.link.CATCH_UP_S = 0.05
        await client.start()
        try:
            await _until(lambda: all(r.connected for r in client.replicas), "both connections")
            deadline = asyncio.get_running_loop().time() + 10
            while client.link.seq == 0:  # until the subscription delivers (a slow joiner)
                assert asyncio.get_running_loop().time() < deadline, "no event ever arrived"
                sup.emit(_server_ready())
                await asyncio.sleep(0.05)
            await dying.die()
            sup.emit(_restarting(0))
            await _until(lambda: client.restarting == [0], "dp=0 seen restarting")
            reborn = FakeReplica(zctx, eps[0], 0)
            sup.emit(_ready_again(0), publish=False)  # lost on the way
            await _until(lambda: client.restarting == [], "dp=0 back through a catch-up")
            await _until(lambda: client.replicas[0].connected, "dp=0 connected again")
            await client.one(lambda rid: messages.EmbedRequest(rid, ["x"]), None)
            assert len(reborn.received) == 1 and sup.queries >= 1

            await reborn.die()
            await other.die()
        finally:
            await client.close()
            await sup.close()
            zctx.destroy(0)

    asyncio.run(scenario())


def test_without_healing_one_dead_replica_makes_the_client_unhealthy(tmp_path):
    import zmq.asyncio

    eps = [f"ipc://{tmp_path}/n0.sock", f"ipc://{tmp_path}/n1.sock"]

    async def scenario():
        zctx = zmq.asyncio.Context()
        dying, other = FakeReplica(zctx, eps[0], 0), FakeReplica(zctx, eps[1], 1)
        client = SchedulerClient(eps)
        await client.start()
        try:
            await _until(lambda: all(r.connected for r in client.replicas), "both connections")
            await dying.die()
            await _until(lambda: not client.healthy, "replica 0 to be seen dead")
            assert "scheduler dp=0" in client.unhealthy_reason and client.restarting == []
            await other.die()
        finally:
            await client.close()
            zctx.destroy(0)

    asyncio.run(scenario())


_CLOSE_AS_REPLICAS_DIE = """
import asyncio, sys, tempfile, zmq, zmq.asyncio
from serving.http.client import SchedulerClient

async def main(rounds):
    folder = tempfile.mkdtemp()
    for i in range(rounds):
        zctx = zmq.asyncio.Context()
        eps = [f"ipc://{folder}/a{i}.sock", f"ipc://{folder}/b{i}.sock"]
        routers = []
        for ep in eps:
            router = zctx.socket(zmq.ROUTER)
            router.setsockopt(zmq.LINGER, 0)
            router.bind(ep)
            routers.append(router)
        client = SchedulerClient(eps)
        await client.start()
        while not all(r.connected for r in client.replicas):
            await asyncio.sleep(0.001)
        for router in routers:
            router.close(0)
        await client.close()
        zctx.destroy(0)
    print("closed", rounds)

asyncio.run(main(int(sys.argv[1])))
"""


def test_closing_while_the_replicas_go_away_never_hangs(tmp_path):
    """The HTTP worker shuts down as its schedulers exit (every stop of a server): the client's
    close() returns each time. Closing a monitor's reader before the monitor itself once left
    libzmq's I/O thread blocked on a disconnect event and close() waiting for it for ever (seen
    within 50 rounds); the rounds run in a child so that a hang is a failure, not a stuck run."""
    import subprocess
    import sys

    done = subprocess.run(
        [sys.executable, "-c", _CLOSE_AS_REPLICAS_DIE, "200"],
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0 and "closed 200" in done.stdout, done.stderr


# -- replicas a reload or a scale adds and retires --------------------------------------------
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


def _joining(dp: int) -> events.ReplicaJoining:
    return events.ReplicaJoining(
        replica=f"scheduler dp={dp}",
        dp_rank=dp,
        change="reload",
        pids=[None],
        startup_s=0.1,
        model_path="/m",
        served_name="m",
        probe=True,
    )


def _draining(dp: int, in_place: bool = False) -> events.ReplicaDraining:
    return events.ReplicaDraining(
        replica=f"scheduler dp={dp}", dp_rank=dp, change="reload", in_place=in_place
    )


def test_a_joining_replica_serves_once_probed_a_draining_one_once_empty_then_requests_wait(
    tmp_path,
):
    """A reload's replica dp=1 is probed with one embedding before it gets a request; dp=0,
    draining, finishes what it holds before it is reported drained; with no replica serving
    during the reload a request waits, then gets a 503 with Retry-After (through the app)."""
    import httpx
    import zmq.asyncio

    from launchspec.server_args import ServerArgs
    from serving.http.app import AppState, create_app
    from serving.http.metrics import Metrics
    from serving.http.responses import PlatformSummary

    def endpoint(dp: int) -> str:
        return f"ipc://{tmp_path}/j{dp}.sock"

    async def scenario():
        zctx = zmq.asyncio.Context()
        sup = ReportingSupervisor(zctx, tmp_path)
        old = FakeReplica(zctx, endpoint(0), 0, hold=True)
        new = FakeReplica(zctx, endpoint(1), 1)
        client = SchedulerClient(
            [endpoint(0)], query_endpoint=sup.query, endpoint_of=endpoint, wait_s=0.3
        )
        await client.start()
        try:
            await _until(lambda: client.replicas[0].connected, "dp=0 connected")
            held = asyncio.ensure_future(client.one(lambda rid: messages.EmbedRequest(rid, ["x"])))
            await _until(lambda: len(old.received) == 1, "a request held by dp=0")
            client.link.apply(
                events.ReloadStarted(
                    id=1,
                    reason="test",
                    replicas=[0],
                    surge=1,
                    model_path="/m",
                    served_name="m",
                    previous_model_path=None,
                    previous_served_name=None,
                    changes=[],
                )
            )
            client.link.apply(_joining(1))
            await _until(lambda: sup.reports, "the probe's report")
            assert sup.reports[0] == {
                "query": "replica.probed",
                "dp_rank": 1,
                "ok": True,
                "error": None,
            }
            assert [type(m).__name__ for m in new.received] == ["EmbedRequest"]  # the probe
            assert client.replica(1).serving

            client.link.apply(_draining(0))
            await client.one(lambda rid: messages.EmbedRequest(rid, ["y"]))
            assert len(new.received) == 2 and len(old.received) == 1  # nothing new for dp=0
            draining = client.replica(0)  # it still holds a request: not drained, not forgotten
            assert draining is not None and draining.draining and len(sup.reports) == 1
            held.cancel()
            await _until(lambda: len(sup.reports) == 2, "the drained report")
            assert sup.reports[1] == {"query": "replica.drained", "dp_rank": 0}
            assert [r.dp_rank for r in client.replicas] == [1]

            client.link.apply(_draining(1, in_place=True))
            await _until(lambda: not client.replicas, "dp=1 drained")
            state = AppState(
                client=client,
                metrics=Metrics(),
                server_args=ServerArgs(),
                served_name="m",
                model_path="/m",
                platform=PlatformSummary(key="builtin:cpu"),
            )
            transport = httpx.ASGITransport(app=create_app(state))
            async with httpx.AsyncClient(transport=transport, base_url="http://app") as http:
                reply = await http.post("/v1/embeddings", json={"input": "z"})
            assert reply.status_code == 503 and reply.headers["retry-after"] == "5", reply.text
            assert "while a reload replaces it" in reply.json()["error"]["message"]

            client.link.apply(
                events.ReloadFinished(
                    id=1, replicas=[2], model_path="/n", served_name="n", seconds=1.0
                )
            )
            with pytest.raises(SchedulerError) as gone:  # no change under way: at once
                await client.one(lambda rid: messages.EmbedRequest(rid, ["z"]))
            assert gone.value.status == 503 and gone.value.retry_after is None
            await old.die()
            await new.die()
        finally:
            await client.close()
            await sup.close()
            zctx.destroy(0)

    asyncio.run(scenario())


def test_a_reload_that_finished_changes_the_model_the_app_reports(tmp_path):
    from launchspec.server_args import ServerArgs
    from serving.http.app import AppState
    from serving.http.metrics import Metrics
    from serving.http.responses import PlatformSummary

    client = SchedulerClient([])
    state = AppState(
        client=client,
        metrics=Metrics(),
        server_args=ServerArgs(model_path="/old"),
        served_name="old",
        model_path="/old",
        platform=PlatformSummary(key="builtin:cpu"),
    )
    state.context_length = 512
    told = []
    client.link.on_model_change = lambda path, name: told.append((path, name))
    client.link.apply(
        events.ReloadFinished(id=1, replicas=[0], model_path="/new", served_name="new", seconds=1)
    )
    assert told == [("/new", "new")]
    state.serve_model("/new", "new", kind="embedding", chat=None)
    assert (state.served_name, state.model_path, state.kind) == ("new", "/new", "embedding")
    assert state.context_length is None  # asked again of the new replicas
    assert state.server_args.model_path == "/new" and state.server_args.served_model_name == "new"
    assert state.wrong_model("old") is not None and state.wrong_model("new") is None
