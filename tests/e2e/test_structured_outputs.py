"""Structured outputs (issue 41) against live servers started through the real CLI, with the
official ``openai`` client where users use it: two tiny random-weight Llamas with a byte-level
BPE tokenizer (``support.structured``). One leans towards the tokens that close a JSON string,
array or object (``closing_bias``), so that a grammar which leaves the length open still ends
within ``max_tokens``; the other is plain random, served with two tensor-parallel ranks (every
rank applies the grammar and they pick the same tokens).

Checked: ``parse()`` with a Pydantic model returns a parsed object on each of 20 requests;
``json_object`` output always parses (greedy, sampled, streamed, ``n``); a ``regex`` on
``/generate`` always matches; constrained and unconstrained requests in one batch leave the
unconstrained greedy texts unchanged; logprobs list only tokens the grammar allowed; a grammar
that cannot end within ``max_tokens`` ends with "length"; every bad grammar is a 400 naming the
field; ``--grammar-backend none`` refuses constrained requests and ``llguidance`` is refused at
start-up; the grammar backend plugin of docs/plugins.md runs as written."""

from __future__ import annotations

import json
import math
import re
import subprocess
from concurrent.futures import ThreadPoolExecutor
from typing import Literal

import openai
import pydantic
import pytest
from support import REPO, make_dist, wait_for
from support.serving import cli_command, post, server_env, start_server
from support.structured import build_tiny_bpe_llama

pytestmark = pytest.mark.e2e

REGEX = r"[0-9]{3}-[a-z]{2,6} (yes|no)"
PROMPTS = ["a cat sits", "the weather is", "stock prices", "once upon a time"]


@pytest.fixture(scope="module")
def biased_model(tmp_path_factory):
    """The model that leans towards closing tokens, built once for the module's servers."""
    return build_tiny_bpe_llama(
        tmp_path_factory.mktemp("structured-model") / "tiny-closing", closing_bias=1.0
    )


@pytest.fixture(scope="module")
def biased(biased_model, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("structured-biased")
    srv = start_server(["--model-path", str(biased_model)], tmp, "biased")
    yield srv
    srv.stop()


def documented_plugin() -> str:
    """docs/plugins.md "Grammar backends": its plugin, as written."""
    doc = (REPO / "docs" / "plugins.md").read_text(encoding="utf-8")
    section = doc[doc.index("### Grammar backends") :]
    start = section.index("```python\n") + len("```python\n")
    return section[start : section.index("```\n", start)]


@pytest.fixture(scope="module")
def plain(tmp_path_factory):
    """The plain model on two tensor-parallel ranks, with the documented grammar plugin."""
    tmp = tmp_path_factory.mktemp("structured-plain")
    path = build_tiny_bpe_llama(tmp / "tiny-plain")
    site = tmp / "site"
    make_dist(
        site,
        "grammar-plugin",
        {"sglang.srt.plugins": {"grammar": "grammar_plugin:register"}},
        {"grammar_plugin.py": documented_plugin()},
    )
    env = server_env(PYTHONPATH=str(site))
    # float32: greedy texts alone and beside constrained requests are compared (a batch's
    # bfloat16 rounding depends on the rows beside it)
    args = ["--model-path", str(path), "--tp-size", "2", "--dtype", "float32"]
    srv = start_server(args, tmp, "plain", env=env)
    yield srv
    srv.stop()


def client_for(server) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=120)


class Pet(pydantic.BaseModel):
    name: str
    age: int = pydantic.Field(ge=0, le=30)
    kind: Literal["cat", "dog", "fish"]
    vaccinated: bool
    toys: list[str]


def test_parse_returns_a_parsed_object_on_each_of_20_requests(biased):
    """Twenty clients at once (the server batches their constrained sequences together)."""
    client = client_for(biased)

    def one(i: int) -> Pet:
        completion = client.beta.chat.completions.parse(
            model="tiny-closing",
            messages=[{"role": "user", "content": f"describe pet {i}"}],
            response_format=Pet,
            max_tokens=120,
            temperature=0.0 if i % 2 else 1.0,
            seed=i,
        )
        message = completion.choices[0].message
        assert completion.choices[0].finish_reason == "stop", message.content
        assert message.refusal is None
        assert isinstance(message.parsed, Pet), message.content
        assert Pet.model_validate_json(message.content) == message.parsed
        return message.parsed

    with ThreadPoolExecutor(max_workers=20) as pool:
        parsed = list(pool.map(one, range(20)))
    assert len(parsed) == 20


