"""Per-token overhead: what serving adds to each streamed token, and where it goes.

The method of a hardware vendor's serving plugin, in our own code: a model whose forward first
busy-waits a known time (2.00 ms) and then, as the vendor's mock does, does no arithmetic: each
row's next token (the next of a fixed English text, by position) is written one-hot into a
logits buffer kept between calls, and the KV cache grows by a zero entry a token and layer. So
the forward's cost is known, and anything above it is serving. A 2-layer tiny Llama with random
weights (BERT's real tokenizer) is built in a temporary directory with the real transformers
classes; its model class (``BusyLlamaForCausalLM``, a subclass whose ``forward`` busy-waits,
then returns the cached logits) is shipped as model code in the directory (``auto_map`` in
config.json) and served with ``--trust-remote-code``. ``--forward llama`` runs the tiny Llama's
own forward after the busy wait instead (a few milliseconds of real arithmetic, whose memory
traffic leaves the caches cold for the serving code that follows it).

Each round, in turn:

1. the forward, in-process at batch 1 on a KV cache: a child process set up as a dp=1
   scheduler (its torch threads, ``OMP_WAIT_POLICY``, a session of its own) loads the same
   model through ``ModelRunner`` and runs a 128-token sequence; its model times each decode
   forward itself, from the start of the busy wait to its return (each forward appends its
   start and end to a file, ``BUSY_LLAMA_LOG``);
2. ``--requests`` streamed ``/generate`` requests of 128 tokens at concurrency 1 against
   ``sglang-launch`` (a lean keep-alive client); TPOT of a request: (last token's arrival -
   first token's) / (tokens - 1), the median over the round's requests.

Per-token overhead = median TPOT - median forward. Target: at most 0.30 ms/token. The forward
is also taken as the server's model timed it itself while the tokens streamed (the same
boundary, in the server): the child's forward and the server's can run at different speeds on a
busy machine, and TPOT less the server's own forward is then the overhead to read. The server's
log also gives the scheduler's own path per token where it runs: from the end of one forward to
the start of the next.

Where it goes, each part measured on its own (medians over the rounds; every "less its
forward" takes the model's own time off, so the call into the model counts as serving):

- the engine step: ``GenerationBatch.step`` in the child less the forward it ran;
- the scheduler loop without sockets: the real ``Scheduler`` (``turn()``: the socket poll on an
  unconnected socket, ``get_next_batch_to_run`` -> ``run_batch`` -> ``process_batch_result``,
  the answers encoded and handed to ZeroMQ, which drops them) less its forwards, and the same
  loop with the model replaced by a stub that returns fixed logits; a cProfile of the loop
  (top entries by own time, from a run apart);
- the floor, with no serving code: after a 2 ms busy wait, the argmax of one row of logits,
  then one answer encoded and sent (no peer). On this virtual machine a few microseconds of
  work cost tens of microseconds right after a wait (the caches have gone cold), and by how
  much changes from hour to hour: the floor says what the machine made of it that moment;
- the scheduler socket: a ``Generated`` frame's ZeroMQ round trip over ``ipc://`` to an echoing
  process (one way = half of it), and the frame's msgpack encode + decode;
- the HTTP process: ``sglang-launch`` with a stub scheduler (``--scheduler-target``) that
  answers a streamed request with its tokens back to back (the HTTP child's cost per chunk when
  it is the bottleneck), and paced at 2 ms a token with the send time in each token's text (the
  latency from the scheduler's send to the client's read);
- the stream framing: a ``GenerateChunk`` event rendered and SSE-framed, in-process;
- CPU time per token of the server's scheduler and HTTP processes while the real stream runs.

At 16 concurrent clients (one 128-token request each) the step is a batch of 16: its overhead
per token is (median TPOT - the forward at batch 16) / 16 (in-process, and as the server timed
its forwards while all 16 streamed), no worse than at 1 client.

``--baseline CHECKOUT`` runs the same server, stub server and in-process child on another
checkout of this project (``git archive <commit> | tar -x -C /tmp/base``) taking turns with this
one: the change against the code before it, under the same load. The child code is this script's
(the baseline needs no copy of it) importing the checkout's modules.

    .venv/bin/python benchmarks/token_overhead.py [--rounds 5] [--requests 3] [--baseline DIR]
        [--forward mock|llama] [--skip-stub]
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
import types
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
# The child imports the checkout it measures (``--child CODE MODEL``), else this one.
_CODE = Path(sys.argv[2]) if len(sys.argv) > 2 and sys.argv[1] == "--child" else REPO
sys.path[:0] = [str(_CODE), str(REPO / "tests")]
os.environ.setdefault("HF_HUB_OFFLINE", "1")

BUSY_MS = 2.0
TOKENS = 128
PROMPT = "once upon a time there was a tiny model"
STUB_TOKENS = 512

# The text the mock forward "generates", a token per position (English prose, so that the
# stream's decode does what it does for a real model's output).
MOCK_TEXT = (
    "The launcher starts the scheduler first, then the HTTP process, and reports each one as "
    "ready only after it answers. When a worker fails, the supervisor names the rank, the exit "
    "code and the last lines it wrote, and stops the others before it exits. Plugins load in "
    "the order the contract gives, before any model code is imported."
)

BUSY_MODEL = '''"""A Llama whose every forward first busy-waits BUSY_MS ms (a forward of known cost).

