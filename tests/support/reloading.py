"""Helpers for the reload and scale tests through the real CLI (no tests here): a client load in
a thread, and ``sglang-launch status/reload/scale`` against one launch."""

from __future__ import annotations

import json
import subprocess
import threading

import httpx

from support import wait_for
from support.serving import cli_command, server_env
from support.supervisor import short_runtime_dir

# Each of the four clients waits this long after every answer: a request is under way or arrives
# every few tens of milliseconds through every change, while the cores stay free enough for the
# replicas being started.
LOAD_PAUSE = 0.1


class Load:
    """``run(url, body, stop_event=...)`` in a thread until ``finish()``: its result."""

    def __init__(self, run, url: str, body, **kwargs) -> None:
        self.stop = threading.Event()
        self.result: dict = {}
        self.thread = threading.Thread(
            target=lambda: self.result.update(
                run(url, body, clients=4, seconds=600, stop_event=self.stop, **kwargs)
            ),
            daemon=True,
        )
        self.thread.start()

    def finish(self) -> dict:
        self.stop.set()
        self.thread.join(timeout=240)
        assert not self.thread.is_alive(), "the load did not end"
        return self.result


def reload_env(**extra: str | None) -> dict[str, str]:
    """``server_env(**extra)`` with a runtime directory of its own (short enough for its sockets),
    where ``cli`` finds the launch."""
    return server_env(XDG_RUNTIME_DIR=short_runtime_dir(), **extra)


def cli(
    server, env: dict[str, str], *args: str, timeout: float = 600
) -> subprocess.CompletedProcess:
    """``sglang-launch ARGS --pid <the server's launcher>``, run to its end."""
    return subprocess.run(
        [*cli_command(), *args, "--pid", str(server.proc.pid)],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def schedulers(server, env) -> list[int]:
    """The pids of the launch's ready schedulers (``status --json``), sorted."""
    status = cli(server, env, "status", "--json")
    assert status.returncode == 0, status.stderr
    workers = json.loads(status.stdout)["workers"]
    return sorted(w["pid"] for w in workers if w["role"] == "scheduler" and w["ready"])


def served(server) -> list[str]:
    """The model names ``/v1/models`` lists."""
    return [m["id"] for m in httpx.get(server.url + "/v1/models", timeout=30).json()["data"]]


def until_served(server, route: str) -> None:
    """Until the load has had answers on ``route`` (it is running)."""
    wait_for(
        lambda: (
            f'route="{route}",status="200"' in httpx.get(server.url + "/metrics", timeout=30).text
        ),
        120,
        "the load to run",
        interval=0.2,
    )
