"""Worker targets for tests of the bootstrap and the supervisor: ``target(server_args, ctx)``.

Each is a small, honest behaviour a real worker can have. Pass them by dotted path
(``"support.workers.ready_then_wait"``); ``tests/`` is on ``sys.path`` in the test process
(conftest), and spawn hands that path to the children. Tune them through ``ProcessSpec.env``:

- ``TESTWORKER_EXIT_CODE``: the code for ``exit_with_code`` / ``os_exit_after_ready`` (default 3);
- ``TESTWORKER_SIGNAL``: the signal name for ``kill_self`` (default ``SIGKILL``);
- ``TESTWORKER_MARKER``: a file path some workers create once they reach their interesting point
  (so a test can wait on a condition instead of sleeping).

Targets:

- ``ready_then_wait``: ready (with its identity and a few ServerArgs fields as info), waits for
  ``ctx.stopping``, returns: the well-behaved worker.
- ``report_args``: like ``ready_then_wait``, with every ServerArgs field and the class name in info.
- ``raise_error``: raises ``RuntimeError("worker failed on purpose")`` before ready.
- ``raise_after_ready``: ready, then raises.
- ``return_early``: ready, then returns although nobody asked it to stop.
- ``raise_on_stop``: ready, waits for ``ctx.stopping``, then raises while winding down.
- ``hang``: never reports ready and ignores stop requests (SIGTERM is ignored, too).
- ``ignore_stop``: ready, then ignores SIGTERM and sleeps forever (tests need SIGKILL).
- ``exit_with_code``: ``os._exit(TESTWORKER_EXIT_CODE)`` before ready.
- ``os_exit_after_ready``: ready, then ``os._exit(TESTWORKER_EXIT_CODE)``.
- ``kill_self``: sends itself ``TESTWORKER_SIGNAL`` before ready.
- ``import_torch``: imports torch, reports ready with its version, waits for stop.
- ``spawn_grandchild``: starts a ``sleep``-like grandchild process, ready (info: its pid), waits.
- ``spawn_descendants``: starts a plain child and a double-forked ``setsid`` grandchild (whose
  parent exits at once) and does not stop them itself; ready (info: ``child``, ``detached``).
- ``never_ready``: reports phase ``loading``, creates the marker, waits for ``ctx.stopping``
  without ever reporting ready (a worker stopped in the middle of its start-up).
- ``start_children_nonstop``: starts a ``sleep`` child every few milliseconds, for as long as it
  runs, keeping the newest ``TESTWORKER_KEEP`` (default 40) alive and ending the older ones; it
  reports ready once it has started that many (``TESTWORKER_NEVER_READY=1``: never).
- ``signal_a_fork``: forks a copy of itself (as a worker's forked helper is), ready (info: ``fork``),
  sends the copy SIGTERM and reaps it, creates the marker, waits for its own stop; its stop info
  says whether ``ctx.stopping`` was set within a second of the copy's exit (``stopped_by_fork``).
- ``custom_phases``: reports phases ``model_loaded`` and ``warmed_up``, then ready, waits.
- ``chatty_ready``: writes ``TESTWORKER_LINES`` numbered lines to stdout and stderr, then ready.
- ``fail_on_last_rank``: the last scheduler rank raises once the others run; the others never
  get ready and ignore SIGTERM (``TESTWORKER_RANKS_DIR``: a folder for their marker files).
- ``fail_when_model_says``: ``ready_then_wait``, unless its ``--model-path`` folder holds a file
  ``fail`` with a number N: then the first N starts with that folder succeed and every later one
  raises before ready (a reload to a model that cannot load, after N replicas of it started).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time


def _marker() -> None:
    path = os.environ.get("TESTWORKER_MARKER")
    if path:
        with open(path, "w") as fh:
            fh.write(str(os.getpid()))


def _identity(ctx) -> dict:
    return {
        "pid": os.getpid(),
        "role": ctx.role,
        "rank": ctx.rank,
        "local_rank": ctx.local_rank,
        "world_size": ctx.world_size,
        "tp_rank": ctx.tp_rank,
        "dp_rank": ctx.dp_rank,
        "platform": ctx.platform,
    }


def _wait_for_stop(ctx) -> None:
    ctx.stopping.wait()


def ready_then_wait(server_args, ctx) -> None:
    # TESTWORKER_DEVICES: the accelerator count a real scheduler reports from torch (this
    # machine has none, so a test says how many its schedulers claim to see).
    devices = os.environ.get("TESTWORKER_DEVICES")
    extra = {"devices": int(devices)} if devices and ctx.role == "scheduler" else {}
    ctx.ready(**_identity(ctx), port=server_args.port, model_path=server_args.model_path, **extra)
    _marker()
    _wait_for_stop(ctx)


def spin_on_stopping(server_args, ctx) -> None:
    """Ready, then poll ``ctx.stopping`` in a tight loop on the main thread: a SIGTERM then
    lands, nearly always, while this thread holds the event's own lock."""
    ctx.ready(**_identity(ctx))
    _marker()
    while not ctx.stopping.wait(0):
        pass


