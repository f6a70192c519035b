"""The diffusion runtime end to end through the real CLI on the tiny pipeline
(``support.diffusion``): OpenAI's images API, its refusals, the server's reports, batching,
a small request answered between a big one's denoising steps (test_fairness's image case, on this
module's server), a disconnect that cancels, progress streaming (server-sent events, read by httpx, the ``openai``
client and ``curl -N`` running the example of docs/diffusion.md), an error event when the worker
dies mid-stream, dp=2 with least-loaded routing, and SIGINT leaving nothing behind."""

from __future__ import annotations

import base64
import contextlib
import io
import json
import os
import re
import shutil
import signal
import subprocess
import threading
import time

import httpx
import openai
import psutil
import pytest
from PIL import Image
from support.diffusion import SIZE
from support.serving import REPO, leaving_client, report, server_env, start_server
from test_fairness import BIG_SIDE, BIG_STEPS, Timed
from test_fairness import image as image_request

pytestmark = pytest.mark.e2e

KEY = "sk-diffusion-test"
AUTH = {"Authorization": f"Bearer {KEY}"}
ROUTE = "/v1/images/generations"


def body(**extra) -> dict:
    return {
        "prompt": "a photo of a cat",
        "size": f"{SIZE}x{SIZE}",
        "num_inference_steps": 2,
        **extra,
    }


def images_of(reply: httpx.Response) -> list[bytes]:
    assert reply.status_code == 200, reply.text
    return [base64.b64decode(item["b64_json"]) for item in reply.json()["data"]]


def wait_for(condition, timeout: float = 120.0, what: str = "condition"):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(0.2)
    raise AssertionError(f"{what} not met within {timeout}s")


@pytest.fixture(scope="module")
def server(tiny_pipeline, tmp_path_factory):
    srv = start_server(
        ["--runtime", "diffusion", "--model-path", str(tiny_pipeline), "--api-key", KEY],
        tmp_path_factory.mktemp("diffusion-serving"),
        "diffusion",
        env=server_env(OMP_WAIT_POLICY=None),
    )
    yield srv
    srv.stop()


@pytest.fixture
def leak_ok(request):
    """The module-scoped server outlives each test: its processes are not a leak."""
    request.node._leak_ok = True


def post(server, **extra) -> httpx.Response:
    return httpx.post(server.url + ROUTE, json=body(**extra), headers=AUTH, timeout=120)


def test_two_images_of_the_requested_size_and_seeds_are_reproducible(server, leak_ok):
    first = images_of(post(server, n=2, seed=7))
    assert len(first) == 2 and first[0] != first[1]  # image i uses seed + i
    for blob in first:
        with Image.open(io.BytesIO(blob)) as img:
            assert img.format == "PNG" and img.size == (SIZE, SIZE)
    assert images_of(post(server, n=2, seed=7)) == first  # same seed: the same bytes
    assert images_of(post(server, seed=123))[0] not in first  # another seed: another image
    tall = images_of(post(server, size=None, width=SIZE, height=2 * SIZE, seed=1))
    with Image.open(io.BytesIO(tall[0])) as img:
        assert img.size == (SIZE, 2 * SIZE)


@pytest.mark.parametrize("fmt, pil", [("jpeg", "JPEG"), ("webp", "WEBP"), ("png", "PNG")])
def test_output_formats(server, leak_ok, fmt, pil):
    reply = post(server, output_format=fmt, seed=3)
    with Image.open(io.BytesIO(images_of(reply)[0])) as img:
        assert img.format == pil and img.size == (SIZE, SIZE)
    assert reply.json()["output_format"] == fmt


