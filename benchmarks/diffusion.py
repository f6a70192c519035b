"""Diffusion benchmark: HTTP overhead at batch 1, and images per second under concurrency.

1. One image request through HTTP (``sglang-launch --runtime diffusion``, one client, one request
   at a time) against the same pipeline call made in-process: the same directory loaded the way
   the worker loads it (``DiffusionWorker``: same dtype, custom ops, attention), the same
   ``generate`` call (denoising and PNG encoding), with torch's thread count set the way a dp=1
   worker sets it (``share_cpu_threads``). The sides alternate in ``--rounds`` short blocks
   against one server, so a drift in the machine's speed falls on both. Target: HTTP at most
   1.05x the in-process time.
2. Images per second with ``--clients`` concurrent clients against one client at a time, on the
   same server (same-shape requests that arrive together share a pipeline batch).

The pipeline is ``--model-path`` or, by default, the tests' tiny pipeline built in a temporary
folder (``--size`` 32, ``--steps`` 2). ``--device``-free: the platform decides, as when serving.
Loopback only; the script prints each figure and the ratios.

    .venv/bin/python benchmarks/diffusion.py [--model-path DIR] [--size 32] [--steps 2]
        [--rounds 10] [--per-round 5] [--clients 4] [--seconds 20]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(REPO), str(REPO / "tests")]
os.environ.setdefault("HF_HUB_OFFLINE", "1")

from serving_support import server_env, start_server  # noqa: E402


def body(opts, seed: int) -> dict:
    return {
        "prompt": "a photo of a cat",
        "width": opts.size,
        "height": opts.size,
        "num_inference_steps": opts.steps,
        "seed": seed,
    }


def in_process(model_path: str):
    """The worker's own set-up, in this process: a function running one batch-1 request."""
    from types import SimpleNamespace

    from launcher.workers.diffusion.runner import DiffusionWorker, ImageJob
    from launcher.workers.scheduler import share_cpu_threads
    from platforms.diffusion import current_platform, initialize_current_platform

    initialize_current_platform()
    if current_platform.is_cpu():
        share_cpu_threads(ranks_on_node=1)
    args = SimpleNamespace(
        model_path=model_path,
        served_model_name=None,
        dtype="auto",
        seed=0,
        attention_backend=None,
        device=None,
    )
    worker = DiffusionWorker(args, current_platform)
    worker.init_device_and_model()

    def run(opts, seed: int) -> None:
        shape = worker.shape_of(opts.size, opts.size, opts.steps, None)
        worker.generate(shape, [ImageJob("bench", "a photo of a cat", 1, None, seed, "png")])

    return run


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model-path")
    parser.add_argument("--size", type=int, default=32)
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--per-round", type=int, default=5)
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument("--seconds", type=float, default=20.0)
    opts = parser.parse_args()
    import httpx

    tmp = Path(tempfile.mkdtemp(prefix="bench-diffusion-"))
    model_path = opts.model_path
    if model_path is None:
        from diffusion_support import build_tiny_pipeline

        model_path = str(build_tiny_pipeline(tmp / "tiny-sd"))
    env = server_env(SGLANG_USE_CPU_ENGINE=None)
    server = start_server(
        ["--runtime", "diffusion", "--model-path", model_path], tmp, "bench", env=env
    )
    try:
        run_local = in_process(model_path)
        client = httpx.Client(timeout=600)
        url = server.url + "/v1/images/generations"
        for seed in range(2):  # warm both sides
            client.post(url, json=body(opts, seed)).raise_for_status()
            run_local(opts, seed)
        http_times, local_times = [], []
        for r in range(opts.rounds):
            for i in range(opts.per_round):
                start = time.perf_counter()
                client.post(url, json=body(opts, r * 100 + i)).raise_for_status()
                http_times.append(time.perf_counter() - start)
            for i in range(opts.per_round):
                start = time.perf_counter()
                run_local(opts, r * 100 + i)
                local_times.append(time.perf_counter() - start)
        http_ms, local_ms = (
            statistics.median(http_times) * 1e3,
            statistics.median(local_times) * 1e3,
        )
        print(
            f"batch 1, {opts.size}x{opts.size}, {opts.steps} steps, {len(http_times)} requests a side:"
        )
        print(f"  HTTP        median {http_ms:8.1f} ms")
        print(f"  in-process  median {local_ms:8.1f} ms")
        print(f"  ratio HTTP / in-process: {http_ms / local_ms:.3f}x (target <= 1.05x)")

        def images_per_second(clients: int) -> float:
            done, stop = [0], time.monotonic() + opts.seconds
            lock = threading.Lock()

            def loop(k: int) -> None:
                with httpx.Client(timeout=600) as c:
                    n = 0
                    while time.monotonic() < stop:
                        c.post(url, json=body(opts, k * 10000 + n)).raise_for_status()
                        n += 1
                        with lock:
                            done[0] += 1

            started = time.monotonic()
            threads = [threading.Thread(target=loop, args=(k,)) for k in range(clients)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            return done[0] / (time.monotonic() - started)

        one = images_per_second(1)
        many = images_per_second(opts.clients)
        print(f"images per second over {opts.seconds:.0f} s:")
        print(f"  1 client at a time   {one:7.2f}")
        print(f"  {opts.clients} concurrent clients {many:7.2f}")
        print(f"  ratio {opts.clients} clients / 1 client: {many / one:.2f}x")
    finally:
        server.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
