"""No process of a launch outlives it: workers' children and setsid grandchildren included.

Real ``sglang-launch`` processes whose schedulers start a plain child and a double-forked
``setsid`` grandchild (orphaned at once, so a subreaper adopts it) and never stop them. Every
process of a launch carries the launch's tag in its environment, so ``Run.leftovers()`` finds
any of them with psutil wherever they were re-parented.
"""

from __future__ import annotations

import functools
import os
import signal
import sys

import psutil
import pytest
from support import free_port
from support.supervisor import FAST, READY_WAIT, Run, wait_for

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.skipif(
        not sys.platform.startswith("linux"), reason="subreapers and pidfds are Linux's"
    ),
]

ARGS = [
    *FAST,
    "--tp-size",
    "2",
    "--scheduler-target",
    "support.workers.spawn_descendants",
    "--http-target",
    READY_WAIT,
]


def _start(run_args=ARGS) -> tuple[Run, list[dict]]:
    run = Run([*run_args, "--port", str(free_port())])
    try:
        snap = run.wait_ready()
    except BaseException:
        run.stop()
        raise
    schedulers = [w for w in snap["workers"] if w["role"] == "scheduler"]
    for worker in schedulers:
        info = worker["info"]
        # The setsid grandchild's parent exited: it was adopted by its worker, not by pid 1.
        assert psutil.Process(info["detached"]).ppid() == worker["pid"], info
        assert psutil.Process(info["child"]).ppid() == worker["pid"], info
    return run, schedulers


def _tree_pids(schedulers: list[dict]) -> list[int]:
    return [
        pid for w in schedulers for pid in (w["pid"], w["info"]["child"], w["info"]["detached"])
    ]


def _assert_gone_within(run: Run, pids: list[int], seconds: float) -> None:
    def gone():
        alive = [
            p
            for p in pids
            if psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE
        ]
        return not alive and not run.leftovers()

    wait_for(
        gone,
        seconds,
        f"every descendant of the launch to be gone: {[p.pid for p in run.leftovers()]}",
    )


def test_sigkill_of_the_launcher_ends_children_and_setsid_grandchildren():
    run, schedulers = _start()
    with run:
        pids = _tree_pids(schedulers)
        os.kill(run.pid, signal.SIGKILL)
        run.wait(10)
        _assert_gone_within(run, pids, 60)


def test_a_stopped_worker_and_its_tree_end_with_a_sigkilled_launcher():
    """The worker cannot run a line of its own (SIGSTOP): its guard process ends the tree."""
    run, schedulers = _start()
    with run:
        pids = _tree_pids(schedulers)
        os.kill(schedulers[0]["pid"], signal.SIGSTOP)
        wait_for(
            lambda: psutil.Process(schedulers[0]["pid"]).status() == psutil.STATUS_STOPPED,
            10,
            "the worker to stop",
        )
        os.kill(run.pid, signal.SIGKILL)
        run.wait(10)
        _assert_gone_within(run, pids, 60)


def test_a_graceful_stop_ends_descendants_the_worker_left_running():
    run, schedulers = _start()
    with run:
        pids = _tree_pids(schedulers)
        os.kill(run.pid, signal.SIGTERM)
        assert run.wait(60) == 0, run
        _assert_gone_within(run, pids, 60)
        assert "every worker process is gone" in run.stderr


def test_what_a_sigkilled_worker_leaves_behind_is_ended_by_the_launcher():
    """The dead worker's children are adopted by the launcher (a subreaper), which ends them."""
    run, schedulers = _start()
    with run:
        pids = _tree_pids(schedulers)
        os.kill(schedulers[1]["pid"], signal.SIGKILL)
        assert run.wait(60) == 4, run
        assert "scheduler.1 was killed by SIGKILL" in run.stderr
        _assert_gone_within(run, pids, 60)


NONSTOP = [
    *FAST,
    "--tp-size",
    "2",
    "--scheduler-target",
    "support.workers.start_children_nonstop",
    "--http-target",
    READY_WAIT,
]
RUNS = 4


def _schedulers_starting_children(run: Run) -> list[int]:
    """The scheduler pids, once each has started children of its own (the launch still starting)."""

    def busy() -> list[int] | None:
        assert run.proc.poll() is None, run
        snap = run.snapshot()
        pids = [w["pid"] for w in (snap or {}).get("workers", []) if w["role"] == "scheduler"]
        if len(pids) != 2 or not all(pids):
            return None
        try:
            counts = [len(psutil.Process(pid).children()) for pid in pids]
        except psutil.NoSuchProcess:
            return None
        return pids if min(counts) >= 10 else None

    return wait_for(busy, 120, f"both schedulers to start children\n{run}", interval=0.05)


@pytest.mark.parametrize("moment", ["serving", "starting"])
def test_nothing_outlives_a_sigkilled_launcher_whose_workers_start_processes_nonstop(moment):
    """Each scheduler starts a process every few milliseconds, before and after it is ready; the
    launcher is SIGKILLed in the middle of it, several times over. Every process of the launch,
    those started while their worker was being ended included, must be gone."""
    env = {"TESTWORKER_NEVER_READY": "1"} if moment == "starting" else {}
    for _ in range(RUNS):
        with Run([*NONSTOP, "--port", str(free_port())], env=env) as run:
            if moment == "serving":
                snap = run.wait_ready()
                pids = [w["pid"] for w in snap["workers"] if w["role"] == "scheduler"]
            else:
                pids = _schedulers_starting_children(run)
            os.kill(run.pid, signal.SIGKILL)
            run.wait(10)
            _assert_gone_within(run, pids, 60)


