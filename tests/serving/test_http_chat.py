"""``POST /v1/chat/completions`` in process: the app (httpx's ASGI transport) in front of a
scheduler stand-in on a real ZeroMQ socket (``support.fake_scheduler``) that fills every field of
the wire, with the real tokenizer of the default model and a chat template. What the route sends
(the templated prompt, ``raw``, one ``group``, seeds, sampling fields), what it answers (OpenAI's
shapes, decoded strictly into their structs), its stream, and its refusals naming the field.
The same route through the CLI on a real model: ``tests/e2e/test_chat.py``."""

from __future__ import annotations

import asyncio
import json

import msgspec
import pytest
from support.fake_scheduler import MODEL, serve_app, token_text

from launchspec.server_args import ServerArgs, ServerArgsError
from serving.http import responses
from serving.http.chat_template import ChatTemplate, ChatTemplateError
from serving.http.schemas import ChatMessage

TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}<{{ m['role'] }}> {{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}<assistant> {% endif %}"
)
STRICT_TEMPLATE = (
    "{% if messages[0]['role'] != 'user' %}{{ raise_exception('the first message must be the "
    "user\\'s') }}{% endif %}{% for m in messages %}{{ m['content'] }}{% endfor %}"
)
CHAT = "/v1/chat/completions"


@pytest.fixture(scope="module")
def tokenizer():
    from transformers import AutoTokenizer

    from launchspec.model_source import embedding_model_dir

    tok = AutoTokenizer.from_pretrained(embedding_model_dir(), local_files_only=True)
    tok.bos_token = "[CLS]"
    return tok


@pytest.fixture
def template(tokenizer) -> ChatTemplate:
    return ChatTemplate(tokenizer, TEMPLATE, "model")


def rendered(tokenizer, conversation: list[dict]) -> str:
    return tokenizer.apply_chat_template(
        conversation, chat_template=TEMPLATE, add_generation_prompt=True, tokenize=False
    )


def words(seed: int, count: int) -> str:
    return "".join(token_text(seed, i) for i in range(count))


def events(text: str) -> list:
    """The ``data:`` payloads of a server-sent event stream (``"[DONE]"`` as is)."""
    out = []
    for block in text.split("\n\n"):
        if block.startswith("data: "):
            data = block[len("data: ") :]
            out.append(data if data == "[DONE]" else json.loads(data))
    return out


def test_messages_become_the_templated_prompt_sent_raw_one_group_seed_per_choice(
    tmp_path, tokenizer, template
):
    body = {
        "model": "tiny",
        "messages": [
            {"role": "developer", "content": "be brief"},
            {
                "role": "user",
                "content": [{"type": "text", "text": "hello"}, {"type": "text", "text": "there"}],
            },
            {"role": "assistant", "content": "hi", "name": "bot"},
            {"role": "user", "content": "more"},
        ],
        "max_tokens": 3,
        "n": 2,
        "seed": 5,
        "temperature": 0.7,
        "top_p": 0.9,
        "top_k": 20,
        "stop": ["zz"],
        "presence_penalty": 0.5,
        "frequency_penalty": -0.25,
        "user": "someone",
    }

    async def scenario():
        async with serve_app(tmp_path, chat=template) as s:
            r = await s.http.post(CHAT, json=body)
            assert r.status_code == 200, r.text
            answer = msgspec.json.decode(r.content, type=responses.ChatCompletion, strict=True)
            return answer, s.scheduler.generations

    answer, sent = asyncio.run(scenario())
    prompt = rendered(
        tokenizer,
        [
            {"role": "system", "content": "be brief"},
            {"role": "user", "content": "hello\nthere"},
            {"role": "assistant", "content": "hi"},
            {"role": "user", "content": "more"},
        ],
    )
    assert [g.text for g in sent] == [prompt, prompt] and prompt.startswith("[CLS]<system>")
    assert all(g.raw for g in sent)
    assert {g.group for g in sent} == {answer.id} and answer.id.startswith("chatcmpl-")
    assert [g.params.seed for g in sent] == [5, 6]
    params = sent[0].params
    assert (params.max_new_tokens, params.temperature, params.top_p, params.top_k) == (
        3,
        0.7,
        0.9,
        20,
    )
    assert (params.stop, params.presence_penalty, params.frequency_penalty) == (("zz",), 0.5, -0.25)
    assert not params.logprobs and params.top_logprobs == 0
    assert answer.object == "chat.completion" and answer.model == "tiny"
    assert [c.index for c in answer.choices] == [0, 1]
    assert [c.message.content for c in answer.choices] == [words(5, 3), words(6, 3)]
    assert all(c.message.role == "assistant" and c.logprobs is None for c in answer.choices)
    assert [c.finish_reason for c in answer.choices] == ["length", "length"]
    # The prompt is counted once, as the scheduler counted it; the choices' tokens add up.
    assert answer.usage == responses.Usage.of(len(prompt), 6)


