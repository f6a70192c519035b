"""Generation benchmark: continuous batching against static batching, and HTTP against the same
engine in-process, side by side in one run.

Two servers of the same model run side by side: the default, batching continuously, and the
same server with a policy plugin that batches statically (``STATIC_POLICY``, an ``AROUND`` hook
on ``Scheduler.get_next_batch_to_run``, written to a dist-info folder on the server's path:
nothing is admitted while any request runs, so a batch runs until its longest sequence ends,
then everything waiting is admitted together). The in-process side is a child process set up as a dp=1 scheduler (its torch threads and
``OMP_WAIT_POLICY``, a session of its own), driving the same ``GenerationBatch`` with the same
requests and no HTTP. The three sides take turns, each measurement ``--rounds`` times (the
medians are printed), so that a drift in the machine's speed falls on all of them.

1. Head-of-line blocking: a 2-token request sent while a 600-token request streams (once the
   long one's first token arrived), against the same request alone; per server. Target: at most
   2x alone with continuous batching.
2. Output tokens per second with 1, 4 and 16 closed-loop streaming clients of mixed lengths
   (each sends its next request when the last one ended; ``max_new_tokens`` from 8 to 256):
   continuous over HTTP, the same requests in-process, and static over HTTP. Target: HTTP at
   least 0.9x in-process at 16 clients.
3. Time to first token and inter-token latency (a streamed event's gap, split over the tokens
   it carried), p50 and p99, at 16 clients, for each side.

``--baseline CHECKOUT`` adds the same server and the same in-process child run from another
checkout of this project (another commit, ``git worktree add /tmp/base <commit>``), taking turns
with the others: a change to the per-step path against the code before it, under the same load.

Loopback only. The default model is a 4-layer tiny Llama with random weights built in a
temporary directory (``--model-path`` for another causal LM directory).

    .venv/bin/python benchmarks/generation.py [--model-path PATH] [--requests-per-client 4]
        [--skip-static] [--baseline CHECKOUT]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(REPO), str(REPO / "tests")]
os.environ.setdefault("HF_HUB_OFFLINE", "1")

from support import make_dist  # noqa: E402
from support.serving import Server, server_env, start_server  # noqa: E402

from launcher.supervisor.plan import SCHEDULER_ENV_DEFAULTS  # noqa: E402

# Static batching as a scheduling policy: while requests run, the waiting ones stay waiting.
STATIC_POLICY = """
from hooks import HookType, plugin_hook


@plugin_hook("serving.srt.scheduler.Scheduler.get_next_batch_to_run", type=HookType.AROUND)
def static_batches(original_fn, self):
    if not self.running:
        return original_fn(self)
    held = self.waiting_queue[:]
    self.waiting_queue.clear()
    try:
        return original_fn(self)
    finally:
        self.waiting_queue[:0] = held


def register():
    pass
"""
LONG_TOKENS = 600
SHORT_TOKENS = 2
PROMPT = "once upon a time"
# (prompt words, max_new_tokens): the mixed load; client k's request i is MIX[(3k + i) % 10].
MIX = [
    (4, 8),
    (40, 64),
    (12, 256),
    (80, 16),
    (8, 128),
    (24, 32),
    (60, 96),
    (4, 192),
    (16, 48),
    (32, 8),
]
CLIENT_COUNTS = (1, 4, 16)


def request_plan(clients: int, per_client: int) -> list[list[tuple[str, int]]]:
    """Each client's requests, in order: (prompt, max_new_tokens)."""
    return [
        [
            (" ".join(["word"] * MIX[(3 * k + i) % len(MIX)][0]), MIX[(3 * k + i) % len(MIX)][1])
            for i in range(per_client)
        ]
        for k in range(clients)
    ]


@dataclass
class Stream:
    """One streamed request as its client saw it: when it was sent, and (time, tokens so far)
    at each event."""

    sent: float
    events: list[tuple[float, int]] = field(default_factory=list)

    @property
    def tokens(self) -> int:
        return self.events[-1][1] if self.events else 0

    def ttft(self) -> float:
        return next(t for t, n in self.events if n > 0) - self.sent

    def gaps(self) -> list[float]:
        """Inter-token latencies: each event's gap after the first token, per token it carried."""
        out: list[float] = []
        first = next(i for i, (_, n) in enumerate(self.events) if n > 0)
        for (t0, n0), (t1, n1) in zip(self.events[first:], self.events[first + 1 :], strict=False):
            if n1 > n0:
                out.extend([(t1 - t0) / (n1 - n0)] * (n1 - n0))
        return out