BUSY_LLAMA_MOCK=1 (the hardware vendor's method): the forward then does no arithmetic. Each
row's next token is the next one of a fixed text (by the row's position), written one-hot into
a logits buffer kept from call to call, and the KV cache grows by one zero entry a token in
every layer, so that the serving side's cache handling runs as it does for a real model.
Otherwise the busy wait is followed by the tiny Llama's own forward.
"""

import functools
import os
import struct
import time

from transformers import LlamaForCausalLM
from transformers.modeling_outputs import CausalLMOutputWithPast

BUSY_S = BUSY_MS / 1000.0
TEXT_IDS = MOCK_IDS
MOCK = os.environ.get("BUSY_LLAMA_MOCK") == "1"
# BUSY_LLAMA_LOG=FILE: each forward appends its start and end (perf_counter, float64) there.
_LOG = os.environ.get("BUSY_LLAMA_LOG")
_FD = os.open(_LOG, os.O_WRONLY | os.O_CREAT | os.O_APPEND) if _LOG else None


class BusyLlamaForCausalLM(LlamaForCausalLM):
    @functools.wraps(LlamaForCausalLM.forward)
    def forward(self, *args, **kwargs):
        start = time.perf_counter()
        end = start + BUSY_S
        while time.perf_counter() < end:
            pass
        out = self._mock(**kwargs) if MOCK else super().forward(*args, **kwargs)
        if _FD is not None:
            os.write(_FD, struct.pack("dd", start, time.perf_counter()))
        return out

    def _mock(
        self, input_ids, position_ids, past_key_values=None, cache=None, forward_batch=None,
        logits_to_keep=0, **_
    ):
        import torch

        cfg = self.config
        if forward_batch is not None:  # the KV pool's engine: one row, the kept positions' logits
            pool = forward_batch.token_to_kv_pool
            zeros = torch.zeros(input_ids.shape[1], pool.head_num, pool.head_dim)
            for layer in range(cfg.num_hidden_layers):
                pool.set_kv_buffer(layer, forward_batch.out_cache_loc, zeros, zeros)
            kept = position_ids[0] if isinstance(logits_to_keep, int) else position_ids[0, logits_to_keep]
            logits = self._next(kept.shape[0], kept)
            return CausalLMOutputWithPast(logits=logits.view(1, kept.shape[0], cfg.vocab_size))
        cache = cache if cache is not None else past_key_values
        rows, tokens = input_ids.shape
        if cache is not None:
            zeros = torch.zeros(rows, cfg.num_key_value_heads, tokens, cfg.head_dim)
            for layer in range(cfg.num_hidden_layers):
                cache.update(zeros, zeros, layer)
        return CausalLMOutputWithPast(
            logits=self._next(rows, position_ids[:, -1]), past_key_values=cache
        )

    def _next(self, rows, positions):
        """(rows, 1, vocab): each row one-hot at the text's token after its position."""
        import torch

        cfg = self.config
        if getattr(self, "_logits", None) is None or self._logits.shape[0] < rows:
            self._logits = torch.zeros(max(rows, 32), 1, cfg.vocab_size)
            self._text = torch.tensor(TEXT_IDS, dtype=torch.long)
            self._hot = None
        if self._hot is not None:  # only the entries the last call set go back to zero
            self._logits[self._hot[0], 0, self._hot[1]] = 0.0
        rows_at = torch.arange(rows)
        nxt = self._text[(positions + 1) % len(TEXT_IDS)]
        self._logits[rows_at, 0, nxt] = 1.0
        self._hot = (rows_at, nxt)
        return self._logits[:rows]
'''


# A scheduler stand-in for the HTTP measurements: answers pings, and streams a GenerateRequest's
# tokens back to back ("burst" prompt) or one every BUSY_MS with its send time in its text.
STUB_SCHEDULER = f'''"""A stub scheduler worker (--scheduler-target stub_scheduler.run)."""

import os
import time

import msgspec
import zmq

from serving import wire

MODEL = wire.TextModel(
    model_path="stub", served_model_name="stub", embedded_default=False,
    architecture="LlamaForCausalLM", kind="generation", device="cpu", dtype="float32",
    attention="sdpa", tp_size=1, max_input_tokens=1000, max_total_tokens=100000,
    context_length=100000, pooling=None, load_seconds=0.0,
    cpu_threads=wire.CpuThreads(intra_op=1, omp_wait_policy=None),
)
PACE_S = {BUSY_MS / 1000.0!r}


