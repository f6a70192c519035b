"""The radix prefix cache as a client sees it, on a served tiny Llama (random weights, BERT's
real tokenizer) started through the real CLI: a request that shares a 1,000-token prefix with an
earlier one reports at least 1,000 cached tokens (``usage.prompt_tokens_details.cached_tokens``
read by the official ``openai`` client, ``meta_info.cached_tokens`` on ``/generate``) and gives
the greedy text the same prompt gives with nothing cached (after ``POST /flush_cache``);
``/metrics`` shows the hit rate; ``--disable-radix-cache`` reuses nothing."""

from __future__ import annotations

import httpx
import openai
import pytest
from support.serving import build_tiny_llama, start_server

pytestmark = pytest.mark.e2e

STEM = " ".join(f"w{i % 50}" for i in range(1000))  # 1,000 words, each its own token or more


@pytest.fixture(scope="module")
def tiny_path(tmp_path_factory):
    from launchspec.model_source import embedding_model_dir

    path = tmp_path_factory.mktemp("tiny") / "tiny-llama"
    return build_tiny_llama(path, embedding_model_dir(), positions=4096)


def serve(tiny_path, tmp_path_factory, name, *extra):
    # float32: greedy texts are compared across servers (cache on and off, page sizes)
    args = ["--model-path", str(tiny_path), "--max-total-tokens", "8192", "--dtype", "float32"]
    args += extra
    return start_server(args, tmp_path_factory.mktemp(name), name)


@pytest.fixture(scope="module")
def server(tiny_path, tmp_path_factory):
    srv = serve(tiny_path, tmp_path_factory, "prefix")
    yield srv
    srv.stop()


def complete(client: openai.OpenAI, prompt: str):
    return client.completions.create(
        model="tiny-llama",
        prompt=prompt,
        max_tokens=12,
        temperature=0,
        extra_body={"ignore_eos": True},
    )


def test_a_shared_1000_token_prefix_is_served_from_the_cache_with_the_cold_text(server):
    client = openai.OpenAI(
        base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=120
    )
    first = complete(client, f"{STEM} first question")
    assert first.usage.prompt_tokens > 1000
    second = complete(client, f"{STEM} second question")
    assert second.usage.prompt_tokens_details.cached_tokens >= 1000
    assert httpx.post(server.url + "/flush_cache", timeout=60).status_code == 200
    cold = complete(client, f"{STEM} second question")
    assert cold.usage.prompt_tokens_details.cached_tokens == 0
    assert cold.choices[0].text == second.choices[0].text
    native = httpx.post(
        server.url + "/generate",
        json={
            "text": f"{STEM} second question",
            "sampling_params": {"max_new_tokens": 12, "temperature": 0, "ignore_eos": True},
        },
        timeout=120,
    ).json()
    assert native["meta_info"]["cached_tokens"] >= 1000
    assert native["text"] == second.choices[0].text
    metrics = httpx.get(server.url + "/metrics", timeout=60).text
    rate = next(line for line in metrics.splitlines() if line.startswith("sglang:cache_hit_rate"))
    assert 0.3 < float(rate.split()[-1]) < 1.0, rate


def test_a_flush_sent_while_a_request_runs_waits_for_it(server):
    """SGLang's rule: the cache is flushed only when no request runs or waits; the route asks a
    busy replica again until it is idle, and the running request is not disturbed."""
    body = {
        "text": "once upon a time",
        "stream": True,
        "sampling_params": {"max_new_tokens": 300, "temperature": 0, "ignore_eos": True},
    }
    with httpx.stream("POST", server.url + "/generate", json=body, timeout=120) as stream:
        lines = stream.iter_lines()
        next(line for line in lines if line.startswith("data: {"))  # it runs
        flushed = httpx.post(server.url + "/flush_cache", timeout=60)
        events = [line for line in lines if line.startswith("data: {")]
    assert flushed.status_code == 200, flushed.text
    assert '"completion_tokens":300' in events[-1].replace(" ", ""), events[-1]


def test_with_the_radix_cache_disabled_nothing_is_reused(tiny_path, tmp_path_factory):
    srv = serve(tiny_path, tmp_path_factory, "no-radix", "--disable-radix-cache")
    try:
        client = openai.OpenAI(
            base_url=srv.url + "/v1", api_key="unused", max_retries=0, timeout=120
        )
        complete(client, f"{STEM} first question")
        again = complete(client, f"{STEM} first question")
        assert again.usage.prompt_tokens_details.cached_tokens == 0
    finally:
        srv.stop()
