"""Tool calls on ``/v1/chat/completions`` in process: the app in front of a scheduler stand-in on a
real ZeroMQ socket (``support.fake_scheduler``) that writes exactly the text a test gives it, as a
model that calls a tool would. The parsers read real texts of each format, whole and in pieces;
the official ``openai`` client (over loopback HTTP) gets ``message.tool_calls`` and the streamed
deltas; the prompt the scheduler receives shows how tools, earlier calls and tool results are
rendered (a template that reads tools, and the fallback prompt); ``required`` and a named
function send the grammar of a call; bad tools are 400s naming the field. The same with a real
model and the grammar enforced: ``tests/e2e/test_served_tool_calls.py``."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys

import msgspec
import openai
import pytest
from support import REPO, clean_env
from support.fake_scheduler import serve_app
from support.tools import ADD, TOOLS_TEMPLATE, WEATHER

from launchspec.server_args import TOOL_CALL_PARSERS, ServerArgs, ServerArgsError
from serving.http.chat_template import ChatTemplate
from serving.http.tool_parsers import FORCED, FORMATS, ToolStream, infer_parser, parse
from serving.http.tool_schemas import Tool
from serving.http.tools import FALLBACK_INTRO, forced_schema

CHAT = "/v1/chat/completions"
PLAIN_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}<{{ m['role'] }}> {{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}<assistant> {% endif %}"
)
NAMES = frozenset({"get_weather", "add"})
PARIS = '{"city": "Paris", "unit": "celsius"}'
QWEN_TEXT = (
    f'Let me look.\n<tool_call>\n{{"name": "get_weather", "arguments": {PARIS}}}\n</tool_call>\n'
    '<tool_call>\n{"name": "add", "arguments": {"a": 2, "b": true}}\n</tool_call>'
)
TEXTS = {  # a real text of each format, and the calls in it
    "qwen25": QWEN_TEXT,
    "qwen": QWEN_TEXT,
    "hermes": QWEN_TEXT.replace("<tool_call>\n", "<tool_call>").replace(
        "\n</tool_call>", "</tool_call>"
    ),
    "llama3": (
        f'Let me look.\n<|python_tag|>{{"name": "get_weather", "parameters": {PARIS}}}; '
        '{"name": "add", "parameters": {"a": 2, "b": true}}'
    ),
    "mistral": (
        f'Let me look.\n[TOOL_CALLS] [{{"name": "get_weather", "arguments": {PARIS}}}, '
        '{"name": "add", "arguments": {"a": 2, "b": true}}]'
    ),
}
CALLS = [("get_weather", PARIS), ("add", '{"a": 2, "b": true}')]


@pytest.fixture(scope="module")
def tokenizer():
    from transformers import AutoTokenizer

    from launchspec.model_source import embedding_model_dir

    tok = AutoTokenizer.from_pretrained(embedding_model_dir(), local_files_only=True)
    tok.bos_token = "[CLS]"
    return tok


def streamed(text: str, fmt, step: int) -> tuple[str, list[tuple[str, str]], list]:
    """``text`` fed ``step`` characters at a time: the content, the calls and every delta."""
    reader = ToolStream(fmt, NAMES)
    content, calls, deltas = "", {}, []
    pieces = [text[i : i + step] for i in range(0, len(text), step)]
    for k, piece in enumerate(pieces):
        more, parts = reader.feed(piece, final=k == len(pieces) - 1)
        content += more
        deltas += parts
        for d in parts:
            name, args = calls.get(d.index, ("", ""))
            calls[d.index] = (d.function.name or name, args + d.function.arguments)
    return content, [calls[i] for i in sorted(calls)], deltas


@pytest.mark.parametrize("parser", sorted(TEXTS))
def test_each_parser_reads_its_format_whole_and_in_any_pieces(parser):
    fmt = FORMATS[parser]
    content, calls = parse(TEXTS[parser], fmt, NAMES)
    assert content == "Let me look.\n"
    assert [(c.function.name, c.function.arguments) for c in calls] == CALLS
    assert all(c.id.startswith("call_") and c.type == "function" for c in calls)
    assert len({c.id for c in calls}) == 2
    for step in (1, 2, 5, 1000):
        assert streamed(TEXTS[parser], fmt, step)[:2] == ("Let me look.\n", CALLS)
    # The written form of calls (the fallback prompt's, and earlier calls written back) reads back.
    assert [
        (c.function.name, c.function.arguments) for c in parse(fmt.write(CALLS), fmt, NAMES)[1]
    ] == CALLS


def test_a_forced_answer_is_a_json_array_of_calls():
    text = (
        f'[{{"name": "get_weather", "parameters": {PARIS}}}, {{"name": "add", "parameters": {{}}}}]'
    )
    content, calls = parse(text, FORCED, NAMES)
    assert content is None
    assert [(c.function.name, c.function.arguments) for c in calls] == [
        ("get_weather", PARIS),
        ("add", "{}"),
    ]
    assert streamed(text, FORCED, 3)[:2] == (
        "",
        [("get_weather", PARIS), ("add", "{}")],
    )


@pytest.mark.parametrize(
    "text",
    [
        "Just words, no call.",
        "<tool_call>\nnot json\n</tool_call>",
        '<tool_call>\n{"name": "launch_rockets", "arguments": {}}\n</tool_call>',
        '<tool_call>\n{"name": "add", "arguments": [1, 2]}\n</tool_call>',
        'Cut short: <tool_call>\n{"name": "add", "argu',
    ],
)
def test_text_without_a_readable_call_is_all_content(text):
    fmt = FORMATS["qwen25"]
    assert parse(text, fmt, NAMES) == (text, [])
    for step in (1, 4):
        assert streamed(text, fmt, step)[:2] == (text, [])


def test_streamed_deltas_are_openai_s_first_the_call_then_its_arguments():
    _, _, deltas = streamed(QWEN_TEXT, FORMATS["qwen25"], 2)
    first = [d for d in deltas if d.index == 0]
    assert first[0].id.startswith("call_") and first[0].type == "function"
    assert first[0].function.name == "get_weather" and first[0].function.arguments == ""
    assert len(first) > 3  # the arguments come in parts
    assert all(d.id is msgspec.UNSET and d.function.name is msgspec.UNSET for d in first[1:])


def test_the_parser_follows_the_template_s_format():
    assert infer_parser(TOOLS_TEMPLATE) == "qwen25"
    assert infer_parser("{{ '<|python_tag|>' }}") == "llama3"
    assert infer_parser("[TOOL_CALLS] {{ x }}") == "mistral"
    assert infer_parser(PLAIN_TEMPLATE) == infer_parser(None) == "qwen25"
    assert set(TOOL_CALL_PARSERS) == set(FORMATS)


def openai_client(url: str) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=url + "/v1", api_key="unused", max_retries=0)


def test_auto_with_the_openai_client_whole_and_streamed(tmp_path, tokenizer):
    template = ChatTemplate(tokenizer, TOOLS_TEMPLATE, "model")
    script = "Checking.\n" + FORMATS["qwen25"].write([("get_weather", PARIS)])
    args = dict(
        model="tiny",
        messages=[{"role": "user", "content": "Weather in Paris?"}],
        tools=[WEATHER, ADD],
        max_tokens=200,
    )

    async def scenario():
        async with serve_app(tmp_path, loopback=True, chat=template) as s:
            s.scheduler.script = script
            client = openai_client(s.url)
            whole = await client.chat.completions.create(**args)
            chunks = [c async for c in await client.chat.completions.create(**args, stream=True)]
            s.scheduler.script = "Nothing to call."
            plain = await client.chat.completions.create(**args)
            return whole, chunks, plain, s.scheduler.generations

    whole, chunks, plain, sent = asyncio.run(scenario())
    choice = whole.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.content == "Checking.\n"
    (call,) = choice.message.tool_calls
    assert call.id.startswith("call_") and call.type == "function"
    assert call.function.name == "get_weather" and json.loads(call.function.arguments) == {
        "city": "Paris",
        "unit": "celsius",
    }
    assert sent[0].params.json_schema is None  # auto: the model writes what it likes
    deltas = [c.choices[0] for c in chunks if c.choices]
    assert "".join(d.delta.content or "" for d in deltas) == "Checking.\n"
    parts = [t for d in deltas for t in d.delta.tool_calls or []]
    assert parts[0].index == 0 and parts[0].id.startswith("call_") and parts[0].type == "function"
    assert parts[0].function.name == "get_weather" and parts[0].function.arguments == ""
    assert all(p.index == 0 and p.id is None and p.function.name is None for p in parts[1:])
    assert "".join(p.function.arguments for p in parts) == call.function.arguments
    assert deltas[-1].finish_reason == "tool_calls"
    assert all(d.finish_reason is None for d in deltas[:-1])
    assert plain.choices[0].message.content == "Nothing to call."
    assert plain.choices[0].message.tool_calls is None
    assert plain.choices[0].finish_reason == "stop"


def test_tools_and_the_conversation_s_calls_rendered_through_a_template_that_reads_them(
    tmp_path, tokenizer
):
    template = ChatTemplate(tokenizer, TOOLS_TEMPLATE, "model")
    assert template.renders_tools
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Weather in Paris?"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": PARIS},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": "18 degrees and sunny"},
    ]

    async def scenario():
        async with serve_app(tmp_path, chat=template) as s:
            s.scheduler.script = "It is 18 degrees."
            r = await s.http.post(
                CHAT, json={"messages": messages, "tools": [WEATHER], "max_tokens": 50}
            )
            assert r.status_code == 200, r.text
            return r.json(), s.scheduler.generations[0].text

    answer, prompt = asyncio.run(scenario())
    assert answer["choices"][0]["message"]["content"] == "It is 18 degrees."
    assert answer["choices"][0]["finish_reason"] == "stop"
    assert prompt.startswith("<|im_start|>system\nBe brief.\n\n# Tools\n")
    assert json.dumps(WEATHER) in prompt  # transformers' tojson keeps the order
    assert f'<tool_call>\n{{"name": "get_weather", "arguments": {PARIS}}}\n</tool_call>' in prompt
    assert "<|im_start|>user\n<tool_response>\n18 degrees and sunny\n</tool_response>" in prompt
    assert prompt.endswith("<|im_start|>assistant\n")


def test_a_template_that_does_not_read_tools_gets_the_fallback_prompt(tmp_path, tokenizer):
    template = ChatTemplate(tokenizer, PLAIN_TEMPLATE, "model")
    assert not template.renders_tools
    messages = [
        {"role": "user", "content": "Weather in Paris?"},
        {
            "role": "assistant",
            "content": "Looking.",
            "tool_calls": [{"id": "c", "function": {"name": "get_weather", "arguments": PARIS}}],
        },
        {"role": "tool", "tool_call_id": "c", "content": "18 degrees"},
    ]

    async def scenario():
        async with serve_app(tmp_path, chat=template) as s:
            s.scheduler.script = FORMATS["qwen25"].write([("add", '{"a": 1, "b": false}')])
            r = await s.http.post(
                CHAT, json={"messages": messages, "tools": [WEATHER, ADD], "max_tokens": 50}
            )
            assert r.status_code == 200, r.text
            return r.json(), s.scheduler.generations[0].text

    answer, prompt = asyncio.run(scenario())
    assert prompt.startswith(f"[CLS]<system> {FALLBACK_INTRO}\n")
    for tool in (WEATHER, ADD):
        assert json.dumps(tool["function"]) in prompt
    assert "written like this:\n<tool_call>\n" in prompt
    assert (
        f'<assistant> Looking.\n<tool_call>\n{{"name": "get_weather", "arguments": {PARIS}}}'
        in prompt
    )
    assert "<user> <tool_response>\n18 degrees\n</tool_response>" in prompt
    call = answer["choices"][0]["message"]["tool_calls"][0]
    assert call["function"] == {"name": "add", "arguments": '{"a": 1, "b": false}'}


def test_required_and_a_named_function_send_the_grammar_of_a_call_and_none_sends_no_tools(
    tmp_path, tokenizer
):
    template = ChatTemplate(tokenizer, TOOLS_TEMPLATE, "model")
    base = {
        "messages": [{"role": "user", "content": "go"}],
        "tools": [WEATHER, ADD],
        "max_tokens": 50,
    }
    named = {"type": "function", "function": {"name": "add"}}
    forced_text = '[{"name": "add", "parameters": {"a": 3, "b": true}}]'

    async def scenario():
        async with serve_app(tmp_path, chat=template) as s:
            s.scheduler.script = forced_text
            answers = []
            for extra in (
                {"tool_choice": "required"},
                {"tool_choice": named, "parallel_tool_calls": False},
                {"tool_choice": "none"},
            ):
                r = await s.http.post(CHAT, json={**base, **extra})
                assert r.status_code == 200, r.text
                answers.append(r.json()["choices"][0])
            return answers, s.scheduler.generations

    (required, by_name, none), sent = asyncio.run(scenario())
    tools = msgspec.convert([WEATHER, ADD], list[Tool])
    assert json.loads(sent[0].params.json_schema) == forced_schema(tools, True)
    assert json.loads(sent[1].params.json_schema) == {
        "type": "array",
        "minItems": 1,
        "maxItems": 1,
        "items": forced_schema(tools[1:], True)["items"],
    }
    for answer in (required, by_name):
        assert answer["finish_reason"] == "tool_calls"
        assert answer["message"]["content"] is None
        (call,) = answer["message"]["tool_calls"]
        assert call["function"] == {"name": "add", "arguments": '{"a": 3, "b": true}'}
    # none: no grammar, no tools in the prompt, and the text is not read for calls.
    assert sent[2].params.json_schema is None and "# Tools" not in sent[2].text
    assert "# Tools" in sent[0].text
    assert none["message"]["content"] == forced_text and "tool_calls" not in none["message"]
    assert none["finish_reason"] == "stop"


def bad_tool(**function) -> dict:
    return {"type": "function", "function": {"name": "f", **function}}


REFUSED = [  # (body fields beside a valid conversation, param, words in the message)
    ({"tools": [{"function": {"name": "f"}, "type": "retrieval"}]}, "tools[0].type", "'function'"),
    ({"tools": [bad_tool(name="no spaces")]}, "tools[0].function.name", "letters, digits"),
    ({"tools": [bad_tool(), bad_tool()]}, "tools[1].function.name", "given twice"),
    (
        {"tools": [bad_tool(parameters={"type": "string"})]},
        "tools[0].function.parameters",
        "object schema",
    ),
    (
        {"tools": [bad_tool(parameters={"type": "object", "properties": {"x": {"type": "text"}}})]},
        "tools[0].function.parameters.properties.x.type",
        "not a JSON Schema type",
    ),
    (
        {"tools": [bad_tool(parameters={"type": "object", "required": "x"})]},
        "tools[0].function.parameters.required",
        "list of property names",
    ),
    (
        {"tools": [bad_tool(parameters={"type": "object", "properties": {"x": 5}})]},
        "tools[0].function.parameters.properties.x",
        "must be a JSON Schema",
    ),
    ({"tools": [bad_tool(parameters=[1])]}, "tools[0].function.parameters", "JSON object"),
    ({"tools": [bad_tool()], "tool_choice": "always"}, "tool_choice", "not one of auto"),
    ({"tool_choice": "required"}, "tool_choice", "needs tools"),
    (
        {"tools": [bad_tool()], "tool_choice": {"type": "function", "function": {"name": "g"}}},
        "tool_choice.function.name",
        "offered: f",
    ),
    (
        {"tool_choice": {"type": "function", "function": {"name": "g"}}},
        "tool_choice.function.name",
        "offered: none",
    ),
    (
        {
            "messages": [
                {"role": "user", "content": "x"},
                {
                    "role": "assistant",
                    "tool_calls": [{"id": "c", "function": {"name": "f", "arguments": "{oops"}}],
                },
            ]
        },
        "messages[1].tool_calls[0].function.arguments",
        "JSON object as text",
    ),
    (
        {
            "messages": [
                {
                    "role": "user",
                    "content": "x",
                    "tool_calls": [{"id": "c", "function": {"name": "f", "arguments": "{}"}}],
                }
            ]
        },
        "messages[0].tool_calls",
        "only for an assistant",
    ),
    (
        {"messages": [{"role": "tool", "content": "42"}]},
        "messages[0].tool_call_id",
        "id of the call",
    ),
    ({"messages": [{"role": "assistant"}]}, "messages[0].content", "content is required"),
    (
        {
            "tools": [bad_tool()],
            "tool_choice": "required",
            "response_format": {"type": "json_object"},
        },
        "tool_choice",
        "leave out the other grammar",
    ),
    (
        {"tools": [bad_tool()], "tool_choice": "required", "regex": "[a-z]+"},
        "tool_choice",
        "a grammar of its own",
    ),
]


@pytest.mark.parametrize("case", REFUSED, ids=[c[1] + f"-{i}" for i, c in enumerate(REFUSED)])
def test_bad_tools_are_400s_naming_the_field(tmp_path, tokenizer, case):
    extra, param, words = case
    template = ChatTemplate(tokenizer, TOOLS_TEMPLATE, "model")
    body = {"messages": [{"role": "user", "content": "hi"}], **extra}

    async def scenario():
        async with serve_app(tmp_path, chat=template) as s:
            return await s.http.post(CHAT, json=body), s.scheduler.generations

    r, sent = asyncio.run(scenario())
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["param"] == param and words in error["message"], error
    assert sent == []


def test_tool_call_parser_names_sglang_s_formats_and_refuses_others(tmp_path, tokenizer):
    with pytest.raises(ServerArgsError, match="--tool-call-parser 'nope' is not one of hermes"):
        ServerArgs(tool_call_parser="nope").check_server_args()
    bad = subprocess.run(
        [sys.executable, "-m", "launcher", "--tool-call-parser", "nope"],
        env=clean_env(PYTHONPATH=str(REPO)),
        cwd=str(REPO),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert bad.returncode == 2, bad.stderr
    assert "--tool-call-parser" in bad.stderr and "qwen25" in bad.stderr and "llama3" in bad.stderr
    # A parser named at start-up reads the answer in its format, whatever the template.
    template = ChatTemplate(tokenizer, TOOLS_TEMPLATE, "model")
    body = {"messages": [{"role": "user", "content": "add"}], "tools": [ADD], "max_tokens": 50}

    async def scenario():
        args = ServerArgs(tool_call_parser="llama3")
        async with serve_app(tmp_path, chat=template, server_args=args) as s:
            s.scheduler.script = '<|python_tag|>{"name": "add", "parameters": {"a": 1, "b": true}}'
            return (await s.http.post(CHAT, json=body)).json()

    answer = asyncio.run(scenario())
    call = answer["choices"][0]["message"]["tool_calls"][0]
    assert call["function"] == {"name": "add", "arguments": '{"a": 1, "b": true}'}


def test_each_streamed_choice_reads_its_own_calls(tmp_path, tokenizer):
    from serving.http import responses

    template = ChatTemplate(tokenizer, TOOLS_TEMPLATE, "model")
    body = {
        "messages": [{"role": "user", "content": "go"}],
        "tools": [WEATHER, ADD],
        "max_tokens": 60,
        "n": 2,
        "stream": True,
    }

    async def scenario():
        async with serve_app(tmp_path, chat=template) as s:
            s.scheduler.script = FORMATS["qwen25"].write(CALLS)
            return await s.http.post(CHAT, json=body)

    r = asyncio.run(scenario())
    data = [b[len("data: ") :] for b in r.text.split("\n\n") if b.startswith("data: ")]
    assert data[-1] == "[DONE]"
    chunks = [
        msgspec.json.decode(d, type=responses.ChatCompletionChunk, strict=True) for d in data[:-1]
    ]
    for index in (0, 1):
        own = [c.choices[0] for c in chunks if c.choices[0].index == index]
        assert own[-1].finish_reason == "tool_calls"
        calls: dict[int, list[str]] = {}
        for choice in own:
            for part in choice.delta.tool_calls or []:
                calls.setdefault(part.index, ["", ""])
                if isinstance(part.function.name, str):
                    calls[part.index][0] = part.function.name
                calls[part.index][1] += part.function.arguments
        assert [tuple(calls[i]) for i in sorted(calls)] == CALLS


def test_a_forced_call_on_a_server_without_a_grammar_backend_is_a_400_naming_the_flag(
    tmp_path, tokenizer
):
    template = ChatTemplate(tokenizer, TOOLS_TEMPLATE, "model")
    body = {"messages": [{"role": "user", "content": "go"}], "tools": [ADD], "max_tokens": 9}

    async def scenario():
        args = ServerArgs(grammar_backend="none")
        async with serve_app(tmp_path, chat=template, server_args=args) as s:
            s.scheduler.script = "plain text"
            forced = await s.http.post(CHAT, json={**body, "tool_choice": "required"})
            auto = await s.http.post(CHAT, json=body)
            return forced, auto, s.scheduler.generations

    forced, auto, sent = asyncio.run(scenario())
    assert forced.status_code == 400
    error = forced.json()["error"]
    assert error["param"] == "tool_choice" and "--grammar-backend none" in error["message"]
    assert (
        auto.status_code == 200 and auto.json()["choices"][0]["message"]["content"] == "plain text"
    )
    assert len(sent) == 1  # only the auto request reached the scheduler


def test_llama3_calls_may_open_the_text_without_the_python_tag():
    fmt = FORMATS["llama3"]
    text = f'{{"name": "get_weather", "parameters": {PARIS}}}'
    content, calls = parse(text, fmt, NAMES)
    assert content is None and [(c.function.name, c.function.arguments) for c in calls] == [
        ("get_weather", PARIS)
    ]
    assert streamed(text, fmt, 1)[:2] == ("", [("get_weather", PARIS)])
    for plain in ('{"not": "a call"}', 'Text first {"name": "add", "parameters": {}}'):
        assert parse(plain, fmt, NAMES) == (plain, [])
        assert streamed(plain, fmt, 1)[:2] == (plain, [])
