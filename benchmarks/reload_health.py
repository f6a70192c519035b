"""Does the HTTP child's event loop go on while a reload changes the model? ``/health`` latency
during a reload, side by side with the same load and no reload.

An embedding server (the embedded default model, ``--dp-size 2``) serves ``--clients`` clients
posting embeddings back to back, while one more client sends ``GET /health`` every
``--interval`` seconds, whether or not the last one was answered (so a stalled event loop delays
every probe sent meanwhile), and keeps each answer's latency. It is reloaded to a tiny Llama built
here (embeddings to generation: the HTTP child reads a causal LM's tokenizer and chat template
for the first time, which imports transformers), then to a copy of it (generation to
generation). For each reload the window runs from the reload's start to a second after the routes
serve the new model (``/get_model_info`` names it); the baseline is a window of the same length
with the same load and no reload. The script prints p50, p99 and the longest ``/health``
latency in each window and the ratio of the p99s, and counts the embedding requests that failed
during the first reload before its last embedding replica began to drain (each goes to a
replica that serves embeddings while one exists, so none should fail before that).

Target: ``/health`` under 100 ms at the 99th percentile during any reload.

    .venv/bin/python benchmarks/reload_health.py [--clients 2] [--interval 0.02]
        [--reload-args="..."]   (extra options for ``sglang-launch reload``; both reloads pass
                                 ``--allow-kind-change``)
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(REPO), str(REPO / "tests")]
os.environ.setdefault("HF_HUB_OFFLINE", "1")

from support.serving import (  # noqa: E402
    Clients,
    build_tiny_llama,
    cli_command,
    give_chat_template,
    server_env,
    start_server,
)


class Watch:
    """``/health`` every ``interval`` seconds, and ``clients`` threads posting embeddings: the
    time and latency of every health answer, the time of every embedding error."""

    def __init__(self, url: str, clients: int, interval: float) -> None:
        self.url, self.interval = url, interval
        self.health: list[tuple[float, float]] = []  # (sent at, seconds to the answer)
        self.embeddings = Clients(url, clients)
        self.stop = threading.Event()
        self.lock = threading.Lock()
        self.threads = [threading.Thread(target=self._probe, daemon=True)]
        for t in self.threads:
            t.start()

    def _probe(self) -> None:
        """A probe every ``interval`` seconds whether or not the last one was answered (a
        stalled event loop delays every probe sent meanwhile, not only one)."""
        asyncio.run(self._probes())

    async def _probes(self) -> None:
        import httpx

        async def one(c: httpx.AsyncClient) -> None:
            sent = time.monotonic()
            try:
                await c.get(self.url + "/health")
            except httpx.HTTPError:
                pass
            with self.lock:
                self.health.append((sent, time.monotonic() - sent))

        limits = httpx.Limits(max_connections=None, max_keepalive_connections=64)
        async with httpx.AsyncClient(timeout=120, limits=limits) as c:
            pending: set[asyncio.Task[None]] = set()
            while not self.stop.is_set():
                task = asyncio.ensure_future(one(c))
                pending.add(task)
                task.add_done_callback(pending.discard)
                await asyncio.sleep(self.interval)
            await asyncio.gather(*pending, return_exceptions=True)

    def latencies(self, start: float, end: float) -> list[float]:
        with self.lock:
            return sorted(s for t, s in self.health if start <= t < end)

    def errors(self, start: float, end: float) -> list[str]:
        """The embedding errors between wall-clock times ``start`` and ``end``."""
        return self.embeddings.errors(start, end)

    def served(self, start: float, end: float) -> int:
        return self.embeddings.served(start, end)

    def finish(self) -> None:
        self.embeddings.finish()
        self.stop.set()
        for t in self.threads:
            t.join(timeout=180)


def quantile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    return values[min(len(values) - 1, int(q * len(values)))]


def reload_to(
    server, env: dict[str, str], model: Path, name: str, extra: list[str]
) -> list[dict[str, object]]:
    """``sglang-launch reload --json`` to ``model``: its events."""
    done = subprocess.run(
        [
            *cli_command(),
            "reload",
            "--json",
            "--pid",
            str(server.proc.pid),
            "--model-path",
            str(model),
            "--served-model-name",
            name,
            *extra,
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=1800,
    )
    if done.returncode != 0:
        raise SystemExit(
            f"the reload to {model} failed ({done.returncode}):\n{done.stderr}\n"
            f"(a reload that changes the model's kind may need --reload-args naming how to force it)"
        )
    return [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]


def until_served(url: str, name: str, timeout: float = 300) -> float:
    """When ``/get_model_info`` first names ``name`` (the routes serve the new model)."""
    import httpx

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if (
                httpx.get(url + "/get_model_info", timeout=30).json().get("served_model_name")
                == name
            ):
                return time.monotonic()
        except (httpx.HTTPError, ValueError):
            pass
        time.sleep(0.05)
    raise SystemExit(f"the routes never served {name} within {timeout:g}s")


def row(label: str, values: list[float]) -> str:
    return (
        f"{label:<34} {len(values):>7} {quantile(values, 0.5) * 1000:>8.1f} "
        f"{quantile(values, 0.99) * 1000:>8.1f} {(values[-1] if values else float('nan')) * 1000:>8.1f}"
    )


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--clients", type=int, default=2)
    parser.add_argument("--interval", type=float, default=0.02, help="seconds between probes")
    parser.add_argument("--dp-size", type=int, default=2)
    parser.add_argument("--reload-args", default="", help="extra options for the reload")
    ns = parser.parse_args()
    # The first reload changes the kind (embeddings to generation), which must be asked for.
    extra = ["--allow-kind-change", *shlex.split(ns.reload_args)]

    runtime_dir = tempfile.mkdtemp(prefix="sglh")
    env = server_env(XDG_RUNTIME_DIR=runtime_dir)
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        from launchspec.model_source import embedding_model_dir

        llama = give_chat_template(build_tiny_llama(tmp / "tiny-llama", embedding_model_dir()))
        other = tmp / "tiny-llama-2"
        shutil.copytree(llama, other)
        server = start_server(["--dp-size", str(ns.dp_size)], tmp, "reload-health", env=env)
        watch = Watch(server.url, ns.clients, ns.interval)
        try:
            time.sleep(5)  # the clients reach their pace before anything is counted
            windows = []
            cut_off = 0.0  # when the last embedding replica began to drain (time.time())
            began_wall = time.time()
            for model, name, what in (
                (llama, "tiny-llama", "embeddings -> generation"),
                (other, "tiny-llama-2", "generation -> generation"),
            ):
                began = time.monotonic()
                events = reload_to(server, env, model, name, extra)
                if not cut_off:
                    drains = [e["time"] for e in events if str(e["kind"]) == "replica.draining"]
                    cut_off = float(max(drains))  # type: ignore[arg-type]
                ended = until_served(server.url, name) + 1.0
                time.sleep(max(0.0, ended - time.monotonic()))
                windows.append((what, began, ended))
                time.sleep(1.0)
                quiet = time.monotonic()
                time.sleep(ended - began)  # the same length, the same load, no reload
                windows.append(
                    (f"  baseline: no reload, {ended - began:.0f} s", quiet, quiet + ended - began)
                )
            print(
                f"--dp-size {ns.dp_size}, {ns.clients} embedding clients, /health every "
                f"{ns.interval * 1000:.0f} ms"
            )
            print(f"{'/health latency (ms)':<34} {'answers':>7} {'p50':>8} {'p99':>8} {'max':>8}")
            for what, start, end in windows:
                print(row(what, watch.latencies(start, end)))
            for (what, s0, e0), (_, s1, e1) in zip(windows[::2], windows[1::2], strict=True):
                during, quiet = watch.latencies(s0, e0), watch.latencies(s1, e1)
                print(
                    f"p99 during / without a reload ({what}): "
                    f"{quantile(during, 0.99) / quantile(quiet, 0.99):.2f}x; target: p99 under 100 ms"
                )
            what, start, end = windows[0]
            errors = watch.errors(began_wall, cut_off)
            print(
                f"embedding requests during the {what} reload, before its last embedding replica "
                f"began to drain: {len(errors)} failed"
                + (f" (first: {errors[0]})" if errors else "")
            )
        finally:
            watch.finish()
            server.stop()
            shutil.rmtree(runtime_dir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
