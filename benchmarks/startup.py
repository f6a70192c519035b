"""Start-up, failure detection and teardown of the supervisor, against the floor, in one run.

    .venv/bin/python benchmarks/startup.py [--reps 5] [--detect-reps 5]

1. Start-up: for N = 1, 2, 4 scheduler workers (plus the one HTTP child every launch on node 0
   has), the time from ``Launcher.start()`` to its return with every worker ready, against the
   floor: the same number of bare ``spawn`` children that import the same modules as a
   bootstrapped worker and each send one ZeroMQ message, timed from the first ``start()`` to the
   last message. Contender and floor alternate within each repetition; medians and their ratio
   (target: at most 1.15). A second floor also reads the installed entry points once per child,
   for reference: bootstrapped workers skip that scan, adopting the supervisor's one reading
   (``ProcessSpec.entry_points``).
2. Failure detection: a worker that imported torch exits (``os._exit``) after ready; the latency
   from the moment just before its exit to the supervisor's ``worker.scheduler.0.exited`` event.
   p50 (target: under 50 ms).
3. Teardown: ``Launcher.stop()`` of a ready launch whose workers obey SIGTERM, until every process
   is gone. p50 (target: under 100 ms).
4. Failure paths, from the command to its exit (``sglang-launch`` as a fresh process, median):
   a busy HTTP port, and an encoder model with ``--tp-size 2`` (the embedded all-MiniLM-L6-v2); both
   exit 2 before any worker is spawned (target: under 2 s). Beside them ``sglang-launch --help``
   (no torch, no platform selection) and a bare interpreter, the floors they are compared with.

``--failures-only`` runs part 4 alone.

Module scope is standard library only: ``spawn`` children re-run it.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

# What a bootstrapped worker imports before its target runs (bootstrap.run's steps).
WORKER_MODULES = (
    "bootstrap",
    "bootstrap.messages",
    "bootstrap.reporter",
    "platforms",
    "hooks",
    "launchspec.server_args",
    "msgspec",
    "zmq",
)


# -- worker targets (children; resolved by dotted path ``startup.<name>``) ---------------------------
def ready_and_wait(server_args, ctx) -> None:
    ctx.ready()
    ctx.stopping.wait()


def torch_then_exit_on_trigger(server_args, ctx) -> None:
    """Import torch, report ready, and when the trigger file appears, note the time and exit."""
    import torch  # noqa: F401 - the probe is a worker that imported torch

    trigger = Path(os.environ["BENCH_TRIGGER"])
    ctx.ready()
    while not trigger.exists():
        if ctx.stopping.wait(0.0005):
            return
    Path(os.environ["BENCH_EXIT_TIME"]).write_text(repr(time.time()))
    os._exit(3)


def floor_child(endpoint: str, name: str, scan: bool = False) -> None:
    """The floor: import what a worker imports (and, with ``scan``, read the installed entry
    points as every worker must), send one message, wait to be terminated."""
    import importlib

    for module in WORKER_MODULES:
        importlib.import_module(module)
    if scan:
        from platforms import entrypoints

        entrypoints.entry_points(entrypoints.SRT_PLUGINS)
    import zmq

    zctx = zmq.Context()
    sock = zctx.socket(zmq.PUSH)
    sock.connect(endpoint)
    sock.send(name.encode())
    time.sleep(3600)


# -- measurements ---------------------------------------------------------------------------------
def launcher_kwargs(n: int, **extra) -> dict:
    kwargs = dict(
        dp_size=n,
        scheduler_target="startup.ready_and_wait",
        http_target="startup.ready_and_wait",
        port=_free_port(),
        startup_timeout=120,
        stop_grace_period=10,
    )
    kwargs.update(extra)
    return kwargs


def time_contender(n: int) -> tuple[float, float]:
    """(seconds from start() to all-ready, seconds stop() took)."""
    from launcher import Launcher

    launcher = Launcher(**launcher_kwargs(n))
    began = time.perf_counter()
    try:
        launcher.start()
        ready = time.perf_counter() - began
    finally:
        began = time.perf_counter()
        launcher.stop()
        stopped = time.perf_counter() - began
    return ready, stopped


def time_floor(processes: int, scan: bool = False) -> float:
    import multiprocessing

    import zmq

    zctx = zmq.Context()
    pull = zctx.socket(zmq.PULL)
    endpoint = f"ipc://{tempfile.mkdtemp(prefix='sglb')}/floor"
    pull.bind(endpoint)
    context = multiprocessing.get_context("spawn")
    children = [
        context.Process(target=floor_child, args=(endpoint, str(i), scan)) for i in range(processes)
    ]
    began = time.perf_counter()
    try:
        for child in children:
            child.start()
        for _ in children:
            pull.recv()
        return time.perf_counter() - began
    finally:
        for child in children:
            child.terminate()
        for child in children:
            child.join()
        pull.close(0)
        zctx.term()


def time_detection(work: Path) -> float:
    """Seconds from a torch-importing worker's exit to the supervisor's exited event."""
    from launcher import Launcher, LaunchError

    trigger, exit_time = work / "trigger", work / "exit_time"
    for path in (trigger, exit_time):
        path.unlink(missing_ok=True)
    os.environ["BENCH_TRIGGER"], os.environ["BENCH_EXIT_TIME"] = str(trigger), str(exit_time)
    launcher = Launcher(**launcher_kwargs(1, scheduler_target="startup.torch_then_exit_on_trigger"))
    launcher.start()
    known = None
    try:
        stream = launcher.events()
        next(stream)  # the snapshot
        trigger.write_text("go")
        for event in stream:
            if event["topic"] == "worker.scheduler.0.exited":
                known = event["time"]
                break
        try:
            launcher.wait_ready(60)
        except LaunchError:
            pass  # the launch fails, as it should when a worker dies
    finally:
        launcher.stop()
    return known - float(exit_time.read_text())


def time_command(argv: list[str], expect: int) -> float:
    """Seconds from starting ``python ARGV`` to its exit, which must be ``expect``."""
    import subprocess

    env = dict(os.environ, SGLANG_USE_CPU_ENGINE="1", HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    env.pop("PYTHONDONTWRITEBYTECODE", None)  # an installed package has its bytecode cached
    began = time.perf_counter()
    done = subprocess.run([sys.executable, *argv], env=env, capture_output=True, text=True)
    took = time.perf_counter() - began
    if done.returncode != expect:
        raise SystemExit(f"{argv} exited {done.returncode}, expected {expect}:\n{done.stderr}")
    return took


def failure_paths(reps: int) -> dict[str, list[float]]:
    """Part 4: each failure path and its floors, alternated within each repetition."""
    import socket

    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        busy = str(holder.getsockname()[1])
        cases = {
            "python -c pass (interpreter)": (["-c", "pass"], 0),
            "sglang-launch --help": (["-m", "launcher", "--help"], 0),
            "busy port (exit 2)": (["-m", "launcher", "--port", busy], 2),
            "encoder + --tp-size 2 (exit 2)": (
                ["-m", "launcher", "--model-path", "all-MiniLM-L6-v2", "--tp-size", "2"]
                + ["--port", str(_free_port())],
                2,
            ),
        }
        times: dict[str, list[float]] = {name: [] for name in cases}
        for argv, code in cases.values():
            time_command(argv, code)  # warm the file cache
        for _ in range(reps):
            for name, (argv, code) in cases.items():
                times[name].append(time_command(argv, code))
    help_median = statistics.median(times["sglang-launch --help"])
    print(f"failure paths, command to exit, median of {reps} (target < 2 s; ratio against --help)")
    for name, values in times.items():
        median = statistics.median(values)
        print(f"  {name:<32} {_ms(median)}  (max {_ms(max(values))})  {median / help_median:5.2f}x")
    return times


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _ms(seconds: float) -> str:
    return f"{seconds * 1000:8.1f} ms"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--reps", type=int, default=5, help="repetitions per N (start-up, teardown)"
    )
    parser.add_argument("--detect-reps", type=int, default=5, help="launches for failure detection")
    parser.add_argument("--sizes", type=int, nargs="+", default=[1, 2, 4])
    parser.add_argument(
        "--failures-only", action="store_true", help="run only part 4, the failure paths"
    )
    ns = parser.parse_args()
    os.environ.setdefault("XDG_RUNTIME_DIR", tempfile.mkdtemp(prefix="sglb"))
    if ns.failures_only:
        print(json.dumps({"failure_paths_s": failure_paths(ns.reps)}))
        return

    time_contender(1)  # warm-up: the first launch pays this process's platform selection
    time_floor(1)
    print(
        f"start-up to all-ready, median of {ns.reps} (N scheduler workers + 1 HTTP child; floor: N+1 bare spawn children)"
    )
    print(
        "  (floor+scan: bare children that also read the installed entry points themselves; workers adopt the supervisor's one reading instead)"
    )
    print(
        f"  {'N':>2}  {'launcher':>11}  {'floor':>11}  {'ratio':>6}  {'floor+scan':>11}  {'ratio':>6}  (target <= 1.15)"
    )
    teardowns = []
    for n in ns.sizes:
        contender, floor, scanned = [], [], []
        for _ in range(ns.reps):
            ready, stopped = time_contender(n)
            contender.append(ready)
            teardowns.append(stopped)
            floor.append(time_floor(n + 1))
            scanned.append(time_floor(n + 1, scan=True))
        c, f, fs = (
            statistics.median(contender),
            statistics.median(floor),
            statistics.median(scanned),
        )
        print(f"  {n:>2}  {_ms(c)}  {_ms(f)}  {c / f:6.2f}  {_ms(fs)}  {c / fs:6.2f}")

    with tempfile.TemporaryDirectory() as work:
        detections = [time_detection(Path(work)) for _ in range(ns.detect_reps)]
    print(
        f"failure detection, worker that imported torch: p50 {_ms(statistics.median(detections))}"
        f"  (max {_ms(max(detections))}, n={len(detections)}; target < 50 ms)"
    )
    print(
        f"teardown of a tree that obeys SIGTERM (Launcher.stop()): p50 {_ms(statistics.median(teardowns))}"
        f"  (max {_ms(max(teardowns))}, n={len(teardowns)}; target < 100 ms)"
    )
    failures = failure_paths(ns.reps)
    print(
        json.dumps(
            {"detection_s": detections, "teardown_s": teardowns, "failure_paths_s": failures}
        )
    )


if __name__ == "__main__":
    main()
