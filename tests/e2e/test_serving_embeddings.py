"""End to end through the real CLI with the embedded default model (no --model-path): the first
request a user makes, the read-only routes, bad input (all 4xx with a clear message), a
schemathesis fuzz pass over the app's own OpenAPI schema, and a bounded load test at dp=1."""

from __future__ import annotations

import importlib.metadata
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
from support.serving import (
    REPO,
    cosine,
    embedding_body,
    load_line,
    post,
    report,
    run_load,
    server_env,
    start_server,
)


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    # No OpenMP settings of its own (the suite's processes run with some): the launch's default.
    env = server_env(OMP_WAIT_POLICY=None, GOMP_SPINCOUNT=None)
    srv = start_server([], tmp_path_factory.mktemp("default-model"), "default", env=env)
    yield srv
    srv.stop()


def embed(server, texts, **extra):
    r = post(server.url + "/v1/embeddings", {"input": texts, **extra})
    assert r.status_code == 200, r.text
    return r.json()


@pytest.mark.e2e
def test_first_request_with_the_default_model(server):
    body = embed(
        server,
        ["a cat sits on the mat", "a kitten rests on a rug", "stock prices fell sharply"],
        model="all-MiniLM-L6-v2",
    )
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
    from launchspec.model_source import resolve_model
    from platforms.builtin.cpu import CpuSRTPlatform
    from serving.srt.model_runner import ModelRunner

    texts = ["a cat sits on the mat", "stock prices fell sharply", "x"]
    served = [d["embedding"] for d in embed(server, texts)["data"]]
    local = ModelRunner(resolve_model("all-MiniLM-L6-v2"), platform=CpuSRTPlatform()).embed(texts)
    assert [len(v) for v in served] == [384, 384, 384]
    for got, want in zip(served, local, strict=True):
        assert max(abs(a - b) for a, b in zip(got, want, strict=True)) < 1e-5


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
    # The scheduler's OpenMP threads sleep while they wait (the environment says nothing).
    threads = info["model"]["cpu_threads"]
    assert threads["omp_wait_policy"] == "PASSIVE"
    assert threads["intra_op"] >= 1
    memory = info["schedulers"][0]["memory"]
    assert memory["total_bytes"] > memory["available_bytes"] > 0
    # An embedded model's name reaches the server arguments as its path, as platform code reads it.
    from launchspec.model_source import embedding_model_dir

    assert info["server_args"]["host"] == "127.0.0.1"
    assert info["server_args"]["model_path"] == str(embedding_model_dir())
    version = importlib.metadata.version("sglang-launch")  # pyproject.toml, the one source
    assert info["version"] == version and get("/openapi.json").json()["info"]["version"] == version
    embed(server, "count me")
    samples = metric_samples(get("/metrics").text)
    embeddings_200 = (("route", "/v1/embeddings"), ("status", "200"))
    assert samples[("sglang_launch_requests_total", embeddings_200)] >= 1
    assert samples[("sglang_launch_queue_depth", (("dp_rank", "0"),))] == 0
    assert samples[("sglang_launch_batch_size_count", ())] >= 1
    model = (("model_name", "all-MiniLM-L6-v2"),)
    assert samples[("sglang:prompt_tokens_total", model)] > 0
    latency = (("route", "/v1/embeddings"),)
    assert samples[("sglang_launch_request_latency_seconds_count", latency)] >= 1


def metric_samples(page: str) -> dict:
    """The /metrics page parsed by prometheus_client's own text parser: (name, labels) -> value."""
    from prometheus_client.parser import text_string_to_metric_families

    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(page)
        for s in family.samples
    }


