"""End to end through the real CLI with the embedded default model (no --model-path): the first
request a user makes, the read-only routes, bad input (all 4xx with a clear message), a
schemathesis fuzz pass over the app's own OpenAPI schema, and a bounded load test at dp=1."""

from __future__ import annotations

import asyncio
import importlib.metadata
import json
import shutil
import subprocess
from pathlib import Path

import httpx
import pytest

from serving_support import (
    REPO,
    cosine,
    embedding_body,
    post,
    report,
    run_load,
    server_env,
    start_server,
)


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    srv = start_server([], tmp_path_factory.mktemp("default-model"), "default")
    yield srv
    srv.stop()


def embed(server, texts, **extra):
    r = post(server.url + "/v1/embeddings", {"input": texts, **extra})
    assert r.status_code == 200, r.text
    return r.json()


@pytest.mark.e2e
def test_first_request_with_the_default_model(server):
    body = embed(server, ["a cat sits on the mat", "a kitten rests on a rug", "stock prices fell sharply"],
                 model="all-MiniLM-L6-v2")
    cat, kitten, stocks = (d["embedding"] for d in body["data"])
    assert cosine(cat, kitten) > cosine(cat, stocks)
    assert body["model"] == "all-MiniLM-L6-v2" and body["object"] == "list"
    assert [d["index"] for d in body["data"]] == [0, 1, 2] and len(cat) == 384
    assert body["usage"]["prompt_tokens"] > 0
    single = embed(server, "a cat sits on the mat")["data"][0]["embedding"]
    assert cosine(single, cat) > 0.9999


@pytest.mark.e2e
def test_served_vectors_are_the_models_own(server):
    """What reaches the client (float32 bytes from the scheduler, JSON from the HTTP child) is the
    model's output as ModelRunner computes it in-process, for each text of a batch."""
    from platforms.builtin.cpu import CpuSRTPlatform

    from launcher.workers.model_runner import ModelRunner
    from launcher.model_source import resolve_model

    texts = ["a cat sits on the mat", "stock prices fell sharply", "x"]
    served = [d["embedding"] for d in embed(server, texts)["data"]]
    local = ModelRunner(resolve_model(None), platform=CpuSRTPlatform()).embed(texts)
    assert [len(v) for v in served] == [384, 384, 384]
    for got, want in zip(served, local):
        assert max(abs(a - b) for a, b in zip(got, want)) < 1e-5


@pytest.mark.e2e
def test_read_only_routes(server):
    get = lambda path: httpx.get(server.url + path, timeout=30)  # noqa: E731
    assert get("/health").json() == {"healthy": True}
    ready = get("/ready").json()
    assert ready["ready"] is True and len(ready["schedulers"]) == 1
    models = get("/v1/models").json()
    assert [m["id"] for m in models["data"]] == ["all-MiniLM-L6-v2"]
    info = get("/get_server_info").json()
    assert info["platform"]["key"] == "builtin:cpu" and info["device"] == "cpu"
    assert info["model"]["pooling"]["normalize"] is True
    memory = info["schedulers"][0]["memory"]
    assert memory["total_bytes"] > memory["available_bytes"] > 0
    assert info["server_args"]["host"] == "127.0.0.1" and info["server_args"]["model_path"] is None
    version = importlib.metadata.version("sglang-launch")  # pyproject.toml, the one source
    assert info["version"] == version and get("/openapi.json").json()["info"]["version"] == version
    embed(server, "count me")
    metrics = get("/metrics").text
    for name in ("sglang_requests_total{route=\"/v1/embeddings\",status=\"200\"}",
                 "sglang_request_latency_seconds_bucket", "sglang_batch_size_bucket",
                 "sglang_queue_depth{dp_rank=\"0\"} 0"):
        assert name in metrics, name


BAD = [
    ("malformed JSON", b'{"input": "x"', 400, "not valid JSON"),
    ("not an object", b'["x"]', 400, "invalid request"),
    ("missing input", b"{}", 400, "input"),
    ("wrong type", b'{"input": 5}', 400, "input"),
    ("empty text", b'{"input": ""}', 400, "must not be empty"),
    ("empty list", b'{"input": []}', 400, "at least one"),
    ("list of non-strings", b'{"input": [1, 2]}', 400, "input"),
    ("unpaired surrogate", b'{"input": "\\ud800"}', 400, "Unicode"),
    ("unsupported encoding", b'{"input": "x", "encoding_format": "base64"}', 400, "encoding_format"),
    ("unknown model", b'{"input": "x", "model": "gpt-4"}', 404, "not served here"),
    ("dimensions", b'{"input": "x", "dimensions": 128}', 400, "dimensions is not supported"),
    ("too many tokens", json.dumps({"input": "word " * 400}).encode(), 400, "limit of 256"),
    ("too many inputs", json.dumps({"input": ["x"] * 3000}).encode(), 400, "at most 2048"),
    ("too many bytes", json.dumps({"input": "a" * 1_100_000}).encode(), 413, "--max-request-bytes"),
    ("not UTF-8", b'{"input": "\xff"}', 400, "not valid JSON"),
    ("nested too deep", b'{"input": ' + b"[" * 200_000 + b"}", 400, "not valid JSON"),
]


