"""The HTTP child's scheduler client on real ZeroMQ sockets, without a model behind them."""

from __future__ import annotations

import asyncio

import pytest

from launcher.workers import messages
from launcher.workers.client import SchedulerClient, SchedulerError


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
