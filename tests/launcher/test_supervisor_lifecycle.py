"""A running supervisor from the outside: signals, ops tooling, systemd, the terminal.

Real ``sglang-launch`` processes, real spawned workers (some with children of their own), real
signals, the real ``status`` / ``events`` commands over the launcher's ZeroMQ sockets, and a real
unix datagram socket standing in for systemd's ``NOTIFY_SOCKET``.
"""

from __future__ import annotations

import json
import os
import pty
import queue
import signal
import socket
import subprocess
import sys
import threading
from pathlib import Path

import psutil
import pytest
from support import REPO, free_port
from support.supervisor import FAST, READY_WAIT, Run, wait_for

pytestmark = pytest.mark.e2e  # every test here starts the launcher, a server or worker processes

W = "support.workers."


class Lines:
    """The lines a process writes to a pipe, collected by a thread (so reads can time out)."""

    def __init__(self, stream) -> None:
        self.queue: queue.Queue = queue.Queue()
        self.seen: list[str] = []
        threading.Thread(target=self._pump, args=(stream,), daemon=True).start()

    def _pump(self, stream) -> None:
        for line in stream:
            self.queue.put(line)
        self.queue.put(None)

    def next(self, timeout: float = 30) -> str | None:
        line = self.queue.get(timeout=timeout)
        if line is not None:
            self.seen.append(line)
        return line

    def rest(self, timeout: float = 30) -> list[str]:
        out = []
        while (line := self.next(timeout)) is not None:
            out.append(line)
        return out