@dataclass
class LoadResult:
    wall: float
    streams: list[Stream]

    @property
    def tokens_per_s(self) -> float:
        return sum(s.tokens for s in self.streams) / self.wall


def body(prompt: str, max_new: int, stream: bool = True) -> dict:
    return {
        "text": prompt,
        "stream": stream,
        "sampling_params": {"max_new_tokens": max_new, "temperature": 0, "ignore_eos": True},
    }


class LeanStream:
    """One keep-alive HTTP/1.1 connection that POSTs a ``/generate`` stream and reads its
    chunked server-sent events, taking only ``completion_tokens`` out of each: the least a
    streaming client can do per event, so that the figures are the server's cost (a Python
    HTTP library parsing every event costs the shared cores about as much as the server)."""

    def __init__(self, url: str) -> None:
        host, port = url.split("//", 1)[1].rsplit(":", 1)
        self.host, self.port = host, int(port)
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None

    async def stream(self, prompt: str, max_new: int, first=None) -> Stream:
        """Stream one request; ``first`` (an event) is set at its first token."""
        if self.writer is None:
            self.reader, self.writer = await asyncio.open_connection(self.host, self.port)
        assert self.reader is not None
        data = json.dumps(body(prompt, max_new)).encode()
        rec = Stream(time.perf_counter())
        self.writer.write(
            f"POST /generate HTTP/1.1\r\nHost: {self.host}\r\nContent-Type: application/json"
            f"\r\nContent-Length: {len(data)}\r\n\r\n".encode()
            + data
        )
        head = await self.reader.readuntil(b"\r\n\r\n")
        if not head.startswith(b"HTTP/1.1 200") or b"chunked" not in head.lower():
            raise RuntimeError(f"unexpected answer: {head[:200]!r}")
        pending = b""
        while True:
            size = int((await self.reader.readuntil(b"\r\n")).strip(), 16)
            chunk = await self.reader.readexactly(size + 2)
            if size == 0:
                break
            pending += chunk[:-2]
            *events, pending = pending.split(b"\n\n")
            for event in events:
                at = event.find(b'"completion_tokens":')
                if at < 0:
                    continue
                end = at + len('"completion_tokens":')
                digits = end
                while event[digits : digits + 1].isdigit():
                    digits += 1
                n = int(event[end:digits])
                rec.events.append((time.perf_counter(), n))
                if first is not None and n > 0:
                    first.set()
        if rec.tokens != max_new:
            raise RuntimeError(f"asked for {max_new} tokens, got {rec.tokens}")
        return rec

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()


async def http_load(url: str, plan: list[list[tuple[str, int]]]) -> LoadResult:
    """Every client of ``plan`` sends its requests one after another, all clients at once."""
    clients = [LeanStream(url) for _ in plan]

    async def run(client: LeanStream, requests: list[tuple[str, int]]) -> list[Stream]:
        return [await client.stream(p, n) for p, n in requests]

    started = time.perf_counter()
    try:
        per_client = await asyncio.gather(
            *(run(c, reqs) for c, reqs in zip(clients, plan, strict=True))
        )
    finally:
        for c in clients:
            c.close()
    wall = time.perf_counter() - started
    return LoadResult(wall, [s for streams in per_client for s in streams])


async def short_during_long(url: str, rounds: int) -> tuple[list[float], list[float], list[bool]]:
    """The short request's latencies alone, and sent once a long one streams its first token;
    and whether it finished before the long one each time."""
    alone: list[float] = []
    during: list[float] = []
    finished_first: list[bool] = []
    short_client, long_client = LeanStream(url), LeanStream(url)
    try:
        for _ in range(rounds):
            rec = await short_client.stream(PROMPT, SHORT_TOKENS)
            alone.append(rec.events[-1][0] - rec.sent)
            first = asyncio.Event()
            long = asyncio.create_task(long_client.stream(PROMPT, LONG_TOKENS, first))
            await first.wait()
            rec = await short_client.stream(PROMPT, SHORT_TOKENS)
            during.append(rec.events[-1][0] - rec.sent)
            long_rec = await long
            finished_first.append(rec.events[-1][0] < long_rec.events[-1][0])
    finally:
        short_client.close()
        long_client.close()
    return alone, during, finished_first


