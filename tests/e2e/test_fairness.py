"""One request's share of a replica is bounded, through the real CLI: a big request and a small one
sent beside it, the small one answered first and in a fraction of the big one's time, measured in
the same run (ordering and a ratio, not seconds). Embeddings with the embedded default model (a
big request runs as several batches of texts, interleaved); images with the tiny pipeline (a
request over ``--max-pixel-steps`` is a 400 naming it; calls take turns a denoising step at a
time: ``test_a_small_image_request_runs_its_steps_between_a_big_ones``, which runs on
test_diffusion_serving's server, with this module's ``Timed`` and sizes); a request that timed out
(504) or whose client left frees the replica at its next step."""

from __future__ import annotations

import threading
import time

import httpx
import pytest
from support import wait_for
from support.diffusion import SIZE
from support.serving import cosine, leaving_client, post, report, server_env, start_server

pytestmark = pytest.mark.e2e

ROUTE = "/v1/images/generations"
TEXT = 2 * (
    "the quick brown fox jumps over the lazy dog while the farmer watches from the porch and "
    "the cat sleeps in the warm afternoon sun beside a bowl of fresh milk "
)  # about 75 tokens


def counts(server) -> dict:
    """The one scheduler's counters (``batches``, ``aborted``, ...) from ``/get_server_info``,
    asked again until the scheduler answers (the page holds null for a replica that did not
    answer in time, as a scheduler busy with a big request on a loaded machine may not)."""

    def state():
        return httpx.get(server.url + "/get_server_info", timeout=60).json()["schedulers"][0]

    return wait_for(state, 60, "the scheduler's counters in /get_server_info")


class Timed(threading.Thread):
    """``send()`` in a thread of its own: its answer, and when it was sent and answered
    (``time.monotonic``, compared only with each other in one run)."""

    def __init__(self, send) -> None:
        super().__init__(daemon=True)
        self.send = send
        self.reply: httpx.Response | None = None
        self.sent = self.answered = 0.0

    def run(self) -> None:
        self.sent = time.monotonic()
        self.reply = self.send()
        self.answered = time.monotonic()

    @property
    def took(self) -> float:
        return self.answered - self.sent


# ---- embeddings --------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def text_server(tmp_path_factory):
    srv = start_server(["--max-batch-size", "2"], tmp_path_factory.mktemp("fair-text"), "text")
    yield srv
    srv.stop()


def test_a_small_embedding_request_is_not_held_behind_a_big_one(text_server, capsys):
    texts = [f"{TEXT} #{i}" for i in range(120)]  # 60 batches of --max-batch-size 2
    before = counts(text_server)["batches"]
    big = Timed(lambda: post(text_server.url + "/v1/embeddings", {"input": texts}, timeout=600))
    big.start()
    wait_for(lambda: counts(text_server)["batches"] > before, 120, "the big request to start")
    small = Timed(lambda: post(text_server.url + "/v1/embeddings", {"input": "a cat"}))
    small.run()
    assert small.reply is not None and small.reply.status_code == 200, small.reply
    assert big.is_alive(), "the big request ended before the small one: nothing was measured"
    big.join(timeout=600)
    assert big.reply is not None and big.reply.status_code == 200, big.reply
    assert small.answered < big.answered
    assert small.took < 0.25 * big.took, (small.took, big.took)
    report(capsys, f"embeddings: 1 text beside 120 took {small.took / big.took:.3f} of the big one")
    # Run in many batches, the big request's vectors are each text's own, in order.
    rows = [d["embedding"] for d in big.reply.json()["data"]]
    assert [d["index"] for d in big.reply.json()["data"]] == list(range(len(texts)))
    for i in (0, 1, 57, len(texts) - 1):
        alone = post(text_server.url + "/v1/embeddings", {"input": texts[i]}).json()
        assert cosine(rows[i], alone["data"][0]["embedding"]) > 0.9999, i


def test_a_big_embedding_request_whose_client_left_stops_at_its_next_batch(text_server):
    texts = [f"{TEXT} #{i}" for i in range(2048)]  # 1024 batches, in a body under 1 MiB
    start = counts(text_server)
    with leaving_client(text_server.url, "/v1/embeddings", {"input": texts}):
        # The client gives up once the request is under way: its first batches have run.
        wait_for(
            lambda: counts(text_server)["batches"] > start["batches"], 120, "the request to start"
        )
    wait_for(
        lambda: counts(text_server)["aborted"] > start["aborted"], 60, "the request counted aborted"
    )
    left = counts(text_server)["batches"]
    assert left - start["batches"] < 1024  # it did not run to its end
    assert post(text_server.url + "/v1/embeddings", {"input": "a cat"}).status_code == 200
    assert counts(text_server)["batches"] == left + 1  # none of its texts ran since


# ---- images ------------------------------------------------------------------------------------

BIG_SIDE, BIG_STEPS = 2 * SIZE, 12  # 4 times the pixels of a small request, 12 steps
BUDGET = 10_000_000  # --max-pixel-steps


def image_server_args(tiny_pipeline, *extra: str) -> list[str]:
    return ["--runtime", "diffusion", "--model-path", str(tiny_pipeline), *extra]


@pytest.fixture(scope="module")
def image_server(tiny_pipeline, tmp_path_factory):
    """One image server for the budget's 400 and the request timeout's 504 (each request here
    is refused at once or is meant to outlast --request-timeout)."""
    srv = start_server(
        image_server_args(
            tiny_pipeline, "--max-pixel-steps", str(BUDGET), "--request-timeout", "3"
        ),
        tmp_path_factory.mktemp("fair-images"),
        "images",
        env=server_env(OMP_WAIT_POLICY=None),
    )
    yield srv
    srv.stop()


def image(server, timeout: float = 120, headers=None, **fields) -> httpx.Response:
    body = {"prompt": "a photo of a cat", "size": f"{SIZE}x{SIZE}", **fields}
    return httpx.post(server.url + ROUTE, json=body, headers=headers, timeout=timeout)


def test_a_request_over_the_pixel_step_budget_is_a_400_naming_it(image_server):
    reply = image(image_server, size="512x512", num_inference_steps=40)  # 10,485,760
    assert reply.status_code == 400, reply.text
    error = reply.json()["error"]
    assert "--max-pixel-steps" in error["message"] and f"{BUDGET:,}" in error["message"]
    assert error["param"] == "num_inference_steps"


def test_an_image_request_that_timed_out_frees_the_worker_at_its_next_step(image_server):
    srv = image_server
    before = counts(srv)
    # 900 steps of 4 times a small request's pixels take minutes; --request-timeout 3
    # answers 504 long before, and the call ends at its next step.
    reply = image(srv, size=f"{2 * SIZE}x{2 * SIZE}", num_inference_steps=900, seed=1)
    assert reply.status_code == 504, reply.text
    assert "--request-timeout 3s" in reply.json()["error"]["message"]
    wait_for(lambda: counts(srv)["aborted"] > before["aborted"], 30, "the call to end")
    assert image(srv, num_inference_steps=1, seed=2).status_code == 200
    assert counts(srv)["batches"] == before["batches"] + 2
