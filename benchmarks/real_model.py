"""The embedded chat model (SmolLM2-135M-Instruct) served by a bare ``sglang-launch`` against what
a user would run instead, transformers' ``generate()`` in-process, side by side in one run.

Three sides, all on the same model directory (the embedded GGUF file's converted copy in the
model cache), the same dtype and attention implementation (read from the server's
``/get_server_info``) and the same torch threads:

- ``server``: ``sglang-launch`` with no ``--model-path``, streamed ``/generate`` requests (greedy,
  ``ignore_eos``) read by a lean keep-alive client;
- ``generate()``: a child process that calls ``model.generate`` on the model
  ``AutoModelForCausalLM.from_pretrained`` gave for the directory (the engine's own object, or
  with ``--separate-copy`` a second copy loaded apart) (greedy, ``min_new_tokens`` = ``max_new_tokens``), a streamer taking
  the time of every token;
- ``engine``: the same child driving this project's ``ModelRunner`` and ``GenerationBatch``
  with no scheduler and no HTTP (where the server's time goes: model path or serving path).

The child is set up as a dp=1 scheduler is: ``OMP_WAIT_POLICY=PASSIVE``, ``GOMP_SPINCOUNT`` (what the launch gives
a scheduler unless the environment sets it), ``share_cpu_threads(1)`` (torch's intra-op pool,
one thread per core unless ``OMP_NUM_THREADS`` is set), a session of its own. The sides take
turns (each goes first in turn), part 1 ``--rounds`` times and part 2 ``--batch-rounds`` times
(medians printed), so that a drift in the machine's speed falls on all of them.

1. Time per output token at 1 client: (last token - first token) / (tokens - 1) of one request
   of ``--tokens`` tokens; the ratio server/generate() (target: at most 1.05x) and
   server/engine; the cores each side kept busy meanwhile (CPU time / wall time: the scheduler
   process and the launch's whole tree, the child), which tells a slower side from one that got
   less of a loaded machine. Also whether the server's greedy text is ``generate()``'s.
2. Output tokens per second with ``--clients`` concurrent requests of ``--batch-tokens`` tokens
   (all sent at once; same prompt): the server, ``generate()`` with a batch of that many rows, the
   engine with that many sequences.

Loopback only; every process started is stopped at the end.

    .venv/bin/python benchmarks/real_model.py [--tokens 128] [--clients 16] [--batch-tokens 64]
        [--rounds 5] [--batch-rounds 2] [--separate-copy]
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
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(REPO), str(REPO / "tests"), str(REPO / "benchmarks")]
os.environ.setdefault("HF_HUB_OFFLINE", "1")

from generation import LeanStream, Stream  # noqa: E402
from support.serving import Server, server_env, start_server  # noqa: E402

from launcher.supervisor.plan import SCHEDULER_ENV_DEFAULTS  # noqa: E402

QUESTION = "Write a short story about a lighthouse keeper who finds a message in a bottle."


def chat_prompt(model_dir: str) -> str:
    """The question rendered with the model's chat template (the text both sides tokenise)."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_dir, local_files_only=True)
    text = tok.apply_chat_template(
        [{"role": "user", "content": QUESTION}], tokenize=False, add_generation_prompt=True
    )
    return str(text)


# ---- the child: generate() and the engine, in-process --------------------------------------