@pytest.mark.e2e
@pytest.mark.parametrize("case", BAD, ids=[c[0] for c in BAD])
def test_bad_input_is_a_4xx_with_a_clear_message(server, case):
    _, body, status, words = case
    r = post(server.url + "/v1/embeddings", body)
    assert r.status_code == status, r.text
    error = r.json()["error"]
    assert words in error["message"] and error["code"] == status


# Refused before anything reaches a scheduler, by the body's schema (or the model name).
SCHEMA_BAD = [c for c in BAD if c[0] not in ("too many tokens", "too many bytes", "not UTF-8",
                                             "nested too deep")]


@pytest.mark.parametrize("case", SCHEMA_BAD, ids=[c[0] for c in SCHEMA_BAD])
def test_guard_dispatch_and_fastapi_endpoint_refuse_alike(case):
    """The Guard answers POST routes itself; FastAPI's endpoint for the same route (what
    /openapi.json documents) must refuse the same input with the same status and message."""
    from launcher.workers.app import AppState, create_app
    from launcher.workers.client import SchedulerClient
    from launcher.workers.metrics import Metrics

    guard = create_app(AppState(client=SchedulerClient([]), metrics=Metrics(), server_args=None,
                                served_name="all-MiniLM-L6-v2", model_path="builtin", platform={}))
    _, body, status, words = case

    async def answers():
        out = []
        for app in (guard, guard.app):  # the Guard's dispatch, then FastAPI's own endpoint
            transport = httpx.ASGITransport(app=app)
            async with httpx.AsyncClient(transport=transport, base_url="http://app") as client:
                r = await client.post("/v1/embeddings", content=body,
                                      headers={"content-type": "application/json"})
                out.append((r.status_code, r.json()["error"]["message"]))
        return out

    by_guard, by_fastapi = asyncio.run(answers())
    assert by_guard == by_fastapi
    assert by_guard[0] == status and words in by_guard[1]


@pytest.mark.e2e
def test_wrong_route_method_and_model_kind_are_4xx(server):
    r = post(server.url + "/v1/completions", {"prompt": "hello"})
    assert r.status_code == 400 and "serves embedding" in r.json()["error"]["message"]
    r = post(server.url + "/generate", {"text": "hello"})
    assert r.status_code == 400
    assert httpx.get(server.url + "/nope").status_code == 404
    assert httpx.put(server.url + "/v1/models").status_code == 405
    # The server is still serving after all of that.
    assert httpx.get(server.url + "/health").status_code == 200


@pytest.mark.e2e
def test_schemathesis_fuzz_finds_no_server_error(server, tmp_path):
    st = shutil.which("st", path=str(REPO / ".venv" / "bin"))
    assert st, "schemathesis is part of the test extra"
    run = subprocess.run(
        [st, "run", server.url + "/openapi.json", "--checks", "not_a_server_error",
         "--phases", "examples,coverage,fuzzing", "--max-examples", "15", "--seed", "7",
         "--generation-database", "none", "--no-shrink", "--workers", "2", "--max-time", "30",
         "--request-timeout", "30", "--report", "junit", "--report-dir", str(tmp_path)],
        capture_output=True, text=True, timeout=300, env=server_env(), cwd=str(tmp_path),
    )
    assert run.returncode == 0, run.stdout[-6000:] + run.stderr[-2000:]
    assert httpx.get(server.url + "/health").json() == {"healthy": True}


@pytest.mark.e2e
def test_load_dp1_sixteen_clients_twenty_seconds(server, capsys):
    stats = run_load(server.url, embedding_body, clients=16, seconds=20)
    report(capsys, f"load dp=1: {stats['requests']} requests, {len(stats['errors'])} errors, "
                   f"{stats['throughput_rps']:.1f} req/s, p50 {stats['p50_ms']:.1f} ms, "
                   f"p99 {stats['p99_ms']:.1f} ms")
    assert stats["errors"] == [] and stats["requests"] > 0
    Path(server.log_path).with_name("load-dp1.json").write_text(json.dumps(
        {k: v for k, v in stats.items() if k != "errors"}))
