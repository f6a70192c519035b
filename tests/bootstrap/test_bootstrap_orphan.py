"""Orphan protection, for real: SIGKILL a real parent and watch its child disappear.

The parent ("middle") is a fresh interpreter started here; it starts the protected child, prints
the child's pid once the child is armed, and waits. The test SIGKILLs the middle (nothing it could
clean up with) and requires the child to end (polled with a generous deadline: how fast is the
machine's business, that it ends is the contract). An orphaned child is reparented away from
this process, so each test kills it itself if it survives, and fails.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import psutil
import pytest
from support import REPO, clean_env, wait_for

pytestmark = pytest.mark.e2e  # every test here starts the launcher, a server or worker processes

TESTS = Path(__file__).resolve().parents[1]

# A parent that spawns bootstrap.run (a ready_then_wait worker) and prints the child's pid once
# it reported ready, so its guard process and the watch thread are both armed.
SPAWNING_PARENT = """
import multiprocessing, os, sys, tempfile, time
import zmq
import bootstrap, platforms
from bootstrap import messages
from launchspec.server_args import ServerArgs, encode_server_args

if __name__ == "__main__":
    platforms.pin_selection("builtin:cpu")
    runtime_dir = tempfile.mkdtemp(prefix="bo-")
    pull = zmq.Context().socket(zmq.PULL)
    pull.bind(f"ipc://{runtime_dir}/status")
    spec = bootstrap.ProcessSpec(role="scheduler", target="support.workers.ready_then_wait",
                                 payload=encode_server_args(ServerArgs()),
                                 status_endpoint=f"ipc://{runtime_dir}/status",
                                 args_class="launchspec.server_args.ServerArgs",
                                 platform_key="builtin:cpu", runtime_dir=runtime_dir)
    child = multiprocessing.get_context("spawn").Process(target=bootstrap.run, args=(spec,))
    child.start()
    while True:
        msg = messages.decode(pull.recv())
        if msg.pid == child.pid and type(msg).__name__ in ("Ready", "Failed"):
            break
    print(type(msg).__name__, child.pid, flush=True)
    time.sleep(600)
"""

# A parent that starts a plain subprocess arming only the watch thread (no PR_SET_PDEATHSIG):
# the second line of defence, and the only one off Linux.
WATCHING_PARENT = """
import os, subprocess, sys, time
child = subprocess.Popen(
    [sys.executable, "-c",
     "import os, sys, time\\n"
     "from bootstrap import orphan\\n"
     "armed = orphan.arm(int(sys.argv[1]), death_signal=False, guard=False)\\n"
     "assert armed['watch_thread'] and not armed['death_signal'] and not armed['guard'], armed\\n"
     "print('armed', flush=True)\\n"
     "time.sleep(600)\\n",
     str(os.getpid())],
    stdout=subprocess.PIPE, text=True)
assert child.stdout.readline().strip() == "armed"
print("Armed", child.pid, flush=True)
time.sleep(600)
"""


def _start_parent(code: str) -> tuple[subprocess.Popen, int]:
    env = clean_env(
        PYTHONPATH=os.pathsep.join([str(TESTS), str(REPO)]), PYTHONDONTWRITEBYTECODE="1"
    )
    parent = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(code)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        cwd=str(REPO),
    )
    line: list[str] = []
    reader = threading.Thread(target=lambda: line.append(parent.stdout.readline()), daemon=True)
    reader.start()
    reader.join(60)
    if not line or not line[0].strip():
        parent.kill()
        _, err = parent.communicate(timeout=30)
        pytest.fail(f"the parent never reported its child: {err}")
    state, pid = line[0].split()
    if state not in ("Ready", "Armed"):
        parent.kill()
        _, err = parent.communicate(timeout=30)
        pytest.fail(f"the child did not start ({state}): {err}")
    return parent, int(pid)


def _gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def _kill_parent_and_expect_child_gone(parent: subprocess.Popen, child_pid: int) -> None:
    child = psutil.Process(child_pid)
    assert child.ppid() in (parent.pid,) or child.parent().pid == parent.pid
    try:
        os.kill(parent.pid, signal.SIGKILL)
        parent.wait(30)
        wait_for(lambda: _gone(child_pid), 60, "the child to end with its SIGKILLed parent")
    finally:
        if not _gone(child_pid):
            child.kill()
        if parent.poll() is None:
            parent.kill()
            parent.wait(30)
        for stream in (parent.stdout, parent.stderr):
            stream.close()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux-only")
def test_bootstrap_child_dies_with_its_sigkilled_parent():
    parent, child_pid = _start_parent(SPAWNING_PARENT)
    _kill_parent_and_expect_child_gone(parent, child_pid)


def test_watch_thread_alone_kills_the_orphan():
    parent, child_pid = _start_parent(WATCHING_PARENT)
    _kill_parent_and_expect_child_gone(parent, child_pid)


# A parent whose spawn child runs nothing of sglang-launch's (a bare time.sleep) but carries an
# ``ArmedName``: unpickling that name is the child's first step, which alone must end it with its
# parent. The parent reports the child the moment start() returns, and is killed at once: the
# child may not even have started its interpreter.
ARMED_NAME_PARENT = """
import multiprocessing, time
from bootstrap.early_guard import ArmedName

if __name__ == "__main__":
    child = multiprocessing.get_context("spawn").Process(
        target=time.sleep, args=(600,), name=ArmedName("sleeper"))
    child.start()
    print("Armed", child.pid, flush=True)
    time.sleep(600)
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux-only")
def test_a_spawn_child_with_an_armed_name_dies_with_its_parent_before_its_own_code_runs():
    for _ in range(3):  # the parent dies at a different point of the child's start-up each time
        parent, child_pid = _start_parent(ARMED_NAME_PARENT)
        _kill_parent_and_expect_child_gone(parent, child_pid)


NOT_THE_PARENT = """
import multiprocessing, os, time
from bootstrap.early_guard import ArmedName
from bootstrap.phases import EXIT_PARENT_GONE

if __name__ == "__main__":
    child = multiprocessing.get_context("spawn").Process(
        target=time.sleep, args=(600,), name=ArmedName("sleeper", parent_pid=os.getpid() + 7_000_000))
    child.start()
    child.join(60)
    if child.exitcode is None:
        child.kill()
    print("Exit", child.exitcode, "expected", EXIT_PARENT_GONE, flush=True)
"""


def test_a_spawn_child_whose_parent_is_not_the_one_named_exits_before_its_target():
    """The re-check of the race the death signal cannot cover: the parent died (the child was
    re-parented) before the signal was armed. Here the pid named is not the parent's: the child
    exits with EXIT_PARENT_GONE instead of running its target (600 s of sleep)."""
    env = clean_env(
        PYTHONPATH=os.pathsep.join([str(TESTS), str(REPO)]), PYTHONDONTWRITEBYTECODE="1"
    )
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(NOT_THE_PARENT)],
        capture_output=True,
        text=True,
        env=env,
        cwd=str(REPO),
        timeout=120,
    )
    words = done.stdout.split()
    assert len(words) == 4 and words[1] == words[3], done
