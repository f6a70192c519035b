"""Run the checks in a spawned child through the same bootstrap as workers, and collect them.

``run_child(runtime, timeout)`` makes a private directory (mode 0700), binds a ZeroMQ PULL socket
there for the bootstrap's status messages, and spawns ``bootstrap.run`` with a local ``spawn``
context and a ``ProcessSpec`` whose target is ``child.run_checks``. Nothing is pinned: the child
selects its platform from the same environment a launch reads, so this process never imports
torch (built-in probing would). It waits on the status socket and the child's sentinel at once,
under one deadline; on ``ready`` it asks the child to stop (SIGTERM), and whatever happens it
leaves no process behind. The child's stdout is pointed at this process's stderr, so a plugin
that prints cannot corrupt ``--json`` output.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass
from typing import NamedTuple

from . import journal

TARGET = "launcher.conformance.child:run_checks"
_STOP_GRACE_S = 10.0  # for the child to wind down after SIGTERM before it is killed
_SETTLE_QUIET_S = 0.2  # a dead child's last status messages: wait until the socket is this quiet
_SETTLE_MAX_S = 2.0


class SetupError(RuntimeError):
    """This process could not prepare or start the check process; the message names the fix."""


@dataclass
class _CheckArgs:
    """The check process's ServerArgs payload: only the runtime (every other field keeps its
    default in the child, where the bootstrap decodes it into the real ServerArgs class)."""

    runtime: str


class ChildResult(NamedTuple):
    """How the check process went: its journal, the last bootstrap phase it reported
    (``"starting"`` if none), its ``failed`` report (``bootstrap.messages`` as a dict) if any,
    its exit code (negative: killed by that signal), and whether it finished or timed out."""

    journal: journal.Reading
    reached: str
    failure: dict | None
    exitcode: int | None
    ready: bool
    timed_out: bool
    timeout: float


@contextlib.contextmanager
def _stdout_to_stderr():
    """While a child is started, fd 1 is this process's stderr, so the child inherits that."""
    sys.stdout.flush()
    saved = os.dup(1)
    os.dup2(2, 1)
    try:
        yield
    finally:
        os.dup2(saved, 1)
        os.close(saved)


class _Status:
    def __init__(self) -> None:
        self.reached = "starting"
        self.failure: dict | None = None
        self.ready = False

    def take(self, frame: bytes) -> None:
        from bootstrap import messages

        try:
            message = messages.decode(frame)
        except messages.MessageError:
            return  # only our child knows this private endpoint; ignore what cannot be ours
        if isinstance(message, messages.Phase):
            self.reached = message.phase
        elif isinstance(message, messages.Ready):
            self.ready = True
        elif isinstance(message, messages.Failed):
            self.failure = messages.to_dict(message)


def _drain(socket, status: _Status) -> None:
    import zmq

    while True:
        try:
            status.take(socket.recv(zmq.NOBLOCK))
        except zmq.Again:
            return


def _settle(socket, status: _Status) -> None:
    """Messages a dead child sent just before it died travel apart from its exit: take them."""
    import zmq

    poller = zmq.Poller()
    poller.register(socket, zmq.POLLIN)
    deadline = time.monotonic() + _SETTLE_MAX_S
    while time.monotonic() < deadline and poller.poll(_SETTLE_QUIET_S * 1000):
        _drain(socket, status)


def _stop(process, grace: float) -> None:
    """SIGTERM the child's tree, SIGKILL what is left after ``grace``; reap the child."""
    import asyncio

    from launcher import _proctree

    if process.exitcode is None and process.pid:
        asyncio.run(_proctree.stop_trees([process.pid], grace))
    process.join(timeout=10)


def run_child(runtime: str, timeout: float) -> ChildResult:
    """Run the checks of ``runtime`` in a spawned bootstrap child; never leaves it running."""
    import multiprocessing

    import zmq

    import bootstrap

    try:
        workdir = tempfile.mkdtemp(prefix="sglang-check-")
    except OSError as exc:
        raise SetupError(
            f"cannot create a private directory for the check process: {exc}; set TMPDIR to a "
            "writable directory"
        ) from exc
    context = zmq.Context(1)
    socket = context.socket(zmq.PULL)
    socket.setsockopt(zmq.LINGER, 0)
    process = None
    status = _Status()
    timed_out = False
    try:
        endpoint = f"ipc://{workdir}/status"
        try:
            socket.bind(endpoint)
        except zmq.ZMQError as exc:
            raise SetupError(
                f"cannot listen on {endpoint}: {exc}; set TMPDIR to a short, writable directory"
            ) from exc
        spec = bootstrap.ProcessSpec(
            role="check",
            target=TARGET,
            payload=bootstrap.encode_payload(_CheckArgs(runtime)),
            status_endpoint=endpoint,
            runtime=runtime,
            platform_key=None,  # select in the child, from the same environment a launch reads,
            serving_fallback=True,  # and by the same rule a launch follows
            runtime_dir=workdir,
            log_level="warning",
        )
        process = multiprocessing.get_context("spawn").Process(
            target=bootstrap.run, args=(spec,), name=spec.worker_id
        )
        with _stdout_to_stderr():
            process.start()

        poller = zmq.Poller()
        poller.register(socket, zmq.POLLIN)
        poller.register(process.sentinel, zmq.POLLIN)
        deadline = time.monotonic() + timeout
        stop_sent = False
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                timed_out = not status.ready
                break
            events = dict(poller.poll(remaining * 1000))
            if socket in events:
                _drain(socket, status)
            if status.ready and not stop_sent:
                process.terminate()  # a worker runs until asked to stop; the checks are done
                stop_sent = True
                deadline = time.monotonic() + _STOP_GRACE_S
            if process.sentinel in events:
                break
        if not timed_out:
            _settle(socket, status)
    finally:
        if process is not None and process.pid is not None:
            _stop(process, grace=_STOP_GRACE_S if status.ready else 2.0)
        socket.close()
        context.term()
        reading = journal.read(workdir)
        shutil.rmtree(workdir, ignore_errors=True)
    return ChildResult(
        journal=reading,
        reached=status.reached,
        failure=status.failure,
        exitcode=process.exitcode,
        ready=status.ready,
        timed_out=timed_out,
        timeout=timeout,
    )