def child(model_dir: str, dtype: str, attention: str, separate: bool) -> None:
    """Load the model (``ModelRunner``; ``separate``: also a second copy for ``generate()``,
    else ``generate()`` runs on the runner's model object), then answer one JSON
    line per request on stdin: {"side", "rows", "tokens", "prompt"} -> {"wall", "times",
    "tokens", "text"} (``times``: when each of row 0's tokens was there)."""
    import torch
    import transformers
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.generation.streamers import BaseStreamer

    from launchspec.model_source import resolve_model
    from platforms import current_platform
    from serving.srt.model_runner import ModelRunner
    from serving.srt.sampling import Sequence
    from serving.threads import share_cpu_threads
    from serving.wire import SamplingParams

    transformers.utils.logging.disable_progress_bar()
    share_cpu_threads(ranks_on_node=1)  # what a dp=1 scheduler on the CPU does
    tok = AutoTokenizer.from_pretrained(model_dir, local_files_only=True)
    runner = ModelRunner(resolve_model(model_dir), platform=current_platform)
    runner.warm_up()
    if separate:
        model = AutoModelForCausalLM.from_pretrained(
            model_dir,
            dtype=getattr(torch, dtype),
            attn_implementation=attention,
            local_files_only=True,
        ).eval()
    else:  # the runner's own: AutoModelForCausalLM.from_pretrained(dir, dtype, attention)
        model = runner.model
        assert str(model.dtype) == f"torch.{dtype}", model.dtype
        assert model.config._attn_implementation == attention, model.config._attn_implementation

    class Clock(BaseStreamer):
        def __init__(self) -> None:
            self.times: list[float] = []
            self.prompt_seen = False

        def put(self, value: torch.Tensor) -> None:
            if self.prompt_seen:
                self.times.append(time.perf_counter())
            self.prompt_seen = True

        def end(self) -> None:
            pass

    def run_generate(prompt: str, rows: int, tokens: int) -> dict:
        enc = tok([prompt] * rows, return_tensors="pt")
        clock = Clock()
        cpu = time.process_time()
        started = time.perf_counter()
        with torch.inference_mode():
            out = model.generate(
                **enc,
                max_new_tokens=tokens,
                min_new_tokens=tokens,
                do_sample=False,
                pad_token_id=tok.pad_token_id if tok.pad_token_id is not None else 0,
                streamer=clock,
            )
        wall = time.perf_counter() - started
        new = out[:, enc["input_ids"].shape[1] :]
        return {
            "wall": wall,
            "cpu": time.process_time() - cpu,
            "sent": started,
            "times": clock.times,
            "tokens": int(new.numel()),
            "text": tok.decode(new[0], skip_special_tokens=True),
            "prompt_tokens": int(enc["input_ids"].shape[1]),
        }

    def run_engine(prompt: str, rows: int, tokens: int) -> dict:
        params = SamplingParams(max_new_tokens=tokens, temperature=0.0, ignore_eos=True)
        ids = runner.encode_prompt(prompt, tokens)
        seqs = [Sequence(str(i), ids, params, seed=0, stream=True) for i in range(rows)]
        batch = runner.new_batch()
        times: list[float] = []
        cpu = time.process_time()
        started = time.perf_counter()
        batch.join(seqs)
        while len(batch):
            for seq in runner.generate(batch):
                if seq is seqs[0]:
                    times.append(time.perf_counter())
        wall = time.perf_counter() - started
        return {
            "wall": wall,
            "cpu": time.process_time() - cpu,
            "sent": started,
            "times": times,
            "tokens": sum(len(s.output_ids) for s in seqs),
            "text": tok.decode(seqs[0].output_ids, skip_special_tokens=True),
            "prompt_tokens": len(ids),
        }

    run_generate("warm-up", 2, 4)
    print(json.dumps({"threads": torch.get_num_threads()}), flush=True)
    for line in sys.stdin:
        req = json.loads(line)
        side = run_generate if req["side"] == "generate" else run_engine
        print(json.dumps(side(req["prompt"], req["rows"], req["tokens"])), flush=True)


class Child:
    def __init__(
        self, model_dir: str, dtype: str, attention: str, separate: bool, env: dict[str, str]
    ) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, __file__, "--child", model_dir, dtype, attention, str(int(separate))],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            env=env,
            cwd=str(REPO),
            text=True,
            start_new_session=True,  # a session of its own, as the server has
        )
        self.threads = json.loads(self._line())["threads"]

    def _line(self) -> str:
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"the child exited with {self.proc.wait()}")
        return line

    def run(self, side: str, prompt: str, rows: int, tokens: int) -> dict:
        assert self.proc.stdin is not None
        self.proc.stdin.write(
            json.dumps({"side": side, "prompt": prompt, "rows": rows, "tokens": tokens}) + "\n"
        )
        self.proc.stdin.flush()
        result: dict = json.loads(self._line())
        return result

    def close(self) -> None:
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        try:
            self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=10)


