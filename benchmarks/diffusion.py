"""Diffusion benchmark: HTTP overhead at batch 1, and images per second under concurrency.

1. Batch 1: one image request through HTTP (``sglang-launch --runtime diffusion``, one client,
   one request at a time) against the same pipeline call made in-process. The in-process side is
   a child of this script (``--baseline``) set up the way a dp=1 worker sets itself up
   (``run_scheduler_process``: ``share_cpu_threads``, then ``DiffusionModelRunner`` and
   ``init_device_and_model()``: same directory, dtype, custom ops and attention), in the
   server's environment, with the thread settings the server's worker reports in
   ``/get_server_info`` (``cpu_threads``: torch's intra-op thread count and
   ``OMP_WAIT_POLICY``, checked equal before anything is timed). It times
   ``DiffusionModelRunner.generate(shape, [job])``, the call the worker's scheduler makes for a
   batch of one: the same prompt, size, step count and guidance, denoising and PNG encoding.
   The HTTP side adds what serving adds: parsing and checking the request, the ZeroMQ round trip
   to the worker, its queue, the step callback, base64 and the JSON answer.

   The target is measured with a lean client (``benchmarks/serving.py``'s ``KeepAliveClient``:
   one keep-alive connection, a prepared request, the answer read by its Content-Length), so the
   figure is the server's overhead; the same request through httpx is shown beside it (a Python
   HTTP library adds its own per-request cost, the client's). The three sides alternate request
   by request, the order rotating every round, so that other work on the machine falls on each
   side alike; nothing else of this benchmark runs while one side is timed. Target: HTTP at most
   1.05x the in-process time (ratio of the medians; the per-round ratios' spread is printed).
2. Images per second with ``--clients`` concurrent lean clients against one client at a time, on
   the same server, in ``--load-rounds`` alternating windows of ``--seconds`` each (same-shape
   requests that arrive together share a pipeline batch, so concurrency should raise
   throughput).

The pipeline is ``--model-path`` or, by default, the tests' tiny pipeline built in a temporary
folder (``--size`` 32, ``--steps`` 2). The platform decides the device, as when serving.
Loopback only; the script prints each figure and the ratios.

    .venv/bin/python benchmarks/diffusion.py [--model-path DIR] [--size 32] [--steps 2]
        [--rounds 100] [--clients 4] [--seconds 5] [--load-rounds 4]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(REPO), str(REPO / "tests"), str(REPO / "benchmarks")]
os.environ.setdefault("HF_HUB_OFFLINE", "1")

PROMPT = "a photo of a cat"
GUIDANCE = 7.5


def request_body(opts: argparse.Namespace, seed: int) -> dict:
    return {
        "prompt": PROMPT,
        "width": opts.size,
        "height": opts.size,
        "num_inference_steps": opts.steps,
        "guidance_scale": GUIDANCE,
        "seed": seed,
    }


def baseline(opts: argparse.Namespace) -> int:
    """``--baseline``: the worker's own set-up in this process, then one timed
    ``generate(shape, [job])`` per seed read from stdin; prints the seconds it took. The first
    line out reports the thread settings."""
    import msgspec

    from launchspec.server_args import ServerArgs
    from platforms.diffusion import current_platform, initialize_current_platform
    from serving.diffusion.model_runner import DiffusionModelRunner, ImageJob
    from serving.threads import share_cpu_threads

    initialize_current_platform()
    if current_platform.is_cpu():
        share_cpu_threads(ranks_on_node=1)  # what run_scheduler_process does at dp=1
    # The server's arguments: its defaults for everything but the model.
    worker = DiffusionModelRunner(
        ServerArgs(model_path=opts.model_path, runtime="diffusion"), current_platform
    )
    worker.init_device_and_model()
    shape = worker.shape_of(opts.size, opts.size, opts.steps, GUIDANCE)
    print(msgspec.json.encode(worker.describe().cpu_threads).decode(), flush=True)
    for line in sys.stdin:
        job = ImageJob("bench", PROMPT, 1, None, int(line), "png")
        started = time.perf_counter()
        worker.generate(shape, [job])
        print(time.perf_counter() - started, flush=True)
    return 0


class Baseline:
    """The ``--baseline`` child: ``call(seed)`` runs one timed pipeline call there."""

    def __init__(self, opts: argparse.Namespace, env: dict[str, str]) -> None:
        command = [sys.executable, __file__, "--baseline", "--model-path", opts.model_path]
        command += ["--size", str(opts.size), "--steps", str(opts.steps)]
        # A session of its own, as the server has (support.serving.Server): Linux shares the
        # CPU between sessions (autogroups) first, so both sides get the same kind of share.
        self.proc = subprocess.Popen(
            command,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env=env,
            start_new_session=True,
        )
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.stdin, self.stdout = self.proc.stdin, self.proc.stdout
        first = self.stdout.readline()
        if not first:
            raise RuntimeError(f"the in-process baseline exited with {self.proc.wait()}")
        self.threads = json.loads(first)
        self.last = 0.0

    def call(self, seed: int) -> None:
        self.stdin.write(f"{seed}\n")
        self.stdin.flush()
        self.last = float(self.stdout.readline())

    def close(self) -> None:
        self.stdin.close()
        self.proc.wait(timeout=60)


def batch_one(
    opts: argparse.Namespace, url: str, local: Baseline
) -> tuple[dict[str, list[float]], int]:
    """Times of the three sides, alternating request by request in ``opts.rounds`` rounds, and
    how often the lean client had to reopen its connection."""
    import httpx

    from serving import KeepAliveClient

    path = "/v1/images/generations"
    for _ in range(3):  # warm the in-process side before the connection opens: the server
        local.call(1)  # gives a new connection 10 s to send its first request
    lean = KeepAliveClient(url, path, json.dumps(request_body(opts, 1)).encode())
    library = httpx.Client(timeout=600)

    def over_httpx() -> None:
        library.post(url + path, json=request_body(opts, 1)).raise_for_status()

    def timed(call) -> float:
        started = time.perf_counter()
        call()
        return time.perf_counter() - started

    sides = {
        "in-process": lambda: local.call(1) or local.last,
        "http": lambda: timed(lean.post),
        "http (httpx)": lambda: timed(over_httpx),
    }
    times: dict[str, list[float]] = {name: [] for name in sides}
    try:
        for _ in range(3):  # warm the HTTP paths
            sides["http"]()
            sides["http (httpx)"]()
        names = list(sides)
        for r in range(opts.rounds):
            shift = r % len(names)
            for name in names[shift:] + names[:shift]:
                times[name].append(sides[name]())
    finally:
        lean.close()
        library.close()
    return times, lean.reconnects


def images_per_second(url: str, opts: argparse.Namespace, clients: int) -> float:
    """Images per second with ``clients`` lean clients posting back to back for ``opts.seconds``."""
    from serving import KeepAliveClient

    done = [0] * clients
    stop = time.monotonic() + opts.seconds

    def loop(k: int) -> None:
        c = KeepAliveClient(
            url, "/v1/images/generations", json.dumps(request_body(opts, k)).encode()
        )
        try:
            while time.monotonic() < stop:
                c.post()
                done[k] += 1
        finally:
            c.close()

    started = time.monotonic()
    threads = [threading.Thread(target=loop, args=(k,)) for k in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return sum(done) / (time.monotonic() - started)


def spread(values: list[float]) -> str:
    q = statistics.quantiles(values, n=4)
    return f"{min(values):.3f} / {q[0]:.3f} / {q[1]:.3f} / {q[2]:.3f} / {max(values):.3f}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model-path")
    parser.add_argument("--size", type=int, default=32)
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=100, help="batch-1 requests per side")
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument("--seconds", type=float, default=5.0, help="one load window")
    parser.add_argument("--load-rounds", type=int, default=4, help="windows per client count")
    parser.add_argument("--baseline", action="store_true", help=argparse.SUPPRESS)
    opts = parser.parse_args()
    if opts.baseline:
        return baseline(opts)
    import httpx
    from support.serving import server_env, start_server

    tmp = Path(tempfile.mkdtemp(prefix="bench-diffusion-"))
    if opts.model_path is None:
        from support.diffusion import build_tiny_pipeline

        opts.model_path = str(build_tiny_pipeline(tmp / "tiny-sd"))
    env = server_env(SGLANG_USE_CPU_ENGINE=None)
    server = start_server(
        ["--runtime", "diffusion", "--model-path", opts.model_path], tmp, "bench", env=env
    )
    local = None
    try:
        served = httpx.get(server.url + "/get_server_info", timeout=60).json()["model"]
        threads = served["cpu_threads"]
        local_env = dict(env)
        local_env.pop("OMP_WAIT_POLICY", None)
        if threads.get("omp_wait_policy"):
            local_env["OMP_WAIT_POLICY"] = threads["omp_wait_policy"]
        local = Baseline(opts, local_env)
        if local.threads != threads:
            raise RuntimeError(
                f"the in-process side runs with {local.threads}, the server's worker with "
                f"{threads}: the comparison would not be the same call on the same threads"
            )
        times, reconnects = batch_one(opts, server.url, local)
        local.close()
        local = None
        med = {name: statistics.median(t) * 1e3 for name, t in times.items()}
        per_round = [h / p for h, p in zip(times["http"], times["in-process"], strict=True)]
        print(
            f"cores: {len(os.sched_getaffinity(0))}; device {served['device']}; threads {threads}"
        )
        print(
            f"1) batch 1, {opts.size}x{opts.size}, {opts.steps} steps, {opts.rounds} requests "
            f"a side, alternating"
        )
        print(f"   in-process generate()     median {med['in-process']:8.1f} ms")
        print(f"   HTTP (lean client)        median {med['http']:8.1f} ms")
        print(
            f"   ratio HTTP / in-process   {med['http'] / med['in-process']:.3f}x (target <= 1.05x)"
        )
        print(f"   per-round ratio min/q1/median/q3/max: {spread(per_round)}")
        if reconnects:  # each such request's time includes opening a new connection
            print(f"   the lean client reopened its connection {reconnects} time(s) (idle close)")
        print(
            f"   HTTP through httpx        median {med['http (httpx)']:8.1f} ms "
            f"({med['http (httpx)'] / med['in-process']:.3f}x; the client library's cost included)"
        )

        rates: dict[int, list[float]] = {1: [], opts.clients: []}
        for r in range(opts.load_rounds):
            for clients in (1, opts.clients) if r % 2 == 0 else (opts.clients, 1):
                rates[clients].append(images_per_second(server.url, opts, clients))
        one, many = (statistics.median(rates[k]) for k in (1, opts.clients))
        windows = ", ".join(
            f"{m / o:.2f}" for o, m in zip(rates[1], rates[opts.clients], strict=True)
        )
        print(
            f"2) images per second, {opts.load_rounds} alternating windows of "
            f"{opts.seconds:.0f} s per client count (median)"
        )
        print(f"   1 client at a time        {one:7.2f}")
        print(f"   {opts.clients} concurrent clients      {many:7.2f}")
        print(
            f"   ratio {opts.clients} clients / 1 client  {many / one:.2f}x  (windows: {windows})"
        )
    finally:
        if local is not None:
            local.proc.kill()
        server.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