def run(server_args, ctx):
    zctx = zmq.Context()
    sock = zctx.socket(zmq.ROUTER)
    sock.setsockopt(zmq.LINGER, 0)
    endpoint = ctx.endpoint(wire.scheduler_endpoint_name(ctx.dp_rank))
    sock.bind(endpoint)
    memory = wire.TextMemory(None, None, None)
    ready = wire.ReplicaReady(
        dp_rank=ctx.dp_rank, endpoint=endpoint, pid=os.getpid(), model=MODEL, memory=memory
    )
    ctx.ready(**msgspec.to_builtins(ready))
    while not ctx.stopping.is_set():
        if not sock.poll(100):
            continue
        identity, frame = sock.recv_multipart()
        msg = wire.decode_to_scheduler(frame)
        if isinstance(msg, wire.Ping):
            stats = wire.TextStats(model=MODEL, memory=memory)
            pong = wire.Pong(msg.rid, ctx.dp_rank, os.getpid(), "stub", "generation", 0, stats)
            sock.send_multipart([identity, wire.encode(pong)])
        elif isinstance(msg, wire.GenerateRequest):
            n = msg.params.max_new_tokens
            paced = not msg.text.startswith("burst")
            at = time.perf_counter()
            for i in range(n):
                if paced:
                    at += PACE_S
                    while time.perf_counter() < at:
                        pass
                text = f" t{{time.perf_counter_ns()}}" if paced else " word"
                last = i + 1 == n
                reply = wire.Generated(
                    msg.rid, text, 4, i + 1, finished=last,
                    finish_reason="length" if last else None, seed=0,
                )
                sock.send_multipart([identity, wire.encode(reply)])
