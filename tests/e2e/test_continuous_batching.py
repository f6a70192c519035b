"""Continuous batching end to end, with a tiny causal LM built at test time (random weights, a
real tokenizer), through the real CLI: a short request sent while a long one streams finishes
first; a request that does not fit the KV pool (--max-total-tokens) waits and then runs, one
that could never fit is a 400 naming the option; admission is fair across HTTP requests (the
scheduler's own socket, the ``group`` of each sequence); a step that fails (a real plugin makes
it) answers its requests with a 500 and the replica serves on. Ordering only: no test here
asserts a speed. (That a tp=2 replica gives tp=1's greedy and seeded tokens for requests that
join each other's batches is checked in test_serving_generation, beside its other tp=2 checks.)

Two launches serve the module: an HTTP server (the failing-step plugin installed; it fails only a
step whose prompt says so) and a launch without HTTP whose scheduler socket the admission tests
use (a small KV pool and room for two running sequences)."""

from __future__ import annotations

import json
import threading

import httpx
import pytest
from support.serving import (
    SchedulerSocket,
    build_tiny_llama,
    plugin_env,
    post,
    start_server,
)
from support.supervisor import Run

from serving import wire

pytestmark = pytest.mark.e2e  # every test here starts the launcher and its workers

POOL = 700  # --max-total-tokens of the module's HTTP server
# The socket launch's --max-total-tokens: a ~156-token and a ~53-token sequence (prompt +
# max_new_tokens) each fit, together they do not; two ~36-token sequences fit.
SOCKET_POOL = 200
LONG = 600  # tokens of the long stream that a short request overtakes


@pytest.fixture(scope="module")
def tiny_path(tmp_path_factory):
    from launchspec.model_source import embedding_model_dir

    return build_tiny_llama(tmp_path_factory.mktemp("tiny") / "tiny-llama", embedding_model_dir())


FAILING = """
def register():
    from hooks import HookType, plugin_hook

    def fail_marked(original_fn, runner, batch, *args, **kwargs):
        texts = [runner.tokenizer.decode(s.prompt_ids) for s in batch.sequences()]
        if any("fail this step" in text for text in texts):
            raise RuntimeError("the step broke on purpose")
        return original_fn(runner, batch, *args, **kwargs)

    plugin_hook("serving.srt.model_runner.ModelRunner.generate", type=HookType.AROUND)(
        fail_marked
    )
"""


@pytest.fixture(scope="module")
def server(tiny_path, tmp_path_factory):
    env = plugin_env(
        tmp_path_factory.mktemp("failing-site"),
        "failing-steps",
        {"sglang.srt.plugins": {"failing": "failing_steps:register"}},
        {"failing_steps.py": FAILING},
    )
    srv = start_server(
        [
            "--model-path",
            str(tiny_path),
            "--max-total-tokens",
            str(POOL),
            "--max-input-tokens",
            "64",
            "--dtype",  # the precision the tests here were written for
            "float32",
        ],
        tmp_path_factory.mktemp("cb-server"),
        "cb",
        env=env,
    )
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def socket_launch(tiny_path):
    """A launch without HTTP (``--http-target ''``): its scheduler's endpoint, for tests that
    send on the scheduler's own socket."""
    args = ["--model-path", str(tiny_path), "--http-target", ""]
    args += ["--max-total-tokens", str(SOCKET_POOL), "--max-running-requests", "2"]
    with Run(args, env={"SGLANG_USE_CPU_ENGINE": "1"}) as run:
        snap = run.wait_ready(timeout=180)
        scheduler = next(w for w in snap["workers"] if w["role"] == "scheduler")
        yield scheduler["info"]["endpoint"]


class Stream(threading.Thread):
    """A streamed ``/generate`` request in a thread: ``events`` are (order, completion tokens)
    of each event it received, ``order`` a counter shared by all streams of a test, so that
    the test can say which event came first without reading a clock."""

    def __init__(self, url: str, text: str, clock: list[int], lock, **params) -> None:
        super().__init__(daemon=True)
        self.url, self.text, self.params = url, text, params
        self.clock, self.lock = clock, lock
        self.events: list[tuple[int, int]] = []
        self.started_streaming = threading.Event()
        self.error: str | None = None

    def run(self) -> None:
        body = {"text": self.text, "stream": True, "sampling_params": self.params}
        try:
            with httpx.stream("POST", self.url + "/generate", json=body, timeout=120) as r:
                if r.status_code != 200:
                    self.error = f"{r.status_code} {r.read()!r}"
                    return
                for line in r.iter_lines():
                    if line.startswith("data: {"):
                        tokens = json.loads(line[6:])["meta_info"]["completion_tokens"]
                        with self.lock:
                            self.clock[0] += 1
                            self.events.append((self.clock[0], tokens))
                        self.started_streaming.set()
        except httpx.HTTPError as exc:
            self.error = f"{type(exc).__name__}: {exc}"
        finally:
            self.started_streaming.set()

    def finish(self) -> Stream:
        self.join(timeout=180)
        assert not self.is_alive() and self.error is None, self.error
        return self

    @property
    def first(self) -> int:
        return self.events[0][0]

    @property
    def last(self) -> int:
        return self.events[-1][0]

    @property
    def tokens(self) -> int:
        return self.events[-1][1]


