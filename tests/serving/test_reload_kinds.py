"""A reload that changes what the server serves, as the HTTP child lives it (real ZeroMQ sockets,
stand-in schedulers, the app in-process): each request goes to a replica of its own kind while
both kinds serve; a kind no replica serves any more is a 400 naming the routes that serve; and
the new model's files and tokenizer are read off the event loop, swapped in once read."""

from __future__ import annotations

import asyncio
import functools
import json
import threading

import httpx
import zmq.asyncio
from support.replicas import (
    FakeReplica,
    ReportingSupervisor,
    draining,
    joining,
    reload_finished,
    reload_started,
    serving,
    until,
)

from launchspec.server_args import ServerArgs
from serving import wire
from serving.http.app import AppState
from serving.http.dispatcher import Dispatcher
from serving.http.metrics import Metrics
from serving.http.pool import ReplicaPool
from serving.http.responses import PlatformSummary
from serving.http.routes import create_app
from serving.http.server import change_model, connected
from serving.http.supervisor_link import QuerySocket, SupervisorLink

PARAMS = wire.SamplingParams(max_new_tokens=1)


def _state(pool: ReplicaPool, queries: QuerySocket, **fields: object) -> AppState:
    values: dict = dict(
        pool=pool,
        dispatcher=Dispatcher(pool, wait_s=30.0),
        queries=queries,
        metrics=Metrics(),
        server_args=ServerArgs(),
        served_name="fake",
        model_path="/m",
        platform=PlatformSummary(key="builtin:cpu"),
        kind="embedding",
    )
    values.update(fields)
    return AppState(**values)


def test_while_a_reload_changes_the_kind_each_request_goes_to_a_replica_of_its_kind(tmp_path):
    """An embedding replica (dp=0) serves; a reload brings a generation replica (dp=1), which
    says its kind in its Pong and passes a generation probe. While both serve, every embedding
    goes to dp=0 and every generation to dp=1. Before dp=1 joined, a generation was a 400 at
    once; once dp=0 drained, an embedding is a 400 naming the routes that serve generation; while
    a replica of unknown kind joins, an embedding waits for it and is answered by it."""

    def endpoint(dp: int) -> str:
        return f"ipc://{tmp_path}/k{dp}.sock"

    async def scenario():
        zctx = zmq.asyncio.Context()
        sup = ReportingSupervisor(zctx, tmp_path)
        old = FakeReplica(zctx, endpoint(0), 0, kind="embedding")
        new = FakeReplica(zctx, endpoint(1), 1, kind="generation")
        pool = ReplicaPool([endpoint(0)], endpoint_of=endpoint)
        queries = QuerySocket(sup.query)
        state = _state(pool, queries)
        link = SupervisorLink(pool, state.dispatcher, queries)
        app = create_app(state, functools.partial(connected, pool, queries, link))
        transport = httpx.ASGITransport(app=app)
        try:
            async with (
                connected(pool, queries, link),
                httpx.AsyncClient(transport=transport, base_url="http://app") as http,
            ):
                await until(lambda: pool.replicas[0].connected, "dp=0 connected")
                await state.dispatcher.ping_all(timeout=5)  # as the server does before ready
                early = await http.post("/generate", json={"text": "hi"})
                assert early.status_code == 400, early.text
                error = early.json()["error"]
                assert error["param"] == "model", error
                assert "serves embedding, not generation" in error["message"], error
                assert "use /v1/embeddings" in error["message"], error

                link.apply(reload_started())
                link.apply(joining(1))
                await until(lambda: sup.reports, "dp=1's probe")
                assert sup.reports[0]["ok"], sup.reports
                probe = new.received[0]
                assert isinstance(probe, wire.GenerateRequest)  # of the kind it said

                def embed(text: str):
                    return http.post("/v1/embeddings", json={"input": text})

                def generate(text: str):
                    return http.post("/generate", json={"text": text})

                replies = await asyncio.gather(
                    *(embed(f"e{i}") for i in range(8)), *(generate(f"g{i}") for i in range(8))
                )
                assert [r.status_code for r in replies] == [200] * 16, [r.text for r in replies]
                assert [type(m) for m in old.received] == [wire.EmbedRequest] * 8
                assert [type(m) for m in new.received] == [wire.GenerateRequest] * 9

                link.apply(draining(0))
                await until(lambda: pool.replica(0) is None, "dp=0 drained")
                late = await embed("late")
                assert late.status_code == 400, late.text
                error = late.json()["error"]
                assert error["param"] == "model", error
                assert "serves generation, not embedding" in error["message"], error
                assert (
                    "use /v1/completions or /v1/chat/completions or /generate" in (error["message"])
                ), error

                # A replica that has not said its kind may serve it: the embedding waits.
                again = FakeReplica(zctx, endpoint(2), 2, kind="embedding")
                link.apply(joining(2, probe=False))
                waiting = asyncio.ensure_future(embed("waits"))
                await asyncio.sleep(0.05)
                assert not waiting.done() and again.received == []
                link.apply(serving(2))
                answered = await waiting
                assert answered.status_code == 200, answered.text
                assert [type(m) for m in again.received] == [wire.EmbedRequest]
                await until(lambda: pool.replica(2).kind == "embedding", "dp=2's kind")
                for fake in (old, new, again):
                    await fake.die()
        finally:
            await sup.close()
            zctx.destroy(0)

    asyncio.run(scenario())


