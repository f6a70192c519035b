"""Log-probabilities, penalties and request groups on ``/v1/completions`` and ``/generate``, in
process, against a scheduler stand-in on a real ZeroMQ socket that fills ``Generated.logprobs``
(``support.fake_scheduler``): OpenAI's legacy shape (``tokens``, ``token_logprobs``,
``top_logprobs``, ``text_offset``, offsets running on across a stream's chunks) and SGLang's
``meta_info.output_token_logprobs`` / ``output_top_logprobs`` (the whole stream so far in each
event). Answers decode strictly into their structs."""

from __future__ import annotations

import asyncio
import json

import msgspec
from support.fake_scheduler import serve_app, token_text

from serving.http import responses


def events(text: str) -> list[dict]:
    return [
        json.loads(block[len("data: ") :])
        for block in text.split("\n\n")
        if block.startswith("data: ") and block != "data: [DONE]"
    ]


def test_completions_logprobs_in_openais_legacy_shape(tmp_path):
    async def scenario():
        async with serve_app(tmp_path) as s:
            two = await s.http.post(
                "/v1/completions",
                json={"prompt": ["ab", "cde"], "max_tokens": 3, "seed": 4, "logprobs": 2},
            )
            none = await s.http.post(
                "/v1/completions", json={"prompt": "ab", "max_tokens": 2, "logprobs": 0}
            )
            plain = await s.http.post("/v1/completions", json={"prompt": "ab", "max_tokens": 2})
            return two, none, plain, s.scheduler.generations

    two, none, plain, sent = asyncio.run(scenario())
    answer = msgspec.json.decode(two.content, type=responses.Completion, strict=True)
    assert [(g.params.logprobs, g.params.top_logprobs) for g in sent] == [
        (True, 2),
        (True, 2),
        (True, 0),
        (False, 0),
    ]
    assert len({g.group for g in sent[:2]}) == 1 and sent[0].group == answer.id
    tokens = [token_text(4, i) for i in range(3)]
    for choice in answer.choices:
        lp = choice.logprobs
        assert lp.tokens == tokens and lp.token_logprobs == [-0.1, -0.2, -0.3]
        assert lp.top_logprobs == [
            {t: -(i + 1) / 10, " alt": -(i + 1) / 10 - 1} for i, t in enumerate(tokens)
        ]
        assert lp.text_offset == [0, len(tokens[0]), len(tokens[0]) + len(tokens[1])]
    assert none.json()["choices"][0]["logprobs"]["top_logprobs"] is None
    assert len(none.json()["choices"][0]["logprobs"]["tokens"]) == 2
    assert plain.json()["choices"][0]["logprobs"] is None


def test_streamed_completion_logprobs_continue_the_text_offsets(tmp_path):
    async def scenario():
        async with serve_app(tmp_path) as s:
            return await s.http.post(
                "/v1/completions",
                json={"prompt": "ab", "max_tokens": 3, "seed": 2, "logprobs": 1, "stream": True},
            )

    chunks = [
        msgspec.convert(e, responses.CompletionChunk, strict=True)
        for e in events(asyncio.run(scenario()).text)
    ]
    logprobs = [c.choices[0].logprobs for c in chunks]
    assert [lp.tokens for lp in logprobs] == [[token_text(2, i)] for i in range(3)]
    offsets = [lp.text_offset[0] for lp in logprobs]
    text = "".join(c.choices[0].text for c in chunks)
    assert offsets == [0, len(token_text(2, 0)), len(token_text(2, 0) + token_text(2, 1))]
    assert text == "".join(token_text(2, i) for i in range(3))
    assert [lp.top_logprobs for lp in logprobs] == [
        [{token_text(2, i): -(i + 1) / 10}] for i in range(3)
    ]


def test_generate_returns_sglangs_logprob_fields(tmp_path):
    body = {"text": "hello", "sampling_params": {"max_new_tokens": 2, "seed": 9}}

    async def scenario():
        async with serve_app(tmp_path) as s:
            bare = await s.http.post("/generate", json={**body, "return_logprob": True})
            full = await s.http.post(
                "/generate",
                json={
                    **body,
                    "return_logprob": True,
                    "top_logprobs_num": 3,
                    "return_text_in_logprobs": True,
                },
            )
            none = await s.http.post("/generate", json=body)
            stream = await s.http.post(
                "/generate",
                json={**body, "stream": True, "return_logprob": True, "top_logprobs_num": 1},
            )
            return bare, full, none, stream, s.scheduler.generations

    bare, full, none, stream, sent = asyncio.run(scenario())
    assert [(g.params.logprobs, g.params.top_logprobs) for g in sent] == [
        (True, 0),
        (True, 3),
        (False, 0),
        (True, 1),
    ]
    assert len({g.group for g in sent}) == 4  # one group per HTTP request
    meta = msgspec.json.decode(bare.content, type=responses.GenerateResult, strict=True).meta_info
    assert meta.output_token_logprobs == [(-0.1, 100, None), (-0.2, 101, None)]
    assert meta.output_top_logprobs is msgspec.UNSET
    meta = msgspec.json.decode(full.content, type=responses.GenerateResult, strict=True).meta_info
    tokens = [token_text(9, 0), token_text(9, 1)]
    assert meta.output_token_logprobs == [(-0.1, 100, tokens[0]), (-0.2, 101, tokens[1])]
    assert [[entry[2] for entry in top] for top in meta.output_top_logprobs] == [
        [tokens[0], " alt", " other"],
        [tokens[1], " alt", " other"],
    ]
    assert all(entry[1] is None for top in meta.output_top_logprobs for entry in top)
    assert "output_token_logprobs" not in none.json()["meta_info"]
    streamed = [
        msgspec.convert(e, responses.GenerateChunk, strict=True) for e in events(stream.text)
    ]
    assert [len(c.meta_info.output_token_logprobs) for c in streamed] == [1, 2]  # all so far
    assert [len(c.meta_info.output_top_logprobs) for c in streamed] == [1, 2]


def test_penalties_reach_the_scheduler_from_every_generation_route(tmp_path):
    penalties = {"presence_penalty": 1.5, "frequency_penalty": -0.5}

    async def scenario():
        async with serve_app(tmp_path) as s:
            await s.http.post("/v1/completions", json={"prompt": "x", "max_tokens": 1, **penalties})
            await s.http.post(
                "/generate",
                json={"text": "x", "sampling_params": {"max_new_tokens": 1, **penalties}},
            )
            bad = await s.http.post(
                "/generate", json={"text": "x", "sampling_params": {"frequency_penalty": -3}}
            )
            start = await s.http.post("/generate", json={"text": "x", "logprob_start_len": 0})
            return s.scheduler.generations, bad, start

    sent, bad, start = asyncio.run(scenario())
    assert [(g.params.presence_penalty, g.params.frequency_penalty) for g in sent] == [
        (1.5, -0.5)
    ] * 2
    assert not any(g.raw for g in sent)  # a completion's prompt gets the tokenizer's special tokens
    assert bad.json()["error"]["param"] == "sampling_params.frequency_penalty"
    error = start.json()["error"]
    assert error["param"] == "logprob_start_len" and "prompt are not computed" in error["message"]
