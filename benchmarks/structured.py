"""Structured outputs: the cost per token of a JSON-schema request against the same request
unconstrained, on the embedded chat model (SmolLM2-135M-Instruct, a bare ``sglang-launch``), and
what compiling a grammar costs and where.

1. Time per token at 1 and 16 closed-loop clients (each sends its next request when the last one
   ended): ``/v1/chat/completions``, greedy, ``max_tokens`` ``--tokens``. Unconstrained requests
   set ``ignore_eos``; constrained ones carry ``response_format`` json_schema with a schema the
   answer cannot complete within ``--tokens`` (an array of at least 64 strings), so both sides
   generate exactly ``--tokens`` tokens per request. At 1 client: a request's time (prompt
   included) over its tokens; at 16: the wall time of the whole load over all its tokens. The two
   sides take turns, ``--rounds`` times (medians printed). Target: at most 1.10x.
2. Grammar compile time: a request with a schema the server has never seen against the same
   request with a schema it has compiled (``max_tokens`` 1, each median of ``--rounds``), and the
   compile alone, in this process, with the same backend class and tokenizer
   (``XGrammarGrammarBackend.compile``) for a small and a larger schema.
3. Compiles off the step: the longest gap between two tokens of an unconstrained stream while
   8 requests with new schemas arrive, against the same stream while 8 requests with a cached
   schema arrive.

    .venv/bin/python benchmarks/structured.py [--tokens 64] [--rounds 3]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(REPO), str(REPO / "tests")]
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import httpx  # noqa: E402
from support.serving import server_env, start_server  # noqa: E402

from launcher.supervisor.plan import SCHEDULER_ENV_DEFAULTS  # noqa: E402

PROMPT = "List the animals you know, as many as you can."
# The answer cannot complete within --tokens: every request runs to its length.
LONG_SCHEMA = {
    "type": "object",
    "properties": {"animals": {"type": "array", "items": {"type": "string"}, "minItems": 64}},
    "required": ["animals"],
}
SMALL_SCHEMA = {
    "type": "object",
    "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
    "required": ["name", "age"],
}
LARGER_SCHEMA = {
    "type": "object",
    "properties": {
        "id": {"type": "string", "pattern": "^[A-Z]{3}-[0-9]{4}$"},
        "owner": {
            "type": "object",
            "properties": {
                "name": {"type": "string", "maxLength": 40},
                "email": {"type": "string", "format": "email"},
                "age": {"type": "integer", "minimum": 0, "maximum": 120},
            },
            "required": ["name", "email"],
        },
        "pets": {
            "type": "array",
            "items": {
                "type": "object",
                "properties": {
                    "kind": {"enum": ["cat", "dog", "fish", "bird"]},
                    "name": {"type": "string"},
                    "vaccinated": {"type": "boolean"},
                    "weight": {"type": "number"},
                },
                "required": ["kind", "name"],
            },
        },
        "tags": {"type": "array", "items": {"type": "string"}, "maxItems": 8},
    },
    "required": ["id", "owner", "pets"],
}


def body(tokens: int, schema: dict | None) -> dict:
    out: dict = {
        "messages": [{"role": "user", "content": PROMPT}],
        "max_tokens": tokens,
        "temperature": 0,
    }
    if schema is None:
        out["ignore_eos"] = True
    else:
        out["response_format"] = {
            "type": "json_schema",
            "json_schema": {"name": "answer", "schema": schema},
        }
    return out


def chat(client: httpx.Client, url: str, payload: dict) -> int:
    r = client.post(url + "/v1/chat/completions", json=payload, timeout=600)
    r.raise_for_status()
    return int(r.json()["usage"]["completion_tokens"])


def per_token(
    url: str, clients: int, requests_each: int, tokens: int, schema: dict | None
) -> float:
    """Milliseconds per token: 1 client, a request's time over its tokens (median); more, the
    load's wall time over all its tokens."""
    payload = body(tokens, schema)
    if clients == 1:
        with httpx.Client() as client:
            times = []
            for _ in range(requests_each):
                start = time.perf_counter()
                n = chat(client, url, payload)
                times.append((time.perf_counter() - start) * 1000 / n)
        return statistics.median(times)

    def one_client(_: int) -> int:
        with httpx.Client() as client:
            return sum(chat(client, url, payload) for _ in range(requests_each))

    start = time.perf_counter()
    with ThreadPoolExecutor(clients) as pool:
        total = sum(pool.map(one_client, range(clients)))
    return (time.perf_counter() - start) * 1000 / total


def fresh(schema: dict) -> dict:
    """``schema`` with a property no earlier request named: a text the server has not compiled."""
    props = {**schema["properties"], f"p{uuid.uuid4().hex[:8]}": {"type": "boolean"}}
    return {**schema, "properties": props}