@pytest.mark.parametrize(
    "extra, param, words",
    [
        ({"response_format": "url"}, "response_format", ["b64_json"]),
        ({"response_format": "url", "stream": True}, "response_format", ["b64_json"]),
        ({"size": "36x32", "stream": True}, "width", ["width 36", "multiple of 8"]),
        ({"size": "36x32"}, "width", ["width 36", "multiple of 8"]),
        ({"size": None, "width": 32, "height": 20}, "height", ["height 20", "multiple of 8"]),
        ({"size": "big"}, "size", ["WIDTHxHEIGHT"]),
        ({"n": 0}, "n", ["n must be between 1 and 10"]),
        ({"n": 11}, "n", ["n must be between 1 and 10"]),
        ({"num_inference_steps": 0}, "num_inference_steps", ["between 1 and 1000"]),
        ({"num_inference_steps": 5000}, "num_inference_steps", ["between 1 and 1000"]),
        (
            {"num_inference_steps": 1000},
            "num_inference_steps",
            ["num_inference_steps 1000", "between 1 and 999"],
        ),
        ({"prompt": "   "}, "prompt", ["prompt must not be empty"]),
        ({"output_format": "gif"}, "output_format", ["png, jpeg, webp"]),
        ({"seed": -1}, "seed", ["seed must be between 0"]),
        ({"model": "other"}, "model", ["'other'", "/v1/models"]),
        ({"size": "\u0663\u0662x\u0663\u0662"}, "size", ["WIDTHxHEIGHT"]),  # Arabic-Indic 32
        (
            {"size": "4096x4096", "num_inference_steps": 100},
            "num_inference_steps",
            ["1,677,721,600 pixel-steps", "--max-pixel-steps"],
        ),
    ],
)
def test_bad_input_is_a_json_4xx_naming_field_and_limit(server, leak_ok, extra, param, words):
    reply = post(server, **extra)
    assert 400 <= reply.status_code < 500, reply.text
    assert reply.json()["error"]["param"] == param, reply.text
    message = reply.json()["error"]["message"]
    for word in words:
        assert word in message, message


@pytest.mark.parametrize("field", ["prompt", "negative_prompt"])
def test_an_unpaired_surrogate_is_a_400_naming_its_field(server, leak_ok, field):
    raw = json.dumps(body(**{field: "a cat \ud800"}))  # the JSON escape \ud800, alone
    reply = httpx.post(
        server.url + ROUTE,
        content=raw,
        headers={**AUTH, "content-type": "application/json"},
        timeout=120,
    )
    assert reply.status_code == 400, reply.text
    error = reply.json()["error"]
    assert error["param"] == field and "unpaired surrogate" in error["message"], error


def test_api_key_and_the_text_routes_refuse_clearly(server, leak_ok):
    assert httpx.post(server.url + ROUTE, json=body(), timeout=30).status_code == 401
    assert httpx.get(server.url + "/health", timeout=30).status_code == 200  # public
    reply = httpx.post(
        server.url + "/v1/completions", json={"prompt": "hi"}, headers=AUTH, timeout=30
    )
    # The scheduler names what is served and what was asked; the HTTP side adds the route to use.
    error = reply.json()["error"]
    assert reply.status_code == 400 and "serves image, not generation" in error["message"]
    assert "use /v1/images/generations" in error["message"]
    assert error["param"] == "model"


def test_models_ready_info_and_metrics(server, leak_ok, tiny_pipeline):
    models = httpx.get(server.url + "/v1/models", headers=AUTH, timeout=30).json()
    assert models["data"][0]["id"] == tiny_pipeline.name
    assert httpx.get(server.url + "/ready", timeout=30).json()["ready"] is True
    info = httpx.get(server.url + "/get_server_info", headers=AUTH, timeout=30).json()
    assert info["platform"]["platform_class"] == "platforms.builtin.cpu.CpuPlatform"
    model = info["model"]
    assert model["pipeline_class"] == "StableDiffusionPipeline" and model["dtype"] == "float32"
    assert model["device"] == "cpu" and info["device"] == "cpu"
    assert model["attention"]["backend"] == "torch.nn.functional.scaled_dot_product_attention"
    assert model["attention"]["processors"] == ["AttnProcessor2_0"]
    # The CPU platform's key is "native": each norm resolved to forward_native, once.
    assert model["custom_ops"]["GroupNorm"]["forward"] == {
        "forward_native": model["custom_ops"]["GroupNorm"]["count"]
    }
    assert model["custom_ops"]["LayerNorm"]["count"] > 0
    # The launch tells the worker's OpenMP threads to sleep while they wait (no spinning).
    assert model["cpu_threads"]["omp_wait_policy"] == "PASSIVE"
    assert model["cpu_threads"]["intra_op"] >= 1
    memory = info["schedulers"][0]["memory"]
    assert memory["total_gib"] > 0 and memory["available_gib"] > 0
    post(server, seed=1)
    metrics = httpx.get(server.url + "/metrics", headers=AUTH, timeout=30).text
    assert f'route="{ROUTE}"' in metrics


