"""Serving benchmark: HTTP overhead at batch 1, and data-parallel throughput, side by side.

1. An embedding request through HTTP (``sglang-launch`` with the embedded default model, one
   client, one request at a time) against the same model call made in-process
   (``ModelRunner.embed`` on one text: tokenising and the model, as the scheduler does), with
   torch's thread count set the way a dp=1 scheduler sets it (``share_cpu_threads``), so both
   sides run the same model call on the same threads. Target: HTTP at most 1.2x the in-process time.
2. Throughput of 16 concurrent clients against ``--dp-size 2`` and ``--dp-size 1``.

Both contenders and baselines run in this one invocation, one after the other (never at the same
time, so they do not share the CPU), and the script prints the ratios. Loopback only.

    .venv/bin/python benchmarks/serving.py [--requests 300] [--seconds 15] [--clients 16]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(REPO), str(REPO / "tests")]
os.environ.setdefault("HF_HUB_OFFLINE", "1")

# The CLI server helpers and the load generator the tests use (one copy of each).
from test_serving_support import embedding_body, run_load, start_server  # noqa: E402

TEXT = "a cat sits on the mat"


def in_process(requests: int) -> tuple[list[float], int]:
    """Batch-1 ``ModelRunner.embed`` times, and the torch threads they ran on."""
    import torch
    from platforms.builtin.cpu import CpuSRTPlatform

    from launcher.workers.model_runner import ModelRunner
    from launcher.workers.model_source import resolve_model
    from launcher.workers.scheduler import share_cpu_threads

    share_cpu_threads(ranks_on_node=1)  # what the dp=1 server's scheduler does
    runner = ModelRunner(resolve_model(None), platform=CpuSRTPlatform())
    runner.warm_up()
    for _ in range(20):
        runner.embed([TEXT])
    times = []
    for _ in range(requests):
        started = time.perf_counter()
        runner.embed([TEXT])
        times.append(time.perf_counter() - started)
    return times, torch.get_num_threads()


def over_http(url: str, requests: int) -> list[float]:
    import httpx

    times = []
    with httpx.Client(timeout=60) as client:
        for _ in range(20):
            client.post(url + "/v1/embeddings", json={"input": TEXT})
        for _ in range(requests):
            started = time.perf_counter()
            r = client.post(url + "/v1/embeddings", json={"input": TEXT})
            times.append(time.perf_counter() - started)
            r.raise_for_status()
    return times


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--requests", type=int, default=300, help="batch-1 requests per side")
    parser.add_argument("--seconds", type=float, default=15.0, help="load duration per dp size")
    parser.add_argument("--clients", type=int, default=16)
    opts = parser.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="sglang-bench-"))

    local, threads = in_process(opts.requests)
    server = start_server([], tmp, "dp1")
    try:
        http = over_http(server.url, opts.requests)
        dp1 = run_load(server.url, embedding_body, clients=opts.clients, seconds=opts.seconds)
    finally:
        server.stop()
    server = start_server(["--dp-size", "2"], tmp, "dp2")
    try:
        dp2 = run_load(server.url, embedding_body, clients=opts.clients, seconds=opts.seconds)
    finally:
        server.stop()

    med_local, med_http = statistics.median(local) * 1000, statistics.median(http) * 1000
    print(f"cores: {len(os.sched_getaffinity(0))}")
    print("1) embedding, batch 1, median of %d requests" % opts.requests)
    print(f"   in-process ModelRunner.embed : {med_local:8.2f} ms  (torch threads: {threads}, as the server's scheduler)")
    print(f"   HTTP /v1/embeddings          : {med_http:8.2f} ms")
    print(f"   ratio HTTP / in-process      : {med_http / med_local:8.2f}x  (target <= 1.2x)")
    print(f"2) throughput, {opts.clients} clients, {opts.seconds:.0f} s each")
    for name, s in (("dp=1", dp1), ("dp=2", dp2)):
        print(f"   {name}: {s['throughput_rps']:8.1f} req/s  p50 {s['p50_ms']:7.1f} ms  "
              f"p99 {s['p99_ms']:7.1f} ms  errors {len(s['errors'])}")
    print(f"   ratio dp=2 / dp=1            : {dp2['throughput_rps'] / dp1['throughput_rps']:8.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
