"""End to end through the real CLI with a tiny causal LM built at test time (random weights, a
real tokenizer): exact token counts, greedy determinism, streaming, the API key, client
disconnects, and tensor parallelism (tp=2 gives tp=1's greedy tokens, and for requests that join
each other's running batch tp=1's greedy and seeded tokens, as every rank steps the batch and
samples the same tokens; a model with no plan is refused at start-up; tp=2 over two nodes, one
rank each, also gives tp=1's tokens)."""

from __future__ import annotations

import json
import threading

import httpx
import msgspec
import pytest
from support import wait_for
from support.http_bodies import SEEN_AS_500
from support.serving import (
    SchedulerSocket,
    Server,
    build_tiny_llama,
    leaving_client,
    post,
    server_env,
    start_server,
    start_two_nodes,
    stop_all,
)

pytestmark = pytest.mark.e2e  # every test here starts the launcher, a server or worker processes

KEY = "test-key-123"
AUTH = {"Authorization": f"Bearer {KEY}"}


@pytest.fixture(scope="module")
def tiny_path(tmp_path_factory):
    from launchspec.model_source import embedding_model_dir

    return build_tiny_llama(tmp_path_factory.mktemp("tiny") / "tiny-llama", embedding_model_dir())


@pytest.fixture(scope="module")
def server(tiny_path, tmp_path_factory):
    srv = start_server(
        # float32: greedy texts are compared with a tp-size 2 server's (--dtype auto may be bf16)
        ["--model-path", str(tiny_path), "--api-key", KEY, "--dtype", "float32"],
        tmp_path_factory.mktemp("tiny-server"),
        "tiny",
    )
    yield srv
    srv.stop()


def generate(url, text, headers=AUTH, **params):
    r = post(url + "/generate", {"text": text, "sampling_params": params}, headers)
    assert r.status_code == 200, r.text
    return r.json()


def test_ignore_eos_gives_exactly_the_requested_tokens_identically_twice(server):
    first = generate(server.url, "hello world", max_new_tokens=17, temperature=0, ignore_eos=True)
    second = generate(server.url, "hello world", max_new_tokens=17, temperature=0, ignore_eos=True)
    assert first["meta_info"]["completion_tokens"] == 17
    assert first["meta_info"]["finish_reason"] == {"type": "length"}
    assert first["meta_info"]["prompt_tokens"] > 0
    assert first["text"] == second["text"] and first["text"]
    r = post(
        server.url + "/v1/completions",
        {
            "model": "tiny-llama",
            "prompt": "hello world",
            "max_tokens": 17,
            "temperature": 0,
            "ignore_eos": True,
        },
        AUTH,
    )
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["usage"]["completion_tokens"] == 17
    assert body["choices"][0]["text"] == first["text"]
    assert body["choices"][0]["finish_reason"] == "length"


def test_seeded_sampling_repeats_and_stop_strings_cut(server):
    hot = dict(max_new_tokens=12, temperature=1.2, top_p=0.9, top_k=100, seed=11, ignore_eos=True)
    a, b = (
        generate(server.url, "once upon a time", **hot),
        generate(server.url, "once upon a time", **hot),
    )
    assert a["text"] == b["text"] and a["meta_info"]["seed"] == 11
    words = a["text"].split()
    cut = generate(server.url, "once upon a time", stop=[words[3]], **hot)
    assert cut["meta_info"]["finish_reason"] == {"type": "stop"}
    assert words[3] not in cut["text"] and a["text"].startswith(cut["text"])


def _events(response) -> list[dict]:
    out = []
    for line in response.iter_lines():
        if line.startswith("data: ") and line != "data: [DONE]":
            out.append(json.loads(line[6:]))
        elif line == "data: [DONE]":
            out.append("DONE")
    return out


def test_streaming_native_and_openai(server):
    whole = generate(server.url, "stream me", max_new_tokens=9, temperature=0, ignore_eos=True)
    body = {
        "text": "stream me",
        "stream": True,
        "sampling_params": {"max_new_tokens": 9, "temperature": 0, "ignore_eos": True},
    }
    with httpx.stream("POST", server.url + "/generate", json=body, headers=AUTH, timeout=60) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        events = _events(r)
    assert events[-1] == "DONE" and len(events) > 2
    assert events[-2]["text"] == whole["text"]
    assert events[-2]["meta_info"]["completion_tokens"] == 9
    body = {
        "prompt": "stream me",
        "max_tokens": 9,
        "temperature": 0,
        "ignore_eos": True,
        "stream": True,
    }
    with httpx.stream(
        "POST", server.url + "/v1/completions", json=body, headers=AUTH, timeout=60
    ) as r:
        chunks = _events(r)
    assert "".join(c["choices"][0]["text"] for c in chunks[:-1]) == whole["text"]
    assert chunks[-2]["choices"][0]["finish_reason"] == "length"