def first_token_ms(url: str, schema: dict) -> float:
    with httpx.Client() as client:
        start = time.perf_counter()
        chat(client, url, body(1, schema))
        return (time.perf_counter() - start) * 1000


def longest_gap_ms(url: str, schemas: list[dict]) -> float:
    """The longest gap between two events of an unconstrained 96-token stream while requests
    with ``schemas`` arrive (from its 8th token on)."""
    stamps: list[float] = []
    started = threading.Event()

    def stream() -> None:
        with httpx.Client() as client:
            with client.stream(
                "POST", url + "/v1/chat/completions", json={**body(96, None), "stream": True}
            ) as r:
                for line in r.iter_lines():
                    if line.startswith("data: {"):
                        stamps.append(time.perf_counter())
                        if len(stamps) == 8:
                            started.set()

    reader = threading.Thread(target=stream)
    reader.start()
    started.wait(120)
    with ThreadPoolExecutor(len(schemas)) as pool:
        list(pool.map(lambda s: first_token_ms(url, s), schemas))
    reader.join()
    gaps = [b - a for a, b in zip(stamps[8:], stamps[9:], strict=False)]
    return max(gaps) * 1000


def compile_in_process(rounds: int) -> dict[str, float]:
    """Milliseconds of ``XGrammarGrammarBackend.compile`` for each schema, median of fresh
    texts, with the embedded model's tokenizer (and the tokenizer's set-up, once)."""
    from transformers import AutoConfig, AutoTokenizer

    from launchspec.model_source import resolve_model
    from serving.srt.constrained.xgrammar_backend import XGrammarGrammarBackend

    source = resolve_model(None, None)
    tokenizer = AutoTokenizer.from_pretrained(source.path)
    vocab = AutoConfig.from_pretrained(source.path).vocab_size
    start = time.perf_counter()
    backend = XGrammarGrammarBackend(tokenizer, vocab, [tokenizer.eos_token_id])
    out = {"tokenizer set-up (once per rank)": (time.perf_counter() - start) * 1000}
    for name, schema in (("small schema", SMALL_SCHEMA), ("larger schema", LARGER_SCHEMA)):
        times = []
        for _ in range(rounds):
            text = json.dumps(fresh(schema))
            start = time.perf_counter()
            backend.compile("json_schema", text)
            times.append((time.perf_counter() - start) * 1000)
        out[name] = statistics.median(times)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--requests-per-client", type=int, default=2)
    parser.add_argument("--skip-per-token", action="store_true", help="only parts 2 and 3")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory() as tmp:
        env = {
            **server_env(),
            **{k: os.environ.get(k, v) for k, v in SCHEDULER_ENV_DEFAULTS.items()},
        }
        server = start_server([], Path(tmp), "server", env=env, default_model=True)
        try:
            url = server.url
            chat(httpx.Client(), url, body(4, LONG_SCHEMA))  # warm: compile the schema once
            for clients in () if args.skip_per_token else (1, 16):
                each = max(args.requests_per_client, 4 if clients == 1 else 1)
                plain, constrained = [], []
                for _ in range(args.rounds):
                    plain.append(per_token(url, clients, each, args.tokens, None))
                    constrained.append(per_token(url, clients, each, args.tokens, LONG_SCHEMA))
                p, c = statistics.median(plain), statistics.median(constrained)
                print(
                    f"{clients:>2} clients: unconstrained {p:.2f} ms/token, json_schema "
                    f"{c:.2f} ms/token, ratio {c / p:.3f} (target <= 1.10)",
                    flush=True,
                )
            new = [first_token_ms(url, fresh(LARGER_SCHEMA)) for _ in range(args.rounds)]
            cached = [first_token_ms(url, LARGER_SCHEMA) for _ in range(args.rounds)]
            print(
                f"first token, larger schema: new {statistics.median(new):.1f} ms, cached "
                f"{statistics.median(cached):.1f} ms",
                flush=True,
            )
            new_gap = longest_gap_ms(url, [fresh(LARGER_SCHEMA) for _ in range(8)])
            cached_gap = longest_gap_ms(url, [LARGER_SCHEMA] * 8)
            print(
                f"longest gap of a stream while 8 requests arrive: with new schemas "
                f"{new_gap:.1f} ms, with a cached one {cached_gap:.1f} ms",
                flush=True,
            )
        finally:
            server.stop()
    for name, ms in compile_in_process(args.rounds).items():
        print(f"compile in-process, {name}: {ms:.1f} ms", flush=True)


if __name__ == "__main__":
    main()