def test_the_stream_has_the_role_first_then_deltas_then_finish_reason_and_usage(tmp_path, template):
    messages = [{"role": "user", "content": "stream me"}]

    async def scenario():
        async with serve_app(tmp_path, chat=template) as s:
            plain = await s.http.post(
                CHAT, json={"messages": messages, "max_tokens": 4, "seed": 3, "n": 2}
            )
            streamed = await s.http.post(
                CHAT,
                json={
                    "messages": messages,
                    "max_tokens": 4,
                    "seed": 3,
                    "n": 2,
                    "stream": True,
                    "stream_options": {"include_usage": True},
                },
            )
            return plain.json(), streamed

    plain, streamed = asyncio.run(scenario())
    assert streamed.headers["content-type"].startswith("text/event-stream")
    data = events(streamed.text)
    assert data[-1] == "[DONE]"
    chunks = [msgspec.convert(d, responses.ChatCompletionChunk, strict=True) for d in data[:-1]]
    assert all(c.object == "chat.completion.chunk" for c in chunks)
    assert chunks[-1].choices == [] and chunks[-1].usage == msgspec.convert(
        plain["usage"], responses.Usage
    )
    for index in (0, 1):
        own = [c.choices[0] for c in chunks[:-1] if c.choices[0].index == index]
        assert own[0].delta == responses.ChatDelta(role="assistant", content="")
        assert own[-1].finish_reason == "length" and own[-1].delta == responses.ChatDelta()
        assert all(c.finish_reason is None for c in own[:-1])
        text = "".join(c.delta.content for c in own[1:-1] if isinstance(c.delta.content, str))
        assert text == plain["choices"][index]["message"]["content"]
    assert all(c.usage is msgspec.UNSET for c in chunks[:-1])


def test_logprobs_and_top_logprobs_in_the_chat_shape(tmp_path, template):
    body = {"messages": [{"role": "user", "content": "x"}], "max_tokens": 2, "seed": 1}

    async def scenario():
        async with serve_app(tmp_path, chat=template) as s:
            asked = {**body, "logprobs": True, "top_logprobs": 2}
            plain = await s.http.post(CHAT, json=asked)
            streamed = await s.http.post(CHAT, json={**asked, "stream": True})
            return plain, streamed, s.scheduler.generations

    plain, streamed, sent = asyncio.run(scenario())
    assert sent[0].params.logprobs and sent[0].params.top_logprobs == 2
    answer = msgspec.json.decode(plain.content, type=responses.ChatCompletion, strict=True)
    content = answer.choices[0].logprobs.content
    assert [t.token for t in content] == [token_text(1, 0), token_text(1, 1)]
    assert [t.logprob for t in content] == [-0.1, -0.2]
    assert content[0].bytes == list(token_text(1, 0).encode())
    assert [[a.token for a in t.top_logprobs] for t in content] == [
        [token_text(1, 0), " alt"],
        [token_text(1, 1), " alt"],
    ]
    deltas = [
        d["choices"][0]["logprobs"]["content"]
        for d in events(streamed.text)[:-1]
        if d["choices"][0]["logprobs"]
    ]
    assert [t for part in deltas for t in part] == msgspec.to_builtins(content)


def test_without_max_tokens_a_choice_may_fill_the_context(tmp_path, template):
    messages = [{"role": "user", "content": "how long"}]

    async def scenario():
        async with serve_app(tmp_path, chat=template) as s:
            for limits in ({}, {"max_tokens": 9}, {"max_tokens": 9, "max_completion_tokens": 4}):
                r = await s.http.post(CHAT, json={"messages": messages, **limits})
                assert r.status_code == 200, r.text
            return [g.params.max_new_tokens for g in s.scheduler.generations]

    prompt = template.render(msgspec.convert(messages, list[ChatMessage]), "tiny")
    room = MODEL.max_total_tokens - template.count_tokens(prompt)
    assert asyncio.run(scenario()) == [room, 9, 4]