def test_json_object_output_always_parses_greedy_sampled_streamed_and_n(biased):
    client = client_for(biased)
    texts = []
    for i in range(8):
        completion = client.chat.completions.create(
            model="tiny-closing",
            messages=[{"role": "user", "content": f"question {i}"}],
            response_format={"type": "json_object"},
            max_tokens=120,
            temperature=1.0 if i % 2 else 0.0,
            seed=i,
            n=2,
        )
        texts += [c.message.content for c in completion.choices]
        assert all(c.finish_reason == "stop" for c in completion.choices)
    stream = client.chat.completions.create(
        model="tiny-closing",
        messages=[{"role": "user", "content": "a stream"}],
        response_format={"type": "json_object"},
        max_tokens=120,
        stream=True,
    )
    texts.append("".join(chunk.choices[0].delta.content or "" for chunk in stream if chunk.choices))
    for text in texts:
        assert isinstance(json.loads(text), dict), text
    raw = post(
        biased.url + "/v1/chat/completions",
        {
            "messages": [{"role": "user", "content": "x"}],
            "response_format": {"type": "json_object"},
        },
    ).json()
    message = raw["choices"][0]["message"]
    assert "refusal" in message and message["refusal"] is None, message


def test_a_schema_that_cannot_end_in_max_tokens_ends_with_length(biased):
    completion = client_for(biased).chat.completions.create(
        model="tiny-closing",
        messages=[{"role": "user", "content": "x"}],
        response_format={"type": "json_object"},
        max_tokens=2,
    )
    choice = completion.choices[0]
    assert choice.finish_reason == "length"
    assert choice.message.content.startswith("{")
    with pytest.raises(openai.LengthFinishReasonError):
        client_for(biased).beta.chat.completions.parse(
            model="tiny-closing",
            messages=[{"role": "user", "content": "x"}],
            response_format=Pet,
            max_tokens=3,
        )


def generate(server, text: str, **params) -> dict:
    body = {"text": text, "sampling_params": {"max_new_tokens": 40, **params}}
    r = post(server.url + "/generate", body)
    assert r.status_code == 200, r.text
    return r.json()


def test_a_regex_on_generate_always_matches(plain):
    for i in range(12):
        temperature = 0.0 if i < 4 else 1.0
        out = generate(plain, PROMPTS[i % 4], regex=REGEX, temperature=temperature, seed=i)
        assert re.fullmatch(REGEX, out["text"]), out
        assert out["meta_info"]["finish_reason"] == {"type": "stop"}, out
    same = [generate(plain, "again", regex=REGEX, temperature=1.0, seed=7)["text"] for _ in "ab"]
    assert same[0] == same[1]  # a seed repeats a constrained sample too


def test_completions_and_a_generate_stream_take_a_grammar_too(plain):
    client = client_for(plain)
    completion = client.completions.create(
        model="tiny-plain", prompt="code:", max_tokens=30, extra_body={"regex": REGEX}
    )
    assert re.fullmatch(REGEX, completion.choices[0].text), completion
    body = {
        "text": "code:",
        "stream": True,
        "sampling_params": {"max_new_tokens": 30, "regex": REGEX},
    }
    events = post(plain.url + "/generate", body).text.split("\n\n")
    last = json.loads([e for e in events if e.startswith("data: {")][-1][len("data: ") :])
    assert re.fullmatch(REGEX, last["text"]), last


def test_the_documented_plugin_wraps_the_grammar_backend_on_every_rank(plain):
    generate(plain, "plugin", regex="[a-c]{5}", temperature=0.0)
    line = "grammar plugin: compiling a regex grammar"
    # Each of the two ranks compiles the grammar once (rank 0 before admitting the request, the
    # other when it joins the batch), through the wrapped backend.
    wait_for(lambda: plain.log.count(line) >= 2, 30, "both ranks to log the compile")


def test_an_ebnf_grammar_and_a_json_schema_string_on_generate(plain):
    ebnf = 'root ::= "answer: " ("yes" | "no") "."'
    out = generate(plain, "is it?", ebnf=ebnf, temperature=0.0)
    assert re.fullmatch(r"answer: (yes|no)\.", out["text"]), out
    schema = {
        "type": "object",
        "properties": {"ok": {"type": "boolean"}, "n": {"type": "integer", "maximum": 99}},
        "required": ["ok", "n"],
        "additionalProperties": False,
    }
    out = generate(plain, "json please", json_schema=json.dumps(schema), temperature=0.0)
    value = json.loads(out["text"])
    assert set(value) == {"ok", "n"} and isinstance(value["ok"], bool), out


def test_constrained_requests_in_the_batch_leave_unconstrained_greedy_texts_unchanged(plain):
    alone = [generate(plain, p, temperature=0.0, ignore_eos=True)["text"] for p in PROMPTS]
    bodies = [("plain", p, {}) for p in PROMPTS] + [("regex", p, {"regex": REGEX}) for p in PROMPTS]
    with ThreadPoolExecutor(len(bodies)) as pool:
        results = list(
            pool.map(
                lambda b: (b[0], generate(plain, b[1], temperature=0.0, ignore_eos=True, **b[2])),
                bodies * 2,
            )
        )
    together = [out["text"] for kind, out in results if kind == "plain"]
    assert together == alone * 2
    assert all(re.fullmatch(REGEX, out["text"]) for kind, out in results if kind == "regex")


