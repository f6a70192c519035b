"""Chat, logprobs and SGLang's operational routes end to end: servers started through the real
CLI on a tiny Llama built at test time (random weights, BERT's tokenizer) whose tokenizer gets a
chat template here, driven with the official ``openai`` client and plain HTTP. One model without
a template: chat is a 400 naming ``--chat-template``, and with ``--chat-template FILE`` it chats."""

from __future__ import annotations

import json
import shutil

import httpx
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families
from support.serving import (
    build_tiny_llama,
    give_chat_template,
    post,
    start_server,
)

pytestmark = pytest.mark.e2e

MESSAGES = [
    {"role": "system", "content": "You answer briefly."},
    {"role": "user", "content": "What is the weather like?"},
]


@pytest.fixture(scope="module")
def plain_model(tmp_path_factory):
    """A tiny Llama whose tokenizer has no chat template."""
    from launchspec.model_source import embedding_model_dir

    return build_tiny_llama(tmp_path_factory.mktemp("plain") / "tiny-plain", embedding_model_dir())


@pytest.fixture(scope="module")
def chat_model(tmp_path_factory, plain_model):
    path = tmp_path_factory.mktemp("chat") / "tiny-chat"
    shutil.copytree(plain_model, path)
    return give_chat_template(path)


@pytest.fixture(scope="module")
def server(chat_model, tmp_path_factory):
    srv = start_server(["--model-path", str(chat_model)], tmp_path_factory.mktemp("chat"), "chat")
    yield srv
    srv.stop()


def client_for(server) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=120)


def test_chat_completions_plain_and_streamed_give_the_same_text(server):
    client = client_for(server)
    args = dict(model="tiny-chat", messages=MESSAGES, max_tokens=8, temperature=0.9, seed=21)
    plain = client.chat.completions.create(**args, extra_body={"ignore_eos": True})
    assert plain.object == "chat.completion" and len(plain.choices) == 1
    choice = plain.choices[0]
    assert choice.message.role == "assistant" and choice.message.content
    assert choice.finish_reason == "length" and plain.usage.completion_tokens == 8
    assert plain.usage.total_tokens == plain.usage.prompt_tokens + 8
    chunks = list(
        client.chat.completions.create(
            **args,
            stream=True,
            stream_options={"include_usage": True},
            extra_body={"ignore_eos": True},
        )
    )
    deltas = [c.choices[0] for c in chunks if c.choices]
    assert deltas[0].delta.role == "assistant"
    assert "".join(d.delta.content or "" for d in deltas) == choice.message.content
    assert deltas[-1].finish_reason == "length"
    assert all(d.finish_reason is None for d in deltas[:-1])
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 8
    assert chunks[-1].usage.prompt_tokens == plain.usage.prompt_tokens
    several = client.chat.completions.create(**args, n=3, extra_body={"ignore_eos": True})
    assert [c.index for c in several.choices] == [0, 1, 2]
    assert several.choices[0].message.content == choice.message.content  # seed + 0
    assert several.usage.prompt_tokens == plain.usage.prompt_tokens
    assert several.usage.completion_tokens == 24


def test_usage_counts_the_templated_prompt_with_its_bos_once(server, chat_model):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(chat_model, local_files_only=True)
    ids = tok.apply_chat_template(
        MESSAGES, add_generation_prompt=True, tokenize=True, return_dict=False
    )
    assert ids[0] == tok.cls_token_id and ids[1] != tok.cls_token_id
    answer = client_for(server).chat.completions.create(
        model="tiny-chat", messages=MESSAGES, max_tokens=2
    )
    assert answer.usage.prompt_tokens == len(ids)


def test_chat_logprobs_with_the_openai_client(server):
    answer = client_for(server).chat.completions.create(
        model="tiny-chat",
        messages=MESSAGES,
        max_tokens=5,
        temperature=0,
        logprobs=True,
        top_logprobs=3,
        extra_body={"ignore_eos": True},
    )
    content = answer.choices[0].logprobs.content
    assert len(content) == 5
    assert all(t.logprob <= 0 and len(t.top_logprobs) == 3 for t in content)
    # Greedy: the chosen token is the most likely one.
    assert all(t.top_logprobs[0].logprob == pytest.approx(t.logprob) for t in content)


def test_generate_returns_output_token_logprobs(server):
    r = post(
        server.url + "/generate",
        {
            "text": "hello",
            "sampling_params": {"max_new_tokens": 4, "temperature": 0, "ignore_eos": True},
            "return_logprob": True,
            "top_logprobs_num": 2,
        },
    )
    meta = r.json()["meta_info"]
    assert len(meta["output_token_logprobs"]) == 4 == meta["completion_tokens"]
    assert all(len(top) == 2 for top in meta["output_top_logprobs"])