def _scheduler_answers(server, request) -> list:
    """Every answer of the server's scheduler to ``request``, sent on a DEALER socket of our own
    to the scheduler's endpoint (named in the server's log), until the final one."""
    import re

    endpoint = re.search(r"serving \S+ \(generation\) at (ipc://\S+)", server.log)
    assert endpoint, server.log
    sock = SchedulerSocket(endpoint.group(1))
    try:
        sock.send(request)
        return sock.answers()
    finally:
        sock.close()


def test_a_stream_naming_the_schedulers_tokenizer_is_answered_with_token_ids(server, tiny_path):
    """A streamed request that names the scheduler's own tokenizer (``TextDecoder.identity``, as
    the HTTP child computes it from the model directory) gets token ids and no text, and the ids
    decode to the plain request's text; naming another tokenizer, a stop string, or an HTTP child
    with more than ``ID_STREAMS`` requests outstanding gets text."""
    from serving import wire
    from serving.detokenize import IdStream, TextDecoder
    from serving.http.chat_template import load_tokenizer
    from serving.srt.scheduler import ID_STREAMS

    decoder = TextDecoder(load_tokenizer(str(tiny_path)))
    assert decoder.identity
    whole = generate(server.url, "ids please", max_new_tokens=12, temperature=0, ignore_eos=True)
    params = wire.SamplingParams(max_new_tokens=12, temperature=0.0, ignore_eos=True)

    def ask(rid: str, name: str, p: wire.SamplingParams = params, inflight: int = 1) -> list:
        request = wire.GenerateRequest(
            rid, "ids please", p, stream=True, inflight=inflight, decoder=name
        )
        return _scheduler_answers(server, request)

    answers = ask("ids-1", decoder.identity)
    assert all(a.text == "" and a.token_ids for a in answers), answers
    ids = [t for a in answers for t in a.token_ids]
    assert len(ids) == 12 and answers[-1].completion_tokens == 12
    stream = IdStream(decoder)
    pieces = [stream.push(a.token_ids, a.finished) for a in answers]
    assert "".join(pieces) == whole["text"]

    for rid, name, p, inflight in (
        ("ids-2", "another tokenizer", params, 1),
        ("ids-3", decoder.identity, msgspec.structs.replace(params, stop=["never appears"]), 1),
        ("ids-4", decoder.identity, params, ID_STREAMS + 1),  # a busy HTTP child
    ):
        answers = ask(rid, name, p, inflight)
        assert all(a.token_ids is None for a in answers), answers
        assert "".join(a.text for a in answers) == whole["text"]


def test_api_key_guards_all_but_health_and_ready(server):
    for path in ("/health", "/ready"):
        assert httpx.get(server.url + path).status_code == 200
    for method, path in (
        ("GET", "/v1/models"),
        ("GET", "/get_server_info"),
        ("GET", "/metrics"),
        ("GET", "/openapi.json"),
        ("POST", "/generate"),
        ("POST", "/v1/completions"),
    ):
        r = httpx.request(method, server.url + path, json={"text": "x"})
        assert r.status_code == 401, (path, r.text)
        assert "API key" in r.json()["error"]["message"]
        r = httpx.request(
            method, server.url + path, json={"text": "x"}, headers={"Authorization": "Bearer nope"}
        )
        assert r.status_code == 401
    assert httpx.get(server.url + "/v1/models", headers=AUTH).status_code == 200


def test_generation_bad_input_is_4xx(server):
    cases = [
        ({"text": ""}, "must not be empty"),
        ({"text": "x", "sampling_params": {"temperature": -1}}, "temperature"),
        ({"text": "x", "sampling_params": {"max_new_tokens": 0}}, "max_new_tokens"),
        ({"text": "x", "sampling_params": {"max_new_tokens": 5000}}, "max_position_embeddings"),
        ({"text": "x", "sampling_params": {"top_p": 0}}, "top_p"),
        ({"text": "x", "sampling_params": {"stop": ["a", "b", "c", "d", "e"]}}, "at most 4"),
        ({"text": "x", "sampling_params": {"seed": 2**70}}, "seed"),
        ({"text": ["x"]}, "text"),
    ]
    for body, words in cases:
        r = post(server.url + "/generate", body, AUTH)
        assert r.status_code == 400 and words in r.json()["error"]["message"], (body, r.text)
    r = post(server.url + "/v1/completions", {"prompt": "x", "model": "other"}, AUTH)
    assert r.status_code == 404
    r = post(server.url + "/v1/embeddings", {"input": "x"}, AUTH)
    assert r.status_code == 400 and "serves generation" in r.json()["error"]["message"]


# The generation routes' bodies a fault-injection run once saw answered with a plain-text 500.
SURROGATES = [case for case in SEEN_AS_500 if case[0] != "/v1/embeddings"]


@pytest.mark.parametrize(
    "route, body, param", SURROGATES, ids=[b.decode() for _, b, _ in SURROGATES]
)
def test_an_unpaired_surrogate_of_the_wrong_type_or_as_a_key_is_a_400_naming_it(
    server, route, body, param
):
    r = post(server.url + route, body, AUTH)
    assert r.status_code == 400 and r.headers["content-type"] == "application/json", r.text
    assert r.json()["error"]["param"] == param, r.text