REFUSED = [  # (body fields beside a valid conversation, param, words in the message)
    ({"messages": []}, "messages", "at least one message"),
    (
        {"messages": [{"role": "tool", "content": "42"}]},
        "messages[0].tool_call_id",
        "tool_call_id is required",
    ),
    ({"messages": [{"role": "robot", "content": "x"}]}, "messages[0].role", "use one of"),
    ({"messages": [{"role": "user"}]}, "messages[0].content", "content is required"),
    (
        {"messages": [{"role": "user", "content": [{"type": "image_url"}]}]},
        "messages[0].content[0].type",
        "text only",
    ),
    ({"messages": [{"role": "user", "content": 5}]}, "messages[0].content", "must be a string"),
    ({"top_logprobs": 2}, "top_logprobs", "needs logprobs: true"),
    ({"logprobs": True, "top_logprobs": 21}, "top_logprobs", "between 0 and 20"),
    ({"n": 0}, "n", "between 1 and 128"),
    ({"max_tokens": 0}, "max_tokens", "between 1 and"),
    ({"max_completion_tokens": 0}, "max_completion_tokens", "between 1 and"),
    ({"presence_penalty": 3}, "presence_penalty", "between -2.0 and 2.0"),
    ({"temperature": 5}, "temperature", "between 0.0 and 2.0"),
    ({"tools": [{"type": "function"}]}, "tools[0].function", "is required"),
    ({"tool_choice": "required"}, "tool_choice", "needs tools"),
    ({"response_format": {"type": "xml"}}, "response_format.type", "not supported"),
    ({"response_format": {"type": "json_schema"}}, "response_format.json_schema", "is required"),
    (
        {"response_format": {"type": "json_schema", "json_schema": {"schema": {}}}},
        "response_format.json_schema.name",
        "letters, digits",
    ),
    (
        {"response_format": {"type": "json_object"}, "regex": "a+"},
        "regex",
        "at most one",
    ),
    ({"regex": "a", "ebnf": 'root ::= "a"'}, "ebnf", "at most one grammar"),
    ({"json_schema": "{not json"}, "json_schema", "not valid JSON"),
    ({"logit_bias": {"5": 1.0}}, "logit_bias", "leave logit_bias out"),
    ({"model": "other"}, "model", "serves 'tiny'"),
]


@pytest.mark.parametrize("case", REFUSED, ids=[c[1] + f"-{i}" for i, c in enumerate(REFUSED)])
def test_refusals_name_the_field(tmp_path, template, case):
    fields, param, words = case
    body = {"messages": [{"role": "user", "content": "x"}], **fields}

    async def scenario():
        async with serve_app(tmp_path, chat=template) as s:
            return await s.http.post(CHAT, json=body), s.scheduler.received

    r, received = asyncio.run(scenario())
    error = r.json()["error"]
    assert (error["param"], error["code"]) == (param, r.status_code), error
    assert r.status_code in (400, 404) and words in error["message"], error
    assert received == []  # refused before anything reached the scheduler


def test_text_with_an_unpaired_surrogate_is_refused_naming_it(tmp_path, template):
    bodies = {
        "messages[0].content": b'{"messages": [{"role": "user", "content": "a\\ud800"}]}',
        "messages[0].content[0].text": (
            b'{"messages": [{"role": "user", "content": [{"type": "text", "text": "\\udfff"}]}]}'
        ),
    }

    async def scenario():
        async with serve_app(tmp_path, chat=template) as s:
            return {p: await s.http.post(CHAT, content=b) for p, b in bodies.items()}

    for param, r in asyncio.run(scenario()).items():
        error = r.json()["error"]
        assert (r.status_code, error["param"]) == (400, param), error
        assert "unpaired surrogate" in error["message"]


def test_a_model_without_a_template_is_a_400_naming_chat_template(tmp_path, tokenizer):
    reason = "it has no chat template (tokenizer_config.json or chat_template.jinja)"
    cases = [ChatTemplate(tokenizer, None, None, reason), None]  # no template; none loaded

    async def scenario():
        answers = []
        for chat in cases:
            async with serve_app(tmp_path, chat=chat) as s:
                answers.append(
                    await s.http.post(CHAT, json={"messages": [{"role": "user", "content": "x"}]})
                )
        return answers

    answers = asyncio.run(scenario())
    for r in answers:
        error = r.json()["error"]
        assert r.status_code == 400 and error["param"] == "messages", error
        assert "--chat-template FILE" in error["message"], error
        assert "model 'tiny' has no chat" in error["message"], error
    assert reason in answers[0].json()["error"]["message"]
    assert "no tokenizer was loaded" in answers[1].json()["error"]["message"]