# ---- the server side -------------------------------------------------------------------------


def get_json(url: str, body: dict | None = None) -> dict:
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=600) as resp:
        result: dict = json.loads(resp.read())
        return result


async def server_load(url: str, prompt: str, clients: int, tokens: int) -> tuple[float, Stream]:
    """``clients`` streamed requests at once; the wall time and the first client's stream."""
    conns = [LeanStream(url) for _ in range(clients)]
    started = time.perf_counter()
    try:
        streams = await asyncio.gather(*(c.stream(prompt, tokens) for c in conns))
    finally:
        for c in conns:
            c.close()
    return time.perf_counter() - started, streams[0]


def server_cpu(server: Server) -> dict[int, float]:
    """CPU seconds (user + system, all threads) of each process of the server's tree so far."""
    import psutil

    out: dict[int, float] = {}
    root = psutil.Process(server.proc.pid)
    for proc in [root, *root.children(recursive=True)]:
        try:
            t = proc.cpu_times()
        except psutil.NoSuchProcess:
            continue
        out[proc.pid] = t.user + t.system
    return out


def cpu_delta(before: dict[int, float], after: dict[int, float]) -> tuple[float, float]:
    """CPU seconds between two ``server_cpu`` readings: the busiest process (the scheduler) and
    the whole tree."""
    deltas = [after[pid] - before.get(pid, 0.0) for pid in after]
    return max(deltas, default=0.0), sum(deltas)


def tpot(times: list[float]) -> float:
    """Seconds per output token after the first."""
    return (times[-1] - times[0]) / (len(times) - 1) if len(times) > 1 else float("nan")