def _scheduler_counts(server) -> dict:
    info = httpx.get(server.url + "/get_server_info", headers=AUTH, timeout=30).json()
    return info["schedulers"][0]


def test_client_disconnect_cancels_the_request(server):
    before = _scheduler_counts(server)
    long = {"max_new_tokens": 1000, "temperature": 0, "ignore_eos": True}
    # Streaming: read the first event, then hang up.
    with httpx.stream(
        "POST",
        server.url + "/generate",
        headers=AUTH,
        timeout=60,
        json={"text": "go on", "stream": True, "sampling_params": long},
    ) as r:
        next(r.iter_lines())
    wait_for(
        lambda: _scheduler_counts(server)["aborted"] > before["aborted"],
        60,
        "the scheduler to abort the stream",
        interval=0.1,
    )
    # Plain: give up while the server is generating (its tokens are under way).
    mid = _scheduler_counts(server)
    plain = {"text": "go on", "sampling_params": long}
    with leaving_client(server.url, "/generate", plain, AUTH):
        wait_for(
            lambda: _scheduler_counts(server)["generated_tokens"] > mid["generated_tokens"],
            60,
            "the plain request to generate",
            interval=0.1,
        )
    now = wait_for(
        lambda: (c := _scheduler_counts(server))["aborted"] - before["aborted"] >= 2 and c,
        60,
        "the scheduler to abort both requests",
        interval=0.1,
    )
    assert now["aborted"] - before["aborted"] == 2, now
    # Both stopped early: far fewer than the 2000 tokens asked for were generated.
    assert now["generated_tokens"] - before["generated_tokens"] < 1500


# Requests sent together, so that they join each other's running batch: greedy and seeded.
JOINING = [
    ("hello world", {"max_new_tokens": 24, "temperature": 0}),
    ("the quick brown fox", {"max_new_tokens": 9, "temperature": 0}),
    ("tensor parallel check", {"max_new_tokens": 16, "temperature": 1.1, "seed": 5}),
]


def together(url: str, headers: dict) -> list[str]:
    """The texts of ``JOINING``, sent at once from a thread each."""
    out: list[str] = [""] * len(JOINING)

    def one(i: int) -> None:
        text, params = JOINING[i]
        out[i] = generate(url, text, headers=headers, **params, ignore_eos=True)["text"]

    threads = [threading.Thread(target=one, args=(i,)) for i in range(len(JOINING))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=180)
    return out


def test_tp2_gives_the_same_tokens_as_tp1_alone_and_in_a_joined_batch(server, tiny_path, tmp_path):
    """One request at a time (greedy), then requests sent together that join each other's
    running batch (greedy and seeded): every rank steps the batch and samples the same tokens,
    so a tp=2 replica gives what one rank gives."""
    prompts = ["hello world", "the quick brown fox", "tensor parallel check"]
    want = [
        generate(server.url, p, max_new_tokens=20, temperature=0, ignore_eos=True)["text"]
        for p in prompts
    ]
    want_joined = together(server.url, AUTH)
    tp2 = start_server(
        ["--model-path", str(tiny_path), "--tp-size", "2", "--dtype", "float32"], tmp_path, "tp2"
    )
    try:
        got = [
            generate(tp2.url, p, headers={}, max_new_tokens=20, temperature=0, ignore_eos=True)[
                "text"
            ]
            for p in prompts
        ]
        got_joined = together(tp2.url, {})
        info = httpx.get(tp2.url + "/get_server_info", timeout=30).json()
        assert info["model"]["tp_size"] == 2
    finally:
        tp2.stop()
    assert got == want
    assert got_joined == want_joined and all(want_joined)


def test_tp2_over_two_nodes_gives_the_same_greedy_tokens_as_tp1(server, tiny_path, tmp_path):
    prompts = ["hello world", "the quick brown fox"]
    want = [
        generate(server.url, p, max_new_tokens=12, temperature=0, ignore_eos=True)["text"]
        for p in prompts
    ]
    nodes = start_two_nodes(
        ["--model-path", str(tiny_path), "--tp-size", "2"],
        tmp_path,
        "tp2-2nodes",
        env=server_env(GLOO_SOCKET_IFNAME="lo"),
    )
    try:
        got = [
            generate(
                nodes[0].url, p, headers={}, max_new_tokens=12, temperature=0, ignore_eos=True
            )["text"]
            for p in prompts
        ]
        assert "tp_group_joined" in nodes[1].log
    finally:
        stop_all(nodes)
    assert got == want
    assert [n.proc.returncode for n in nodes] == [0, 0], "\n".join(n.log for n in nodes)


def test_model_without_tp_plan_fails_start_up_clearly(tmp_path):
    srv = Server(["--tp-size", "2"], tmp_path / "no-plan.log")
    try:
        code = srv.wait_exit(timeout=180)
    finally:
        srv.stop()
    assert code == 2, srv.log  # refused from config.json before any worker starts
    assert "cannot be split over tensor-parallel ranks" in srv.log and "--tp-size 1" in srv.log
