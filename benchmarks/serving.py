"""Serving benchmark: HTTP overhead at batch 1, and data-parallel throughput, side by side.

1. An embedding request through HTTP (``sglang-launch`` with the embedded embedding model, one
   client, one request at a time) against the same model call made in-process
   (``ModelRunner.embed`` on one text: tokenising and the model, as the scheduler does), with
   torch's thread count set the way a dp=1 scheduler sets it (``share_cpu_threads``) and the
   OpenMP wait policy the server's scheduler reports (``cpu_threads`` in ``/get_server_info``;
   checked equal), so both sides run the same model call on the same threads. The sides alternate in ``--rounds`` short
   blocks against one server (30 blocks of 10 requests by default), so a drift in the machine's
   speed falls on both (benchmarks/README.md shows how much fewer, longer blocks let the ratio
   move). Target: HTTP at most 1.2x the in-process time.

   The target is measured with a lean client: one keep-alive connection that sends a prepared
   request and reads the response up to its Content-Length, as a load generator does, so that
   the figure is the server's overhead (HTTP parsing, validation, the ZeroMQ round trip to the
   scheduler, the JSON answer). The same requests through httpx are shown beside it: a Python
   HTTP library adds its own cost per request, which is the client's, not the server's.
2. Throughput of 16 concurrent clients against ``--dp-size 2`` and ``--dp-size 1``.

Nothing else runs while a side is timed (the other side waits), and the script prints the
ratios. Loopback only.

    .venv/bin/python benchmarks/serving.py [--requests 300] [--rounds 30] [--seconds 15] [--clients 16]
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(REPO), str(REPO / "tests")]
os.environ.setdefault("HF_HUB_OFFLINE", "1")

# The CLI server helpers and the load generator the tests use (one copy of each).
from support.serving import embedding_body, run_load, server_env, start_server  # noqa: E402

TEXT = "a cat sits on the mat"


class ServerClosed(ConnectionError):
    """The server closed the connection before it answered (an idle keep-alive connection)."""


class KeepAliveClient:
    """One HTTP/1.1 keep-alive connection that POSTs one prepared JSON body and reads each response
    by its Content-Length: the least a client can do per request.

    A server may close a keep-alive connection it finds idle (uvicorn does after a few seconds, and
    a busy machine can leave a connection idle that long between blocks). When the connection turns
    out closed before any byte of the answer arrived, the client opens a new one and sends that
    request once more; ``reconnects`` counts how often. A second failure is raised."""

    def __init__(self, url: str, path: str, body: bytes) -> None:
        host, port = url.split("//", 1)[1].rsplit(":", 1)
        self.address = (host, int(port))
        self.request = (
            f"POST {path} HTTP/1.1\r\nHost: {host}:{port}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
        ).encode() + body
        self.reconnects = 0
        self.sock = self._connect()

    def _connect(self) -> socket.socket:
        sock = socket.create_connection(self.address)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return sock

    def post(self) -> bytes:
        """Send the request and return the response body (an HTTP 200 is required)."""
        try:
            return self._exchange()
        except (ServerClosed, BrokenPipeError, ConnectionResetError):
            self.sock.close()
            self.sock = self._connect()
            self.reconnects += 1
            return self._exchange()

    def _exchange(self) -> bytes:
        self.sock.sendall(self.request)
        data = bytearray()
        while (end := data.find(b"\r\n\r\n")) < 0:
            data += self._recv(answered=bool(data))
        head = bytes(data[:end]).lower()
        if not head.startswith(b"http/1.1 200"):
            raise RuntimeError(f"the server answered {head.splitlines()[0]!r}")
        length = int(head.split(b"content-length:", 1)[1].split(b"\r\n", 1)[0])
        while len(data) < end + 4 + length:
            data += self._recv(answered=True)
        return bytes(data[end + 4 : end + 4 + length])

    def _recv(self, answered: bool) -> bytes:
        chunk = self.sock.recv(65536)
        if not chunk:
            if answered:  # part of an answer came: not an idle close, so not safe to resend
                raise RuntimeError("the server closed the connection in the middle of a response")
            raise ServerClosed("the server closed the connection")
        return chunk

    def close(self) -> None:
        self.sock.close()


def batch_one(
    url: str, model_path: str | None, requests: int, rounds: int
) -> tuple[dict[str, list[float]], str]:
    """Batch-1 times of three sides, alternating in ``rounds`` blocks: ``ModelRunner.embed``
    in-process, HTTP with the lean client, HTTP with httpx. Returns the times and where the
    in-process model ran."""
    import httpx

    # OpenMP reads OMP_WAIT_POLICY once, when torch loads it: take the server worker's first.
    served = httpx.get(url + "/get_server_info", timeout=60).json()["model"]["cpu_threads"]
    if "torch" in sys.modules:
        raise RuntimeError("torch was imported before the in-process side's thread settings")
    os.environ.pop("OMP_WAIT_POLICY", None)
    if served["omp_wait_policy"]:
        os.environ["OMP_WAIT_POLICY"] = served["omp_wait_policy"]
    import msgspec
    import torch

    from launchspec.model_source import resolve_model
    from platforms import current_platform, current_selection
    from serving.srt.model_runner import ModelRunner
    from serving.threads import share_cpu_threads

    if current_platform.is_cpu():
        share_cpu_threads(ranks_on_node=1)  # what the dp=1 server's scheduler does
        where = f"cpu, torch threads: {torch.get_num_threads()}, as the server's scheduler"
    else:
        where = current_selection().key
    runner = ModelRunner(resolve_model(model_path), platform=current_platform)
    threads = msgspec.to_builtins(runner.describe().cpu_threads)
    if threads != served:
        raise RuntimeError(
            f"the in-process side runs with {threads}, the server's "
            f"scheduler with {served}: the comparison would not be on the same threads"
        )
    runner.warm_up()
    body = json.dumps({"input": TEXT}).encode()
    lean = KeepAliveClient(url, "/v1/embeddings", body)
    library = httpx.Client(timeout=60)
    vector = json.loads(lean.post())["data"][0]["embedding"]
    if len(vector) != len(runner.embed([TEXT])[0]):
        raise RuntimeError("the server and the in-process model disagree on the embedding size")

    def over_httpx() -> None:
        library.post(
            url + "/v1/embeddings", content=body, headers={"Content-Type": "application/json"}
        ).raise_for_status()

    sides = {
        "in-process": lambda: runner.embed([TEXT]),
        "http": lean.post,
        "http (httpx)": over_httpx,
    }
    times: dict[str, list[float]] = {name: [] for name in sides}
    try:
        for call in sides.values():  # warm every path
            for _ in range(20):
                call()
        per_round = max(1, requests // rounds)
        for _ in range(rounds):
            for name, call in sides.items():
                for _ in range(per_round):
                    started = time.perf_counter()
                    call()
                    times[name].append(time.perf_counter() - started)
    finally:
        lean.close()
        library.close()
    where = f"{where}; device {runner.describe().device}"
    if lean.reconnects:  # each such request's time includes opening a new connection
        where += f"; the lean client reconnected {lean.reconnects} time(s) after an idle close"
    return times, where


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--requests", type=int, default=300, help="batch-1 requests per side")
    parser.add_argument(
        "--rounds", type=int, default=30, help="blocks the batch-1 sides alternate in"
    )
    parser.add_argument("--seconds", type=float, default=15.0, help="load duration per dp size")
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument(
        "--skip-dp",
        action="store_true",
        help="measure batch 1 only (a node with one accelerator cannot run dp=2)",
    )
    parser.add_argument(
        "--model-path",
        default="all-MiniLM-L6-v2",
        help="an embedding model directory (default: the embedded one, all-MiniLM-L6-v2)",
    )
    parser.add_argument(
        "--platform",
        choices=("cpu", "auto"),
        default="cpu",
        help="cpu: SGLANG_USE_CPU_ENGINE=1 on both sides; auto: the platform a launch "
        "selects (an accelerator where there is one)",
    )
    opts = parser.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="sglang-bench-"))
    engine = "1" if opts.platform == "cpu" else None
    env = server_env(SGLANG_USE_CPU_ENGINE=engine)
    os.environ.pop("SGLANG_USE_CPU_ENGINE", None)
    if engine:
        os.environ["SGLANG_USE_CPU_ENGINE"] = (
            engine  # the in-process side selects as the server does
        )
    model = ["--model-path", opts.model_path]

    server = start_server(model, tmp, "dp1", env=env)
    try:
        times, threads = batch_one(server.url, opts.model_path, opts.requests, opts.rounds)
        if not opts.skip_dp:
            dp1 = run_load(server.url, embedding_body, clients=opts.clients, seconds=opts.seconds)
    finally:
        server.stop()
    if not opts.skip_dp:
        server = start_server([*model, "--dp-size", "2"], tmp, "dp2", env=env)
        try:
            dp2 = run_load(server.url, embedding_body, clients=opts.clients, seconds=opts.seconds)
        finally:
            server.stop()

    med = {name: statistics.median(t) * 1000 for name, t in times.items()}
    local = med["in-process"]
    print(f"cores: {len(os.sched_getaffinity(0))}")
    print(
        f"1) embedding, batch 1, median of {len(times['http'])} requests per side in {opts.rounds} rounds"
    )
    print(f"   in-process ModelRunner.embed : {local:8.2f} ms  ({threads})")
    print(f"   HTTP /v1/embeddings          : {med['http']:8.2f} ms  (lean keep-alive client)")
    print(f"   ratio HTTP / in-process      : {med['http'] / local:8.2f}x  (target <= 1.2x)")
    print(
        f"   HTTP through httpx           : {med['http (httpx)']:8.2f} ms  "
        f"({med['http (httpx)'] / local:.2f}x; the client library's own cost included)"
    )
    if opts.skip_dp:
        return 0
    print(f"2) throughput, {opts.clients} clients, {opts.seconds:.0f} s each")
    for name, s in (("dp=1", dp1), ("dp=2", dp2)):
        print(
            f"   {name}: {s['throughput_rps']:8.1f} req/s  p50 {s['p50_ms']:7.1f} ms  "
            f"p99 {s['p99_ms']:7.1f} ms  errors {len(s['errors'])}"
        )
    print(
        f"   ratio dp=2 / dp=1            : {dp2['throughput_rps'] / dp1['throughput_rps']:8.2f}x"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
