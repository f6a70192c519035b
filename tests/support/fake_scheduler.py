"""A text scheduler stand-in on a real ZeroMQ ROUTER socket, and the HTTP app in front of it.

``FakeScheduler`` answers the wire as a scheduler that fills every field does (log-probabilities,
the running/queued/KV figures of ``TextStats``), with made-up tokens whose text names the seed
they were sampled with, so a test sees exactly what the HTTP child did with each field:

- a ``GenerateRequest`` gets ``max_new_tokens`` tokens, token ``i`` being ``" s<seed>w<i>"``,
  with log-probability ``-(i + 1) / 10`` and ``top_logprobs`` alternatives (``logprobs`` only
  when asked); ``prompt_tokens`` is the prompt's length in characters; streamed, one message
  per token;
- ``cached``: the prompt tokens each generation reports taken from the prefix cache
  (``Generated.cached_tokens``, on every message; at most the prompt's length); the ``Pong``'s
  ``TextStats`` counts every generation's prompt and cached tokens (``prompt_tokens_total``,
  ``cached_tokens_total``) as a scheduler with a prefix cache does;
- a ``Ping`` gets a ``Pong`` with ``STATS``; an ``EmbedRequest`` a one-value vector;
- a ``FlushCache`` gets a ``FlushCacheResult`` of ``flush`` (``(ok, message)``; default a
  success), and counts in ``flushes``;
- ``hold``: generation and embedding requests stay unanswered (pings are still answered, as a
  scheduler whose steps hang or fail answers them between steps); ``fail``: they are refused
  with a ``RequestFailed`` of that status and message; ``trickle``: seconds between the messages
  of a streamed generation (sent by a task of their own, so pings are answered meanwhile);
- ``script``: a text every generation answers instead (as tokens of 3 characters, the last
  ending it with ``stop``; cut at ``max_new_tokens`` with ``length``), as a model that writes
  exactly that text would.

``serve_app(tmp_path, **state)`` runs a test body against the app (httpx's ASGI transport) with
its replica pool connected to a ``FakeScheduler`` (``connected``, as the server joins them);
``replicas=N`` connects N of them (``Served.schedulers``, dp rank 0 to N-1); ``loopback=True``
serves the app with uvicorn on a real loopback port instead (``Served.url``; ``Served.http`` then
talks real HTTP to it). ``make_state(pool)`` is the ``AppState`` of a pool (a ``Dispatcher`` over
it).
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

    def __init__(
        self,
        zctx: zmq.asyncio.Context,
        endpoint: str,
        kind: str = "generation",
        dp_rank: int = 0,
    ) -> None:
        self.kind = kind  # what its Pong says it serves
        self.dp_rank = dp_rank
        self.sock = zctx.socket(zmq.ROUTER)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.bind(endpoint)
        self.received: list[wire.Request] = []
        self.hold = False
        self.fail: tuple[int, str] | None = None
        self.trickle = 0.0
        self._trickles: set[asyncio.Task[None]] = set()
        self.cached = 0
        self.prompt_tokens_total = 0
        self.cached_tokens_total = 0
        self.flush: tuple[bool, str] = (True, "")
        self.flushes = 0
        self.script: str | None = None
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
            if isinstance(msg, wire.FlushCache):
                self.flushes += 1
                await self._send(identity, wire.FlushCacheResult(msg.rid, *self.flush))
                continue
            self.received.append(msg)
            if self.hold:
                continue
            if self.fail is not None:
                status, message = self.fail
                await self._send(identity, wire.RequestFailed(msg.rid, status, message))
            elif isinstance(msg, wire.GenerateRequest) and self.trickle and msg.stream:
                task = asyncio.ensure_future(self._trickle(identity, self._generate(msg)))
                self._trickles.add(task)
                task.add_done_callback(self._trickles.discard)
            elif isinstance(msg, wire.GenerateRequest):
                for reply in self._generate(msg):
                    await self._send(identity, reply)
            elif isinstance(msg, wire.EmbedRequest):
                await self._send(identity, wire.Embeddings(msg.rid, b"\0\0\0\0", 1, 1))

    async def _trickle(self, identity: bytes, replies: list[wire.Generated]) -> None:
        for reply in replies:
            await self._send(identity, reply)
            await asyncio.sleep(self.trickle)

    def _pong(self, rid: str) -> wire.Pong:
        stats = wire.TextStats(
            model=MODEL,
            memory=wire.TextMemory(None, None, None),
            generation_tokens_per_s=THROUGHPUT,
            prompt_tokens_total=self.prompt_tokens_total,
            cached_tokens_total=self.cached_tokens_total,
            **STATS,
        )
        return wire.Pong(rid, self.dp_rank, os.getpid(), "tiny", self.kind, 0, stats)

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
        end = "length"
        if self.script is not None:
            pieces = [self.script[i : i + 3] for i in range(0, len(self.script), 3)]
            tokens = [
                wire.TokenLogprob(100 + i, piece, -0.1, [])
                for i, piece in enumerate(pieces[: params.max_new_tokens])
            ]
            end = "stop" if len(tokens) == len(pieces) else "length"
        prompt = len(msg.text)
        cached = min(self.cached, prompt)
        self.prompt_tokens_total += prompt
        self.cached_tokens_total += cached

        def reply(part: list[wire.TokenLogprob], done: int, finished: bool) -> wire.Generated:
            return wire.Generated(
                msg.rid,
                "".join(t.token for t in part),
                prompt,
                done,
                finished=finished,
                finish_reason=end if finished else None,
                seed=seed,
                logprobs=part if params.logprobs else None,
                cached_tokens=cached,
            )

        if not msg.stream:
            return [reply(tokens, len(tokens), True)]
        return [reply([t], i + 1, i + 1 == len(tokens)) for i, t in enumerate(tokens)]

    async def _send(self, identity: bytes, msg: wire.FromScheduler) -> None:
        await self.sock.send_multipart([identity, wire.encode(msg)])

    async def stop(self) -> None:
        tasks = [self.task, *self._trickles]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self.sock.close(0)


@dataclass
class Served:
    app: App
    http: httpx.AsyncClient
    scheduler: FakeScheduler  # the first of ``schedulers``
    schedulers: list[FakeScheduler]
    url: str = "http://app"  # with ``loopback``, the real server's


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
async def serve_app(
    tmp_path, *, replicas: int = 1, loopback: bool = False, **state: object
) -> AsyncIterator[Served]:
    """The app with its pool connected to ``replicas`` ``FakeScheduler``s, over httpx's ASGI
    transport or (``loopback``) real HTTP (see the module docstring)."""
    endpoints = [f"ipc://{tmp_path}/fake-scheduler-{dp}.sock" for dp in range(replicas)]
    zctx = zmq.asyncio.Context()
    kind = state.get("kind", "generation")
    schedulers = [
        FakeScheduler(zctx, e, kind if isinstance(kind, str) else "generation", dp_rank=dp)
        for dp, e in enumerate(endpoints)
    ]
    metrics = Metrics("tiny")
    pool = ReplicaPool(endpoints, metrics=metrics)
    app = create_app(make_state(pool, metrics=metrics, **state))
    queries = app.state.queries
    link = SupervisorLink(pool, app.state.dispatcher, queries)
    try:
        async with connected(pool, queries, link):
            deadline = asyncio.get_running_loop().time() + 10
            while not all(r.connected for r in pool.replicas):
                assert asyncio.get_running_loop().time() < deadline, "the pool never connected"
                await asyncio.sleep(0.01)
            if loopback:
                async with _on_loopback(app) as url, httpx.AsyncClient(base_url=url) as http:
                    yield Served(app, http, schedulers[0], schedulers, url)
            else:
                transport = httpx.ASGITransport(app=app)
                async with httpx.AsyncClient(transport=transport, base_url="http://app") as http:
                    yield Served(app, http, schedulers[0], schedulers)
    finally:
        for scheduler in schedulers:
            await scheduler.stop()
        zctx.destroy(0)


@contextlib.asynccontextmanager
async def _on_loopback(app: App) -> AsyncIterator[str]:
    """``app`` served by uvicorn on a free loopback port, on this event loop; its base URL."""
    import uvicorn

    config = uvicorn.Config(
        app, host="127.0.0.1", port=0, loop="none", lifespan="off", log_level="warning"
    )
    server = uvicorn.Server(config)
    task = asyncio.ensure_future(server.serve(sockets=None))
    try:
        deadline = asyncio.get_running_loop().time() + 10
        while not server.started:
            assert not task.done(), "uvicorn stopped before it started"
            assert asyncio.get_running_loop().time() < deadline, "uvicorn never started"
            await asyncio.sleep(0.01)
        port = server.servers[0].sockets[0].getsockname()[1]
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        await asyncio.wait_for(task, 10)
