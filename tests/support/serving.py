"""Helpers for the serving tests (no tests here): a server started through the real CLI, a tiny
causal LM built at test time, and small HTTP helpers over loopback.

``Server`` runs ``sglang-launch`` as a subprocess in its own session, waits for ``/ready`` (a
condition, with a generous deadline), and in ``stop()`` SIGTERMs the supervisor, then SIGKILLs
whatever of its tree is left, so a failing test leaves nothing running.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

from support import REPO, clean_env, free_port, kill_tree, make_dist, wait_for

CLI = REPO / ".venv" / "bin" / "sglang-launch"


def cli_command() -> list[str]:
    """The real console script when installed, else the same entry through ``python -m``."""
    if CLI.exists():
        return [str(CLI)]
    return [sys.executable, "-m", "launcher"]


def server_env(**extra: str | None) -> dict[str, str]:
    """The environment of a test server: offline, on the CPU platform chosen the documented way
    (``SGLANG_USE_CPU_ENGINE=None`` in ``extra`` leaves the choice to the launch), plus ``extra``."""
    env = clean_env(
        **{
            "SGLANG_USE_CPU_ENGINE": "1",
            "HF_HUB_OFFLINE": "1",
            "TRANSFORMERS_OFFLINE": "1",
            **extra,
        }
    )
    env["PYTHONPATH"] = str(REPO) + (
        os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else ""
    )
    return env


def plugin_env(
    site: Path, name: str, entry_points: dict[str, dict[str, str]], modules: dict[str, str]
) -> dict[str, str]:
    """``server_env()`` with the distribution ``name`` (``make_dist``) written into ``site`` and
    ``site`` first on the children's ``PYTHONPATH``: a launch that loads that plugin."""
    make_dist(site, name, entry_points, modules)
    env = server_env()
    env["PYTHONPATH"] = f"{site}{os.pathsep}{env['PYTHONPATH']}"
    return env


# What the launcher prints once every worker, the HTTP child included, reported ready: from then on
# a scheduler that dies is a failure of a ready launch (restarted, set aside or fatal as the policy
# says), no longer a start-up failure.
READY_LINE = "sglang-launch: ready at http"

# The model a test server serves when its arguments name none: the embedded embedding model, the
# suite's cheapest real model to start. ``default_model=True`` serves what a bare
# ``sglang-launch`` serves instead (the embedded chat model, slower to start).
EMBEDDING_MODEL = "all-MiniLM-L6-v2"


def with_model(args: list[str], default_model: bool = False) -> list[str]:
    """``args``, plus ``--model-path all-MiniLM-L6-v2`` when they name no model (and no other
    runtime) and ``default_model`` is False."""
    named = any(a == "--model-path" or a.startswith("--model-path=") for a in args)
    other_runtime = any(
        a == "--runtime=diffusion" or (a == "--runtime" and args[i + 1 : i + 2] == ["diffusion"])
        for i, a in enumerate(args)
    )
    if default_model or named or other_runtime:
        return list(args)
    return ["--model-path", EMBEDDING_MODEL, *args]