def signal_a_fork(server_args, ctx) -> None:
    pid = os.fork()
    if pid == 0:  # the copy keeps the bootstrap's SIGTERM handler and its own ctx.stopping
        while not ctx.stopping.is_set():
            time.sleep(0.01)
        os._exit(0)
    ctx.ready(**_identity(ctx), fork=pid)
    os.kill(pid, signal.SIGTERM)
    _, status = os.waitpid(pid, 0)
    # The copy's signal is its own. Nothing marks the moment a wrong stop would have arrived by,
    # so the worker gives it a second: long enough to catch one, never needed to pass.
    stopped_by_fork = ctx.stopping.wait(1.0)
    _marker()
    _wait_for_stop(ctx)
    ctx.stopped(stopped_by_fork=stopped_by_fork, fork_status=status)


def report_args(server_args, ctx) -> None:
    import dataclasses

    fields = {f.name: getattr(server_args, f.name) for f in dataclasses.fields(server_args)}
    cls = type(server_args)
    ctx.ready(
        **_identity(ctx),
        args_class=f"{cls.__module__}.{cls.__qualname__}",
        fields=fields,
        env={k: v for k, v in os.environ.items() if k.startswith(("TESTWORKER_", "RANK", "WORLD"))},
        endpoint=ctx.endpoint("probe") if ctx.runtime_dir else None,
    )
    _marker()
    _wait_for_stop(ctx)


def raise_error(server_args, ctx) -> None:
    raise RuntimeError("worker failed on purpose")


def raise_after_ready(server_args, ctx) -> None:
    ctx.ready(**_identity(ctx))
    _marker()
    raise RuntimeError("worker failed on purpose after ready")


def return_early(server_args, ctx) -> None:
    ctx.ready(**_identity(ctx))


def raise_on_stop(server_args, ctx) -> None:
    ctx.ready(**_identity(ctx))
    _wait_for_stop(ctx)
    raise RuntimeError("worker failed on purpose while stopping")


def hang(server_args, ctx) -> None:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    _marker()
    while True:
        time.sleep(3600)


def ignore_stop(server_args, ctx) -> None:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    ctx.ready(**_identity(ctx))
    _marker()
    while True:
        time.sleep(3600)


def exit_with_code(server_args, ctx) -> None:
    sys.stderr.flush()
    os._exit(int(os.environ.get("TESTWORKER_EXIT_CODE", "3")))


def os_exit_after_ready(server_args, ctx) -> None:
    ctx.ready(**_identity(ctx))
    _marker()
    os._exit(int(os.environ.get("TESTWORKER_EXIT_CODE", "3")))


def kill_self(server_args, ctx) -> None:
    sig = getattr(signal, os.environ.get("TESTWORKER_SIGNAL", "SIGKILL"))
    os.kill(os.getpid(), sig)
    time.sleep(60)  # only reached for a signal the process survives


def import_torch(server_args, ctx) -> None:
    import torch

    ctx.ready(**_identity(ctx), torch=torch.__version__)
    _marker()
    _wait_for_stop(ctx)