def batches(server) -> int:
    info = httpx.get(server.url + "/get_server_info", headers=AUTH, timeout=30).json()
    return info["schedulers"][0]["batches"]


def sent_to_the_worker(server) -> int:
    """The requests the HTTP child has sent the worker and not had answered yet (its
    ``sglang_launch_queue_depth``): it keeps counting while the worker is paused."""
    page = httpx.get(server.url + "/metrics", headers=AUTH, timeout=30).text
    found = re.search(r'^sglang_launch_queue_depth\{dp_rank="0"\} ([0-9.]+)$', page, re.M)
    return int(float(found.group(1))) if found else 0


@contextlib.contextmanager
def worker_paused(server):
    """The worker stopped with SIGSTOP inside the block, and let go on after it: what the HTTP
    child sends it meanwhile waits in its socket, and it reads all of it at once."""
    worker = httpx.get(server.url + "/get_server_info", headers=AUTH, timeout=30).json()
    pid = worker["schedulers"][0]["pid"]
    os.kill(pid, signal.SIGSTOP)
    try:
        yield
    finally:
        os.kill(pid, signal.SIGCONT)


def queued_beside_a_long_request(server, requests: list[threading.Thread]) -> None:
    """Start ``requests`` while a long streamed request is under way and the worker is paused,
    wait until the HTTP child has sent every one of them, then let the worker go on (it takes
    them into its queue together) and hang up on the long one: the worker stops it. Joins the
    threads."""
    long = body(stream=True, num_inference_steps=900)
    with httpx.stream("POST", server.url + ROUTE, json=long, headers=AUTH, timeout=60) as reply:
        lines = reply.iter_lines()  # kept: a dropped line generator would hang up at once
        first_step(lines)  # the worker is in the long request's denoising loop
        with worker_paused(server):
            for t in requests:
                t.start()
            wait_for(
                lambda: sent_to_the_worker(server) >= len(requests) + 1,
                what=f"{len(requests)} requests sent beside the long one",
            )
    for t in requests:
        t.join()


def test_same_shape_requests_that_arrive_together_share_a_batch(server, leak_ok):
    """Six requests of one shape that wait in the queue together run as one pipeline call, beside
    the long request under way."""
    before = batches(server)
    replies: list[httpx.Response] = []
    threads = [
        threading.Thread(target=lambda i=i: replies.append(post(server, seed=100 + i)))
        for i in range(6)
    ]
    queued_beside_a_long_request(server, threads)
    assert [r.status_code for r in replies] == [200] * 6
    assert batches(server) - before == 2  # the long request, and the six in one pipeline call


def test_a_small_image_request_runs_its_steps_between_a_big_ones(server, leak_ok, capsys):
    """One request's share of a replica is bounded (test_fairness): a 1-step request sent once a
    big request's denoising is under way is answered before the big one's midpoint, in a
    fraction of its time (ordering and a ratio measured in the same run, not seconds)."""
    body = {
        "prompt": "a photo of a cat",
        "size": f"{BIG_SIDE}x{BIG_SIDE}",
        "num_inference_steps": BIG_STEPS,
        "stream": True,
    }
    started = time.monotonic()
    small = Timed(lambda: image_request(server, headers=AUTH, num_inference_steps=1, seed=3))
    steps: list[int] = []
    small_done_at: int | None = None  # the big call's step when the small request was answered
    with httpx.stream("POST", server.url + ROUTE, json=body, headers=AUTH, timeout=300) as reply:
        assert reply.status_code == 200
        for line in reply.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            data = json.loads(line[len("data: ") :])
            if data["type"] != "image_generation.progress":
                continue
            steps.append(data["step"])
            if len(steps) == 1:  # the big call is under way: the small request goes beside it
                small.start()
            elif small_done_at is None and not small.is_alive():
                small_done_at = data["step"]
        ended = time.monotonic()
    small.join(timeout=60)
    assert small.reply is not None and small.reply.status_code == 200, small.reply
    assert steps == list(range(1, BIG_STEPS + 1))
    assert small_done_at is not None and small_done_at <= BIG_STEPS // 2, small_done_at
    assert small.took < 0.5 * (ended - started), (small.took, ended - started)
    report(
        capsys,
        f"images: a 1-step request beside a {BIG_STEPS}-step one of 4x its pixels was answered "
        f"at its step {small_done_at}, in {small.took / (ended - started):.3f} of its time",
    )


