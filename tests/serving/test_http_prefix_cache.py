"""The prefix cache as clients see it, over real HTTP on loopback (uvicorn) in front of scheduler
stand-ins on real ZeroMQ sockets (``support.fake_scheduler``): ``meta_info.cached_tokens`` on
``/generate`` (SGLang's name), ``usage.prompt_tokens_details.cached_tokens`` on the OpenAI routes
(OpenAI's shape, read by the official ``openai`` client), ``sglang:cache_hit_rate`` in
``/metrics``, and ``POST /flush_cache`` sent to every replica (200, or 400 naming the replica
that refused). And the scheduler base's answer to ``FlushCache`` on its real socket: a runtime
without a prefix cache refuses, saying so."""

from __future__ import annotations

import asyncio
import json

import msgspec
import openai
import pytest
import zmq
from prometheus_client.parser import text_string_to_metric_families
from support.fake_scheduler import serve_app

from serving import wire
from serving.http.chat_template import ChatTemplate
from serving.http.responses import GenerateChunk, GenerateResult

KEY = "cache-test-key"
AUTH = {"Authorization": f"Bearer {KEY}"}
TEMPLATE = "{% for m in messages %}<{{ m['role'] }}> {{ m['content'] }}\n{% endfor %}<assistant> "


@pytest.fixture(scope="module")
def template() -> ChatTemplate:
    from transformers import AutoTokenizer

    from launchspec.model_source import embedding_model_dir

    tok = AutoTokenizer.from_pretrained(embedding_model_dir(), local_files_only=True)
    return ChatTemplate(tok, TEMPLATE, "model")


def events(text: str) -> list:
    """The JSON payloads of a server-sent event stream, ``[DONE]`` left out."""
    data = [line[6:] for line in text.splitlines() if line.startswith("data: ")]
    assert data[-1] == "[DONE]", text
    return [json.loads(d) for d in data[:-1]]