def spawn_grandchild(server_args, ctx) -> None:
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(3600)"])
    try:
        ctx.ready(**_identity(ctx), grandchild=child.pid)
        _marker()
        _wait_for_stop(ctx)
    finally:
        child.terminate()
        child.wait()


def custom_phases(server_args, ctx) -> None:
    ctx.phase("model_loaded")
    ctx.phase("warmed_up")
    ctx.ready(**_identity(ctx))
    _wait_for_stop(ctx)


def chatty_ready(server_args, ctx) -> None:
    """Writes ``TESTWORKER_LINES`` (default 5) numbered lines to stdout and stderr in turn,
    each naming the worker, before and after it reports a phase of its own; then ready, waits."""
    count = int(os.environ.get("TESTWORKER_LINES", "5"))
    name = f"{ctx.role}.{ctx.rank}"
    for i in range(count):
        # One write per line: with PYTHONUNBUFFERED, print() writes the text and its newline
        # apart, and two workers sharing one file could interleave between them.
        stream = sys.stderr if i % 2 else sys.stdout
        stream.write(f"log line {i} of {name}\n")
        stream.flush()
        if i == count // 2:
            ctx.phase("warming_up")
    ctx.ready(**_identity(ctx))
    _wait_for_stop(ctx)


def fail_on_last_rank(server_args, ctx) -> None:
    """The last scheduler rank raises once every other rank is running (their marker files
    exist); every other worker never reports ready and ignores SIGTERM, as a rank blocked in a
    collective would. ``TESTWORKER_RANKS_DIR`` is a folder: each waiting worker creates
    ``<role>.<rank>`` in it."""
    folder = os.environ["TESTWORKER_RANKS_DIR"]
    if ctx.role == "scheduler" and ctx.rank == ctx.world_size - 1:
        others = [f"scheduler.{r}" for r in range(ctx.world_size - 1)]
        while not all(os.path.exists(os.path.join(folder, n)) for n in others):
            time.sleep(0.01)
        raise RuntimeError("the last rank failed on purpose")
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    open(os.path.join(folder, f"{ctx.role}.{ctx.rank}"), "w").close()
    while True:
        time.sleep(3600)


def fail_when_model_says(server_args, ctx) -> None:
    folder = server_args.model_path
    marker = os.path.join(folder, "fail") if folder else ""
    if marker and os.path.exists(marker):
        with open(marker) as fh:
            allowed = int(fh.read().strip() or 0)
        started = len([n for n in os.listdir(folder) if n.startswith("started.")])
        open(os.path.join(folder, f"started.{os.getpid()}"), "w").close()
        if started >= allowed:
            raise RuntimeError(f"worker failed on purpose: {folder} cannot be loaded")
    ready_then_wait(server_args, ctx)


_DETACH = """
import subprocess, sys
p = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(3600)"], start_new_session=True,
                     stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
print(p.pid, flush=True)
"""


def spawn_descendants(server_args, ctx) -> None:
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(3600)"])
    # The intermediate starts a setsid grandchild and exits: the grandchild is orphaned at once.
    middle = subprocess.run(
        [sys.executable, "-c", _DETACH], capture_output=True, text=True, check=True
    )
    ctx.ready(**_identity(ctx), child=child.pid, detached=int(middle.stdout.split()[0]))
    _marker()
    _wait_for_stop(ctx)


def never_ready(server_args, ctx) -> None:
    ctx.phase("loading")
    _marker()
    _wait_for_stop(ctx)


def start_children_nonstop(server_args, ctx) -> None:
    import collections

    keep = int(os.environ.get("TESTWORKER_KEEP", "40"))
    ready = os.environ.get("TESTWORKER_NEVER_READY") != "1"
    alive: collections.deque[subprocess.Popen] = collections.deque()
    started = 0
    while not ctx.stopping.is_set():
        alive.append(subprocess.Popen(["sleep", "3600"], stdin=subprocess.DEVNULL))
        started += 1
        if len(alive) > keep:
            oldest = alive.popleft()
            oldest.kill()
            oldest.wait()
        if started == keep:
            _marker()
            if ready:
                ctx.ready(**_identity(ctx))
        time.sleep(0.005)
    for child in alive:
        child.kill()
        child.wait()