BAD = [  # (name, body, status, words in the message, param)
    (
        "malformed JSON",
        b'{"input": "x"',
        400,
        "not valid JSON (Expecting ',' delimiter at character 13)",
        None,
    ),
    (
        "unterminated string",
        b'{"input": "x',
        400,
        "Unterminated string starting at character 10",
        None,
    ),
    ("not an object", b'["x"]', 400, "must be a JSON object", None),
    ("missing input", b"{}", 400, "input is required", "input"),
    ("wrong type", b'{"input": 5}', 400, "input must be a string or a list", "input"),
    ("empty text", b'{"input": ""}', 400, "must not be empty", "input"),
    ("empty list", b'{"input": []}', 400, "at least one", "input"),
    ("list of non-strings", b'{"input": [1, 2]}', 400, "input[0] must be a string", "input[0]"),
    ("unpaired surrogate", b'{"input": "\\ud800"}', 400, "Unicode", "input"),
    ("unpaired surrogate as a key", b'{"input": "x", "\\ud800": 1}', 400, "key", "\\ud800"),
    (
        "unpaired surrogate of the wrong type",
        b'{"input": "x", "dimensions": "\\ud800"}',
        400,
        "dimensions must be an integer or null, not a string",
        "dimensions",
    ),
    (
        "unsupported encoding",
        b'{"input": "x", "encoding_format": "int8"}',
        400,
        "'float' or 'base64'",
        "encoding_format",
    ),
    ("unknown model", b'{"input": "x", "model": "gpt-4"}', 404, "not served here", "model"),
    (
        "dimensions",
        b'{"input": "x", "dimensions": 128}',
        400,
        "dimensions is not supported",
        "dimensions",
    ),
    (
        "too many tokens",
        json.dumps({"input": "word " * 2000}).encode(),
        400,
        "limit of 256",
        "input",
    ),
    (
        "one text too long",
        json.dumps({"input": ["x", "word " * 400]}).encode(),
        400,
        "limit of 256",
        "input[1]",
    ),
    ("too many inputs", json.dumps({"input": ["x"] * 3000}).encode(), 400, "at most 2048", "input"),
    (
        "too many bytes",
        json.dumps({"input": "a" * 1_100_000}).encode(),
        413,
        "--max-request-bytes",
        None,
    ),
    ("not UTF-8", b'{"input": "\xff"}', 400, "not valid JSON (it is not UTF-8 text)", None),
    (
        "nested too deep",
        b'{"x": ' + b"[" * 200_000 + b"}",
        400,
        "not valid JSON (it is nested too deeply)",
        None,
    ),
]


@pytest.mark.e2e
@pytest.mark.parametrize("case", BAD, ids=[c[0] for c in BAD])
def test_bad_input_is_a_4xx_naming_the_field(server, case):
    _, body, status, words, param = case
    r = post(server.url + "/v1/embeddings", body)
    assert r.status_code == status, r.text
    error = r.json()["error"]
    assert words in error["message"] and error["code"] == status, error
    assert error["param"] == param, error
    assert "Value error" not in error["message"] and "at at" not in error["message"]


@pytest.mark.e2e
def test_too_long_input_leaves_no_tokenizer_warning_in_the_log(server):
    r = post(server.url + "/v1/embeddings", {"input": "word " * 2000})
    assert r.status_code == 400 and "input has 2002 tokens" in r.json()["error"]["message"], r.text
    assert httpx.get(server.url + "/health").status_code == 200
    assert "Token indices sequence length" not in server.log
    assert "2002 >" not in server.log


@pytest.mark.e2e
def test_wrong_route_method_and_model_kind_are_4xx(server):
    r = post(server.url + "/v1/completions", {"prompt": "hello"})
    assert r.status_code == 400 and "serves embedding" in r.json()["error"]["message"]
    assert r.json()["error"]["param"] == "model"
    r = post(server.url + "/generate", {"text": "hello"})
    assert r.status_code == 400
    assert httpx.get(server.url + "/nope").status_code == 404
    assert httpx.put(server.url + "/v1/models").status_code == 405
    # The server is still serving after all of that.
    assert httpx.get(server.url + "/health").status_code == 200


@pytest.mark.e2e
def test_schemathesis_fuzz_finds_no_server_error(server, tmp_path):
    st = shutil.which(
        "st", path=os.pathsep.join([str(REPO / ".venv" / "bin"), str(Path(sys.executable).parent)])
    )
    assert st, "schemathesis is part of the test extra"
    run = subprocess.run(
        [
            st,
            "run",
            server.url + "/openapi.json",
            "--checks",
            "not_a_server_error",
            "--phases",
            "examples,coverage,fuzzing",
            "--max-examples",
            "15",
            "--seed",
            "7",
            "--generation-database",
            "none",
            "--no-shrink",
            # One worker: hypothesis describes strategies with ast.parse, which CPython 3.11 can
            # fail from two threads at once ("AST constructor recursion depth mismatch").
            "--workers",
            "1",
            "--max-time",
            "20",
            # A fuzzed batch of 2047 texts takes a minute on a busy 2-core machine: the check is
            # for 5xx answers, not for speed.
            "--request-timeout",
            "180",
            "--report",
            "junit",
            "--report-dir",
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        env=server_env(),
        cwd=str(tmp_path),
    )
    assert run.returncode == 0, run.stdout[-6000:] + run.stderr[-2000:]
    assert httpx.get(server.url + "/health").json() == {"healthy": True}


@pytest.mark.e2e
def test_load_dp1_sixteen_clients_three_seconds(server, capsys):
    stats = run_load(server.url, embedding_body, clients=16, seconds=3)
    report(capsys, load_line("load dp=1", stats))
    assert stats["errors"] == [] and stats["requests"] > 0
    Path(server.log_path).with_name("load-dp1.json").write_text(
        json.dumps({k: v for k, v in stats.items() if k != "errors"})
    )