def in_process_child(model_path: str) -> None:
    """The in-process side (a child process): for each plan read from stdin (a JSON line), the
    plan's clients against a ``GenerationBatch``, each client's next request joining at the step
    after its last one ended; one JSON line of results per plan on stdout."""
    import torch

    from launchspec.model_source import resolve_model
    from platforms import current_platform
    from serving.srt.model_runner import ModelRunner
    from serving.srt.sampling import Sequence
    from serving.threads import share_cpu_threads
    from serving.wire import SamplingParams

    if current_platform.is_cpu():
        share_cpu_threads(ranks_on_node=1)  # what a dp=1 scheduler does
    runner = ModelRunner(resolve_model(model_path), platform=current_platform)
    runner.warm_up()
    print(json.dumps({"ready": True, "threads": torch.get_num_threads()}), flush=True)
    for line in sys.stdin:
        queues = [list(reqs) for reqs in json.loads(line)]
        batch = runner.new_batch()
        streams: list[Stream] = []
        active: dict[str, tuple[int, Stream]] = {}
        busy: set[int] = set()
        started = time.perf_counter()
        with torch.inference_mode():
            while active or any(queues):
                for k, reqs in enumerate(queues):
                    if k not in busy and reqs:
                        prompt, n = reqs.pop(0)
                        params = SamplingParams(max_new_tokens=n, temperature=0.0, ignore_eos=True)
                        rid = str(len(streams))
                        ids = runner.encode_prompt(prompt, n)
                        batch.join([Sequence(rid, ids, params, seed=0, stream=True)])
                        rec = Stream(time.perf_counter())
                        streams.append(rec)
                        active[rid] = (k, rec)
                        busy.add(k)
                for seq in runner.generate(batch):
                    k, rec = active[seq.rid]
                    rec.events.append((time.perf_counter(), len(seq.output_ids)))
                    if seq.finished:
                        del active[seq.rid]
                        busy.discard(k)
        wall = time.perf_counter() - started
        print(json.dumps([wall, [[s.sent, s.events] for s in streams]]), flush=True)


class InProcess:
    """The in-process child, kept running so that its rounds alternate with the server's
    (``script``: this benchmark of the checkout whose engine it drives)."""

    def __init__(self, model_path: str, env: dict[str, str], script: str = __file__) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, script, "--child", model_path],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            env=env,
            cwd=str(REPO),
            text=True,
            start_new_session=True,  # a session of its own, as the server has (the same CPU share)
        )
        self.threads = json.loads(self._line())["threads"]

    def _line(self) -> str:
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"the in-process child exited with {self.proc.wait()}")
        return line

    def run(self, plan: list[list[tuple[str, int]]]) -> LoadResult:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps(plan) + "\n")
        self.proc.stdin.flush()
        wall, streams = json.loads(self._line())
        return LoadResult(wall, [Stream(sent, [tuple(e) for e in ev]) for sent, ev in streams])

    def close(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        self.proc.wait(timeout=60)


def pct(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))] if values else float("nan")


def latency_line(name: str, result: LoadResult) -> str:
    ttft = [s.ttft() for s in result.streams]
    itl = [g for s in result.streams for g in s.gaps()]
    return (
        f"  {name:<22} TTFT p50 {pct(ttft, 0.5) * 1000:8.1f} ms  p99 {pct(ttft, 0.99) * 1000:8.1f}"
        f" ms   ITL p50 {pct(itl, 0.5) * 1000:6.1f} ms  p99 {pct(itl, 0.99) * 1000:7.1f} ms"
    )


def build_model(tmp: Path) -> str:
    from support.serving import build_tiny_llama

    from launchspec.model_source import embedding_model_dir

    return str(build_tiny_llama(tmp / "tiny-llama-4", embedding_model_dir(), layers=4))