def load_average() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def main() -> int:
    if len(sys.argv) == 6 and sys.argv[1] == "--child":
        child(sys.argv[2], sys.argv[3], sys.argv[4], separate=sys.argv[5] == "1")
        return 0
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tokens", type=int, default=128, help="tokens of the 1-client request")
    parser.add_argument("--clients", type=int, default=16, help="concurrent requests (part 2)")
    parser.add_argument("--batch-tokens", type=int, default=64, help="tokens of each (part 2)")
    parser.add_argument(
        "--separate-copy",
        action="store_true",
        help="generate() on a model loaded apart from the engine's (default: the same object)",
    )
    parser.add_argument("--rounds", type=int, default=5, help="repetitions of part 1")
    parser.add_argument("--batch-rounds", type=int, default=2, help="repetitions of part 2")
    args = parser.parse_args()

    from launchspec.model_source import chat_model_dir

    model_dir = str(chat_model_dir())
    prompt = chat_prompt(model_dir)
    tmp = Path(tempfile.mkdtemp(prefix="bench-real-model-"))
    print(f"load average before: {load_average()}", flush=True)
    server: Server | None = None
    kid: Child | None = None
    single: dict[str, list[float]] = {}
    many: dict[str, list[float]] = {}
    cpu: dict[str, list[float]] = {}  # CPU seconds per wall second of each 1-client request
    try:
        server = start_server([], tmp, "server", default_model=True)
        info = get_json(server.url + "/get_server_info")["model"]
        dtype, attention = info["dtype"], info["attention"]
        env = {**server_env(), **scheduler_env()}
        kid = Child(model_dir, dtype, attention, args.separate_copy, env)
        print(
            f"model {info['model_path']} ({info['served_model_name']}), {dtype}, {attention}; "
            f"torch threads: server {info['cpu_threads']}, child {kid.threads}",
            flush=True,
        )
        # The same greedy text from each side (and a warm server path).
        check = get_json(
            server.url + "/generate",
            {
                "text": prompt,
                "sampling_params": {
                    "max_new_tokens": args.tokens,
                    "temperature": 0,
                    "ignore_eos": True,
                },
            },
        )
        ref = kid.run("generate", prompt, 1, args.tokens)
        eng = kid.run("engine", prompt, 1, args.tokens)
        print(
            f"prompt tokens: server {check['meta_info']['prompt_tokens']}, generate() "
            f"{ref['prompt_tokens']}; same greedy text as generate(): server "
            f"{check['text'] == ref['text']}, engine {eng['text'] == ref['text']}",
            flush=True,
        )
        asyncio.run(server_load(server.url, prompt, args.clients, 4))  # warm a batch
        sides = ["server", "generate", "engine"]
        for r in range(max(args.rounds, args.batch_rounds)):
            order = sides[r % 3 :] + sides[: r % 3]  # each side goes first in turn
            for side in order if r < args.rounds else []:
                if side == "server":
                    before = server_cpu(server)
                    wall, stream = asyncio.run(server_load(server.url, prompt, 1, args.tokens))
                    times = [t for t, n in stream.events if n > 0]
                    busiest, tree = cpu_delta(before, server_cpu(server))
                    cpu.setdefault("server tree", []).append(tree / wall)
                    cpu.setdefault("server", []).append(busiest / wall)
                else:
                    res = kid.run(side, prompt, 1, args.tokens)
                    times = res["times"]
                    cpu.setdefault(side, []).append(res["cpu"] / res["wall"])
                single.setdefault(side, []).append(tpot(times))
            for side in order if r < args.batch_rounds else []:
                if side == "server":
                    wall, _ = asyncio.run(
                        server_load(server.url, prompt, args.clients, args.batch_tokens)
                    )
                    rate = args.clients * args.batch_tokens / wall
                else:
                    res = kid.run(side, prompt, args.clients, args.batch_tokens)
                    rate = res["tokens"] / res["wall"]
                many.setdefault(side, []).append(rate)
            print(
                f"round {r + 1}: ms/token "
                + ", ".join(f"{k} {v[-1] * 1000:.1f}" for k, v in single.items())
                + f"; tok/s at {args.clients} "
                + ", ".join(f"{k} {v[-1]:.1f}" for k, v in many.items())
                + f"; load {load_average()}",
                flush=True,
            )
    finally:
        if kid is not None:
            kid.close()
        if server is not None:
            server.stop()

    med = {k: statistics.median(v) for k, v in single.items()}
    rates = {k: statistics.median(v) for k, v in many.items()}
    print(
        f"{args.rounds} rounds (part 2: {args.batch_rounds}), medians; "
        f"load average after: {load_average()}"
    )
    print(f"1. time per output token, 1 client, {args.tokens} tokens (greedy, ignore_eos)")
    print(
        f"  server {med['server'] * 1000:.1f} ms   generate() {med['generate'] * 1000:.1f} ms   "
        f"engine {med['engine'] * 1000:.1f} ms   server/generate() "
        f"{med['server'] / med['generate']:.3f}x (target: at most 1.05x)   server/engine "
        f"{med['server'] / med['engine']:.3f}x   engine/generate() "
        f"{med['engine'] / med['generate']:.3f}x"
    )
    print(
        "  cores busy per second of a request (CPU time / wall time, medians): "
        + ", ".join(f"{k} {statistics.median(v):.2f}" for k, v in cpu.items())
        + " (server: the scheduler process; server tree: every process of the launch)"
    )
    paired = sorted(s / g for s, g in zip(single["server"], single["generate"], strict=True))
    print(
        f"  server/generate() round by round: median {statistics.median(paired):.3f}x, "
        f"from {paired[0]:.3f}x to {paired[-1]:.3f}x"
    )
    print(f"2. output tokens per second, {args.clients} concurrent requests of {args.batch_tokens}")
    print(
        f"  server {rates['server']:.1f}   generate() batch of {args.clients} "
        f"{rates['generate']:.1f}   engine {rates['engine']:.1f}   server/generate() "
        f"{rates['server'] / rates['generate']:.2f}x   server/engine "
        f"{rates['server'] / rates['engine']:.2f}x"
    )
    return 0


def scheduler_env() -> dict[str, str]:
    """The OpenMP settings the launch gives a scheduler child (``SCHEDULER_ENV_DEFAULTS``,
    unless this environment sets them), for a child that runs as one."""
    return {k: os.environ.get(k, v) for k, v in SCHEDULER_ENV_DEFAULTS.items()}


if __name__ == "__main__":
    sys.exit(main())