class Server:
    """``sglang-launch ARGS --port <free>`` with its output in ``log_path`` (``with_model``: the
    embedding model unless ARGS name a model or ``default_model`` is True)."""

    def __init__(
        self,
        args: list[str],
        log_path: Path,
        env: dict[str, str] | None = None,
        *,
        default_model: bool = False,
    ) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = log_path
        self._log = open(log_path, "w")
        self.proc = subprocess.Popen(
            [*cli_command(), *with_model(args, default_model), "--port", str(self.port)],
            stdout=self._log,
            stderr=subprocess.STDOUT,
            env=env or server_env(),
            cwd=str(REPO),
            start_new_session=True,
        )

    @property
    def log(self) -> str:
        if not self._log.closed:
            self._log.flush()
        return self.log_path.read_text(errors="replace")

    def wait_ready(self, timeout: float = 180.0, headers: dict | None = None) -> None:
        """Return once the launch is ready: the launcher printed its ready line and ``/ready``
        answers 200; fail naming the log if the server exits first or ``timeout`` seconds pass.

        ``/ready`` alone is not enough: it is the HTTP child's view (every scheduler answers a
        ping) and can turn 200 a fraction of a second before the HTTP child's own wait for the
        schedulers ends and its ready report reaches the launcher. Until the launcher says ready
        the launch is starting, and a worker that dies then ends it as a start-up failure (never
        restarted) instead of healing."""
        import httpx

        def ready() -> bool:
            if self.proc.poll() is not None:
                raise AssertionError(
                    f"server exited with {self.proc.returncode} before ready:\n{self.log}"
                )
            if READY_LINE not in self.log:
                return False
            try:
                return httpx.get(self.url + "/ready", timeout=5).status_code == 200
            except httpx.HTTPError:
                return False  # too busy to answer in time

        wait_for(ready, timeout, f"the server to be ready (log {self.log_path})", interval=0.2)

    @contextlib.contextmanager
    def log_on_failure(self) -> Iterator[None]:
        """Print the launch's output when the block raises (pytest shows it with the failure)."""
        try:
            yield
        except BaseException:
            print(f"--- sglang-launch output ({self.log_path}):\n{self.log}")
            raise

    def wait_exit(self, timeout: float = 60.0) -> int:
        return self.proc.wait(timeout=timeout)

    def stop(self) -> None:
        import psutil

        try:
            tree = [
                psutil.Process(self.proc.pid),
                *psutil.Process(self.proc.pid).children(recursive=True),
            ]
        except psutil.NoSuchProcess:
            tree = []
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGCONT)  # in case a test left it stopped
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                pass
        kill_tree([p for p in tree if p.is_running()])
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=10)
        self._log.close()


def start_server(
    args: list[str],
    tmp: Path,
    name: str,
    headers: dict | None = None,
    env: dict[str, str] | None = None,
    *,
    default_model: bool = False,
) -> Server:
    """A ready ``Server`` (stopped again if it never becomes ready)."""
    server = Server(args, tmp / f"{name}.log", env=env, default_model=default_model)
    try:
        server.wait_ready()
    except BaseException:
        server.stop()
        raise
    return server


def start_two_nodes(
    args: list[str], tmp: Path, name: str, env: dict[str, str] | None = None, timeout: float = 180.0
) -> list[Server]:
    """One launch over two "nodes" on loopback: two ``sglang-launch`` processes with ``--nnodes 2``,
    ``--node-rank 0/1`` and one ``--dist-init-addr``. Returns once node 0's supervisor says ready;
    at that moment ``/ready`` must already be 200 (checked once, no retry: the supervisor's ready
    and the HTTP child's must agree). On any failure both trees are stopped before raising."""
    import httpx

    common = [*args, "--nnodes", "2", "--dist-init-addr", f"127.0.0.1:{free_port()}"]
    nodes: list[Server] = []
    try:
        for rank in (0, 1):
            nodes.append(
                Server([*common, "--node-rank", str(rank)], tmp / f"{name}-node{rank}.log", env)
            )

        def node0_ready() -> bool:
            for node in nodes:
                if node.proc.poll() is not None:
                    raise AssertionError(
                        f"a node exited with {node.proc.returncode} before ready:\n"
                        + "\n".join(n.log for n in nodes)
                    )
            return READY_LINE in nodes[0].log

        wait_for(node0_ready, timeout, "node 0 to be ready", interval=0.2)
        r = httpx.get(nodes[0].url + "/ready", timeout=30)
        assert r.status_code == 200, (
            f"the supervisor said ready but /ready is {r.status_code}: {r.text}"
        )
    except BaseException:
        stop_all(nodes)
        raise
    return nodes


def stop_all(servers: list[Server]) -> None:
    """SIGTERM every server first (so that no node waits on another's stop), then stop each."""
    for srv in servers:
        if srv.proc.poll() is None:
            srv.proc.send_signal(signal.SIGTERM)
    for srv in servers:
        srv.stop()


