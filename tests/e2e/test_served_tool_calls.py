"""Tool calls end to end with the official ``openai`` client: one server started through the real
CLI on a tiny random-weight Llama with a byte-level BPE tokenizer whose chat template renders tools
in the Qwen2.5 style (``support.tools``). Whatever the random weights
prefer, ``tool_choice`` ``required`` and a named function return calls whose arguments match the
function's schema (the grammar holds the model to it); a streamed call reassembles to the same
call; a tool's result goes back into the prompt through the template; ``none`` returns no calls.
How ``auto`` reads a call the model writes: ``tests/serving/test_tool_calls.py``."""

from __future__ import annotations

import json
import re

import openai
import pytest
from support.serving import start_server
from support.tools import ADD, WEATHER, build_tool_model, valid_arguments

pytestmark = pytest.mark.e2e

TOOLS = {"get_weather": WEATHER, "add": ADD}
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return build_tool_model(tmp_path_factory.mktemp("tools") / "tiny-tools")


@pytest.fixture(scope="module")
def server(model, tmp_path_factory):
    srv = start_server(["--model-path", str(model)], tmp_path_factory.mktemp("tools"), "tools")
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def client(server) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=120)


def check_calls(choice, names: set[str], finish: tuple[str, ...] = ("tool_calls",)) -> list:
    """The choice's calls, each checked: a function of ``names``, arguments valid for it."""
    assert choice.finish_reason in finish, choice
    calls = choice.message.tool_calls
    assert calls, choice
    for call in calls:
        assert call.type == "function" and call.id.startswith("call_")
        assert call.function.name in names
        arguments = json.loads(call.function.arguments)
        assert valid_arguments(TOOLS[call.function.name], arguments), call.function.arguments
    return calls


def test_required_always_returns_calls_that_match_their_schema(client):
    args = dict(model="tiny-tools", messages=ASK, tools=[WEATHER, ADD], tool_choice="required")
    for seed in range(4):
        answer = client.chat.completions.create(
            **args, parallel_tool_calls=False, temperature=1.0, seed=seed, max_tokens=250
        )
        assert len(check_calls(answer.choices[0], set(TOOLS))) == 1
    # Calls in parallel: a random model may go on calling until max_tokens, and every call
    # complete by then is there.
    answer = client.chat.completions.create(**args, temperature=1.0, seed=9, max_tokens=120)
    check_calls(answer.choices[0], set(TOOLS), ("tool_calls", "length"))


def test_a_named_function_is_the_one_called(client):
    for seed in range(3):
        answer = client.chat.completions.create(
            model="tiny-tools",
            messages=ASK,
            tools=[WEATHER, ADD],
            tool_choice={"type": "function", "function": {"name": "add"}},
            parallel_tool_calls=False,
            temperature=1.0,
            seed=seed,
            max_tokens=250,
        )
        (call,) = check_calls(answer.choices[0], {"add"})


def test_a_streamed_call_reassembles_to_the_same_call(client):
    args = dict(
        model="tiny-tools",
        messages=ASK,
        tools=[WEATHER, ADD],
        tool_choice="required",
        parallel_tool_calls=False,
        temperature=0,
        max_tokens=250,
    )
    whole = check_calls(client.chat.completions.create(**args).choices[0], set(TOOLS))
    deltas = [
        c.choices[0] for c in client.chat.completions.create(**args, stream=True) if c.choices
    ]
    parts = [p for d in deltas for p in d.delta.tool_calls or []]
    calls: dict[int, list[str]] = {}
    for p in parts:
        if p.id is not None:  # a call's first delta: its id, type and name, empty arguments
            assert p.type == "function" and p.function.arguments == "" and p.index not in calls
            calls[p.index] = [p.id, p.function.name, ""]
        else:
            assert p.function.name is None
            calls[p.index][2] += p.function.arguments
    assert [(n, a) for _, n, a in calls.values()] == [
        (c.function.name, c.function.arguments) for c in whole
    ]
    assert deltas[-1].finish_reason == "tool_calls"


def test_the_tool_s_result_goes_back_into_the_prompt(client, model):
    from transformers import AutoTokenizer

    arguments = {"city": "Paris", "unit": "celsius"}
    conversation = [
        *ASK,
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": json.dumps(arguments)},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": "18 degrees and sunny"},
    ]
    answer = client.chat.completions.create(
        model="tiny-tools", messages=conversation, tools=[WEATHER], tool_choice="none", max_tokens=3
    )
    # tool_choice none leaves the tools out of the prompt; the call and its result are in it.
    tok = AutoTokenizer.from_pretrained(model, local_files_only=True)
    rendered = [dict(m) for m in conversation]
    rendered[1] = {
        **rendered[1],
        "content": "",
        "tool_calls": [
            {
                **rendered[1]["tool_calls"][0],
                "function": {"name": "get_weather", "arguments": arguments},
            }
        ],
    }
    text = tok.apply_chat_template(rendered, add_generation_prompt=True, tokenize=False)
    assert "<tool_response>\n18 degrees and sunny\n</tool_response>" in text
    assert answer.usage.prompt_tokens == len(tok(text, add_special_tokens=False)["input_ids"])
    without = client.chat.completions.create(
        model="tiny-tools",
        messages=conversation[:2],
        tools=[WEATHER],
        tool_choice="none",
        max_tokens=3,
    )
    assert without.usage.prompt_tokens < answer.usage.prompt_tokens
    # none: no calls, whatever the model wrote.
    assert answer.choices[0].message.tool_calls is None
    assert answer.choices[0].finish_reason != "tool_calls"
    assert isinstance(answer.choices[0].message.content, str)


def test_auto_with_a_model_that_writes_no_call_answers_with_text(client):
    answer = client.chat.completions.create(
        model="tiny-tools", messages=ASK, tools=[WEATHER], max_tokens=8, temperature=0
    )
    choice = answer.choices[0]
    assert choice.message.tool_calls is None and choice.finish_reason in ("stop", "length")
    assert isinstance(choice.message.content, str)


def test_the_documented_tool_loop_runs_as_written(server, capsys):
    from support.serving import REPO

    page = (REPO / "docs" / "api.md").read_text(encoding="utf-8")
    (loop,) = [
        b for b in re.findall(r"^```python\n(.*?)^```", page, re.S | re.M) if "tool_calls" in b
    ]
    code = loop.replace("http://127.0.0.1:30000", server.url)
    scope: dict = {}
    exec(compile(code, "docs/api.md", "exec"), scope)
    messages = scope["messages"]
    assert [m["role"] for m in messages] == ["user", "assistant", "tool"]
    assert messages[2]["content"].startswith("18 degrees and sunny in ")
    assert messages[2]["tool_call_id"] == messages[1]["tool_calls"][0]["id"]
    assert isinstance(scope["final"].choices[0].message.content, str)
    assert capsys.readouterr().out.strip() == scope["final"].choices[0].message.content.strip()