EMBEDDING_APP = """
import json, sys, time
from launcher import Launcher


def main():
    launcher = Launcher(
        scheduler_target="support.workers.spawn_descendants",
        http_target="support.workers.ready_then_wait",
        port=int(sys.argv[1]),
        startup_timeout=60,
        stop_grace_period=5,
    )
    launcher.start()
    print("READY:" + json.dumps(launcher.status()["workers"]), flush=True)
    for event in launcher.events():  # until the launch ends (its scheduler is killed)
        pass
    launcher.stop()  # the launch is over: this waits for its thread to finish
    print("ENDED:" + json.dumps(launcher.outcome.exit_code), flush=True)
    time.sleep(3600)  # the application goes on; the test ends it


if __name__ == "__main__":
    main()
"""


def _line(run: Run, prefix: str):
    import json

    def found():
        assert run.proc.poll() is None, str(run)
        lines = [line for line in run.stdout.splitlines() if line.startswith(prefix)]
        return json.loads(lines[0][len(prefix) :]) if lines else None

    return wait_for(found, 120, f"the application to print {prefix}\n{run}", interval=0.05)


def test_what_a_sigkilled_worker_of_an_embedded_launcher_leaves_behind_is_ended(tmp_path):
    """The application is no subreaper: the dead worker's child and ``setsid`` grandchild are
    re-parented away from it, and the launch still ends them (they carry its tag)."""
    app = tmp_path / "app.py"
    app.write_text(EMBEDDING_APP)
    with Run([str(free_port())], command=[sys.executable, str(app)]) as run:
        workers = _line(run, "READY:")
        scheduler = next(w for w in workers if w["role"] == "scheduler")
        info = scheduler["info"]
        os.kill(scheduler["pid"], signal.SIGKILL)
        assert _line(run, "ENDED:") == 4, run
        pids = [scheduler["pid"], info["child"], info["detached"]]

        def gone():
            alive = [
                p
                for p in pids
                if psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE
            ]
            left = [p for p in run.leftovers() if "resource_tracker" not in " ".join(p.cmdline())]
            return not alive and not left

        wait_for(gone, 60, f"the dead worker's descendants to be gone\n{run}")
        assert run.proc.poll() is None, "the application goes on"


# A reload's new replica, the launcher SIGKILLed while it starts: at the first sight of its
# process (still starting the interpreter, or not even executed yet), and once its orphan guard
# stands. The first moment is where a rare race lived (the child ran on until its own code armed
# it): it is tried most.
RELOAD_MOMENTS = ("first sight", "first sight", "first sight", "first sight", "guarded")
GONE_WITHIN = 5.0  # seconds: a child ends at once, or as soon as its interpreter has started


def _new_child(launcher: psutil.Process, before: set[int]) -> psutil.Process:
    def spawned() -> psutil.Process | None:
        fresh = [c for c in launcher.children() if c.pid not in before]
        return fresh[0] if fresh else None

    return wait_for(spawned, 60, "the launcher to start a new process", interval=0.001)


def _guarded(child: psutil.Process) -> bool:
    try:
        return bool(child.children())
    except psutil.NoSuchProcess:
        raise AssertionError("the new replica died before the launcher was killed") from None


def test_nothing_outlives_a_launcher_sigkilled_while_a_reload_spawns_a_replica():
    """Every process of the launch, the replica being spawned and the multiprocessing resource
    tracker included, is gone within seconds of the SIGKILL, at whichever moment it lands."""
    args = [*FAST, "--scheduler-target", READY_WAIT, "--http-target", READY_WAIT]
    for moment in RELOAD_MOMENTS:
        with Run([*args, "--port", str(free_port())]) as run:
            run.wait_ready()
            launcher = psutil.Process(run.pid)
            before = {child.pid for child in launcher.children()}
            os.kill(run.pid, signal.SIGHUP)  # a reload: the new replica first, then the old goes
            replica = _new_child(launcher, before)
            if moment == "guarded":
                wait_for(functools.partial(_guarded, replica), 60, "its orphan guard", 0.005)
            os.kill(run.pid, signal.SIGKILL)
            run.wait(10)
            _assert_all_gone(run, GONE_WITHIN, f"the SIGKILL at the replica's {moment}")


def _assert_all_gone(run: Run, seconds: float, after: str) -> None:
    try:
        wait_for(lambda: not run.leftovers(), seconds, "every process of the launch to be gone")
    except AssertionError as exc:
        raise AssertionError(f"{exc}, {after}; still running: {_named(run)}") from None


def _named(run: Run) -> list[str]:
    """What is left of the launch, by pid and command line (for a failure's message)."""
    named = []
    for proc in run.leftovers():
        try:
            named.append(f"{proc.pid} {' '.join(proc.cmdline())[:120]}")
        except psutil.Error:
            continue
    return named
