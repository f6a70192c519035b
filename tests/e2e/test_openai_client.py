"""The official ``openai`` Python client against live servers started through the real CLI: the
default model for embeddings (the client's default base64 encoding and "float", a list input,
models.list), the tiny causal LM for completions (plain and streamed, with logprobs), and error
responses the client raises as the matching exception class carrying the server's message and
``param``. Chat through the client: ``tests/e2e/test_chat.py``.
One request goes through the real ``curl`` binary, which labels its body as a form."""

from __future__ import annotations

import base64
import json
import re
import shutil
import struct
import subprocess

import httpx
import openai
import pytest
from support import REPO
from support.serving import build_tiny_llama, post, start_server

pytestmark = pytest.mark.e2e

KEY = "openai-test-key"
TEXTS = ["a cat sits on the mat", "stock prices fell sharply"]


@pytest.fixture(scope="module")
def embedder(tmp_path_factory):
    srv = start_server([], tmp_path_factory.mktemp("openai-embed"), "embed")
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def generator(tmp_path_factory):
    from launchspec.model_source import embedding_model_dir

    tmp = tmp_path_factory.mktemp("openai-tiny")
    path = build_tiny_llama(tmp / "tiny-llama", embedding_model_dir())
    srv = start_server(
        ["--model-path", str(path), "--api-key", KEY],
        tmp,
        "tiny",
        headers={"Authorization": f"Bearer {KEY}"},
    )
    yield srv
    srv.stop()


def client_for(server, api_key: str = "unused") -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url + "/v1", api_key=api_key, max_retries=0, timeout=120)


def test_embeddings_default_base64_and_float_agree(embedder):
    client = client_for(embedder)
    default = client.embeddings.create(model="all-MiniLM-L6-v2", input=TEXTS)
    floats = client.embeddings.create(
        model="all-MiniLM-L6-v2", input=TEXTS, encoding_format="float"
    )
    assert [d.index for d in default.data] == [0, 1]
    assert [len(d.embedding) for d in default.data] == [384, 384]
    assert [d.embedding for d in default.data] == [d.embedding for d in floats.data]
    assert default.model == "all-MiniLM-L6-v2" and default.usage.prompt_tokens > 0
    one = client.embeddings.create(model="all-MiniLM-L6-v2", input=TEXTS[0])
    alone = client.embeddings.create(
        model="all-MiniLM-L6-v2", input=TEXTS[0], encoding_format="float"
    )
    assert one.data[0].embedding == alone.data[0].embedding


def test_base64_is_little_endian_float32_as_openai_defines_it(embedder):
    raw = post(
        embedder.url + "/v1/embeddings", {"input": TEXTS[0], "encoding_format": "base64"}
    ).json()
    as_float = post(embedder.url + "/v1/embeddings", {"input": TEXTS[0]}).json()
    packed = base64.b64decode(raw["data"][0]["embedding"])
    assert len(packed) == 384 * 4
    assert list(struct.unpack("<384f", packed)) == as_float["data"][0]["embedding"]


def test_models_list(embedder):
    models = client_for(embedder).models.list()
    assert [m.id for m in models.data] == ["all-MiniLM-L6-v2"]
    assert models.data[0].owned_by == "sglang-launch"


def test_fields_the_client_sends_are_handled(embedder):
    client = client_for(embedder)
    with_user = client.embeddings.create(
        model="all-MiniLM-L6-v2", input=TEXTS[0], user="someone", encoding_format="float"
    )
    plain = client.embeddings.create(
        model="all-MiniLM-L6-v2", input=TEXTS[0], encoding_format="float"
    )
    assert with_user.data[0].embedding == plain.data[0].embedding
    with pytest.raises(openai.BadRequestError) as info:
        client.embeddings.create(model="all-MiniLM-L6-v2", input="x", dimensions=128)
    assert info.value.status_code == 400 and info.value.param == "dimensions"
    assert "dimensions is not supported" in info.value.body["message"]


def test_embedding_errors_are_the_clients_exception_classes(embedder):
    client = client_for(embedder)
    with pytest.raises(openai.NotFoundError) as info:
        client.embeddings.create(model="gpt-4", input="x")
    assert info.value.param == "model" and "is not served here" in info.value.body["message"]
    with pytest.raises(openai.BadRequestError) as info:
        client.embeddings.create(model="all-MiniLM-L6-v2", input="word " * 600)
    assert info.value.param == "input" and "limit of 256" in info.value.body["message"]
    assert "limit of 256" in str(info.value)
    with pytest.raises(openai.BadRequestError) as info:
        client.completions.create(model="all-MiniLM-L6-v2", prompt="hello")
    assert info.value.param == "model" and "serves embedding" in info.value.body["message"]
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(
            model="all-MiniLM-L6-v2", messages=[{"role": "user", "content": "hello"}]
        )
    assert info.value.param == "model" and "use /v1/embeddings" in info.value.body["message"]
    assert "Token indices sequence length" not in embedder.log