def test_a_template_that_refuses_the_conversation_is_a_400_with_its_words(tmp_path, tokenizer):
    chat = ChatTemplate(tokenizer, STRICT_TEMPLATE, "--chat-template strict.jinja")

    async def scenario():
        async with serve_app(tmp_path, chat=chat) as s:
            return await s.http.post(CHAT, json={"messages": [{"role": "system", "content": "x"}]})

    error = asyncio.run(scenario()).json()["error"]
    assert (
        error["param"] == "messages" and "the first message must be the user's" in error["message"]
    )
    assert "--chat-template strict.jinja" in error["message"]


def test_an_embedding_model_refuses_chat_naming_its_routes(tmp_path):
    async def scenario():
        async with serve_app(tmp_path, kind="embedding") as s:
            return await s.http.post(CHAT, json={"messages": [{"role": "user", "content": "x"}]})

    error = asyncio.run(scenario()).json()["error"]
    assert error["param"] == "model"
    assert error["message"] == "model 'tiny' serves embedding, not generation; use /v1/embeddings"


# ---- where the template comes from ---------------------------------------------------------


@pytest.fixture(scope="module")
def model_dirs(tmp_path_factory, tokenizer):
    """A tokenizer-only directory with a chat template of its own, and one without."""
    root = tmp_path_factory.mktemp("templates")
    with_template, without = root / "with", root / "without"
    tokenizer.save_pretrained(without)
    tokenizer.chat_template = TEMPLATE
    try:
        tokenizer.save_pretrained(with_template)
    finally:
        tokenizer.chat_template = None
    return with_template, without


def test_the_template_is_the_models_own_or_the_one_chat_template_names(model_dirs, tmp_path):
    with_template, without = model_dirs
    own = ChatTemplate.load(str(with_template))
    assert (own.source, own.template) == ("model", TEMPLATE)
    override = tmp_path / "mine.jinja"
    override.write_text("{% for m in messages %}[{{ m['content'] }}]{% endfor %}")
    for folder in (with_template, without):
        chosen = ChatTemplate.load(str(folder), str(override))
        assert chosen.source == f"--chat-template {override}"
        assert chosen.template == override.read_text()
    none = ChatTemplate.load(str(without))
    assert none.template is None and "has no chat template" in none.reason
    broken = ChatTemplate.load(str(tmp_path / "no-such-model"))
    assert broken.template is None and "could not be loaded" in broken.reason


def test_a_chat_template_file_that_cannot_be_used_stops_the_start_with_the_reason(
    tmp_path, model_dirs
):
    bad = tmp_path / "bad.jinja"
    bad.write_text("{% for m in messages %}{{ m['content'] }")
    with pytest.raises(
        ChatTemplateError, match=r"--chat-template .*bad.jinja: not a valid Jinja template"
    ):
        ChatTemplate.load(str(model_dirs[0]), str(bad))
    with pytest.raises(ChatTemplateError, match="cannot read the file"):
        ChatTemplate.load(str(model_dirs[0]), str(tmp_path / "missing.jinja"))
    with pytest.raises(ServerArgsError) as info:
        ServerArgs(chat_template=str(tmp_path / "missing.jinja")).check_server_args()
    assert "--chat-template" in str(info.value) and "not a readable file" in str(info.value)


# ---- several choices streamed as one -----------------------------------------------------------


def test_merged_streams_yield_in_arrival_order_and_close_together():
    from serving.http.streaming import merged

    closed: list[str] = []

    async def stream(name: str, count: int, fail: bool = False):
        try:
            for i in range(count):
                await asyncio.sleep(0)
                yield f"{name}{i}"
            if fail:
                raise ValueError(f"{name} failed")
            await asyncio.Event().wait()  # never ends by itself: only closing ends it
        finally:
            closed.append(name)

    async def scenario():
        seen = []
        together = merged([stream("a", 2), stream("b", 3)])
        async for index, item in together:
            seen.append((index, item))
            if len(seen) == 5:
                break
        await together.aclose()
        failing = merged([stream("c", 1, fail=True), stream("d", 5)])
        with pytest.raises(ValueError, match="c failed"):
            async for _ in failing:
                pass
        return seen

    seen = asyncio.run(scenario())
    assert sorted(seen) == [(0, "a0"), (0, "a1"), (1, "b0"), (1, "b1"), (1, "b2")]
    assert [item for index, item in seen if index == 1] == ["b0", "b1", "b2"]
    assert sorted(closed) == ["a", "b", "c", "d"]