def test_generate_and_the_openai_routes_report_the_cached_prompt_tokens(tmp_path, template):
    async def scenario():
        async with serve_app(tmp_path, loopback=True, chat=template) as s:
            s.scheduler.cached = 3
            post = s.http.post
            got = {
                "generate": await post(
                    "/generate", json={"text": "abcdef", "sampling_params": {"max_new_tokens": 2}}
                ),
                "generate_stream": await post(
                    "/generate",
                    json={
                        "text": "abcdef",
                        "sampling_params": {"max_new_tokens": 3},
                        "stream": True,
                    },
                ),
                # Two prompts: the usage sums them, and a prompt shorter than the cached
                # count is cached whole, never more.
                "completions": await post(
                    "/v1/completions", json={"prompt": ["abcdef", "ab"], "max_tokens": 2}
                ),
                "completions_stream": await post(
                    "/v1/completions",
                    json={
                        "prompt": "abcdef",
                        "max_tokens": 2,
                        "stream": True,
                        "stream_options": {"include_usage": True},
                    },
                ),
                "chat": await post(
                    "/v1/chat/completions",
                    json={"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2, "n": 3},
                ),
                "chat_stream": await post(
                    "/v1/chat/completions",
                    json={
                        "messages": [{"role": "user", "content": "hi"}],
                        "max_tokens": 2,
                        "n": 2,
                        "stream": True,
                        "stream_options": {"include_usage": True},
                    },
                ),
            }
            s.scheduler.cached = 0
            got["uncached"] = await post(
                "/v1/completions", json={"prompt": "abcdef", "max_tokens": 1}
            )
            return got

    got = asyncio.run(scenario())
    assert all(r.status_code == 200 for r in got.values()), {k: r.text for k, r in got.items()}
    native = msgspec.json.decode(got["generate"].content, type=GenerateResult, strict=True)
    assert (native.meta_info.prompt_tokens, native.meta_info.cached_tokens) == (6, 3)
    assert got["generate"].json()["meta_info"]["cached_tokens"] == 3  # SGLang's name, on the wire
    chunks = [msgspec.convert(e, GenerateChunk) for e in events(got["generate_stream"].text)]
    assert len(chunks) == 3 and all(c.meta_info.cached_tokens == 3 for c in chunks)

    usage = got["completions"].json()["usage"]
    assert usage == {
        "prompt_tokens": 8,
        "completion_tokens": 4,
        "total_tokens": 12,
        "prompt_tokens_details": {"cached_tokens": 3 + 2},
    }
    streamed = events(got["completions_stream"].text)
    assert streamed[-1]["choices"] == [] and streamed[-1]["usage"] == {
        "prompt_tokens": 6,
        "completion_tokens": 2,
        "total_tokens": 8,
        "prompt_tokens_details": {"cached_tokens": 3},
    }
    assert all("usage" not in e for e in streamed[:-1])

    # n choices of one prompt: the prompt and its cached tokens are counted once.
    chat = got["chat"].json()["usage"]
    assert chat["completion_tokens"] == 6 and chat["prompt_tokens"] > 3
    assert chat["prompt_tokens_details"] == {"cached_tokens": 3}
    chat_streamed = events(got["chat_stream"].text)
    assert chat_streamed[-1]["usage"]["prompt_tokens_details"] == {"cached_tokens": 3}
    assert chat_streamed[-1]["usage"]["prompt_tokens"] == chat["prompt_tokens"]

    assert got["uncached"].json()["usage"]["prompt_tokens_details"] == {"cached_tokens": 0}


def test_the_openai_client_reads_prompt_tokens_details_cached_tokens(tmp_path, template):
    async def scenario():
        async with serve_app(tmp_path, loopback=True, chat=template, api_key=KEY) as s:
            s.scheduler.cached = 4
            client = openai.AsyncOpenAI(base_url=s.url + "/v1", api_key=KEY, max_retries=0)
            try:
                completion = await client.completions.create(
                    model="tiny", prompt="abcdefgh", max_tokens=2
                )
                chat = await client.chat.completions.create(
                    model="tiny", messages=[{"role": "user", "content": "hello"}], max_tokens=2
                )
                stream = await client.chat.completions.create(
                    model="tiny",
                    messages=[{"role": "user", "content": "hello"}],
                    max_tokens=2,
                    stream=True,
                    stream_options={"include_usage": True},
                )
                chunks = [chunk async for chunk in stream]
            finally:
                await client.close()
            return completion, chat, chunks

    completion, chat, chunks = asyncio.run(scenario())
    assert completion.usage is not None and completion.usage.prompt_tokens == 8
    assert completion.usage.prompt_tokens_details is not None
    assert completion.usage.prompt_tokens_details.cached_tokens == 4
    assert chat.usage is not None and chat.usage.prompt_tokens_details is not None
    assert chat.usage.prompt_tokens_details.cached_tokens == 4
    usage = chunks[-1].usage
    assert usage is not None and usage.prompt_tokens_details is not None
    assert usage.prompt_tokens_details.cached_tokens == 4


def hit_rate(page: str) -> float:
    [family] = [
        f for f in text_string_to_metric_families(page) if f.name == "sglang:cache_hit_rate"
    ]
    assert family.type == "gauge"
    [sample] = family.samples
    assert sample.labels == {"model_name": "tiny"}
    return sample.value


def test_metrics_cache_hit_rate_is_cached_over_prompt_tokens_of_every_replica(tmp_path):
    async def scenario():
        async with serve_app(tmp_path, loopback=True, replicas=2) as s:
            pages = [(await s.http.get("/metrics")).text]  # nothing admitted yet: 0
            s.scheduler.cached = 3
            for text in ("abcdef", "abcd"):  # 3 of 6 and 3 of 4 prompt tokens, wherever sent
                body = {"text": text, "sampling_params": {"max_new_tokens": 1}}
                assert (await s.http.post("/generate", json=body)).status_code == 200
            pages.append((await s.http.get("/metrics")).text)
            one, two = s.schedulers  # what each replica counted since it started, summed
            one.prompt_tokens_total, one.cached_tokens_total = 100, 30
            two.prompt_tokens_total, two.cached_tokens_total = 300, 90
            pages.append((await s.http.get("/metrics")).text)
            return pages

    pages = asyncio.run(scenario())
    assert [hit_rate(p) for p in pages] == [0.0, 0.6, 0.3]


def test_flush_cache_flushes_every_replica_or_names_the_one_that_refused(tmp_path):
    async def scenario():
        async with serve_app(tmp_path, loopback=True, replicas=2, api_key=KEY) as s:
            got = {"no_key": await s.http.post("/flush_cache")}
            got["flushed"] = await s.http.post("/flush_cache", headers=AUTH)
            counts = [f.flushes for f in s.schedulers]
            s.schedulers[1].flush = (False, "1 request running, 2 waiting; retry when idle")
            got["refused"] = await s.http.post("/flush_cache", headers=AUTH)
            s.schedulers[0].flush = (False, "this runtime has no prefix cache")
            got["both"] = await s.http.post("/flush_cache", headers=AUTH)
            got["get"] = await s.http.get("/flush_cache", headers=AUTH)
            got["openapi"] = await s.http.get("/openapi.json", headers=AUTH)
            return got, counts, [f.flushes for f in s.schedulers]

    got, counts, final = asyncio.run(scenario())
    assert got["no_key"].status_code == 401  # behind the API key like every non-probe route
    flushed = got["flushed"]
    assert (flushed.status_code, flushed.text) == (200, "Cache flushed.\n")
    assert flushed.headers["content-type"].startswith("text/plain")
    assert counts == [1, 1] and final == [3, 3]  # every replica is asked every time

    refused = got["refused"]
    assert refused.status_code == 400
    error = refused.json()["error"]
    assert error["message"] == (
        "the cache was not flushed on dp=1: 1 request running, 2 waiting; retry when idle "
        "(flushed on dp=0)"
    )
    both = got["both"].json()["error"]["message"]
    assert got["both"].status_code == 400 and both == (
        "the cache was not flushed on dp=0: this runtime has no prefix cache; "
        "dp=1: 1 request running, 2 waiting; retry when idle"
    )
    assert got["get"].status_code == 405 and got["get"].headers["allow"] == "POST"
    operation = got["openapi"].json()["paths"]["/flush_cache"]["post"]
    assert set(operation["responses"]) == {"200", "400", "401", "503"}
    assert "text/plain" in operation["responses"]["200"]["content"]
    assert operation["security"] == [{"bearer": []}]


def test_the_scheduler_base_refuses_a_flush_when_its_runtime_has_no_prefix_cache(tmp_path):
    from bootstrap.context import WorkerContext
    from launchspec.server_args import ServerArgs
    from serving.scheduler import BatchingScheduler

    class NoCache(BatchingScheduler):  # a runtime that overrides nothing about the cache
        def admit(self, identity, request):
            raise AssertionError("no request is sent")

        def get_next_batch_to_run(self):
            return None

        def run_batch(self, batch):
            raise AssertionError("nothing runs")

        def process_batch_result(self, batch, result):
            raise AssertionError("nothing runs")

        def stats(self):
            raise AssertionError("not pinged")

    ctx = WorkerContext(
        role="scheduler",
        rank=0,
        local_rank=0,
        world_size=1,
        tp_size=1,
        dp_size=1,
        runtime_dir=str(tmp_path),
        ops_endpoint="",
        query_endpoint="",
        platform="cpu",
    )
    scheduler = NoCache(
        ServerArgs(),
        ctx,
        serves=(wire.GenerateRequest,),
        model="tiny",
        kind="generation",
        ranks=1,
        platform=None,  # type: ignore[arg-type]
    )
    endpoint = scheduler.bind()
    client = zmq.Context.instance().socket(zmq.DEALER)
    client.setsockopt(zmq.LINGER, 0)
    client.connect(endpoint)
    try:
        client.send(wire.encode(wire.FlushCache("f-1")))
        for _ in range(50):
            scheduler.turn()
            if client.poll(0):
                break
        assert client.poll(1000), "no answer to FlushCache"
        answer = wire.decode_from_scheduler(client.recv())
    finally:
        client.close(0)
        scheduler.sock.close(0)
    assert answer == wire.FlushCacheResult("f-1", False, "this runtime has no prefix cache")