def test_a_client_that_disconnects_cancels_its_request(server, leak_ok):
    def aborted() -> int:
        info = httpx.get(server.url + "/get_server_info", headers=AUTH, timeout=30).json()
        return info["schedulers"][0]["aborted"]

    before, started = aborted(), batches(server)
    # The client leaves once its request of 900 steps is under way (its pipeline call started).
    with leaving_client(server.url, ROUTE, body(num_inference_steps=900), AUTH):
        wait_for(lambda: batches(server) > started, what="the request under way")
    wait_for(lambda: aborted() > before, what="the cancelled request counted as aborted")
    assert len(images_of(post(server, seed=2))) == 1  # and the server goes on serving


# ---- progress streaming ------------------------------------------------------------------------


def sse_events(lines) -> list[tuple[str | None, object]]:
    """``(event name or None, data)`` for each server-sent event of ``lines`` (data as JSON, or
    the string ``"[DONE]"``)."""
    events, name = [], None
    for line in lines:
        if line.startswith("event: "):
            name = line[len("event: ") :]
        elif line.startswith("data: "):
            data = line[len("data: ") :]
            events.append((name, data if data == "[DONE]" else json.loads(data)))
            name = None
    return events


def first_step(lines) -> dict:
    """The data of the first event of ``lines``, read without closing them (a line generator that
    is dropped closes its connection: the client would hang up there)."""
    for line in lines:
        if line.startswith("data: "):
            return json.loads(line[len("data: ") :])
    raise AssertionError("the stream ended before its first event")


def stream(server, **extra) -> list[tuple[str | None, object]]:
    with httpx.stream(
        "POST", server.url + ROUTE, json=body(stream=True, **extra), headers=AUTH, timeout=120
    ) as reply:
        assert reply.status_code == 200, reply.read()
        assert reply.headers["content-type"].startswith("text/event-stream")
        return sse_events(reply.iter_lines())


def split_events(events) -> tuple[list[dict], list[dict]]:
    """The progress and the completed events of one whole stream, checked for their shape: the
    progress events first, each image after them, then ``[DONE]`` last."""
    assert events[-1] == (None, "[DONE]"), events[-3:]
    progress = [data for name, data in events if name == "image_generation.progress"]
    images = [data for name, data in events if name == "image_generation.completed"]
    assert [name for name, _ in events[:-1]] == ["image_generation.progress"] * len(progress) + [
        "image_generation.completed"
    ] * len(images)
    for name, data in events[:-1]:
        assert data["type"] == name
    return progress, images


@pytest.mark.parametrize("n", [1, 2])
def test_stream_sends_one_event_per_step_then_the_images(server, leak_ok, n):
    wide = {"size": None, "width": 2 * SIZE, "height": SIZE}
    progress, images = split_events(stream(server, n=n, seed=11, num_inference_steps=3, **wide))
    assert [(e["step"], e["total_steps"]) for e in progress] == [(k, 3) for k in range(1, 4)]
    assert [image["index"] for image in images] == list(range(n))
    plain = images_of(post(server, n=n, seed=11, num_inference_steps=3, **wide))
    for image, same in zip(images, plain, strict=True):
        blob = base64.b64decode(image["b64_json"])
        with Image.open(io.BytesIO(blob)) as img:
            assert img.format == "PNG" and img.size == (2 * SIZE, SIZE)
        assert blob == same  # streaming changes nothing in the image
        assert image["seed"] == 11 + image["index"] and image["size"] == f"{2 * SIZE}x{SIZE}"
        assert image["output_format"] == "png" and image["num_inference_steps"] == 3


