"""A launcher whose output reader goes away (``sglang-launch 2>&1 | head -n 1``, a killed ``tee``)
keeps serving without spinning, stops at once on SIGTERM and exits 0; the ops events still say
everything.

Real ``sglang-launch`` processes whose stderr is a real pipe: the test reads the first line, as
``head -n 1`` does, and closes its end.
"""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import time

import psutil
import pytest
from support import REPO, free_port, wait_for
from support.supervisor import FAST, READY_WAIT, Run

pytestmark = pytest.mark.e2e

ARGS = [*FAST, "--scheduler-target", READY_WAIT, "--http-target", READY_WAIT]


def _first_line(fd: int, timeout: float) -> bytes:
    """Read up to the first newline from ``fd``, as ``head -n 1`` does."""
    data = b""
    deadline = time.monotonic() + timeout
    while b"\n" not in data:
        left = deadline - time.monotonic()
        assert left > 0, f"no first line within {timeout}s (read {data!r})"
        if select.select([fd], [], [], left)[0]:
            chunk = os.read(fd, 1)
            assert chunk, f"the pipe closed before a line (read {data!r})"
            data += chunk
    return data


def _follow_events(run: Run) -> subprocess.Popen:
    """``sglang-launch events --follow`` against ``run``, its JSON lines on a pipe."""
    return subprocess.Popen(
        [sys.executable, "-m", "launcher", "events", "--follow", "--pid", str(run.pid)],
        env=run.env,
        cwd=str(REPO),
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )


def test_a_launcher_whose_stderr_reader_exits_serves_on_and_stops_promptly():
    read_end, write_end = os.pipe()
    try:
        run = Run([*ARGS, "--port", str(free_port())], stderr=write_end)
    finally:
        os.close(write_end)
    with run:
        try:
            assert b"sglang-launch" in _first_line(read_end, 60)
        finally:
            os.close(read_end)  # the reader is gone: every later write meets a broken pipe
        run.wait_ready()
        follower = _follow_events(run)
        try:
            # Writes to the broken pipe: a log line for each of these signals.
            for sig in (signal.SIGUSR1, signal.SIGPIPE, signal.SIGUSR2, signal.SIGPIPE):
                os.kill(run.pid, sig)
            launcher = psutil.Process(run.pid)
            cpu_before, wall_before = sum(launcher.cpu_times()[:2]), time.monotonic()
            answered = 0

            def twenty_snapshots() -> bool:
                nonlocal answered
                snap = run.snapshot()
                assert snap is not None and snap["phase"] == "ready", snap
                answered += 1
                return answered >= 20

            wait_for(twenty_snapshots, 60, "twenty status snapshots", interval=0.05)
            cpu = sum(launcher.cpu_times()[:2]) - cpu_before
            wall = time.monotonic() - wall_before
            assert cpu < 0.5 * wall, f"the launcher spins: {cpu:.2f}s of CPU in {wall:.2f}s"

            os.kill(run.pid, signal.SIGTERM)
            assert run.wait(30) == 0, run
            out, _ = follower.communicate(timeout=30)
        finally:
            if follower.poll() is None:
                follower.kill()
                follower.wait()
        lines = [json.loads(line) for line in out.splitlines() if line.strip()]
        assert lines[0]["topic"] == "snapshot" and lines[0]["snapshot"]["phase"] == "ready", lines
        assert lines[-1]["topic"] == "server.stopped" and lines[-1]["exit_code"] == 0, lines
        run.assert_nothing_left()
