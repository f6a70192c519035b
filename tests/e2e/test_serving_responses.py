"""Real answers of real servers (the default embedding model, a tiny causal LM, the tiny diffusion
pipeline; through the CLI, over loopback) against the server's own ``/openapi.json``: every JSON
answer decodes strictly into the struct of ``serving.http.responses`` its route documents and
validates against the documented schema, every streamed ``data:`` line into one of the structs
the route documents for its events; and a request of the wrong kind for the model is a 400 that
names the routes of the served kind once."""

from __future__ import annotations

import json

import httpx
import jsonschema_rs
import msgspec
import pytest
from support.serving import build_tiny_llama, give_chat_template, post, server_env, start_server

from serving.http import responses

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def embedder(tmp_path_factory):
    srv = start_server([], tmp_path_factory.mktemp("responses-embed"), "embed")
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def generator(tmp_path_factory):
    from launchspec.model_source import embedding_model_dir

    tiny = build_tiny_llama(tmp_path_factory.mktemp("tiny") / "tiny-llama", embedding_model_dir())
    give_chat_template(tiny)
    srv = start_server(
        ["--model-path", str(tiny)], tmp_path_factory.mktemp("responses-gen"), "generate"
    )
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def painter(tiny_pipeline, tmp_path_factory):
    srv = start_server(
        ["--runtime", "diffusion", "--model-path", str(tiny_pipeline)],
        tmp_path_factory.mktemp("responses-images"),
        "images",
        env=server_env(OMP_WAIT_POLICY=None),
    )
    yield srv
    srv.stop()


@pytest.fixture
def leak_ok(request):
    """The module-scoped diffusion server outlives each test: its processes are not a leak."""
    request.node._leak_ok = True


def document(server) -> dict:
    r = httpx.get(server.url + "/openapi.json", timeout=30)
    assert r.status_code == 200, r.text
    return r.json()


def _struct(ref: str) -> type:
    return getattr(responses, ref.rsplit("/", 1)[1])


def _validator(doc: dict, ref: str):
    return jsonschema_rs.validator_for({"$ref": ref, "components": doc["components"]})


def check_json(doc: dict, method: str, path: str, answer: httpx.Response) -> object:
    """``answer`` decoded into the struct ``doc`` documents for it, after validating it against
    the documented schema."""
    operation = doc["paths"][path][method.lower()]
    documented = operation["responses"][str(answer.status_code)]["content"]["application/json"]
    ref = documented["schema"]["$ref"]
    _validator(doc, ref).validate(answer.json())
    return msgspec.json.decode(answer.content, type=_struct(ref), strict=True)


def check_events(doc: dict, path: str, answer: httpx.Response) -> list:
    """Each ``data:`` line of a streamed ``answer`` decoded into the one struct of those ``doc``
    documents for the route's events that it validates against."""
    assert answer.status_code == 200 and answer.headers["content-type"].startswith(
        "text/event-stream"
    ), answer.text
    stream = doc["paths"][path]["post"]["responses"]["200"]["content"]["text/event-stream"]
    refs = [item["$ref"] for item in stream["x-event-data"]["oneOf"]]
    lines = [line[6:] for line in answer.text.splitlines() if line.startswith("data: ")]
    assert lines[-1] == "[DONE]", answer.text
    events = []
    for line in lines[:-1]:
        fits = [ref for ref in refs if _validator(doc, ref).is_valid(json.loads(line))]
        assert len(fits) == 1, (line, fits)
        events.append(msgspec.json.decode(line.encode(), type=_struct(fits[0]), strict=True))
    return events


def check_server_routes(server, doc: dict) -> responses.ServerInfo:
    for path in ("/health", "/ping", "/health_generate", "/ready", "/v1/models", "/get_model_info"):
        answer = httpx.get(server.url + path, timeout=60)
        assert answer.status_code == 200, (path, answer.text)
        check_json(doc, "GET", path, answer)
    info = check_json(doc, "GET", "/get_server_info", httpx.get(server.url + "/get_server_info"))
    assert isinstance(info, responses.ServerInfo) and info.schedulers[0] is not None
    return info


def check_kind_refusal(server, path: str, body: dict, routes: str) -> None:
    r = post(server.url + path, body)
    assert r.status_code == 400, r.text
    error = msgspec.json.decode(r.content, type=responses.ErrorBody, strict=True).error
    assert error.param == "model" and error.message.count(f"use {routes}") == 1, error
    assert error.message.count("use /") == 1, error