'''

ECHO = """
import sys, zmq
ctx = zmq.Context()
sock = ctx.socket(zmq.ROUTER)
sock.bind(sys.argv[1])
print("ready", flush=True)
while True:
    frames = sock.recv_multipart()
    if frames[1] == b"stop":
        break
    sock.send_multipart(frames)
"""


def median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def load() -> str:
    return "load average " + " ".join(f"{x:.2f}" for x in os.getloadavg())


# ---- the model ------------------------------------------------------------------------------


def build_busy_model(tmp: Path) -> str:
    """The tiny Llama (2 layers) with ``BusyLlamaForCausalLM`` as its model code."""
    from support.serving import build_tiny_llama
    from transformers import AutoTokenizer

    from launchspec.model_source import embedding_model_dir

    path = build_tiny_llama(tmp / "busy-llama", embedding_model_dir(), layers=2)
    ids = AutoTokenizer.from_pretrained(str(path))(MOCK_TEXT, add_special_tokens=False)
    code = BUSY_MODEL.replace("BUSY_MS", repr(BUSY_MS)).replace("MOCK_IDS", repr(ids["input_ids"]))
    (path / "busy_llama.py").write_text(code)
    config = json.loads((path / "config.json").read_text())
    config["architectures"] = ["BusyLlamaForCausalLM"]
    config["auto_map"] = {"AutoModelForCausalLM": "busy_llama.BusyLlamaForCausalLM"}
    (path / "config.json").write_text(json.dumps(config, indent=2))
    return str(path)


# ---- the in-process child ---------------------------------------------------------------------


class _Timed:
    """A forward that records how long each call took."""

    def __init__(self, fn) -> None:
        self.fn = fn
        self.times: list[float] = []

    def __call__(self, *args, **kwargs):
        t0 = time.perf_counter()
        out = self.fn(*args, **kwargs)
        self.times.append(time.perf_counter() - t0)
        return out


def _sequences(runner, n: int, count: int) -> list:
    from serving.srt.sampling import Sequence
    from serving.wire import SamplingParams

    params = SamplingParams(max_new_tokens=n, temperature=0.0, ignore_eos=True)
    ids = runner.encode_prompt(PROMPT, n)
    return [Sequence(f"s{i}", list(ids), params, seed=0, stream=True) for i in range(count)]


# In the child: the forwards its model timed itself (``BUSY_LLAMA_LOG``), read by the ops.
_CHILD_LOG: ForwardLog | None = None


def own_forwards(first: int, steps: list[tuple[int, float]]) -> list[tuple[float, float]]:
    """Each of ``steps`` (index of its forward in the child's log, counted from the log's
    ``first`` new entry; the step's time) as (step time, the model's own forward time)."""
    entries = _CHILD_LOG.since_last() if _CHILD_LOG is not None else []
    out = []
    for index, took in steps:
        at = index - first
        if 0 <= at < len(entries):
            start, end = entries[at]
            out.append((took, end - start))
    return out


def op_engine(runner, batch: int, tokens: int) -> dict:
    """``GenerationBatch.step`` of ``batch`` sequences, each step timed; the decode steps only
    (one forward each), less the forward as the model timed it itself (``BUSY_LLAMA_LOG``: the
    same boundary as the server's figure)."""
    engine = runner.new_batch()
    timed = _Timed(engine.forward)
    engine.forward = timed
    engine.join(_sequences(runner, tokens, batch))
    if _CHILD_LOG is not None:
        _CHILD_LOG.since_last()
    steps = []
    while len(engine):
        before = len(timed.times)
        t0 = time.perf_counter()
        runner.generate(engine)
        took = time.perf_counter() - t0
        if len(timed.times) - before == 1 and engine.steps > 1 and engine.last_step_size == batch:
            steps.append((before, took))
    pairs = own_forwards(0, steps)
    return {
        "forward_ms": median([f for _, f in pairs]) * 1000,
        "engine_ms": median([t - f for t, f in pairs]) * 1000,
    }


def _scheduler(runner, model: str, tmp: str):
    from bootstrap import WorkerContext
    from launchspec.server_args import ServerArgs
    from serving.srt.scheduler import Scheduler

    args = ServerArgs(model_path=model, trust_remote_code=True, max_running_requests=32)
    ctx = WorkerContext(
        role="scheduler",
        rank=0,
        local_rank=0,
        world_size=1,
        tp_size=1,
        dp_size=1,
        runtime_dir=tmp,
        ops_endpoint="",
        query_endpoint="",
        platform="cpu",
    )
    return Scheduler(runner, args, ctx)


class _StubModel:
    """Stands in for the model: the same logits on every call, shaped as a model gives them
    (rows, 1, vocab), so each checkout's runner reads them its own way."""

    def __init__(self, config, logits) -> None:
        self.config = config
        self._logits = logits

    def __call__(self, input_ids, forward_batch=None, logits_to_keep=0, **_):
        if forward_batch is None:  # a checkout before the KV pool: rows of one token each
            return types.SimpleNamespace(logits=self._logits[: input_ids.shape[0]])
        rows = input_ids.shape[1] if isinstance(logits_to_keep, int) else len(logits_to_keep)
        logits = self._logits[:rows]
        return types.SimpleNamespace(logits=logits.view(1, rows, logits.shape[-1]))


def op_scheduler(runner, model: str, tmp: str, batch: int, tokens: int, stub: bool, profile: bool):
    """The real scheduler loop (``turn()``) over ``batch`` streamed requests, no peer on its
    socket: per decode turn, its time less its forward (or with a stub forward)."""
    import torch

    from serving import wire

    sched = _scheduler(runner, model, tmp)
    engine = sched.engine
    real_model = runner.model
    if stub:  # the turn with a stub for the model (it leaves no entry in the model's log)
        word = runner.tokenizer.convert_tokens_to_ids("word")
        fixed = torch.zeros((batch, 1, runner.model.config.vocab_size))
        fixed[:, 0, word] = 1.0
        runner.model = _StubModel(real_model.config, fixed)
    timed = _Timed(engine.forward)
    engine.forward = timed
    params = wire.SamplingParams(max_new_tokens=tokens, temperature=0.0, ignore_eos=True)
    for i in range(batch):
        req = wire.GenerateRequest(f"r{i}", PROMPT, params, stream=True, inflight=batch, group="g")
        sched.take_in(b"client", req)
    turns, forwards = [], []
    profiler = None
    if profile:
        import cProfile

        profiler = cProfile.Profile()
        profiler.enable()
    if _CHILD_LOG is not None:
        _CHILD_LOG.since_last()
    while sched.running or sched.waiting_queue:
        before = len(timed.times)
        t0 = time.perf_counter()
        sched.turn()
        took = time.perf_counter() - t0
        calls = timed.times[before:]
        if len(calls) == 1 and engine.steps > 1 and engine.last_step_size == batch:
            turns.append((before, took))
            forwards.append(calls[0])
    text = ""
    if profiler is not None:
        import io
        import pstats

        profiler.disable()
        out = io.StringIO()
        pstats.Stats(profiler, stream=out).sort_stats("tottime").print_stats(18)
        text = out.getvalue()
    sched.sock.close(0)
    sched._zctx.term()
    runner.model = real_model  # the next operation runs the model again
    if stub:  # no model: the stub's own time is part of the turn
        overhead = [t - f for (_, t), f in zip(turns, forwards, strict=True)]
    else:
        overhead = [t - f for t, f in own_forwards(0, turns)]
    return {"turn_ms": median(overhead) * 1000, "profile": text}


def op_wire(tmp: str) -> dict:
    """A ``Generated`` frame: msgpack encode + decode; its ZeroMQ round trip to an echoing
    process over ipc://; a ``GenerateChunk`` event rendered and SSE-framed."""
    import zmq

    from serving import wire

    msg = wire.Generated("1a2b-17", " word", 9, 17, finished=False, seed=1234, batch_size=1)
    n = 3000
    t0 = time.perf_counter()
    for _ in range(n):
        wire.decode_from_scheduler(wire.encode(msg))
    codec = (time.perf_counter() - t0) / n
    endpoint = f"ipc://{tmp}/echo"
    echo = subprocess.Popen([sys.executable, "-c", ECHO, endpoint], stdout=subprocess.PIPE)
    try:
        assert echo.stdout is not None
        echo.stdout.readline()
        zctx = zmq.Context()
        sock = zctx.socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.connect(endpoint)
        frame = wire.encode(msg)
        rtts = []
        for _ in range(500):
            t0 = time.perf_counter()
            sock.send(frame)
            sock.recv()
            rtts.append(time.perf_counter() - t0)
        sock.send(b"stop")
        sock.close(0)
        zctx.term()
    finally:
        echo.wait(timeout=10)
    framing = float("nan")
    try:
        from serving.http.responses import GenerateChunk, GenerateMeta
        from serving.http.streaming import sse

        text = ""
        t0 = time.perf_counter()
        for i in range(n):
            reply = wire.decode_from_scheduler(frame)
            text += reply.text
            meta = GenerateMeta(
                id=reply.rid,
                prompt_tokens=reply.prompt_tokens,
                completion_tokens=i,
                finish_reason=None,
                seed=reply.seed,
            )
            sse(GenerateChunk(text=text[-600:], meta_info=meta))
        framing = (time.perf_counter() - t0) / n
    except ImportError:
        pass
    return {
        "codec_ms": codec * 1000,
        "zmq_one_way_ms": median(rtts) / 2 * 1000,
        "framing_ms": framing * 1000,
    }


def op_floor(runner, tmp: str) -> dict:
    """This machine's floor at that moment, with no serving code: after a 2 ms busy wait, the
    argmax of a 1-row logits tensor (the model's vocabulary; on this machine the same few
    microseconds of work cost many times more right after a wait than in a tight loop), and
    then an answer's frame sent on a ROUTER socket (no peer: ZeroMQ drops it)."""
    import torch
    import zmq

    from serving import wire

    logits = torch.zeros((1, 1, runner.model.config.vocab_size))
    zctx = zmq.Context()
    sock = zctx.socket(zmq.ROUTER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.bind(f"ipc://{tmp}/floor")
    more, last = int(zmq.SNDMORE | zmq.NOBLOCK), int(zmq.NOBLOCK)
    argmax, sent = [], []
    for i in range(300):
        end = time.perf_counter() + BUSY_MS / 1000.0
        while time.perf_counter() < end:
            pass
        t0 = time.perf_counter()
        token = logits.numpy()[:, -1].argmax(axis=-1).tolist()[0]
        t1 = time.perf_counter()
        frame = wire.encode(wire.Generated("r", " word", 9, i, finished=False, seed=token))
        sock.send(b"client", more)
        sock.send(frame, last)
        t2 = time.perf_counter()
        argmax.append(t1 - t0)
        sent.append(t2 - t0)
    sock.close(0)
    zctx.term()
    return {"floor_argmax_ms": median(argmax) * 1000, "floor_ms": median(sent) * 1000}


def child(model: str) -> None:
    """The in-process side: load the model as a dp=1 scheduler does, then answer each operation
    read from stdin (a JSON line) with one JSON line."""
    import torch

    from launchspec.model_source import resolve_model
    from platforms import current_platform
    from serving.srt.model_runner import ModelRunner
    from serving.threads import share_cpu_threads

    if current_platform.is_cpu():
        share_cpu_threads(ranks_on_node=1)
    global _CHILD_LOG
    if os.environ.get("BUSY_LLAMA_LOG"):
        _CHILD_LOG = ForwardLog(Path(os.environ["BUSY_LLAMA_LOG"]))
    runner = ModelRunner(resolve_model(model), platform=current_platform, trust_remote_code=True)
    runner.warm_up()
    tmp = tempfile.mkdtemp(prefix="tok-")
    print(json.dumps({"threads": torch.get_num_threads()}), flush=True)
    for line in sys.stdin:
        op = json.loads(line)
        name = op.pop("op")
        if name == "engine":
            out = op_engine(runner, **op)
        elif name == "scheduler":
            out = op_scheduler(runner, model, tmp, **op)
        elif name == "floor":
            out = op_floor(runner, tmp)
        else:
            out = op_wire(tmp)
        print(json.dumps(out), flush=True)


class InProcess:
    """The child, kept running so that its measurements alternate with the server's."""

    def __init__(self, code: Path, model: str, env: dict[str, str]) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, __file__, "--child", str(code), model],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            env=env,
            cwd=str(code),
            text=True,
            start_new_session=True,
        )
        self.threads = self.ask(None)["threads"]

    def ask(self, op: dict | None) -> dict:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        if op is not None:
            self.proc.stdin.write(json.dumps(op) + "\n")
            self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"the in-process child exited with {self.proc.wait()}")
        return json.loads(line)

    def close(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        self.proc.wait(timeout=60)


# ---- the HTTP client --------------------------------------------------------------------------


class Client:
    """One keep-alive connection streaming ``/generate``; each event's arrival time and bytes
    are kept and read after the stream ends (the least a client can do while it streams)."""

    def __init__(self, url: str) -> None:
        host, port = url.split("//", 1)[1].rsplit(":", 1)
        self.host, self.port = host, int(port)
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None

    async def stream(self, text: str, tokens: int) -> list[tuple[float, bytes]]:
        if self.writer is None:
            self.reader, self.writer = await asyncio.open_connection(self.host, self.port)
        assert self.reader is not None
        body = {
            "text": text,
            "stream": True,
            "sampling_params": {"max_new_tokens": tokens, "temperature": 0, "ignore_eos": True},
        }
        data = json.dumps(body).encode()
        self.writer.write(
            f"POST /generate HTTP/1.1\r\nHost: {self.host}\r\nContent-Type: application/json"
            f"\r\nContent-Length: {len(data)}\r\n\r\n".encode()
            + data
        )
        head = await self.reader.readuntil(b"\r\n\r\n")
        if not head.startswith(b"HTTP/1.1 200"):
            raise RuntimeError(f"unexpected answer: {head[:300]!r}")
        events: list[tuple[float, bytes]] = []
        pending = b""
        while True:
            size = int((await self.reader.readuntil(b"\r\n")).strip(), 16)
            chunk = await self.reader.readexactly(size + 2)
            if size == 0:
                return events
            pending += chunk[:-2]
            *done, pending = pending.split(b"\n\n")
            now = time.perf_counter()
            events.extend((now, e) for e in done)

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()


def _tokens(event: bytes) -> int:
    at = event.find(b'"completion_tokens":')
    if at < 0:
        return -1
    end = at + len(b'"completion_tokens":')
    digits = end
    while event[digits : digits + 1].isdigit():
        digits += 1
    return int(event[end:digits])


def token_span(events: list[tuple[float, bytes]], tokens: int) -> tuple[float, float, int]:
    """When the first and the last token arrived, and the tokens between them."""
    counted = [(t, _tokens(e)) for t, e in events]
    counted = [(t, n) for t, n in counted if n > 0]
    if not counted or counted[-1][1] != tokens:
        raise RuntimeError(f"asked for {tokens} tokens, got {counted[-1:] or 'none'}")
    (t0, n0), (t1, n1) = counted[0], counted[-1]
    return t0, t1, n1 - n0


def tpot(events: list[tuple[float, bytes]], tokens: int) -> float:
    """(last token's arrival - first token's) / (tokens between them)."""
    t0, t1, n = token_span(events, tokens)
    return (t1 - t0) / n


class ForwardLog:
    """The forwards the server's model timed itself (``BUSY_LLAMA_LOG``)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.read_at = 0

    def since_last(self) -> list[tuple[float, float]]:
        import struct

        data = self.path.read_bytes() if self.path.exists() else b""
        new, self.read_at = data[self.read_at :], len(data)
        return [struct.unpack_from("dd", new, i) for i in range(0, len(new) - 15, 16)]


def server_forward(log: list[tuple[float, float]], spans: list[tuple[float, float, int]]) -> float:
    """The median forward the server ran while the requests' tokens streamed (decode steps)."""
    inside = [e - s for s, e in log if any(t0 <= s and e <= t1 for t0, t1, _ in spans)]
    return median(inside)


def server_gap(log: list[tuple[float, float]], spans: list[tuple[float, float, int]]) -> float:
    """The median time from the end of one of the server's forwards to the start of the next
    while the requests' tokens streamed: the scheduler's own path per token, measured by the
    server's model in the server itself."""
    gaps = []
    for t0, t1, _ in spans:
        inside = [(s, e) for s, e in log if t0 <= s and e <= t1]
        gaps.extend(b[0] - a[1] for a, b in zip(inside, inside[1:], strict=False))
    return median(gaps)


async def streams(url: str, clients: int, per_client: int, text: str, tokens: int) -> list:
    """Each client's requests one after another, all clients at once: every request's events."""
    conns = [Client(url) for _ in range(clients)]

    async def run(c: Client) -> list:
        return [await c.stream(text, tokens) for _ in range(per_client)]

    try:
        results = await asyncio.gather(*(run(c) for c in conns))
    finally:
        for c in conns:
            c.close()
    return [events for per in results for events in per]


def stub_latency(events: list[tuple[float, bytes]]) -> list[float]:
    """Send-to-read latency of each paced stub token (its send time is the last ``t<ns>``)."""
    out = []
    for t, e in events:
        at = e.rfind(b" t")
        if at < 0:
            continue
        end = at + 2
        while e[end : end + 1].isdigit():
            end += 1
        if end > at + 2:
            out.append(t - int(e[at + 2 : end]) / 1e9)
    return out


def server_processes(server) -> tuple[object, object]:
    """The server's scheduler and HTTP child (the one listening on its port)."""
    import psutil

    http = None
    others = []
    for p in psutil.Process(server.proc.pid).children(recursive=True):
        try:
            if any(
                c.status == "LISTEN" and c.laddr.port == server.port for c in p.net_connections()
            ):
                http = p
            else:
                others.append((cpu_s(p), p))
        except psutil.Error:
            continue
    # The scheduler: the busiest other child (it loaded the model and ran the warm-up).
    sched = max(others, key=lambda x: x[0])[1] if others else None
    return sched, http


def cpu_s(proc) -> float:
    if proc is None:
        return float("nan")
    t = proc.cpu_times()
    return t.user + t.system


# ---- the run ----------------------------------------------------------------------------------


def main() -> int:
    if len(sys.argv) == 4 and sys.argv[1] == "--child":
        child(sys.argv[3])
        return 0
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--requests", type=int, default=3, help="1-client requests per round")
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument("--baseline", type=Path, help="another checkout of this project")
    parser.add_argument("--skip-stub", action="store_true", help="no stub-scheduler servers")
    parser.add_argument(
        "--forward",
        choices=("mock", "llama"),
        default="mock",
        help="after the busy wait: no arithmetic, a cached logits buffer (mock, the vendor's "
        "method), or the tiny Llama's own forward (llama)",
    )
    args = parser.parse_args()

    from support.serving import Server, server_env, start_server

    tmp = Path(tempfile.mkdtemp(prefix="bench-token-overhead-"))
    model = build_busy_model(tmp)
    stub_dir = tmp / "stub"
    stub_dir.mkdir()
    (stub_dir / "stub_scheduler.py").write_text(STUB_SCHEDULER)
    codes = {"contender": REPO}
    if args.baseline is not None:
        codes["baseline"] = args.baseline.resolve()
    launch = ["--model-path", model, "--trust-remote-code", "--max-running-requests", "32"]
    stub_launch = ["--model-path", model, "--scheduler-target", "stub_scheduler.run"]
    child_policy = os.environ.get("OMP_WAIT_POLICY", "PASSIVE")
    servers: dict[str, Server] = {}
    stubs: dict[str, Server] = {}
    children: dict[str, InProcess] = {}
    rows: dict[str, dict[str, list[float]]] = {side: {} for side in codes}
    profiles: dict[str, str] = {}
    logs: dict[str, ForwardLog] = {}

    def note(side: str, key: str, value: float) -> None:
        rows[side].setdefault(key, []).append(value)

    print(f"start: {load()}", flush=True)
    try:
        for side, code in codes.items():
            env = {
                **server_env(),
                "PYTHONPATH": str(code),
                "BUSY_LLAMA_MOCK": "1" if args.forward == "mock" else "0",
            }
            logs[side] = ForwardLog(tmp / f"{side}-forwards.bin")
            servers[side] = start_server(
                launch, tmp, side, env={**env, "BUSY_LLAMA_LOG": str(logs[side].path)}
            )
            if not args.skip_stub:
                stub_env = {**env, "PYTHONPATH": f"{code}{os.pathsep}{stub_dir}"}
                stubs[side] = start_server(stub_launch, tmp, f"{side}-stub", env=stub_env)
            child_env = {
                **env,
                "OMP_WAIT_POLICY": child_policy,
                "BUSY_LLAMA_LOG": str(tmp / f"{side}-child-forwards.bin"),
            }
            children[side] = InProcess(code, model, child_env)
            asyncio.run(streams(servers[side].url, 2, 1, PROMPT, 16))  # warm the paths
            logs[side].since_last()
        for r in range(args.rounds):
            for side in codes:
                server, child_ = servers[side], children[side]
                sched, http = server_processes(server)
                cpu0 = (cpu_s(sched), cpu_s(http))
                one = asyncio.run(streams(server.url, 1, args.requests, PROMPT, TOKENS))
                cpu1 = (cpu_s(sched), cpu_s(http))
                made = args.requests * TOKENS
                note(side, "tpot1", median([tpot(e, TOKENS) for e in one]) * 1000)
                spans = [token_span(e, TOKENS) for e in one]
                entries = logs[side].since_last()
                note(side, "sforward1", server_forward(entries, spans) * 1000)
                note(side, "sgap1", server_gap(entries, spans) * 1000)
                note(side, "cpu_sched", (cpu1[0] - cpu0[0]) / made * 1000)
                note(side, "cpu_http", (cpu1[1] - cpu0[1]) / made * 1000)
                out = child_.ask({"op": "engine", "batch": 1, "tokens": TOKENS})
                note(side, "forward1", out["forward_ms"])
                note(side, "engine1", out["engine_ms"])
                many = asyncio.run(streams(server.url, args.clients, 1, PROMPT, TOKENS))
                note(side, "tpotN", median([tpot(e, TOKENS) for e in many]) * 1000)
                # The forwards of full steps: while every client's tokens streamed.
                spansN = [token_span(e, TOKENS) for e in many]
                both = [(max(s[0] for s in spansN), min(s[1] for s in spansN), 0)]
                note(side, "sforwardN", server_forward(logs[side].since_last(), both) * 1000)
                out = child_.ask({"op": "engine", "batch": args.clients, "tokens": TOKENS})
                note(side, "forwardN", out["forward_ms"])
                note(side, "engineN", out["engine_ms"])
                for stub in (False, True):
                    out = child_.ask(
                        {
                            "op": "scheduler",
                            "batch": 1,
                            "tokens": TOKENS,
                            "stub": stub,
                            "profile": False,
                        }
                    )
                    note(side, "sched_stub1" if stub else "sched1", out["turn_ms"])
                if r == 0:  # a profiled run apart: the profiler's cost stays out of the figures
                    out = child_.ask(
                        {
                            "op": "scheduler",
                            "batch": 1,
                            "tokens": TOKENS,
                            "stub": False,
                            "profile": True,
                        }
                    )
                    profiles[side] = out["profile"]
                out = child_.ask({"op": "floor"})
                note(side, "floor_argmax", out["floor_argmax_ms"])
                note(side, "floor", out["floor_ms"])
                out = child_.ask(
                    {
                        "op": "scheduler",
                        "batch": args.clients,
                        "tokens": TOKENS,
                        "stub": False,
                        "profile": False,
                    }
                )
                note(side, "schedN", out["turn_ms"])
                out = child_.ask({"op": "wire"})
                for key in ("codec_ms", "zmq_one_way_ms", "framing_ms"):
                    note(side, key, out[key])
                if side in stubs:
                    url = stubs[side].url
                    t0 = time.perf_counter()
                    asyncio.run(streams(url, 1, 1, "burst", STUB_TOKENS))
                    note(side, "stub_burst", (time.perf_counter() - t0) / STUB_TOKENS * 1000)
                    paced = asyncio.run(streams(url, 1, 1, "paced", TOKENS))
                    note(side, "stub_latency", median(stub_latency(paced[0])) * 1000)
            print(f"round {r + 1}/{args.rounds} done: {load()}", flush=True)
    finally:
        for c in children.values():
            c.close()
        for s in [*servers.values(), *stubs.values()]:
            s.stop()

    def med(side: str, key: str) -> float:
        return median(rows[side].get(key, []))

    sides = list(codes)
    for side in sides:
        rows[side]["overhead1"] = [
            t - f for t, f in zip(rows[side]["tpot1"], rows[side]["forward1"], strict=True)
        ]
        rows[side]["overheadN"] = [
            (t - f) / args.clients
            for t, f in zip(rows[side]["tpotN"], rows[side]["forwardN"], strict=True)
        ]
        rows[side]["soverhead1"] = [
            t - f for t, f in zip(rows[side]["tpot1"], rows[side]["sforward1"], strict=True)
        ]
        rows[side]["soverheadN"] = [
            (t - f) / args.clients
            for t, f in zip(rows[side]["tpotN"], rows[side]["sforwardN"], strict=True)
        ]
    n = args.clients
    lines = [
        ("TPOT, 1 client (streamed /generate, 128 tokens)", "tpot1"),
        ("forward, in-process, batch 1 on a KV cache", "forward1"),
        ("per-token overhead = TPOT - forward (target 0.30)", "overhead1"),
        ("forward, timed by the server's model while it streamed", "sforward1"),
        ("per-token overhead = TPOT - the server's forward", "soverhead1"),
        ("  the server's forward end -> its next forward's start", "sgap1"),
        ("  engine step (GenerationBatch.step - forward)", "engine1"),
        ("  scheduler loop, no sockets (turn - forward)", "sched1"),
        ("  scheduler loop, stub forward (turn)", "sched_stub1"),
        ("  floor, no serving code: argmax after a 2 ms wait", "floor_argmax"),
        ("  floor: the argmax, then an answer encoded and sent", "floor"),
        ("  Generated frame: msgpack encode + decode", "codec_ms"),
        ("  ZeroMQ hop, ipc, one way (RTT / 2)", "zmq_one_way_ms"),
        ("  HTTP child: stub stream, per chunk back to back", "stub_burst"),
        ("  HTTP path: stub send -> client read, paced 2 ms", "stub_latency"),
        ("  stream framing: GenerateChunk + SSE, in-process", "framing_ms"),
        ("  CPU per token: server's scheduler process", "cpu_sched"),
        ("  CPU per token: server's HTTP process", "cpu_http"),
        (f"TPOT, {n} clients (one batch step per token)", "tpotN"),
        (f"forward, in-process, batch {n}", "forwardN"),
        (f"overhead per token of a batch step = (TPOT - forward) / {n}", "overheadN"),
        (f"forward at batch {n}, timed by the server's model", "sforwardN"),
        ("per token of a batch step, with the server's forward", "soverheadN"),
        (f"  engine step at batch {n} (per step)", "engineN"),
        (f"  scheduler loop at batch {n}, no sockets (per step)", "schedN"),
    ]
    print()
    print(
        f"model: BusyLlamaForCausalLM (2 layers, forward busy-waits {BUSY_MS} ms, then "
        + ("no arithmetic: cached logits" if args.forward == "mock" else "the Llama's forward")
        + "); "
        f"{args.rounds} rounds, medians in ms; child threads "
        + ", ".join(f"{s} {children[s].threads}" for s in sides)
    )
    head = f"{'':<62}" + "".join(f"{s:>12}" for s in sides)
    if len(sides) == 2:
        head += f"{'ratio':>9}"
    print(head)
    for label, key in lines:
        vals = [med(s, key) for s in sides]
        line = f"{label:<62}" + "".join(f"{v:12.3f}" for v in vals)
        if len(sides) == 2 and vals[1]:
            line += f"{vals[0] / vals[1]:9.2f}"
        print(line)
    for side in sides:
        for how, a, b in (
            ("in-process forward", "overhead1", "overheadN"),
            ("the server's forward", "soverhead1", "soverheadN"),
        ):
            o1, on = med(side, a), med(side, b)
            print(
                f"{side}, {how}: overhead {o1:.3f} ms/token at 1 client (target 0.30: "
                f"{'met' if o1 <= 0.30 else 'not met'}); per token of a {n}-row step {on:.3f} "
                f"({'no worse' if on <= o1 else 'WORSE'} than at 1 client)"
            )
    print(f"end: {load()}")
    for side, text in profiles.items():
        print(f"\nprofile of the scheduler loop at batch 1 ({side}), top entries by own time:")
        print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