def test_streamed_requests_batched_together_each_get_every_step(server, leak_ok):
    before = batches(server)
    streams: dict[int, list] = {}
    threads = [
        threading.Thread(target=lambda i=i: streams.update({i: stream(server, seed=200 + i)}))
        for i in range(4)
    ]
    queued_beside_a_long_request(server, threads)
    assert sorted(streams) == [0, 1, 2, 3]
    for i, events in streams.items():
        progress, images = split_events(events)
        assert [e["step"] for e in progress] == [1, 2], (i, progress)
        assert len(images) == 1 and images[0]["seed"] == 200 + i
    assert batches(server) - before == 2  # the long request, and the four in one pipeline call


def test_the_openai_client_reads_the_stream(server, leak_ok):
    client = openai.OpenAI(base_url=server.url + "/v1", api_key=KEY, max_retries=0)
    events = list(
        client.images.generate(
            prompt="a photo of a cat",
            stream=True,
            size=f"{SIZE}x{SIZE}",  # type: ignore[arg-type]
            extra_body={"num_inference_steps": 3, "seed": 5},
        )
    )
    assert [e.type for e in events] == ["image_generation.progress"] * 3 + [
        "image_generation.completed"
    ]
    assert (
        base64.b64decode(events[-1].b64_json)
        == images_of(post(server, seed=5, num_inference_steps=3))[0]
    )


def scheduler_counts(server) -> dict:
    """The one scheduler's counters (``batches``, ``aborted``, ...) from ``/get_server_info``."""
    info = httpx.get(server.url + "/get_server_info", headers=AUTH, timeout=30).json()
    return info["schedulers"][0]


def long_stream(server):
    """A streamed request of 900 steps: it keeps the worker busy until its client leaves."""
    return httpx.stream(
        "POST",
        server.url + ROUTE,
        json=body(stream=True, num_inference_steps=900),
        headers=AUTH,
        timeout=60,
    )


def test_a_client_that_leaves_mid_stream_cancels_its_request(server, leak_ok):
    def aborted() -> int:
        return scheduler_counts(server)["aborted"]

    before = aborted()
    with long_stream(server) as reply:
        lines = reply.iter_lines()
        assert first_step(lines)["step"] == 1
        assert first_step(lines)["step"] == 2  # still streaming; then hang up
    # The scheduler stops the loop at the next step rather than running 900, and goes on serving.
    wait_for(lambda: aborted() > before, what="the abandoned stream counted as aborted")
    progress, images = split_events(stream(server, seed=2))
    assert len(progress) == 2 and len(images) == 1


def test_a_client_that_leaves_before_the_first_event_is_dropped_from_the_queue(server, leak_ok):
    def counts() -> tuple[int, int]:
        one = scheduler_counts(server)
        return one["batches"], one["aborted"]

    batches, aborted = counts()
    with long_stream(server) as busy:
        lines = busy.iter_lines()
        first_step(lines)
        # The worker is paused: this stream waits for it, and its client gives up before its
        # first event; the worker reads the request and its cancellation together.
        with worker_paused(server):
            with pytest.raises(httpx.ReadTimeout):
                with httpx.stream(
                    "POST", server.url + ROUTE, json=body(stream=True), headers=AUTH, timeout=1
                ) as queued:
                    queued.read()
            wait_for(lambda: sent_to_the_worker(server) == 1, what="the queued request cancelled")
    wait_for(lambda: counts()[1] > aborted, what="the busy stream counted as aborted")
    # A probe of another shape (it cannot share the queued request's batch) runs after where
    # the queued request would have: only the busy batch and the probe's ran.
    assert len(images_of(post(server, num_inference_steps=3, seed=4))) == 1
    assert counts()[0] - batches == 2


