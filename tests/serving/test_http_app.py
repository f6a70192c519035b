"""The HTTP child's ASGI app in-process (httpx's ASGI transport, no server, no scheduler): the one
route table drives both the routing of requests and /openapi.json, and every refusal made before a scheduler is
asked names its field (``param``) in the project's words."""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest

from launchspec.server_args import ServerArgs
from serving.http.app import AppState
from serving.http.dispatcher import Dispatcher
from serving.http.metrics import Metrics
from serving.http.pool import ReplicaPool
from serving.http.responses import PlatformSummary
from serving.http.routes import create_app


def make_app(**state):
    pool = ReplicaPool([])
    return create_app(
        AppState(
            pool=pool,
            dispatcher=Dispatcher(pool),
            metrics=Metrics("tiny"),
            server_args=ServerArgs(),
            served_name="tiny",
            model_path="/models/tiny",
            platform=PlatformSummary(key="builtin:cpu"),
            **state,
        )
    )


def call(
    app, method: str, path: str, body: bytes | None = None, headers: dict | None = None
) -> httpx.Response:
    async def go():
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://app") as client:
            return await client.request(method, path, content=body, headers=headers)

    return asyncio.run(go())


def test_openapi_is_built_from_the_route_table_that_serves():
    app = make_app()
    doc = call(app, "GET", "/openapi.json").json()
    assert doc["openapi"].startswith("3.1")
    served = {
        (r.method.lower(), r.path)
        for by_method in app.routes.values()
        for r in by_method.values()
        if r.in_schema
    }
    documented = {(method, path) for path, ops in doc["paths"].items() for method in ops}
    assert documented == served
    schemas = doc["components"]["schemas"]
    for by_method in app.routes.values():
        for route in by_method.values():
            if route.body is None or not route.in_schema:
                continue
            ref = doc["paths"][route.path][route.method.lower()]["requestBody"]["content"][
                "application/json"
            ]["schema"]["$ref"]
            assert ref == f"#/components/schemas/{route.body.__name__}"
            assert schemas[route.body.__name__]["type"] == "object"
    for path in ("/v1/completions", "/generate"):  # the streaming routes say what they stream
        answer = doc["paths"][path]["post"]["responses"]["200"]["content"]
        assert "data: [DONE]" in answer["text/event-stream"]["schema"]["description"]
    embedding = schemas["EmbeddingRequest"]["properties"]
    assert embedding["encoding_format"]["enum"] == ["float", "base64"]
    assert schemas["EmbeddingRequest"]["required"] == ["input"]
    page = call(app, "GET", "/docs")
    assert (
        page.status_code == 200 and "openapi.json" in page.text and "swagger" in page.text.lower()
    )


REFUSED = [  # (path, body, status, param, words)
    (
        "/v1/embeddings",
        {"input": "x", "encoding_format": "int8"},
        400,
        "encoding_format",
        "'float' or 'base64'",
    ),
    ("/v1/embeddings", {"input": ["a", ""]}, 400, "input[1]", "input[1] must not be empty"),
    ("/v1/embeddings", {"input": "x", "dimensions": 8}, 400, "dimensions", "leave dimensions out"),
    ("/v1/embeddings", {"input": "x", "model": "other"}, 404, "model", "serves 'tiny'"),
    ("/v1/completions", {}, 400, "prompt", "prompt is required"),
    ("/v1/completions", {"prompt": "x", "max_tokens": 0}, 400, "max_tokens", "between 1 and"),
    ("/v1/completions", {"prompt": "x", "n": 3}, 400, "n", "n is not supported"),
    (
        "/v1/completions",
        {"prompt": "x", "logprobs": 21},
        400,
        "logprobs",
        "logprobs must be between 0 and 20",
    ),
    ("/v1/completions", {"prompt": "x", "echo": True}, 400, "echo", "echo is not supported"),
    ("/v1/completions", {"prompt": ["a", "b"], "stream": True}, 400, "prompt", "one prompt"),
    (
        "/v1/completions",
        {"prompt": "x", "temperature": "hot"},
        400,
        "temperature",
        "temperature must be a number, not a string",
    ),
    (
        "/generate",
        {"text": "x", "sampling_params": {"temperature": 3}},
        400,
        "sampling_params.temperature",
        "between 0.0 and 2.0",
    ),
    (
        "/generate",
        {"text": "x", "sampling_params": {"stop": ["a"] * 5}},
        400,
        "sampling_params.stop",
        "at most 4",
    ),
    (
        "/generate",
        {"text": "x", "sampling_params": {"top_p": 0}},
        400,
        "sampling_params.top_p",
        "more than 0",
    ),
    (
        "/generate",
        {"text": "x", "sampling_params": {"seed": -1}},
        400,
        "sampling_params.seed",
        "between 0",
    ),
    ("/generate", {"text": ["x"]}, 400, "text", "text must be a string, not a list"),
    (
        "/generate",
        {"text": "x", "sampling_params": 5},
        400,
        "sampling_params",
        "must be a JSON object",
    ),
]