def test_chat_errors_are_the_clients_exception_classes(server):
    client = client_for(server)
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(
            model="tiny-chat",
            messages=MESSAGES,
            tool_choice={"type": "function", "function": {"name": "get_weather"}},
        )
    assert info.value.param == "tool_choice.function.name"
    assert "not one of the tools" in info.value.body["message"]
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(model="tiny-chat", messages=MESSAGES, max_tokens=5000)
    assert info.value.param == "max_tokens" and info.value.status_code == 400
    with pytest.raises(openai.NotFoundError) as info:
        client.chat.completions.create(model="gpt-4", messages=MESSAGES)
    assert info.value.param == "model"


def test_health_generate_model_info_and_ping(server, chat_model):
    r = httpx.get(server.url + "/health_generate", timeout=60)
    assert (r.status_code, r.json()) == (200, {"healthy": True})
    assert httpx.get(server.url + "/ping", timeout=30).json() == {"healthy": True}
    info = httpx.get(server.url + "/get_model_info", timeout=30).json()
    assert info["model_path"] == str(chat_model) and info["is_generation"] is True
    assert info["architectures"] == ["LlamaForCausalLM"] and info["model_type"] == "llama"
    assert info["chat_template"] == "model"


def test_metrics_have_sglangs_names_with_the_model_name(server):
    client = client_for(server)
    list(
        client.chat.completions.create(
            model="tiny-chat", messages=MESSAGES, max_tokens=4, stream=True
        )
    )
    page = httpx.get(server.url + "/metrics", timeout=30).text
    families = {f.name: f for f in text_string_to_metric_families(page)}
    for name in (
        "sglang:num_running_reqs",
        "sglang:num_queue_reqs",
        "sglang:gen_throughput",
        "sglang:time_to_first_token_seconds",
        "sglang:e2e_request_latency_seconds",
        "sglang:inter_token_latency_seconds",
        "sglang:prompt_tokens",
        "sglang:generation_tokens",
    ):
        labels = [s.labels for s in families[name].samples]
        assert labels and all(lab.get("model_name") == "tiny-chat" for lab in labels), name
    values = {
        s.name: s.value for f in families.values() for s in f.samples if not s.labels.get("le")
    }
    assert values["sglang:time_to_first_token_seconds_count"] >= 1
    assert values["sglang:generation_tokens_total"] >= 4
    assert any(n.startswith("sglang_launch_requests_total") for n in values)
    assert "sglang_requests_total" not in page  # the launcher's own names: sglang_launch_*


def test_a_model_without_a_template_refuses_chat_until_chat_template_names_one(
    plain_model, tmp_path
):
    bare = start_server(["--model-path", str(plain_model)], tmp_path, "no-template")
    try:
        r = post(bare.url + "/v1/chat/completions", {"messages": MESSAGES})
        info = httpx.get(bare.url + "/get_model_info", timeout=30).json()
    finally:
        bare.stop()
    error = r.json()["error"]
    assert r.status_code == 400 and error["param"] == "messages", error
    assert "has no chat template" in error["message"] and "--chat-template FILE" in error["message"]
    assert info["chat_template"] is None
    template = tmp_path / "chat.jinja"
    template.write_text("{% for m in messages %}{{ m['content'] }} {% endfor %}=>")
    given = start_server(
        ["--model-path", str(plain_model), "--chat-template", str(template)], tmp_path, "given"
    )
    try:
        r = post(given.url + "/v1/chat/completions", {"messages": MESSAGES, "max_tokens": 3})
        info = httpx.get(given.url + "/get_model_info", timeout=30).json()
    finally:
        given.stop()
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] >= 1, r.text
    assert info["chat_template"] == f"--chat-template {template}"


def test_a_chat_template_file_that_is_not_jinja_fails_the_start_naming_it(plain_model, tmp_path):
    from support.serving import Server

    template = tmp_path / "broken.jinja"
    template.write_text("{% for m in messages %}")
    srv = Server(
        ["--model-path", str(plain_model), "--chat-template", str(template)],
        tmp_path / "broken.log",
    )
    try:
        code = srv.wait_exit(timeout=180)
    finally:
        srv.stop()
    assert code == 1, srv.log
    assert "--chat-template" in srv.log and "not a valid Jinja template" in srv.log


def test_the_stream_is_server_sent_chat_chunks(server):
    with httpx.stream(
        "POST",
        server.url + "/v1/chat/completions",
        json={"messages": MESSAGES, "max_tokens": 3, "stream": True},
        timeout=60,
    ) as r:
        lines = [line for line in r.iter_lines() if line.startswith("data: ")]
    assert lines[-1] == "data: [DONE]"
    first = json.loads(lines[0][6:])
    assert first["object"] == "chat.completion.chunk"
    assert first["choices"][0]["delta"] == {"role": "assistant", "content": ""}