def docs_stream_example() -> str:
    """The ``curl -N`` command of docs/diffusion.md's streaming section."""
    text = (REPO / "docs" / "diffusion.md").read_text(encoding="utf-8")
    section = text.split("## Streaming progress", 1)[1].split("\n## ", 1)[0]
    command = re.search(r"```bash\n(curl -N .*?)```", section, re.S)
    assert command, "docs/diffusion.md's streaming section has no curl -N example"
    return command.group(1)


@pytest.mark.skipif(shutil.which("curl") is None, reason="curl is not installed")
def test_the_documented_curl_example_streams(server, leak_ok):
    command = docs_stream_example()
    steps = json.loads(re.search(r"-d '(.*?)'", command, re.S).group(1))["num_inference_steps"]
    # As written, at the test server's address and with its API key.
    command = command.replace("http://127.0.0.1:30000", server.url).replace(
        "curl -N", f"curl -N -sS -H 'Authorization: Bearer {KEY}'", 1
    )
    out = subprocess.run(
        ["bash", "-c", command], capture_output=True, text=True, timeout=180, check=True
    ).stdout
    progress, images = split_events(sse_events(out.splitlines()))
    assert [e["step"] for e in progress] == list(range(1, steps + 1))
    with Image.open(io.BytesIO(base64.b64decode(images[0]["b64_json"]))) as img:
        assert img.size == (SIZE, SIZE)  # the pipeline's default size


def test_openapi_documents_streaming(server, leak_ok):
    doc = httpx.get(server.url + "/openapi.json", headers=AUTH, timeout=30).json()
    answer = doc["paths"][ROUTE]["post"]["responses"]["200"]["content"]
    assert "image_generation.progress" in answer["text/event-stream"]["schema"]["description"]
    stream_field = doc["components"]["schemas"]["ImageGenerationRequest"]["properties"]["stream"]
    assert stream_field["type"] == "boolean" and "server-sent events" in stream_field["description"]