@pytest.mark.parametrize("case", REFUSED, ids=[f"{c[0]}-{c[3]}-{i}" for i, c in enumerate(REFUSED)])
def test_refusals_name_the_field(case):
    path, body, status, param, words = case
    r = call(make_app(), "POST", path, json.dumps(body).encode())
    error = r.json()["error"]
    assert (r.status_code, error["param"], error["code"]) == (status, param, status), error
    assert words in error["message"], error
    assert "Value error" not in error["message"] and "Input should" not in error["message"]


def test_any_content_type_is_read_as_json():
    r = call(
        make_app(),
        "POST",
        "/generate",
        b'{"text": ""}',
        headers={"content-type": "application/x-www-form-urlencoded"},
    )
    assert r.status_code == 400 and r.json()["error"]["param"] == "text"


def test_unknown_route_wrong_method_api_key_and_body_limit():
    app = make_app(api_key="k", max_request_bytes=100)
    r = call(app, "GET", "/v1/models")
    assert r.status_code == 401 and r.json()["error"]["type"] == "authentication_error"
    assert call(app, "GET", "/health").status_code != 401  # public
    key = {"Authorization": "Bearer k"}
    r = call(app, "GET", "/nope", headers=key)
    assert r.status_code == 404 and "/docs" in r.json()["error"]["message"]
    r = call(app, "DELETE", "/v1/embeddings", headers=key)
    assert r.status_code == 405 and r.headers["allow"] == "POST"
    r = call(app, "POST", "/v1/embeddings", b'{"input": "' + b"a" * 200 + b'"}', headers=key)
    assert r.status_code == 413 and "--max-request-bytes" in r.json()["error"]["message"]
    doc = call(app, "GET", "/openapi.json", headers=key).json()
    assert doc["components"]["securitySchemes"]["bearer"]["scheme"] == "bearer"


def test_metrics_page_parses_with_prometheus_client():
    from prometheus_client.parser import text_string_to_metric_families

    app = make_app()
    call(app, "POST", "/generate", b"{}")
    call(app, "GET", "/nope")
    app.state.metrics.observe_result(batch_size=3, prompt_tokens=7, completion_tokens=2)
    app.state.metrics.set_queue_depth(0, 1)
    r = call(app, "GET", "/metrics")
    assert r.headers["content-type"].startswith("text/plain; version=0.0.4")
    families = {f.name: f for f in text_string_to_metric_families(r.text)}
    assert {
        "sglang_launch_requests",
        "sglang_launch_request_latency_seconds",
        "sglang_launch_batch_size",
        "sglang_launch_queue_depth",
        "sglang:prompt_tokens",
        "sglang:generation_tokens",
    } <= set(families)
    values = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for f in families.values()
        for s in f.samples
    }
    generate_400 = (("route", "/generate"), ("status", "400"))
    assert values[("sglang_launch_requests_total", generate_400)] == 1
    assert values[("sglang_launch_requests_total", (("route", "other"), ("status", "404")))] == 1
    assert values[("sglang_launch_batch_size_bucket", (("le", "4.0"),))] == 1
    assert values[("sglang:prompt_tokens_total", (("model_name", "tiny"),))] == 7
    assert values[("sglang:generation_tokens_total", (("model_name", "tiny"),))] == 2
    assert values[("sglang_launch_queue_depth", (("dp_rank", "0"),))] == 1
    assert not any(name.endswith("_created") for name, _ in values)
