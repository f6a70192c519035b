"""A worker that stops answering after ready is caught by the watchdog (heartbeats are on by
default): real launchers, real workers stopped with a real SIGSTOP, real HTTP over loopback."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time

import httpx
import pytest
from support import REPO, free_port, wait_for
from support.serving import server_env, start_server
from support.supervisor import FAST, READY_WAIT, Run, short_runtime_dir

pytestmark = pytest.mark.e2e


# A stopped (SIGSTOP) worker cannot act on SIGTERM: the launch's stop waits out the whole
# --stop-grace-period before it kills it. The tests here are about what the watchdog reports, not
# about that wait, so it is short.
GRACE = ("--stop-grace-period", "1")


def test_a_stopped_scheduler_fails_the_launch_with_the_watchdog_as_root_cause():
    args = [
        *FAST,
        *GRACE,
        "--watchdog-timeout",
        "2",
        "--port",
        str(free_port()),
        "--scheduler-target",
        READY_WAIT,
        "--http-target",
        READY_WAIT,
    ]
    with Run(args) as run:
        snap = run.wait_ready()
        scheduler = next(w for w in snap["workers"] if w["role"] == "scheduler")
        os.kill(scheduler["pid"], signal.SIGSTOP)
        assert run.wait(120) == 4, run
        assert "scheduler.0 stopped answering: no heartbeat for" in run.stderr, run
        assert "WatchdogTimeout" in run.stderr and "--watchdog-timeout" in run.stderr
        run.assert_nothing_left()


def test_health_turns_503_when_a_scheduler_stops_answering(tmp_path, capsys):
    runtime_dir = short_runtime_dir()
    env = server_env(XDG_RUNTIME_DIR=runtime_dir)
    server = start_server(["--watchdog-timeout", "3", *GRACE], tmp_path, "watchdog", env=env)
    try:
        status = subprocess.run(
            [sys.executable, "-m", "launcher", "status", "--json"],
            env=env,
            cwd=str(REPO),
            capture_output=True,
            text=True,
            timeout=60,
        )
        scheduler = next(
            w for w in json.loads(status.stdout)["workers"] if w["role"] == "scheduler"
        )
        assert httpx.get(server.url + "/health", timeout=10).status_code == 200
        stopped = time.monotonic()
        os.kill(scheduler["pid"], signal.SIGSTOP)

        seen: list[str] = []

        def unhealthy():
            # 503 while the HTTP child still listens; the launch then fails and stops, HTTP first,
            # so a poll that comes later finds the port closed: both mean "not healthy".
            try:
                code = httpx.get(server.url + "/health", timeout=5).status_code
            except httpx.ConnectError:
                seen.append("refused")
                return True
            except httpx.HTTPError:
                return False
            seen.append(str(code))
            return code == 503

        wait_for(unhealthy, 30, "/health to stop answering 200")
        with capsys.disabled():
            print(
                f"\n/health {seen[-1]} {time.monotonic() - stopped:.2f}s after SIGSTOP (--watchdog-timeout 3)"
            )
        assert server.wait_exit(60) == 4, server.log
        assert "scheduler.0 stopped answering" in server.log
    finally:
        server.stop()
        shutil.rmtree(runtime_dir, ignore_errors=True)