def test_dp2_serves_on_both_a_dying_worker_ends_its_stream_and_sigint_leaves_nothing(
    tiny_pipeline, tmp_path
):
    """dp=2 serves on both replicas; a worker SIGKILLed mid-stream ends that stream with an error
    event (its replica restarts: the dp=2 default); SIGINT, even during that restart, leaves
    nothing behind."""
    srv = start_server(
        ["--runtime", "diffusion", "--model-path", str(tiny_pipeline), "--dp-size", "2"],
        tmp_path,
        "diffusion-dp2",
        env=server_env(OMP_WAIT_POLICY="ACTIVE", OMP_NUM_THREADS=None),
    )
    try:
        tree = [
            psutil.Process(srv.proc.pid),
            *psutil.Process(srv.proc.pid).children(recursive=True),
        ]
        assert len(tree) >= 4  # supervisor, HTTP child, two workers
        replies: list[httpx.Response] = []
        threads = [
            threading.Thread(
                target=lambda i=i: replies.append(
                    httpx.post(
                        srv.url + ROUTE, json=body(seed=i, num_inference_steps=3), timeout=120
                    )
                )
            )
            for i in range(6)
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert [r.status_code for r in replies] == [200] * 6, [r.text for r in replies]
        info = httpx.get(srv.url + "/get_server_info", timeout=30).json()
        assert [s["batches"] > 0 for s in info["schedulers"]] == [
            True,
            True,
        ]  # least-loaded routing
        # The user's OMP_WAIT_POLICY wins; the two replicas share the cores as torch threads.
        cores = len(os.sched_getaffinity(0))
        assert info["model"]["cpu_threads"] == {
            "intra_op": max(1, cores // 2),
            "omp_wait_policy": "ACTIVE",
        }

        worker = info["schedulers"][0]["pid"]  # both idle: the stream goes to dp=0
        with httpx.stream(
            "POST", srv.url + ROUTE, json=body(stream=True, num_inference_steps=900), timeout=60
        ) as reply:
            lines = reply.iter_lines()
            first_step(lines)  # the worker is in the denoising loop
            os.kill(worker, signal.SIGKILL)
            events = sse_events(lines)
        errors = [data for name, data in events if name == "error"]
        assert len(errors) == 1 and events[-1] == (None, "[DONE]"), events[-3:]
        error = errors[0]["error"]
        assert error["code"] == 503 and "scheduler dp=0 is gone" in error["message"], error
        tree += psutil.Process(srv.proc.pid).children(recursive=True)  # dp=0's successor too
        sigint_leaves_nothing(srv, tree)
    finally:
        srv.stop()


def sigint_leaves_nothing(srv, tree: list) -> None:
    """SIGINT stops the launch with 0, and every process of ``tree`` is gone soon after."""
    srv.proc.send_signal(signal.SIGINT)
    assert srv.wait_exit(timeout=60) == 0, srv.log
    wait_for(
        lambda: not any(p.is_running() and p.status() != psutil.STATUS_ZOMBIE for p in tree),
        timeout=30,
        what="every process of the launch gone",
    )


def pixels(blob: bytes):
    import numpy as np

    with Image.open(io.BytesIO(blob)) as img:
        return np.asarray(img.convert("RGB"), dtype=np.int16)


def test_cfg_parallel_gives_the_single_rank_images(server, leak_ok, tiny_pipeline, tmp_path):
    """``--enable-cfg-parallel``: a replica of two ranks, rank 0 the conditional and rank 1 the
    unconditional half of each guidance step. The same requests give the single-rank server's
    images: the same size and pixels within 1 of 255 per channel (the halves are computed as two
    batches instead of one, which can move float rounding; in practice the bytes are equal).
    A cancelled request stops both ranks at the same step, and SIGINT leaves nothing behind."""
    requests = [
        {"n": 2, "seed": 7, "negative_prompt": "blurry", "num_inference_steps": 3},
        {"seed": 11, "guidance_scale": 3.0},
        {"seed": 9, "guidance_scale": 1.0},  # no guidance: rank 0 runs it alone
    ]
    reference = [images_of(post(server, **r)) for r in requests]
    cfg = start_server(
        [
            *("--runtime", "diffusion", "--model-path", str(tiny_pipeline)),
            *("--api-key", KEY, "--enable-cfg-parallel"),
        ],
        tmp_path,
        "diffusion-cfg",
    )
    try:
        tree = [psutil.Process(cfg.proc.pid), *psutil.Process(cfg.proc.pid).children(True)]
        assert len(tree) >= 4  # supervisor, HTTP child, the replica's two ranks
        for extra, expected in zip(requests, reference, strict=True):
            got = images_of(post(cfg, **extra))
            assert len(got) == len(expected)
            for mine, theirs in zip(got, expected, strict=True):
                a, b = pixels(mine), pixels(theirs)
                assert a.shape == b.shape == (SIZE, SIZE, 3)
                assert int(abs(a - b).max()) <= 1, (extra, int(abs(a - b).max()))
        info = httpx.get(cfg.url + "/get_server_info", headers=AUTH, timeout=30).json()
        parallel = info["model"]["parallel"]
        assert parallel["ranks"] == 2 and parallel["cfg_parallel"] is True
        assert parallel["backend"] == "gloo" and parallel["device_id"] is None
        assert parallel["split_steps"] == 3 + 2  # the two guided requests' steps, not the third

        def aborted() -> int:
            info = httpx.get(cfg.url + "/get_server_info", headers=AUTH, timeout=30).json()
            return info["schedulers"][0]["aborted"]

        before, started = aborted(), batches(cfg)
        # Its client leaves once the request of 900 steps is under way (its pipeline call started).
        with leaving_client(cfg.url, ROUTE, body(num_inference_steps=900), AUTH):
            wait_for(lambda: batches(cfg) > started, what="the request under way")
        wait_for(lambda: aborted() > before, what="the cancelled request counted as aborted")
        again = images_of(post(cfg, **requests[0]))  # both ranks stopped together: still in step
        for mine, theirs in zip(again, reference[0], strict=True):
            assert int(abs(pixels(mine) - pixels(theirs)).max()) <= 1
        # A streamed request on the two ranks: rank 0 reports each step of the split loop.
        progress, images = split_events(stream(cfg, seed=9, num_inference_steps=3))
        assert [e["step"] for e in progress] == [1, 2, 3] and len(images) == 1
        sigint_leaves_nothing(cfg, tree)
    finally:
        cfg.stop()