def test_logprobs_list_only_tokens_the_grammar_allows(plain):
    r = post(
        plain.url + "/generate",
        {
            "text": "digits",
            "sampling_params": {"max_new_tokens": 20, "temperature": 0.0, "regex": "[0-9]{4}"},
            "return_logprob": True,
            "top_logprobs_num": 5,
            "return_text_in_logprobs": True,
        },
    )
    meta = r.json()["meta_info"]
    steps = meta["output_top_logprobs"][:4]  # the four digits (then only EOS is allowed)
    for step in steps:
        assert step and all(re.fullmatch("[0-9]", text) for _, _, text in step), step
        assert all(math.isfinite(lp) for lp, _, _ in step)
    assert math.isclose(sum(math.exp(lp) for lp, _, _ in meta["output_top_logprobs"][4]), 1.0)


BAD_GRAMMARS = [
    ({"regex": "[0-9"}, "sampling_params.regex", "regex does not compile: "),
    ({"ebnf": "root ::= missing"}, "sampling_params.ebnf", "ebnf does not compile: "),
    ({"json_schema": "{not json"}, "sampling_params.json_schema", "not valid JSON"),
    ({"json_schema": "[1, 2]"}, "sampling_params.json_schema", "must be a JSON object"),
    ({"regex": ""}, "sampling_params.regex", "is empty"),
    ({"regex": "a", "json_schema": "{}"}, "sampling_params.regex", "at most one grammar"),
]


@pytest.mark.parametrize("fields,param,words", BAD_GRAMMARS)
def test_a_bad_grammar_on_generate_is_a_400_naming_it(plain, fields, param, words):
    r = post(plain.url + "/generate", {"text": "x", "sampling_params": fields})
    error = r.json()["error"]
    assert (r.status_code, error["param"]) == (400, param), error
    assert words in error["message"], error


def test_bad_response_formats_are_400s_the_client_raises_naming_the_field(biased):
    client = client_for(biased)
    cases = [
        ({"type": "xml"}, "response_format.type", "not supported"),
        ({"type": "json_schema", "json_schema": {"name": "x"}}, None, None),
        (
            {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "nope"}}},
            "response_format",
            "does not compile",
        ),
    ]
    for response_format, param, words in cases:
        call = dict(
            model="tiny-closing",
            messages=[{"role": "user", "content": "x"}],
            response_format=response_format,
            max_tokens=60,
        )
        if param is None:  # a json_schema format without a schema: any JSON object
            json.loads(client.chat.completions.create(**call).choices[0].message.content)
            continue
        with pytest.raises(openai.BadRequestError) as caught:
            client.chat.completions.create(**call)
        error = caught.value.body
        assert error["param"] == param and words in error["message"], error


def test_grammar_backend_none_refuses_constrained_requests(biased_model, tmp_path):
    args = ["--model-path", str(biased_model), "--grammar-backend", "none"]
    srv = start_server(args, tmp_path, "none")
    try:
        r = post(srv.url + "/generate", {"text": "x", "sampling_params": {"regex": "a+"}})
        error = r.json()["error"]
        assert (r.status_code, error["param"]) == (400, "sampling_params.regex"), error
        assert "--grammar-backend none" in error["message"], error
        assert generate(srv, "x", max_new_tokens=3)["meta_info"]["completion_tokens"] >= 1
    finally:
        srv.stop()


def test_llguidance_is_refused_at_start_up_naming_what_is_served():
    run = subprocess.run(
        [*cli_command(), "--model-path", "all-MiniLM-L6-v2", "--grammar-backend", "llguidance"],
        capture_output=True,
        text=True,
        env=server_env(),
        timeout=120,
    )
    assert run.returncode == 2, run.stderr
    assert "--grammar-backend llguidance is not supported" in run.stderr + run.stdout
    assert "use xgrammar (the default) or none" in run.stderr + run.stdout


def test_the_documented_parse_example_runs_as_written(biased, capsys):
    page = (REPO / "docs" / "api.md").read_text(encoding="utf-8")
    (example,) = [
        b for b in re.findall(r"^```python\n(.*?)^```", page, re.S | re.M) if ".parse(" in b
    ]
    scope: dict = {}
    code = example.replace("http://127.0.0.1:30000", biased.url)
    # dont_inherit: the example runs as a script would, without this module's __future__ import.
    exec(compile(code, "docs/api.md", "exec", dont_inherit=True), scope)
    pet = scope["pet"]
    assert isinstance(pet, scope["Pet"]) and pet.kind in ("cat", "dog", "fish")
    assert capsys.readouterr().out == f"{pet.name} {pet.age} {pet.kind}\n"