TEMPLATE = "{% for m in messages %}{{ m['content'] }}{% endfor %}"


def test_a_finished_reload_reads_the_new_model_off_the_event_loop_then_swaps_it_in(tmp_path):
    """The new model's chat template is a named pipe here, so reading it waits until the test
    writes it: meanwhile ``/health`` answers and the routes still serve the old model; once the
    template is written, the new model (a generation model: a causal LM's config and a real
    tokenizer) is swapped in with that template."""
    import os
    import shutil

    from launchspec.model_source import embedding_model_dir

    model = tmp_path / "new-model"
    model.mkdir()
    for name in ("tokenizer.json", "tokenizer_config.json", "vocab.txt", "special_tokens_map.json"):
        shutil.copy(embedding_model_dir() / name, model / name)
    (model / "config.json").write_text(
        json.dumps({"architectures": ["LlamaForCausalLM"], "model_type": "llama"})
    )
    fifo = tmp_path / "template.jinja"
    os.mkfifo(fifo)
    seen: list[str] = []
    health_answered = threading.Event()

    def write_template() -> None:
        # Never leave the reader blocked (an event loop that waited on it would never answer
        # /health): write after the health check, or after a while without one.
        health_answered.wait(30)
        seen.append("template written")
        fifo.write_text(TEMPLATE)

    async def scenario():
        pool = ReplicaPool([])
        queries = QuerySocket(None)
        state = _state(pool, queries, server_args=ServerArgs(chat_template=str(fifo)))
        link = SupervisorLink(
            pool, state.dispatcher, queries, on_model_change=functools.partial(change_model, state)
        )
        app = create_app(state)
        writer = threading.Thread(target=write_template, daemon=True)
        writer.start()
        transport = httpx.ASGITransport(app=app)
        async with (
            connected(pool, queries, link),
            httpx.AsyncClient(transport=transport, base_url="http://app") as http,
        ):
            link.apply(reload_finished(str(model), "new"))
            health = await http.get("/health")
            assert health.status_code == 200, health.text
            seen.append(f"health answered, serving {state.served_name}")
            health_answered.set()
            await until(lambda: state.served_name == "new", "the new model swapped in", 60)
            seen.append("swapped")
        await asyncio.to_thread(writer.join, 30)
        return state

    state = asyncio.run(scenario())
    assert seen == ["health answered, serving fake", "template written", "swapped"], seen
    assert (state.kind, state.model_path) == ("generation", str(model))
    assert state.chat is not None and state.chat.template == TEMPLATE