def main() -> int:
    if len(sys.argv) == 3 and sys.argv[1] == "--child":
        in_process_child(sys.argv[2])
        return 0
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model-path", help="a causal LM directory (default: a tiny Llama)")
    parser.add_argument("--requests-per-client", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=3, help="repetitions of each measurement")
    parser.add_argument("--skip-static", action="store_true", help="no static-batching server")
    parser.add_argument(
        "--baseline",
        type=Path,
        help="another checkout of this project: its server and in-process engine take turns too",
    )
    args = parser.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="bench-generation-"))
    model = args.model_path or build_model(tmp)
    plans = {
        f"{c} clients": request_plan(c, args.requests_per_client * (2 if c == 1 else 1))
        for c in CLIENT_COUNTS
    }
    launch = ["--model-path", model, "--max-running-requests", "32"]
    runs: dict[str, dict[str, list[LoadResult]]] = {}
    hol: dict[str, tuple[list[float], list[float], list[bool]]] = {}
    servers = {"continuous": server_env()}
    if not args.skip_static:
        site = tmp / "static-policy"
        make_dist(
            site,
            "static-batching-policy",
            {"sglang.srt.plugins": {"static_batches": "static_batching_policy:register"}},
            {"static_batching_policy.py": STATIC_POLICY},
        )
        servers["static"] = server_env(PYTHONPATH=str(site))
    child_env = {**server_env(), **scheduler_env()}
    base_env: dict[str, str] = {}
    if args.baseline is not None:
        base_env = {**server_env(), "PYTHONPATH": str(args.baseline.resolve())}
        servers["baseline"] = base_env
    started: dict[str, Server] = {}
    child: InProcess | None = None
    base_child: InProcess | None = None
    try:
        for side, env in servers.items():
            started[side] = start_server(launch, tmp, side, env=env)
            asyncio.run(http_load(started[side].url, request_plan(2, 1)))  # warm the paths
        child = InProcess(model, child_env)
        if args.baseline is not None:
            script = str(args.baseline.resolve() / "benchmarks" / "generation.py")
            base_child = InProcess(model, {**child_env, **base_env}, script)
        for side, server in started.items():
            hol[side] = asyncio.run(short_during_long(server.url, args.rounds))
        for _ in range(args.rounds):  # the sides alternate, so a drift falls on all of them
            for name, plan in plans.items():
                for side, server in started.items():
                    result = asyncio.run(http_load(server.url, plan))
                    runs.setdefault(f"http, {side}", {}).setdefault(name, []).append(result)
                    if side == "continuous":
                        runs.setdefault("in-process", {}).setdefault(name, []).append(
                            child.run(plan)
                        )
                    if side == "baseline" and base_child is not None:
                        runs.setdefault("in-process, baseline", {}).setdefault(name, []).append(
                            base_child.run(plan)
                        )
    finally:
        if base_child is not None:
            base_child.close()
        if child is not None:
            child.close()
        for server in started.values():
            server.stop()

    def rate(side: str, name: str) -> float:
        return statistics.median(r.tokens_per_s for r in runs[side][name])

    print(f"model: {model}; {args.rounds} rounds, medians")
    print(f"1. a {SHORT_TOKENS}-token request while a {LONG_TOKENS}-token request streams")
    for side, (alone, during, first) in hol.items():
        a, d = statistics.median(alone), statistics.median(during)
        print(
            f"  {side:<10} alone {a * 1000:8.1f} ms   during {d * 1000:8.1f} ms   {d / a:6.2f}x"
            f"   finished before the long one: {sum(first)}/{len(first)}"
            + ("   (target: at most 2x)" if side == "continuous" else "")
        )
    print("2. output tokens per second, closed-loop streaming clients of mixed lengths")
    for name in plans:
        line = "  ".join(f"{side} {rate(side, name):8.1f}" for side in runs)
        http = rate("http, continuous", name)
        ratio = f"http/in-process {http / rate('in-process', name):5.2f}x"
        if "http, static" in runs:
            ratio += f"  continuous/static {http / rate('http, static', name):5.2f}x"
        if "http, baseline" in runs:
            ratio += f"  http/baseline {http / rate('http, baseline', name):5.2f}x"
            local = rate("in-process", name) / rate("in-process, baseline", name)
            ratio += f"  in-process/baseline {local:5.2f}x"
        print(f"  {name:<11} {line}   {ratio}")
    print("   (target: http/in-process at least 0.9x at 16 clients)")
    print("3. time to first token and inter-token latency at 16 clients (all rounds)")
    for side, by_name in runs.items():
        merged = LoadResult(1.0, [s for r in by_name["16 clients"] for s in r.streams])
        print(latency_line(side, merged))
    return 0


def scheduler_env() -> dict[str, str]:
    """The OpenMP settings the launch gives a scheduler child (``SCHEDULER_ENV_DEFAULTS``,
    unless this environment sets them), for a child that runs as one."""
    return {k: os.environ.get(k, v) for k, v in SCHEDULER_ENV_DEFAULTS.items()}


if __name__ == "__main__":
    sys.exit(main())
