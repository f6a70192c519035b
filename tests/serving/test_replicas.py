"""The HTTP child's side of its schedulers on real ZeroMQ sockets, without a model behind them:
the replica pool, the dispatcher over it and the supervisor link, joined as the server joins them
(``server.connected``)."""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path

import msgspec
import pytest
from support.replicas import (
    FakeReplica,
    ReportingSupervisor,
    draining,
    joined,
    joining,
    ready_again,
    reload_finished,
    reload_started,
    restarting,
    server_ready,
    until,
)

from launchspec import events
from serving import wire
from serving.http.replica import SchedulerError

ROOT = Path(__file__).resolve().parents[2]


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
        c = await joined([endpoint])
        waiting = []
        try:
            for _ in range(100_000):
                task = asyncio.ensure_future(
                    c.dispatcher.one(lambda rid: wire.EmbedRequest(rid, ["x"]))
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
            assert len(c.pool.replicas[0].inflight) == len(waiting)
        finally:
            for task in waiting:
                task.cancel()
            await asyncio.gather(*waiting, return_exceptions=True)
            assert c.pool.replicas[0].inflight == {}
            await c.close()

    try:
        asyncio.run(scenario())
    finally:
        stuck.close(0)
        zctx.term()


# -- a replica that dies and comes back ----------------------------------------------------------
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
        c = await joined(eps, heals=True, metrics=metrics)
        try:
            await until(lambda: all(r.connected for r in c.pool.replicas), "both connections")

            def embed(text):
                return asyncio.ensure_future(
                    c.dispatcher.one(lambda rid: wire.EmbedRequest(rid, [text]), None)
                )

            first, held = embed("a"), embed("b")  # one each: dp=0, then dp=1
            await until(lambda: len(other.received) == 1, "one request at replica 1")
            params = wire.SamplingParams()
            gen = asyncio.ensure_future(
                c.dispatcher.one(lambda rid: wire.GenerateRequest(rid, "hi", params), None)
            )
            await until(lambda: len(dying.received) == 2, "two requests at replica 0")
            other.hold = False
            await dying.die()
            assert isinstance(await first, wire.Embeddings)
            assert (await gen).text == "from dp=1"
            assert c.pool.healthy and c.pool.restarting == [0]
            assert len(other.received) == 3
            held.cancel()

            c.link.apply(restarting(0, "killed"))  # the supervisor's
            assert (
                'sglang_launch_replica_restarts_total{dp="0"} 1.0' in metrics.render()[0].decode()
            )
            reborn = FakeReplica(zctx, eps[0], 0)
            c.link.apply(ready_again(0))
            assert c.pool.restarting == [] and c.pool.healthy
            await until(lambda: c.pool.replicas[0].connected, "dp=0 connected again")
            # Its kind is asked again (a ping): once known, the ping holds it no more.
            await until(lambda: c.pool.replicas[0].kind is not None, "dp=0's kind")
            pongs = await c.dispatcher.ping_all(timeout=5)
            assert [p.dp_rank for p in pongs if p] == [0, 1]
            await c.dispatcher.one(lambda rid: wire.EmbedRequest(rid, ["y"]), None)
            assert len(reborn.received) == 1  # least loaded, lowest rank: the restarted one
            await reborn.die()
            await other.die()
        finally:
            await c.close()
            zctx.destroy(0)

    asyncio.run(scenario())


def test_a_stream_that_sent_output_fails_when_its_replica_dies_one_that_sent_none_moves(tmp_path):
    import zmq.asyncio

    eps = [f"ipc://{tmp_path}/s0.sock", f"ipc://{tmp_path}/s1.sock"]
    params = wire.SamplingParams()

    def stream(rid):
        return wire.GenerateRequest(rid, "hi", params, True)

    async def scenario():
        zctx = zmq.asyncio.Context()
        dying = FakeReplica(zctx, eps[0], 0, kind="generation")
        quiet = FakeReplica(zctx, eps[1], 1, hold=True, kind="generation")
        c = await joined(eps, heals=True)
        try:
            await until(lambda: all(r.connected for r in c.pool.replicas), "both connections")
            started = c.dispatcher.call(stream)
            first = await started.__anext__()  # one chunk reached the client from replica 0
            assert first.text == "dp=0"
            await dying.die()
            with pytest.raises(SchedulerError) as info:
                await started.__anext__()
            assert info.value.status == 503 and "dp=0" in info.value.message
            await started.aclose()

            # Replica 1 dies before its stream produced anything: the stream moves to dp=0's
            # successor, and the client sees only that one's output.
            reborn = FakeReplica(zctx, eps[0], 0, hold=True, kind="generation")
            c.link.apply(ready_again(0))
            # Ties go to a connected replica: once dp=0's fresh connection is up it is the pick.
            await until(lambda: c.pool.replicas[0].connected, "dp=0 connected again")
            # Its kind is asked again (a ping): once known, the ping holds it no more.
            await until(lambda: c.pool.replicas[0].kind is not None, "dp=0's kind")
            filler = asyncio.ensure_future(c.dispatcher.one(stream))  # keeps dp=0 the busier one
            await until(lambda: len(reborn.received) == 1, "a request at dp=0")
            waiting = c.dispatcher.call(stream, None)
            moving = asyncio.ensure_future(waiting.__anext__())
            await until(lambda: len(quiet.received) == 1, "the stream at replica 1")
            reborn.hold = False
            await quiet.die()
            assert (await moving).text == "dp=0" and len(reborn.received) == 2
            await waiting.aclose()
            filler.cancel()
        finally:
            await c.close()
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
        c = await joined(eps, ops=sup.ops, query=sup.query, heals=True, catch_up_s=0.05)
        try:
            await until(lambda: all(r.connected for r in c.pool.replicas), "both connections")
            deadline = asyncio.get_running_loop().time() + 10
            while c.link.seq == 0:  # until the subscription delivers (a slow joiner)
                assert asyncio.get_running_loop().time() < deadline, "no event ever arrived"
                sup.emit(server_ready())
                await asyncio.sleep(0.05)
            await dying.die()
            sup.emit(restarting(0))
            await until(lambda: c.pool.restarting == [0], "dp=0 seen restarting")
            reborn = FakeReplica(zctx, eps[0], 0)
            sup.emit(ready_again(0), publish=False)  # lost on the way
            await until(lambda: c.pool.restarting == [], "dp=0 back through a catch-up")
            await until(lambda: c.pool.replicas[0].connected, "dp=0 connected again")
            # Its kind is asked again (a ping): once known, the ping holds it no more.
            await until(lambda: c.pool.replicas[0].kind is not None, "dp=0's kind")
            await c.dispatcher.one(lambda rid: wire.EmbedRequest(rid, ["x"]), None)
            assert len(reborn.received) == 1 and sup.queries >= 1

            await reborn.die()
            await other.die()
        finally:
            await c.close()
            await sup.close()
            zctx.destroy(0)

    asyncio.run(scenario())


def test_without_healing_one_dead_replica_makes_the_client_unhealthy(tmp_path):
    import zmq.asyncio

    eps = [f"ipc://{tmp_path}/n0.sock", f"ipc://{tmp_path}/n1.sock"]

    async def scenario():
        zctx = zmq.asyncio.Context()
        dying, other = FakeReplica(zctx, eps[0], 0), FakeReplica(zctx, eps[1], 1)
        c = await joined(eps)
        try:
            await until(lambda: all(r.connected for r in c.pool.replicas), "both connections")
            await dying.die()
            await until(lambda: not c.pool.healthy, "replica 0 to be seen dead")
            assert "scheduler dp=0" in c.pool.unhealthy_reason and c.pool.restarting == []
            await other.die()
        finally:
            await c.close()
            zctx.destroy(0)

    asyncio.run(scenario())


_CLOSE_AS_REPLICAS_DIE = """
import asyncio, sys, tempfile, zmq, zmq.asyncio
from serving.http.pool import ReplicaPool

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
        pool = ReplicaPool(eps)
        pool.start(zctx)
        while not all(r.connected for r in pool.replicas):
            await asyncio.sleep(0.001)
        for router in routers:
            router.close(0)
        await pool.close()
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
def test_a_joining_replica_serves_once_probed_a_draining_one_once_empty_then_requests_wait(
    tmp_path,
):
    """A reload's replica dp=1 is probed with one embedding before it gets a request; dp=0,
    draining, finishes what it holds before it is reported drained; with no replica serving
    during the reload a request waits, then gets a 503 with Retry-After (through the app)."""
    import httpx
    import zmq.asyncio

    from launchspec.server_args import ServerArgs
    from serving.http.app import AppState
    from serving.http.metrics import Metrics
    from serving.http.responses import PlatformSummary
    from serving.http.routes import create_app

    def endpoint(dp: int) -> str:
        return f"ipc://{tmp_path}/j{dp}.sock"

    async def scenario():
        zctx = zmq.asyncio.Context()
        sup = ReportingSupervisor(zctx, tmp_path)
        old = FakeReplica(zctx, endpoint(0), 0, hold=True)
        new = FakeReplica(zctx, endpoint(1), 1)
        c = await joined([endpoint(0)], query=sup.query, endpoint_of=endpoint, wait_s=0.3)
        try:
            await until(lambda: c.pool.replicas[0].connected, "dp=0 connected")
            held = asyncio.ensure_future(
                c.dispatcher.one(lambda rid: wire.EmbedRequest(rid, ["x"]))
            )
            await until(lambda: len(old.received) == 1, "a request held by dp=0")
            c.link.apply(reload_started())
            c.link.apply(joining(1))
            await until(lambda: sup.reports, "the probe's report")
            assert sup.reports[0] == {
                "query": "replica.probed",
                "dp_rank": 1,
                "ok": True,
                "error": None,
            }
            assert [type(m).__name__ for m in new.received] == ["EmbedRequest"]  # the probe
            assert c.pool.replica(1).serving

            c.link.apply(draining(0))
            await c.dispatcher.one(lambda rid: wire.EmbedRequest(rid, ["y"]))
            assert len(new.received) == 2 and len(old.received) == 1  # nothing new for dp=0
            held_by = c.pool.replica(0)  # it still holds a request: not drained, not forgotten
            assert held_by is not None and held_by.draining and len(sup.reports) == 1
            held.cancel()
            await until(lambda: len(sup.reports) == 2, "the drained report")
            assert sup.reports[1] == {"query": "replica.drained", "dp_rank": 0}
            assert [r.dp_rank for r in c.pool.replicas] == [1]

            c.link.apply(draining(1, in_place=True))
            await until(lambda: not c.pool.replicas, "dp=1 drained")
            state = AppState(
                pool=c.pool,
                dispatcher=c.dispatcher,
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

            c.link.apply(reload_finished())
            with pytest.raises(SchedulerError) as gone:  # no change under way: at once
                await c.dispatcher.one(lambda rid: wire.EmbedRequest(rid, ["z"]))
            assert gone.value.status == 503 and gone.value.retry_after is None
            await old.die()
            await new.die()
        finally:
            await c.close()
            await sup.close()
            zctx.destroy(0)

    asyncio.run(scenario())