def build_tiny_llama(
    path: Path, tokenizer_dir: Path, layers: int = 2, positions: int = 1024
) -> Path:
    """A tiny Llama of ``layers`` layers and ``positions`` positions with random weights and a
    real tokenizer (BERT's, from ``tokenizer_dir``), saved as a Hugging Face model directory."""
    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    path.mkdir(parents=True, exist_ok=True)
    tok = AutoTokenizer.from_pretrained(tokenizer_dir)
    tok.save_pretrained(path)
    cfg = LlamaConfig(
        vocab_size=len(tok),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=positions,
        bos_token_id=tok.cls_token_id,
        eos_token_id=tok.sep_token_id,
        pad_token_id=tok.pad_token_id,
    )
    torch.manual_seed(1234)
    LlamaForCausalLM(cfg).save_pretrained(path)
    return path


# A chat template that writes the BOS token itself, as most models' templates do: a prompt it
# renders must reach the model with that token once (``GenerateRequest.raw``).
CHAT_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}<{{ m['role'] }}> {{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}<assistant> {% endif %}"
)


def give_chat_template(path: Path, template: str = CHAT_TEMPLATE) -> Path:
    """The model directory at ``path`` with ``template`` as its tokenizer's chat template and
    its BOS token (BERT's [CLS], the tiny Llama's bos_token_id) named, saved the way
    transformers saves them (chat_template.jinja, tokenizer_config.json)."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(path, local_files_only=True)
    tok.chat_template = template
    tok.bos_token = tok.cls_token
    tok.save_pretrained(path)
    return path


# For a test that needs the engine half of issue 18 (a scheduler that fills Generated.logprobs
# and tokenises a GenerateRequest.raw prompt without adding special tokens): it is expected to
# fail until that lands, and fails when it passes, so the mark is removed at the merge.
def post(url: str, body, headers: dict | None = None, timeout: float = 60.0):
    import httpx

    data = body if isinstance(body, (bytes, str)) else json.dumps(body)
    return httpx.post(
        url,
        content=data,
        headers={"content-type": "application/json", **(headers or {})},
        timeout=timeout,
    )


@contextlib.contextmanager
def leaving_client(url: str, path: str, body, headers: dict | None = None):
    """A POST sent on a plain socket whose client leaves when the block ends (the connection
    closes, no answer read): the block waits for the request to be under way, so the client
    leaves at a known point rather than after a timeout a busy machine may spend first."""
    import socket
    from urllib.parse import urlsplit

    where = urlsplit(url)
    data = (body if isinstance(body, (bytes, str)) else json.dumps(body)).encode()
    fields = {"Host": where.netloc, "Content-Type": "application/json", **(headers or {})}
    head = "".join(f"{k}: {v}\r\n" for k, v in fields.items())
    request = f"POST {path} HTTP/1.1\r\n{head}Content-Length: {len(data)}\r\n\r\n"
    with socket.create_connection((where.hostname, where.port)) as client:
        client.sendall(request.encode() + data)
        yield


def cosine(a: list[float], b: list[float]) -> float:
    dot = sum(x * y for x, y in zip(a, b, strict=True))
    na = sum(x * x for x in a) ** 0.5
    nb = sum(y * y for y in b) ** 0.5
    return dot / (na * nb)


def run_load(
    url: str,
    make_body,
    *,
    clients: int = 16,
    seconds: float = 20.0,
    path: str = "/v1/embeddings",
    headers: dict | None = None,
    stop_event=None,
    pause: float = 0.0,
) -> dict:
    """``clients`` threads, each with one keep-alive connection, POST ``make_body(i)`` to ``path``
    for ``seconds`` (or until ``stop_event`` is set), each waiting ``pause`` seconds after every
    answer (0: back to back, a saturating load; a pause leaves the cores room, for example for a
    replica that restarts meanwhile). Returns counts, errors and latency figures."""
    import threading

    import httpx

    latencies: list[float] = []
    errors: list[str] = []
    lock = threading.Lock()
    deadline = time.monotonic() + seconds
    stop = stop_event or threading.Event()

    def client(k: int) -> None:
        with httpx.Client(
            timeout=60, headers={"content-type": "application/json", **(headers or {})}
        ) as c:
            i = 0
            while time.monotonic() < deadline and not (stop_event and stop_event.is_set()):
                started = time.perf_counter()
                try:
                    r = c.post(url + path, content=json.dumps(make_body(k * 100000 + i)))
                    ok = r.status_code == 200
                    note = f"{r.status_code} {r.text[:200]}"
                except httpx.HTTPError as exc:
                    ok, note = False, f"{type(exc).__name__}: {exc}"
                elapsed = time.perf_counter() - started
                with lock:
                    (latencies.append(elapsed) if ok else errors.append(note))
                i += 1
                if pause and stop.wait(pause):
                    break

    started = time.monotonic()
    threads = [threading.Thread(target=client, args=(k,), daemon=True) for k in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=seconds + 120)
    wall = time.monotonic() - started
    latencies.sort()

    def pct(q: float) -> float:
        return (
            latencies[min(len(latencies) - 1, int(q * len(latencies)))]
            if latencies
            else float("nan")
        )

    return {
        "requests": len(latencies),
        "errors": errors,
        "seconds": wall,
        "throughput_rps": len(latencies) / wall,
        "p50_ms": pct(0.50) * 1000,
        "p99_ms": pct(0.99) * 1000,
    }


class Clients:
    """``count`` threads, each with one keep-alive connection, posting ``make_body(k * 100000 +
    i)`` to ``path`` back to back (``pause`` seconds after each answer) until ``finish()``. Keeps
    the time of every answer (``time.monotonic()``) and of every failure (``time.time()``, with
    what failed), for the benchmarks that count what a window of time served."""

    def __init__(
        self, url: str, count: int, make_body=None, *, pause: float = 0.0, path="/v1/embeddings"
    ) -> None:
        import threading

        self.url, self.path, self.pause = url, path, pause
        self.make_body = make_body or embedding_body
        self.answered: list[float] = []
        self.failed: list[tuple[float, str]] = []
        self._taken = (0, 0)
        self.stop = threading.Event()
        self.lock = threading.Lock()
        self.threads = [
            threading.Thread(target=self._run, args=(k,), daemon=True) for k in range(count)
        ]
        for t in self.threads:
            t.start()

    def _run(self, k: int) -> None:
        import httpx

        with httpx.Client(timeout=120, headers={"content-type": "application/json"}) as c:
            i = 0
            while not self.stop.is_set():
                try:
                    r = c.post(
                        self.url + self.path, content=json.dumps(self.make_body(k * 100000 + i))
                    )
                    note = None if r.status_code == 200 else f"{r.status_code} {r.text[:160]}"
                except httpx.HTTPError as exc:
                    note = f"{type(exc).__name__}: {exc}"
                with self.lock:
                    if note is None:
                        self.answered.append(time.monotonic())
                    else:
                        self.failed.append((time.time(), note))
                i += 1
                if self.pause:
                    self.stop.wait(self.pause)

    @property
    def ok(self) -> int:
        return len(self.answered)

    def served(self, start: float, end: float) -> int:
        """The answers between monotonic times ``start`` and ``end``."""
        with self.lock:
            return sum(start <= t < end for t in self.answered)

    def errors(self, start: float = float("-inf"), end: float = float("inf")) -> list[str]:
        """The failures between wall-clock times ``start`` and ``end``."""
        with self.lock:
            return [note for t, note in self.failed if start <= t < end]

    def take(self) -> tuple[int, list[str]]:
        """The number of answers and the failures since the last call."""
        with self.lock:
            answered, failed = self._taken
            self._taken = (len(self.answered), len(self.failed))
            return len(self.answered) - answered, [n for _, n in self.failed[failed:]]

    def finish(self) -> None:
        self.stop.set()
        for t in self.threads:
            t.join(timeout=180)


def run_stream_load(
    url: str,
    make_body,
    *,
    clients: int = 4,
    seconds: float = 60.0,
    path: str = "/generate",
    stop_event=None,
    pause: float = 0.0,
) -> dict:
    """``clients`` threads, each streaming ``make_body(i)`` from ``path`` to its end, one stream
    after the other, for ``seconds`` or until ``stop_event`` is set. A stream counts as an
    error unless it answers 200, carries no error event and ends with ``data: [DONE]``.
    Returns the counts and the errors."""
    import threading

    import httpx

    done: list[int] = []
    errors: list[str] = []
    lock = threading.Lock()
    deadline = time.monotonic() + seconds
    stop = stop_event or threading.Event()

    def client(k: int) -> None:
        with httpx.Client(timeout=120, headers={"content-type": "application/json"}) as c:
            i = 0
            while time.monotonic() < deadline and not stop.is_set():
                note = None
                try:
                    body = json.dumps(make_body(k * 100000 + i))
                    with c.stream("POST", url + path, content=body) as r:
                        text = "".join(r.iter_text())
                    if r.status_code != 200:
                        note = f"{r.status_code} {text[:200]}"
                    elif '"error"' in text or not text.rstrip().endswith("data: [DONE]"):
                        note = f"stream ended badly: {text[-300:]}"
                except httpx.HTTPError as exc:
                    note = f"{type(exc).__name__}: {exc}"
                with lock:
                    (errors.append(note) if note else done.append(1))
                i += 1
                if pause and stop.wait(pause):
                    break

    threads = [threading.Thread(target=client, args=(k,), daemon=True) for k in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=seconds + 180)
    return {"requests": len(done), "errors": errors}


def stream_body(i: int) -> dict:
    """A streamed generation of a few tokens, a different prompt each time."""
    return {
        "text": f"{LOAD_TEXTS[i % len(LOAD_TEXTS)]} #{i}",
        "sampling_params": {"max_new_tokens": 8, "temperature": 0},
        "stream": True,
    }


LOAD_TEXTS = [
    "a cat sits on the mat",
    "the weather is lovely today",
    "stock prices fell sharply",
    "a kitten rests on a rug",
    "how do I reset my password",
    "the quick brown fox",
]


def embedding_body(i: int) -> dict:
    return {"input": f"{LOAD_TEXTS[i % len(LOAD_TEXTS)]} #{i}"}


def load_line(label: str, stats: dict) -> str:
    """One line of a ``run_load`` result: requests, errors, throughput, p50 and p99."""
    return (
        f"{label}: {stats['requests']} requests, {len(stats['errors'])} errors, "
        f"{stats['throughput_rps']:.1f} req/s, p50 {stats['p50_ms']:.1f} ms, "
        f"p99 {stats['p99_ms']:.1f} ms"
    )


def report(capsys, line: str) -> None:
    """Print a figure so it shows in the test run's output, even with -q."""
    with capsys.disabled():
        print("\n" + line)


