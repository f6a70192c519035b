"""SIGTERM while requests outlast the grace period, through the real CLI on the tiny pipeline:
the requests in flight go on through the grace period (they keep streaming after the signal),
then each one still running is ended in words, never cut: a stream gets an error event and
``[DONE]``, a plain request a JSON 503, both naming ``--stop-grace-period``; the launch exits 0,
its last line says how many requests were cut, and so do the HTTP child's ``stopped`` event and
``server.stopped``."""

from __future__ import annotations

import json
import re
import shutil
import signal
import subprocess
import threading

import httpx
import pytest
from support import REPO, wait_for
from support.diffusion import SIZE
from support.serving import build_tiny_llama, cli_command, server_env, start_server
from support.supervisor import short_runtime_dir

pytestmark = pytest.mark.e2e

ROUTE = "/v1/images/generations"
# The drain lets the requests go on for GRACE less its last second; the streams must each see a
# denoising step in that window, while three pipeline calls take turns on a busy machine (a
# turn of all three took up to 2 s when the machine was loaded; 3 s left no room for that).
GRACE = 8


def long_body(side: int, stream: bool) -> dict:
    """900 steps: far longer than the grace period."""
    return {
        "prompt": "a photo of a cat",
        "size": f"{side}x{side}",
        "num_inference_steps": 900,
        "stream": stream,
    }


def sent_to_the_worker(url: str) -> int:
    page = httpx.get(url + "/metrics", timeout=30).text
    found = re.search(r'^sglang_launch_queue_depth\{dp_rank="0"\} ([0-9.]+)$', page, re.M)
    return int(float(found.group(1))) if found else 0


class Stream(threading.Thread):
    """A streamed request read to its end: the events (name or None, data) in order, and how
    many progress events came after ``signalled`` was set."""

    def __init__(self, url: str, side: int, signalled: threading.Event) -> None:
        super().__init__(daemon=True)
        self.url, self.side, self.signalled = url, side, signalled
        self.events: list[tuple[str | None, object]] = []
        self.after_signal = 0
        self.started_streaming = threading.Event()

    def run(self) -> None:
        with httpx.stream(
            "POST", self.url + ROUTE, json=long_body(self.side, True), timeout=120
        ) as r:
            name = None
            for line in r.iter_lines():
                if line.startswith("event: "):
                    name = line[len("event: ") :]
                elif line.startswith("data: "):
                    data = line[len("data: ") :]
                    self.events.append((name, data if data == "[DONE]" else json.loads(data)))
                    if name == "image_generation.progress":
                        self.started_streaming.set()
                        self.after_signal += self.signalled.is_set()
                    name = None


def test_sigterm_ends_what_outlasts_the_grace_period_in_words(tiny_pipeline, tmp_path):
    runtime_dir = short_runtime_dir()
    env = server_env(XDG_RUNTIME_DIR=runtime_dir, OMP_WAIT_POLICY=None)
    srv = start_server(
        [
            *("--runtime", "diffusion", "--model-path", str(tiny_pipeline)),
            *("--stop-grace-period", str(GRACE)),
        ],
        tmp_path,
        "graceful-stop",
        env=env,
    )
    follower = subprocess.Popen(
        [*cli_command(), "events", "--follow"],
        env=env,
        cwd=str(REPO),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert follower.stdout is not None
        assert json.loads(follower.stdout.readline())["topic"] == "snapshot"
        signalled = threading.Event()
        streams = [Stream(srv.url, side, signalled) for side in (SIZE, 2 * SIZE)]
        plain: list[httpx.Response] = []
        blocking = threading.Thread(
            target=lambda: plain.append(
                httpx.post(srv.url + ROUTE, json=long_body(3 * SIZE, False), timeout=120)
            ),
            daemon=True,
        )
        for stream in streams:
            stream.start()
            assert stream.started_streaming.wait(120), "the stream never started"
        blocking.start()
        wait_for(lambda: sent_to_the_worker(srv.url) == 3, 60, "three requests at the worker")
        signalled.set()
        srv.proc.send_signal(signal.SIGTERM)
        wait_for(
            lambda: all(stream.after_signal or not stream.is_alive() for stream in streams),
            60,
            "a denoising step on each stream after SIGTERM (the drain lets requests go on)",
        )
        assert srv.wait_exit(timeout=60) == 0, srv.log
        for stream in streams + [blocking]:
            stream.join(timeout=30)

        for stream in streams:
            assert stream.after_signal > 0  # the drain let it go on after SIGTERM
            assert stream.events[-1] == (None, "[DONE]"), stream.events[-3:]
            name, data = stream.events[-2]
            assert name == "error", stream.events[-3:]
            error = data["error"]  # type: ignore[index]
            assert error["code"] == 503, error
            assert f"--stop-grace-period of {GRACE}s ran out" in error["message"], error
        assert len(plain) == 1 and plain[0].status_code == 503, plain
        assert f"--stop-grace-period of {GRACE}s ran out" in plain[0].json()["error"]["message"]

        # The launcher's own last line (a diffusion launch's multiprocessing may warn after it).
        last = [line for line in srv.log.splitlines() if line.startswith("sglang-launch:")][-1]
        assert "3 requests still running when the grace period ran out were cut" in last, last
        assert "every worker process is gone" in last
        out, _ = follower.communicate(timeout=60)
        events = [json.loads(line) for line in out.splitlines() if line.strip()]
        by_topic = {e["topic"]: e for e in events}
        assert by_topic["worker.http.0.stopped"]["info"] == {"requests_cut": 3}, by_topic
        assert by_topic["server.stopped"]["requests_cut"] == 3
        assert by_topic["server.stopped"]["exit_code"] == 0
    finally:
        srv.stop()
        if follower.poll() is None:
            follower.kill()
            follower.wait(timeout=10)
        shutil.rmtree(runtime_dir, ignore_errors=True)


def test_sigterm_ends_a_text_stream_with_an_error_event(tmp_path):
    """The same for text: a completion stream still decoding when the grace period runs out gets
    ``data: {"error": ...}`` and ``data: [DONE]``."""
    from launchspec.model_source import embedding_model_dir

    model = build_tiny_llama(tmp_path / "tiny-llama", embedding_model_dir())
    srv = start_server(["--model-path", str(model), "--stop-grace-period", "1"], tmp_path, "text")
    try:
        body = {"prompt": "go on", "max_tokens": 1000, "ignore_eos": True, "stream": True}
        with httpx.stream("POST", srv.url + "/v1/completions", json=body, timeout=120) as reply:
            assert reply.status_code == 200, reply.read()
            lines = reply.iter_lines()
            assert next(line for line in lines if line.startswith("data: "))  # decoding
            srv.proc.send_signal(signal.SIGTERM)
            data = [line[len("data: ") :] for line in lines if line.startswith("data: ")]
        assert srv.wait_exit(timeout=60) == 0, srv.log
        assert data[-1] == "[DONE]", data[-3:]
        error = json.loads(data[-2])["error"]
        assert error["code"] == 503 and "--stop-grace-period of 1s ran out" in error["message"]
        last = [line for line in srv.log.splitlines() if line.startswith("sglang-launch:")][-1]
        assert "1 request still running when the grace period ran out was cut" in last, last
    finally:
        srv.stop()
