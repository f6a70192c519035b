"""A text scheduler stand-in on a real ZeroMQ ROUTER socket, and the HTTP app in front of it.

``FakeScheduler`` answers the wire as a scheduler that fills every field does (log-probabilities,
the running/queued/KV figures of ``TextStats``), with made-up tokens whose text names the seed
they were sampled with, so a test sees exactly what the HTTP child did with each field:

- a ``GenerateRequest`` gets ``max_new_tokens`` tokens, token ``i`` being ``" s<seed>w<i>"``,
  with log-probability ``-(i + 1) / 10`` and ``top_logprobs`` alternatives (``logprobs`` only
  when asked); ``prompt_tokens`` is the prompt's length in characters; streamed, one message
  per token;
- a ``Ping`` gets a ``Pong`` with ``STATS``; an ``EmbedRequest`` a one-value vector;
- ``hold``: generation and embedding requests stay unanswered; ``fail``: they are refused with a
  ``RequestFailed`` of that status and message.

``serve_app(tmp_path, **state)`` runs a test body against the app (httpx's ASGI transport) with
its replica pool connected to a ``FakeScheduler`` (``connected``, as the server joins them).
``make_state(pool)`` is the ``AppState`` of a pool (a ``Dispatcher`` over it).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import AsyncIterator
from dataclasses import dataclass

import httpx
import zmq
import zmq.asyncio

from launchspec.server_args import ServerArgs
from serving import wire
from serving.http.app import App, AppState
from serving.http.dispatcher import Dispatcher
from serving.http.metrics import Metrics
from serving.http.pool import ReplicaPool
from serving.http.responses import PlatformSummary
from serving.http.routes import create_app
from serving.http.server import connected
from serving.http.supervisor_link import SupervisorLink

MODEL = wire.TextModel(
    model_path="/models/tiny",
    served_model_name="tiny",
    embedded_default=False,
    architecture="LlamaForCausalLM",
    kind="generation",
    device="cpu",
    dtype="float32",
    attention="sdpa",
    tp_size=1,
    max_input_tokens=100,
    max_total_tokens=120,
    context_length=120,
    pooling=None,
    load_seconds=0.0,
    cpu_threads=wire.CpuThreads(intra_op=1, omp_wait_policy=None),
)
STATS = dict(running=2, queued=1, kv_tokens_used=30, kv_tokens_total=120)
THROUGHPUT = 42.5


def token_text(seed: int | None, i: int) -> str:
    return f" s{seed}w{i}"


class FakeScheduler:
    """See the module docstring. ``received``: every request, in order."""

    def __init__(self, zctx: zmq.asyncio.Context, endpoint: str, kind: str = "generation") -> None:
        self.kind = kind  # what its Pong says it serves
        self.sock = zctx.socket(zmq.ROUTER)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.bind(endpoint)
        self.received: list[wire.Request] = []
        self.hold = False
        self.fail: tuple[int, str] | None = None
        self.task = asyncio.ensure_future(self._serve())

    @property
    def generations(self) -> list[wire.GenerateRequest]:
        return [r for r in self.received if isinstance(r, wire.GenerateRequest)]

    async def _serve(self) -> None:
        while True:
            identity, frame = await self.sock.recv_multipart()
            msg = wire.decode_to_scheduler(frame)
            if isinstance(msg, wire.Ping):
                await self._send(identity, self._pong(msg.rid))
                continue
            if isinstance(msg, wire.Cancel):
                continue
            self.received.append(msg)
            if self.hold:
                continue
            if self.fail is not None:
                status, message = self.fail
                await self._send(identity, wire.RequestFailed(msg.rid, status, message))
            elif isinstance(msg, wire.GenerateRequest):
                for reply in self._generate(msg):
                    await self._send(identity, reply)
            elif isinstance(msg, wire.EmbedRequest):
                await self._send(identity, wire.Embeddings(msg.rid, b"\0\0\0\0", 1, 1))

    def _pong(self, rid: str) -> wire.Pong:
        stats = wire.TextStats(
            model=MODEL,
            memory=wire.TextMemory(None, None, None),
            generation_tokens_per_s=THROUGHPUT,
            **STATS,
        )
        return wire.Pong(rid, 0, os.getpid(), "tiny", self.kind, 0, stats)

    def _generate(self, msg: wire.GenerateRequest) -> list[wire.Generated]:
        params = msg.params
        seed = params.seed if params.seed is not None else 7
        tokens = [
            wire.TokenLogprob(
                100 + i,
                token_text(seed, i),
                -(i + 1) / 10,
                [
                    (token_text(seed, i), -(i + 1) / 10),
                    (" alt", -(i + 1) / 10 - 1),
                    (" other", -(i + 1) / 10 - 2),
                ][: params.top_logprobs],
            )
            for i in range(params.max_new_tokens)
        ]
        prompt = len(msg.text)

        def reply(part: list[wire.TokenLogprob], done: int, finished: bool) -> wire.Generated:
            return wire.Generated(
                msg.rid,
                "".join(t.token for t in part),
                prompt,
                done,
                finished=finished,
                finish_reason="length" if finished else None,
                seed=seed,
                logprobs=part if params.logprobs else None,
            )

        if not msg.stream:
            return [reply(tokens, len(tokens), True)]
        return [reply([t], i + 1, i + 1 == len(tokens)) for i, t in enumerate(tokens)]

    async def _send(self, identity: bytes, msg: wire.FromScheduler) -> None:
        await self.sock.send_multipart([identity, wire.encode(msg)])

    async def stop(self) -> None:
        self.task.cancel()
        await asyncio.gather(self.task, return_exceptions=True)
        self.sock.close(0)


@dataclass
class Served:
    app: App
    http: httpx.AsyncClient
    scheduler: FakeScheduler


def make_state(pool: ReplicaPool, **state: object) -> AppState:
    """The ``AppState`` of a generation model served as ``tiny`` by ``pool`` (``state``
    overrides)."""
    fields: dict = dict(
        pool=pool,
        dispatcher=Dispatcher(pool),
        metrics=Metrics("tiny"),
        server_args=ServerArgs(),
        served_name="tiny",
        model_path="/models/tiny",
        platform=PlatformSummary(key="builtin:cpu"),
        kind="generation",
    )
    fields.update(state)
    return AppState(**fields)


@contextlib.asynccontextmanager
async def serve_app(tmp_path, **state: object) -> AsyncIterator[Served]:
    """The app with its pool connected to a ``FakeScheduler`` (see the module docstring)."""
    endpoint = f"ipc://{tmp_path}/fake-scheduler.sock"
    zctx = zmq.asyncio.Context()
    kind = state.get("kind", "generation")
    scheduler = FakeScheduler(zctx, endpoint, kind if isinstance(kind, str) else "generation")
    metrics = Metrics("tiny")
    pool = ReplicaPool([endpoint], metrics=metrics)
    app = create_app(make_state(pool, metrics=metrics, **state))
    queries = app.state.queries
    link = SupervisorLink(pool, app.state.dispatcher, queries)
    try:
        async with connected(pool, queries, link):
            deadline = asyncio.get_running_loop().time() + 10
            while not pool.replicas[0].connected:
                assert asyncio.get_running_loop().time() < deadline, "the pool never connected"
                await asyncio.sleep(0.01)
            transport = httpx.ASGITransport(app=app)
            async with httpx.AsyncClient(transport=transport, base_url="http://app") as http:
                yield Served(app, http, scheduler)
    finally:
        await scheduler.stop()
        zctx.destroy(0)