class Systemd:
    """A unix datagram socket read continuously, as systemd reads ``NOTIFY_SOCKET``."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(path)
        self.messages: list[str] = []
        threading.Thread(target=self._pump, daemon=True).start()

    def _pump(self) -> None:
        while True:
            try:
                self.messages.append(self.sock.recv(4096).decode())
            except OSError:
                return

    def wait_for(self, text: str) -> list[str]:
        return wait_for(
            lambda: any(text in m for m in self.messages) and self.messages,
            30,
            f"{text} on NOTIFY_SOCKET; got {self.messages}",
        )

    def close(self) -> None:
        self.sock.close()


def test_sigterm_stops_gracefully_and_late_callers_see_everything(tmp_path):
    systemd = Systemd(str(tmp_path / "notify.sock"))
    port = free_port()
    args = [
        *FAST,
        "--port",
        str(port),
        "--tp-size",
        "2",
        "--scheduler-target",
        W + "spawn_grandchild",
        "--http-target",
        READY_WAIT,
    ]
    with Run(args, env={"NOTIFY_SOCKET": systemd.path}) as run:
        run.wait_ready()
        grandchildren = [
            psutil.Process(w["info"]["grandchild"])
            for w in run.snapshot()["workers"]
            if w["role"] == "scheduler"
        ]

        # A late `status` sees every worker, ready, with pid, timings and platform.
        status = run.cli("status", "--json")
        assert status.returncode == 0, status.stderr
        snap = json.loads(status.stdout)
        assert snap["pid"] == run.pid and snap["phase"] == "ready"
        assert snap["url"] == f"http://127.0.0.1:{port}"
        # No plugin, no accelerator: the CPU platform, said in one line.
        assert snap["platform"] == "builtin:cpu"
        assert (
            run.stderr.count(
                "no accelerator and no platform plugin found: serving on the CPU platform"
            )
            == 1
        )
        assert [w["name"] for w in snap["workers"]] == ["http.0", "scheduler.0", "scheduler.1"]
        for w in snap["workers"]:
            assert w["phase"] == "ready" and psutil.pid_exists(w["pid"]) and w["exitcode"] is None
            assert w["platform"] == snap["platform"]
            assert {
                "spawned",
                "platform_initialized",
                "hooks_applied",
                "worker_imported",
                "ready",
            } <= set(w["phases"])
        human = run.cli("status")
        assert human.returncode == 0 and f"http://127.0.0.1:{port}" in human.stdout
        assert "scheduler.1" in human.stdout and "ready" in human.stdout

        # A late `events` starts with the full current state.
        events = run.cli("events")
        first = json.loads(events.stdout.splitlines()[0])
        assert first["topic"] == "snapshot" and first["snapshot"]["phase"] == "ready"
        assert all(w["phase"] == "ready" for w in first["snapshot"]["workers"])

        # A malformed query gets an error reply; the launch does not notice.
        state = json.loads(next(Path(run.runtime_dir, "sglang-launch").glob("*.json")).read_text())
        assert _raw_query(state["query_endpoint"], b"not json")["ok"] is False
        assert (
            "unknown query"
            in _raw_query(state["query_endpoint"], b'{"query": "shutdown"}')["error"]
        )
        history = _raw_query(state["query_endpoint"], b'{"query": "events", "after": 0}')
        assert history["complete"] and history["events"][0]["topic"] == "server.starting"
        assert run.snapshot()["phase"] == "ready"

        # systemd heard READY=1 (and start-up progress before it).
        seen = systemd.wait_for("READY=1")
        assert any(m.startswith("STATUS=starting") for m in seen), seen

        follower = subprocess.Popen(
            [sys.executable, "-m", "launcher", "events", "--follow"],
            env=run.env,
            cwd=str(REPO),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        try:
            lines = Lines(follower.stdout)
            start = json.loads(lines.next())
            assert start["topic"] == "snapshot"

            os.kill(run.pid, signal.SIGTERM)
            assert run.wait(60) == 0, run
            followed = [json.loads(line) for line in lines.rest()]
            assert follower.wait(30) == 0, follower.stderr.read()
        finally:
            if follower.poll() is None:
                follower.kill()
                follower.wait()
        topics = [e["topic"] for e in followed]
        assert topics[0] == "server.stopping" and topics[-1] == "server.stopped", topics
        assert {
            "worker.http.0.exited",
            "worker.scheduler.0.exited",
            "worker.scheduler.1.exited",
        } <= set(topics)
        seqs = [start["seq"]] + [e["seq"] for e in followed]
        assert seqs == list(range(seqs[0], seqs[0] + len(seqs))), f"gaps or repeats in {seqs}"
        # HTTP first, then the schedulers.
        assert topics.index("worker.http.0.exited") < topics.index("worker.scheduler.0.exited")

        systemd.wait_for("STOPPING=1")
        systemd.close()
        assert "stopping (received SIGTERM)" in run.stderr
        run.assert_nothing_left()
        assert not any(p.is_running() for p in grandchildren)
        assert not list(Path(run.runtime_dir, "sglang-launch").iterdir()), (
            "state file and runtime dir removed"
        )


def _raw_query(endpoint: str, data: bytes):
    import zmq

    with zmq.Context() as zctx, zctx.socket(zmq.REQ) as sock:
        sock.setsockopt(zmq.LINGER, 0)
        sock.connect(endpoint)
        sock.send(data)
        assert sock.poll(10_000), "the launcher did not answer"
        reply = sock.recv()
    return json.loads(reply)


def test_sigint_stops_a_worker_that_ignores_sigterm_after_the_grace_period():
    """Ctrl-C on a terminal: the live phase table, the ready line, then SIGKILL after the grace."""
    master, slave = pty.openpty()
    args = [
        "--startup-timeout",
        "60",
        "--stop-grace-period",
        "1",
        "--port",
        str(free_port()),
        "--scheduler-target",
        W + "ignore_stop",
        "--http-target",
        READY_WAIT,
    ]
    with Run(args, stderr=slave) as run:
        os.close(slave)
        screen = _PtyReader(master)
        run.wait_ready()
        wait_for(lambda: "ready at http://" in screen.text, 30, "the ready line on the terminal")
        os.kill(run.pid, signal.SIGINT)
        assert run.wait(60) == 0, screen.text
        run.assert_nothing_left()
        text = screen.close()
    assert "\x1b[" in text, "the phase table is redrawn in place on a terminal"
    assert "scheduler.0" in text and "worker_imported" in text
    assert "stopping (received SIGINT)" in text
    assert "every worker process is gone" in text


class _PtyReader:
    def __init__(self, fd: int) -> None:
        self.fd, self.chunks = fd, []
        self.thread = threading.Thread(target=self._pump, daemon=True)
        self.thread.start()

    def _pump(self) -> None:
        while True:
            try:
                data = os.read(self.fd, 4096)
            except OSError:  # the other end closed
                return
            if not data:
                return
            self.chunks.append(data.decode(errors="replace"))

    @property
    def text(self) -> str:
        return "".join(self.chunks)

    def close(self) -> str:
        self.thread.join(5)
        os.close(self.fd)
        return self.text


def test_sigkill_of_the_supervisor_takes_every_worker_down():
    args = [*FAST, "--tp-size", "2", "--scheduler-target", READY_WAIT, "--http-target", READY_WAIT]
    with Run(args + ["--port", str(free_port())]) as victim:
        runtime_dir = victim.runtime_dir
        with Run(args + ["--port", str(free_port())], runtime_dir=runtime_dir) as other:
            victim.wait_ready()
            other.wait_ready()

            # Two launchers: `status` needs --pid, and says so.
            both = victim.cli("status")
            assert both.returncode == 1 and "2 launchers are running" in both.stderr
            assert str(victim.pid) in both.stderr and "--pid" in both.stderr
            assert victim.cli("status", "--pid", str(victim.pid)).returncode == 0

            workers = [psutil.Process(w["pid"]) for w in victim.snapshot()["workers"]]
            os.kill(victim.pid, signal.SIGKILL)
            victim.wait(10)
            # A zombie has exited: reaping it is its new parent's business (pid 1 here).
            wait_for(
                lambda: not [w for w in workers if _running(w)],
                60,
                f"every worker to end after the supervisor died: {workers}",
            )
            victim.assert_nothing_left(timeout=60)

            # The dead launcher's state file is swept; the survivor is the only one now.
            only = other.cli("status", "--json")
            assert only.returncode == 0, only.stderr
            assert json.loads(only.stdout)["pid"] == other.pid
            assert not Path(runtime_dir, "sglang-launch", str(victim.pid)).exists()

            os.kill(other.pid, signal.SIGTERM)
            assert other.wait(60) == 0, other
            other.assert_nothing_left()


def _running(proc: psutil.Process) -> bool:
    try:
        return proc.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False
