"""Slow, stalled and stuck requests against a real server (the embedded default model) over real
loopback sockets: a stalled body or header is answered 408 and closed within its timeout, above
the connection cap the probes still answer and any other request gets a JSON 503, and a request the server cannot answer in time gets a 504 JSON
error (its scheduler stopped with SIGSTOP, the watchdog off)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys

import httpx
import pytest
from support import REPO, wait_for
from support.serving import server_env, start_server
from support.supervisor import short_runtime_dir

pytestmark = pytest.mark.e2e

LIMITS = [
    "--http-header-timeout",
    "1",
    "--http-body-timeout",
    "1",
    "--max-connections",
    "4",
    "--request-timeout",
    "2",
    "--watchdog-timeout",
    "0",
]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    runtime_dir = short_runtime_dir()
    env = server_env(XDG_RUNTIME_DIR=runtime_dir)
    srv = start_server(LIMITS, tmp_path_factory.mktemp("limits"), "limits", env=env)
    srv.env = env
    yield srv
    srv.stop()
    shutil.rmtree(runtime_dir, ignore_errors=True)


def _connect(server) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", server.port), timeout=30)
    return sock


def _read_until_closed(sock: socket.socket) -> bytes:
    data = b""
    while chunk := sock.recv(4096):
        data += chunk
    return data


def test_a_stalled_body_is_answered_408_and_closed(server):
    with _connect(server) as sock:
        sock.sendall(
            b"POST /v1/embeddings HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
            b"content-length: 100\r\n\r\n{"
        )
        reply = _read_until_closed(sock)  # the socket's own 30 s timeout fails the test otherwise
    assert reply.startswith(b"HTTP/1.1 408"), reply


def test_stalled_headers_are_answered_408_and_closed(server):
    with _connect(server) as sock:
        sock.sendall(b"GET /health HTTP/1.1\r\nhost: x\r\n")
        reply = _read_until_closed(sock)
    assert reply.startswith(b"HTTP/1.1 408"), reply


def test_the_probes_answer_above_the_connection_cap_and_the_rest_get_a_json_503(server):
    # Six kept-alive connections, two more than the cap: each asked /health, which is answered
    # whatever the count, and stays open (idle, not timed out as a stalled request would be).
    held = [httpx.Client(base_url=server.url, timeout=30) for _ in range(6)]
    try:
        assert [c.get("/health").status_code for c in held] == [200] * 6
        r = httpx.post(server.url + "/v1/embeddings", json={"input": "hello"}, timeout=30)
        assert r.status_code == 503, r.text
        assert r.headers["retry-after"] == "1" and r.headers["connection"] == "close"
        error = r.json()["error"]
        assert error["code"] == 503 and "--max-connections" in error["message"], error
        assert httpx.get(server.url + "/health", timeout=30).json() == {"healthy": True}
        assert httpx.get(server.url + "/ready", timeout=30).json()["ready"] is True
    finally:
        for client in held:
            client.close()
    wait_for(
        lambda: post_embedding(server).status_code == 200,
        30,
        "the server to take requests again",
    )


def post_embedding(server) -> httpx.Response:
    return httpx.post(server.url + "/v1/embeddings", json={"input": "hello"}, timeout=30)


def test_a_request_not_answered_in_time_gets_504_json(server):
    status = subprocess.run(
        [sys.executable, "-m", "launcher", "status", "--json"],
        env=server.env,
        cwd=str(REPO),
        capture_output=True,
        text=True,
        timeout=60,
    )
    scheduler = next(w for w in json.loads(status.stdout)["workers"] if w["role"] == "scheduler")
    os.kill(scheduler["pid"], signal.SIGSTOP)
    try:
        r = httpx.post(server.url + "/v1/embeddings", json={"input": "hello"}, timeout=60)
    finally:
        os.kill(scheduler["pid"], signal.SIGCONT)
    assert r.status_code == 504, r.text
    error = r.json()["error"]
    assert error["code"] == 504 and "--request-timeout 2s" in error["message"]
    ok = httpx.post(server.url + "/v1/embeddings", json={"input": "hello"}, timeout=60)
    assert ok.status_code == 200, ok.text


def test_oversize_text_is_refused_by_its_length_before_tokenising(server):
    huge = httpx.post(server.url + "/v1/embeddings", json={"input": "word " * 180_000}, timeout=60)
    assert huge.status_code == 400, huge.text
    assert "characters, far more than this model's limit" in huge.json()["error"]["message"]
    # Just over the limit: tokenised, and refused by its token count as before.
    over = httpx.post(server.url + "/v1/embeddings", json={"input": "word " * 600}, timeout=60)
    assert (
        over.status_code == 400
        and "tokens, more than this model's limit" in over.json()["error"]["message"]
    )
    # Whitespace does not count towards the bound.
    spaced = httpx.post(
        server.url + "/v1/embeddings", json={"input": "word" + " " * 50_000}, timeout=60
    )
    assert spaced.status_code == 200, spaced.text