def test_embedding_server_answers_are_their_documented_structs(embedder):
    doc = document(embedder)
    info = check_server_routes(embedder, doc)
    assert info.device == "cpu" and info.model is not None
    for extra in ({}, {"encoding_format": "base64"}):
        r = post(embedder.url + "/v1/embeddings", {"input": ["a cat", "a dog"], **extra})
        assert r.status_code == 200, r.text
        vectors = check_json(doc, "POST", "/v1/embeddings", r)
        assert [e.index for e in vectors.data] == [0, 1]
    refused = post(embedder.url + "/v1/embeddings", {"input": "x", "model": "gpt-4"})
    assert refused.status_code == 404
    check_json(doc, "POST", "/v1/embeddings", refused)  # documented as ErrorBody
    check_kind_refusal(embedder, "/v1/completions", {"prompt": "hi"}, "/v1/embeddings")
    check_kind_refusal(embedder, "/generate", {"text": "hi"}, "/v1/embeddings")
    chat = {"messages": [{"role": "user", "content": "hi"}]}
    check_kind_refusal(embedder, "/v1/chat/completions", chat, "/v1/embeddings")


def test_generation_server_answers_and_streams_are_their_documented_structs(generator):
    doc = document(generator)
    check_server_routes(generator, doc)
    completion = {"prompt": ["hello", "world"], "max_tokens": 4, "ignore_eos": True}
    r = post(generator.url + "/v1/completions", completion)
    assert r.status_code == 200, r.text
    plain = check_json(doc, "POST", "/v1/completions", r)
    assert [c.finish_reason for c in plain.choices] == ["length", "length"]
    streamed = {**completion, "prompt": "hello", "stream": True}
    streamed["stream_options"] = {"include_usage": True}
    chunks = check_events(doc, "/v1/completions", post(generator.url + "/v1/completions", streamed))
    assert all(isinstance(c, responses.CompletionChunk) for c in chunks)
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 4
    assert all(c.usage is msgspec.UNSET for c in chunks[:-1])
    native = {
        "text": "hello",
        "sampling_params": {"max_new_tokens": 3, "ignore_eos": True, "temperature": 0},
    }
    r = post(generator.url + "/generate", native)
    assert r.status_code == 200, r.text
    result = check_json(doc, "POST", "/generate", r)
    assert result.meta_info.finish_reason == responses.FinishReason("length")
    events = check_events(
        doc, "/generate", post(generator.url + "/generate", {**native, "stream": True})
    )
    assert events[-1].text == result.text
    chat = {
        "messages": [{"role": "user", "content": "hello"}],
        "max_tokens": 3,
        "n": 2,
        "ignore_eos": True,
    }
    r = post(generator.url + "/v1/chat/completions", chat)
    assert r.status_code == 200, r.text
    answer = check_json(doc, "POST", "/v1/chat/completions", r)
    assert isinstance(answer, responses.ChatCompletion) and len(answer.choices) == 2
    streamed = {**chat, "stream": True, "stream_options": {"include_usage": True}}
    chunks = check_events(
        doc, "/v1/chat/completions", post(generator.url + "/v1/chat/completions", streamed)
    )
    assert all(isinstance(c, responses.ChatCompletionChunk) for c in chunks)
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 6
    check_kind_refusal(
        generator,
        "/v1/embeddings",
        {"input": "x"},
        "/v1/completions or /v1/chat/completions or /generate",
    )


def test_image_server_answers_and_events_are_their_documented_structs(painter, leak_ok):
    from support.diffusion import SIZE

    doc = document(painter)
    check_server_routes(painter, doc)
    body = {"prompt": "a cat", "size": f"{SIZE}x{SIZE}", "num_inference_steps": 2, "n": 2}
    route = "/v1/images/generations"
    r = httpx.post(painter.url + route, json=body, timeout=120)
    assert r.status_code == 200, r.text
    images = check_json(doc, "POST", route, r)
    assert len(images.data) == 2 and images.size == f"{SIZE}x{SIZE}"
    events = check_events(
        doc, route, httpx.post(painter.url + route, json={**body, "stream": True}, timeout=120)
    )
    kinds = [type(e).__name__ for e in events]
    assert kinds == ["ImageProgressEvent"] * 2 + ["ImageCompletedEvent"] * 2, kinds
    check_kind_refusal(painter, "/v1/embeddings", {"input": "x"}, "/v1/images/generations")
