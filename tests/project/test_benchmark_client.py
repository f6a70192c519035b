"""The serving benchmark's keep-alive client survives a server that closes an idle connection:
it reconnects and sends that request once more. A connection closed in the middle of an answer
is an error, never resent. Real sockets on loopback."""

from __future__ import annotations

import importlib.util
import socket
import threading
from collections.abc import Callable, Iterator

import pytest
from support import REPO


def _load_benchmark():
    spec = importlib.util.spec_from_file_location(
        "serving_benchmark", REPO / "benchmarks" / "serving.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _read_request(conn: socket.socket) -> None:
    data = b""
    while b"\r\n\r\n" not in data:
        data += conn.recv(65536)
    head, body = data.split(b"\r\n\r\n", 1)
    length = int(head.lower().split(b"content-length:", 1)[1].split(b"\r\n", 1)[0])
    while len(body) < length:
        body += conn.recv(65536)


@pytest.fixture
def server() -> Iterator[tuple[socket.socket, list[bytes], Callable[[], None]]]:
    """A listening socket, the answers to give and the function that serves them: one answer per
    connection (bytes sent after reading one request), then that connection is closed, as a
    server closing an idle keep-alive connection does."""
    listener = socket.create_server(("127.0.0.1", 0))
    answers: list[bytes] = []

    def serve() -> None:
        for answer in answers:
            conn, _ = listener.accept()
            with conn:
                _read_request(conn)
                conn.sendall(answer)

    yield listener, answers, serve
    listener.close()


def test_a_connection_the_server_closed_is_reopened_and_the_request_sent_once_more(server):
    listener, answers, serve = server
    ok = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"
    answers += [ok, ok]
    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    client = _load_benchmark().KeepAliveClient(
        f"http://127.0.0.1:{listener.getsockname()[1]}", "/x", b"{}"
    )
    try:
        assert client.post() == b"ok" and client.reconnects == 0
        assert client.post() == b"ok"  # the first connection was closed after its answer
        assert client.reconnects == 1
    finally:
        client.close()
    thread.join(30)


def test_a_connection_closed_in_the_middle_of_an_answer_is_an_error(server):
    listener, answers, serve = server
    answers += [b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nok"]  # 8 bytes short
    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    client = _load_benchmark().KeepAliveClient(
        f"http://127.0.0.1:{listener.getsockname()[1]}", "/x", b"{}"
    )
    try:
        with pytest.raises(RuntimeError, match="closed the connection in the middle of a response"):
            client.post()
        assert client.reconnects == 0
    finally:
        client.close()
    thread.join(30)