def test_completions_plain_and_streamed(generator):
    client = client_for(generator, KEY)
    name = client.models.list().data[0].id
    args = dict(
        model=name,
        prompt="the weather today is",
        max_tokens=6,
        temperature=0,
        extra_body={"ignore_eos": True},
    )
    plain = client.completions.create(**args)
    assert plain.object == "text_completion" and len(plain.choices) == 1
    assert plain.usage.completion_tokens == 6 and plain.choices[0].finish_reason == "length"
    chunks = list(
        client.completions.create(**args, stream=True, stream_options={"include_usage": True})
    )
    text = "".join(c.choices[0].text for c in chunks if c.choices)
    assert text == plain.choices[0].text
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"
    assert chunks[-1].usage.completion_tokens == 6 and chunks[-1].choices == []


def test_completions_logprobs_in_openais_legacy_shape(generator):
    client = client_for(generator, KEY)
    answer = client.completions.create(
        model=client.models.list().data[0].id,
        prompt="the weather today is",
        max_tokens=4,
        temperature=0,
        logprobs=2,
        extra_body={"ignore_eos": True},
    )
    logprobs = answer.choices[0].logprobs
    assert len(logprobs.tokens) == len(logprobs.token_logprobs) == 4
    assert all(lp <= 0 for lp in logprobs.token_logprobs)
    assert all(len(top) <= 2 for top in logprobs.top_logprobs)
    assert logprobs.text_offset[0] == 0 and logprobs.text_offset == sorted(logprobs.text_offset)


def test_generation_errors_are_the_clients_exception_classes(generator):
    with pytest.raises(openai.AuthenticationError) as info:
        client_for(generator, "wrong-key").models.list()
    assert "API key" in info.value.body["message"]
    client = client_for(generator, KEY)
    name = client.models.list().data[0].id
    with pytest.raises(openai.BadRequestError) as info:
        client.completions.create(model=name, prompt="x", max_tokens=5000)
    assert (
        info.value.param == "max_tokens" and "max_position_embeddings" in info.value.body["message"]
    )
    with pytest.raises(openai.BadRequestError) as info:
        client.completions.create(model=name, prompt="x", best_of=2)
    assert info.value.param == "best_of"
    with pytest.raises(openai.BadRequestError) as info:
        client.completions.create(model=name, prompt="x", logprobs=21)
    assert info.value.param == "logprobs" and "between 0 and 20" in info.value.body["message"]
    with pytest.raises(openai.BadRequestError) as info:
        client.embeddings.create(model=name, input="x")
    assert info.value.param == "model" and "serves generation" in info.value.body["message"]


@pytest.mark.skipif(shutil.which("curl") is None, reason="curl is not installed")
def test_curl_with_its_default_form_content_type(embedder):
    out = subprocess.run(
        [
            "curl",
            "-sS",
            "--max-time",
            "120",
            embedder.url + "/v1/embeddings",
            "-d",
            json.dumps({"input": TEXTS[0]}),
        ],
        capture_output=True,
        text=True,
        timeout=180,
        check=True,
    ).stdout
    vector = json.loads(out)["data"][0]["embedding"]
    assert (
        vector
        == post(embedder.url + "/v1/embeddings", {"input": TEXTS[0]}).json()["data"][0]["embedding"]
    )
    error = json.loads(
        subprocess.run(
            [
                "curl",
                "-sS",
                "--max-time",
                "120",
                embedder.url + "/v1/embeddings",
                "-d",
                '{"input": 5}',
            ],
            capture_output=True,
            text=True,
            timeout=180,
            check=True,
        ).stdout
    )["error"]
    assert error["param"] == "input" and error["code"] == 400
    assert httpx.get(embedder.url + "/health").json() == {"healthy": True}


# What docs/operating.md ("One format for every line") promises of the start-up output: every line
# starts "sglang-launch: ", and a log record (the launcher's, a worker's, uvicorn's, a library's)
# is "sglang-launch: [WORKER ]LEVEL LOGGER: MESSAGE" on each of its lines.
RECORD = re.compile(
    r"^sglang-launch: (?:[a-z_]+\.\d+ )?(DEBUG|INFO|WARNING|ERROR|CRITICAL) [\w.\-]+: .*$"
)
LEVEL_WORD = re.compile(r"\b(DEBUG|INFO|WARNING|ERROR|CRITICAL)\b:?")


def _in_the_one_format(lines: list[str], where: str) -> None:
    for line in lines:
        assert line.startswith("sglang-launch: "), f"{line!r} is in another format\n{where}"
        head = line.split(": ", 2)[1] if line.count(": ") >= 2 else ""
        if LEVEL_WORD.search(head):  # a log record: the whole head, as the format says
            assert RECORD.match(line), f"{line!r} is a record in another format\n{where}"


def test_every_line_of_the_start_up_output_has_the_one_format(embedder, generator):
    doc = (REPO / "docs" / "operating.md").read_text()
    section = doc[doc.index("### One format for every line") :]
    start = section.index("```text\n") + len("```text\n")
    example = section[start : section.index("\n```", start)].splitlines()
    assert len(example) >= 5 and any(RECORD.match(line) for line in example), example
    _in_the_one_format(example, "the example of docs/operating.md")
    for server in (embedder, generator):
        log = server.log
        start_up = log[: log.index("sglang-launch: ready at http")].splitlines()
        _in_the_one_format(start_up, log)
        # uvicorn's own lines are records of the HTTP child like any other.
        started = "sglang-launch: http.0 INFO uvicorn: Started server process ["
        assert any(line.startswith(started) for line in start_up), log