class SchedulerSocket:
    """A DEALER on a scheduler's own request socket (what the HTTP child does)."""

    def __init__(self, endpoint: str) -> None:
        import zmq

        self.zctx = zmq.Context()
        self.sock = self.zctx.socket(zmq.DEALER)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.connect(endpoint)

    def send(self, msg) -> None:
        from serving import wire

        self.sock.send(wire.encode(msg))

    def finished(self, count: int, timeout: float = 180.0) -> list[str]:
        """The rids of the next ``count`` finished generations, in the order they finished."""
        from serving import wire

        done: list[str] = []

        def more() -> bool:
            while self.sock.poll(100):
                reply = wire.decode_from_scheduler(self.sock.recv())
                assert isinstance(reply, wire.Generated), reply
                if reply.finished:
                    done.append(reply.rid)
            return len(done) >= count

        wait_for(more, timeout, f"{count} generations to finish", interval=0)
        return done

    def answers(self, timeout: float = 60.0) -> list:
        """Every answer to the one request under way, up to its final one."""
        from serving import wire

        got: list = []
        while not got or not got[-1].finished:
            assert self.sock.poll(int(timeout * 1000)), f"no final answer; got {got}"
            got.append(wire.decode_from_scheduler(self.sock.recv()))
        return got

    def close(self) -> None:
        self.sock.close(0)
        self.zctx.term()