def streams(url: str):
    clock, lock = [0], threading.Lock()
    return lambda text, **params: Stream(url, text, clock, lock, ignore_eos=True, **params)


def test_a_short_request_sent_while_a_long_one_streams_finishes_first(server):
    new = streams(server.url)
    # The long one must still be decoding when the short one, sent after its first token, reaches
    # the scheduler, on a busy machine too, where the short one's way there is slow; its prompt
    # and LONG tokens fit the module's POOL.
    long = new("once upon a time", max_new_tokens=LONG, temperature=0)
    long.start()
    assert long.started_streaming.wait(120) and long.error is None, long.error
    short = new("hello", max_new_tokens=2, temperature=0)
    short.start()
    short.finish(), long.finish()
    assert short.tokens == 2 and long.tokens == LONG
    assert short.last < long.last  # the short one ended while the long one still streamed


def test_a_request_that_does_not_fit_the_pool_waits_then_runs(socket_launch):
    """Sent back to back on the scheduler's own socket, so that both are queued before the
    first has gone far on however busy a machine: ~156 + ~53 tokens do not fit the pool (each
    sequence counted at its own prompt + max_new_tokens), so the shorter second request waits
    for the long first one instead of finishing ahead of it (as it does where both fit: the
    test above); had it joined, it would end about 100 steps before the long one."""
    client = SchedulerSocket(socket_launch)
    try:
        for rid, prompt, tokens in (("long", "once upon a time", 150), ("short", "hi", 50)):
            params = wire.SamplingParams(max_new_tokens=tokens, temperature=0.0, ignore_eos=True)
            client.send(wire.GenerateRequest(rid, prompt, params))
        order = client.finished(2, timeout=300)
    finally:
        client.close()
    assert order == ["long", "short"], order  # the short one never joined the long one's batch


def test_a_request_that_could_never_fit_the_pool_is_a_400_naming_the_option(server):
    r = post(
        server.url + "/generate",
        {"text": "x", "sampling_params": {"max_new_tokens": POOL + 50}},
    )
    assert r.status_code == 400, r.text
    message = r.json()["error"]["message"]
    assert "--max-total-tokens" in message and f"KV pool of {POOL} tokens" in message, message


def test_a_small_request_is_admitted_before_the_rest_of_a_big_one(socket_launch):
    """Eight sequences of one HTTP request (one group), then one of another: with room for two
    running sequences, the small request takes the next free place, ahead of the big one's
    remaining six."""
    client = SchedulerSocket(socket_launch)
    try:
        params = wire.SamplingParams(max_new_tokens=12, temperature=0.0, ignore_eos=True)
        big = [f"big-{i}" for i in range(8)]
        for rid in big:
            client.send(wire.GenerateRequest(rid, "once upon a time", params, group="big"))
        client.send(wire.GenerateRequest("small", "hello", params, group="small"))
        order = client.finished(9)
    finally:
        client.close()
    assert sorted(order) == sorted([*big, "small"])
    assert order.index("small") < order.index(big[-1])
    assert order.index("small") <= 3, order  # after at most the first two waves of the big one


def test_a_failed_step_answers_its_requests_with_a_500_and_the_replica_serves_on(server):
    pid = httpx.get(server.url + "/get_server_info", timeout=30).json()["schedulers"][0]["pid"]
    body = {"sampling_params": {"max_new_tokens": 8, "temperature": 0}}
    failed = post(server.url + "/generate", {"text": "please fail this step", **body})
    assert failed.status_code == 500, failed.text
    assert "RuntimeError: the step broke on purpose" in failed.json()["error"]["message"]
    ok = post(server.url + "/generate", {"text": "hello", **body})
    assert ok.status_code == 200, ok.text
    again = httpx.get(server.url + "/get_server_info", timeout=30).json()["schedulers"][0]["pid"]
    assert again == pid  # the same process served on
