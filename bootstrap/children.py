"""Spawning and watching bootstrap children: the one mechanism behind the supervisor and
``check-platform``.

``Children`` runs on an asyncio loop. It binds the ZeroMQ PULL socket that children report to,
starts each child with a local ``spawn`` context and ``bootstrap.run`` as the target (the
application's global start method is left untouched; the child's process name is an
``early_guard.ArmedName``, so orphan protection is armed before anything of the child runs), and
turns what happens into two callbacks: ``on_message(child, message)`` for every decoded
``bootstrap.messages`` frame from a known child, and ``on_exit(child)`` when a child's sentinel
fires. Around those it offers what both callers need once a child is gone or must go:

- ``reap(child)``: the exit code of a child whose sentinel fired;
- ``settle(child)``: let the status messages a dead child sent before it died arrive (they travel
  apart from its exit), including the ``failed`` report its exit code announces;
- ``stop(children, grace)``: SIGTERM each child's process tree, SIGKILL what is left after
  ``grace`` (0: SIGKILL at once), reap them;
- ``close()``: SIGKILL whatever is still running, release the socket and every ended child's
  pipes.

A child's stdout and stderr are this process's, unless ``spawn(..., output=fd, streams=...)``
points them (both by default) at ``fd`` (check-platform keeps its stdout for the report; the live terminal display reads worker
lines from a pipe). A child's environment is this process's, changed by ``environment`` (a value
is set, None removes the variable) in the environment it starts with: this process's own is
changed for the moment each child is started, under a lock, and restored (a process another
thread starts in that moment gets the changes too).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import multiprocessing
import os
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field

import zmq
import zmq.asyncio

from bootstrap import ProcessSpec, messages, phases
from bootstrap import proctree as _proctree
from bootstrap.early_guard import ArmedName
from bootstrap.phases import signal_name

log = logging.getLogger("launcher")

# How long to wait for a child's ``failed`` report once its exit code says it sent one.
REPORT_WAIT = 5.0
# After a child exits, how long the status socket must stay quiet before its last report counts.
SETTLE_QUIET = 0.05
SETTLE_MAX = 1.0


@dataclass(eq=False)
class Child:
    """One spawned bootstrap child: its spec, its process, and what is known of its end."""

    spec: ProcessSpec
    process: multiprocessing.process.BaseProcess | None = None
    exit_seen: bool = False
    exitcode: int | None = None
    failure: messages.Failed | None = None
    reported_failure: asyncio.Event = field(default_factory=asyncio.Event)

    @property
    def name(self) -> str:
        """The child's worker id, ``"<role>.<rank>"``, as its status messages carry it."""
        return self.spec.worker_id

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process is not None else None

    @property
    def running(self) -> bool:
        """Started and not yet seen to exit."""
        return self.process is not None and not self.exit_seen and self.process.exitcode is None


class Children:
    """The bootstrap children of one process, watched on the running asyncio loop."""

    def __init__(
        self,
        zctx: zmq.asyncio.Context,
        status_endpoint: str,
        on_message: Callable[[Child, messages.Message], None],
        on_exit: Callable[[Child], None],
        environment: Mapping[str, str | None] | None = None,
    ) -> None:
        self._loop = asyncio.get_running_loop()
        self._environment = dict(environment or {})
        self._on_message = on_message
        self._on_exit = on_exit
        self.children: list[Child] = []
        self._forgotten: set[int] = set()  # pids of children forgotten: late news is dropped
        self._arrived = asyncio.Event()
        self._pull = zctx.socket(zmq.PULL)
        self._pull.setsockopt(zmq.LINGER, 0)
        try:
            self._pull.bind(status_endpoint)
        except zmq.ZMQError:
            self._pull.close()
            raise
        self._reader = asyncio.create_task(self._read())

    # ------------------------------------------------------------------ starting
    def add(self, spec: ProcessSpec) -> Child:
        """Register a child to be spawned later (its status messages are accepted from now on)."""
        child = Child(spec)
        self.children.append(child)
        return child

    def forget(self, child: Child) -> None:
        """Stop watching ``child``, which ran and was reaped (a replica retired while the launch
        goes on): its status messages are ignored from now on, and a later child may take its
        name."""
        if child.running:
            raise RuntimeError(f"{child.name} is still running; stop it before forgetting it")
        if child.process is not None:
            with contextlib.suppress(ValueError, OSError):
                self._loop.remove_reader(child.process.sentinel)
        if child.pid is not None:
            self._forgotten.add(child.pid)
        if child in self.children:
            self.children.remove(child)

    def spawn(
        self, child: Child, output: int | None = None, streams: tuple[int, ...] = (1, 2)
    ) -> None:
        """Start ``child``; with ``output``, the child's ``streams`` (fds 1 and 2 by default) are
        that file descriptor, the others this process's. A child that ran before (and was
        reaped) starts again as a new process: what was known of its last end is forgotten, its
        old stop marker removed, and messages from its old process are ignored from now on."""
        import bootstrap

        if child.process is not None:
            if child.running:
                raise RuntimeError(
                    f"{child.name} is still running; stop it before spawning it again"
                )
            with contextlib.suppress(ValueError, OSError):
                self._loop.remove_reader(child.process.sentinel)
            _release(child.process)
            child.exit_seen, child.exitcode, child.failure = False, None, None
            child.reported_failure = asyncio.Event()
        if child.spec.stop_marker:
            with contextlib.suppress(OSError):
                os.unlink(child.spec.stop_marker)

        context = multiprocessing.get_context(
            "spawn"
        )  # local: the global start method is untouched
        global_method = multiprocessing.get_start_method(allow_none=True)
        spec = child.spec
        try:
            child.process = context.Process(
                target=bootstrap.run,
                args=(spec,),
                # Unpickled first in the child: arms it before anything of it is imported.
                name=ArmedName(f"sglang-{spec.role}-{spec.rank}"),
                daemon=False,
            )
            with _output_to(output, streams), _environment(self._environment):
                child.process.start()
        finally:
            if global_method is None:
                _unfix_global_start_method()
        self._loop.add_reader(child.process.sentinel, self._sentinel, child)

    # ------------------------------------------------------------------ watching
    async def _read(self) -> None:
        while True:
            data = await self._pull.recv()
            try:
                message = messages.decode(data)
            except messages.MessageError as exc:
                log.warning("ignored a frame on the status socket: %s", exc)
                continue
            self._arrived.set()
            child = next((c for c in self.children if c.name == message.worker), None)
            if message.pid in self._forgotten and (child is None or child.pid != message.pid):
                continue  # sent by a retired child before it exited, read after
            if child is None:
                log.warning("ignored a status message from unknown worker %r", message.worker)
                continue
            if child.pid is not None and message.pid != child.pid:
                log.debug(
                    "ignored a message from %s's previous process %d", child.name, message.pid
                )
                continue
            if isinstance(message, messages.Failed):
                child.failure = message
                child.reported_failure.set()
            self._on_message(child, message)

    def _sentinel(self, child: Child) -> None:
        if child.process is not None:
            self._loop.remove_reader(child.process.sentinel)
        self._on_exit(child)

    async def reap(self, child: Child) -> int | None:
        """The exit code of a child whose sentinel fired (it may take a moment to be reapable);
        the first call marks the child as exited."""
        process = child.process
        if process is None:  # never started: nothing to reap
            child.exit_seen = True
            return None
        for _ in range(1000):
            code = process.exitcode
            if code is not None:
                break
            await asyncio.sleep(0.001)
        child.exitcode = process.exitcode
        child.exit_seen = True
        return child.exitcode

    async def settle(self, child: Child) -> None:
        """Take the messages ``child`` (which exited) sent before it died: wait until the socket
        has been quiet for ``SETTLE_QUIET`` (``SETTLE_MAX`` at most), and, when its exit code
        says it sent a ``failed`` report that has not come yet, up to ``REPORT_WAIT`` for that."""
        deadline = time.monotonic() + SETTLE_MAX
        while time.monotonic() < deadline:
            self._arrived.clear()
            try:
                await asyncio.wait_for(self._arrived.wait(), SETTLE_QUIET)
            except TimeoutError:
                break
        if child.failure is None and phases.phase_of_exit_code(child.exitcode) not in (
            None,
            "parent_gone",
        ):
            try:
                await asyncio.wait_for(child.reported_failure.wait(), REPORT_WAIT)
            except TimeoutError:
                pass

    # ------------------------------------------------------------------ stopping
    async def stop(
        self, children: list[Child], grace: float, hurry: asyncio.Event | None = None
    ) -> None:
        """SIGTERM the trees of ``children`` still running, SIGKILL what is left after ``grace``
        seconds (0: SIGKILL at once, for children that hold nothing to drain; ``hurry`` set: at
        once from then on), reap them all. A child's ``stop_marker`` is created first: that
        SIGTERM is the ordered stop it waits for."""
        roots = [c.pid for c in children if c.running and c.pid is not None]
        for child in children:
            if child.running and child.spec.stop_marker:
                with contextlib.suppress(OSError):
                    open(child.spec.stop_marker, "w").close()
        if roots:
            if grace > 0:
                await _proctree.stop_trees(roots, grace, hurry=hurry)
            else:
                await _proctree.kill_trees(roots)
        for child in children:
            if child.process is not None:
                child.process.join(timeout=5)
                if not child.exit_seen:
                    await self.reap(child)

    def close(self) -> None:
        """SIGKILL every child still running (only after an unexpected error: normally all are
        gone by now), release the status socket and the pipes each child's process object
        holds."""
        self._reader.cancel()
        for child in self.children:
            if child.process is not None and child.process.sentinel is not None:
                with contextlib.suppress(ValueError, OSError):
                    self._loop.remove_reader(child.process.sentinel)
        roots = [
            c.pid
            for c in self.children
            if c.process is not None and c.process.exitcode is None and c.pid is not None
        ]
        if roots:
            tree = _proctree.Tree(roots)
            try:
                tree.kill()
            finally:
                tree.close()
            for child in self.children:
                if child.process is not None:
                    child.process.join(timeout=5)
        for child in self.children:
            if child.process is not None:
                _release(child.process)
        self._pull.close()


def _release(process: multiprocessing.process.BaseProcess) -> None:
    """Close the pipes ``multiprocessing`` keeps for an ended ``process`` (its sentinel among
    them) now, not whenever the garbage collector gets to the objects that refer to it."""
    with contextlib.suppress(ValueError):  # still running (close() refuses), or closed already
        if process.exitcode is not None:
            process.close()


def describe_exit(code: int | None) -> str:
    """``"was killed by SIGKILL"`` or ``"exited with code 3"``."""
    name = signal_name(code)
    return f"was killed by {name}" if name else f"exited with code {code}"


@contextlib.contextmanager
def _output_to(fd: int | None, streams: tuple[int, ...]) -> Iterator[None]:
    """While a child is started, the fds ``streams`` of this process are ``fd``, so the child
    inherits that (nothing changes when ``fd`` is None)."""
    if fd is None or not streams:
        yield
        return
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    saved = {number: os.dup(number) for number in streams}
    for number in streams:
        os.dup2(fd, number)
    try:
        yield
    finally:
        for number, copy in saved.items():
            os.dup2(copy, number)
            os.close(copy)


_environ_lock = threading.Lock()


@contextlib.contextmanager
def _environment(changes: Mapping[str, str | None]) -> Iterator[None]:
    """While a child is started, this process's environment has ``changes`` (a value is set,
    None removes the variable), so the child starts with them; restored right after."""
    if not changes:
        yield
        return
    with _environ_lock:
        saved = {name: os.environ.get(name) for name in changes}
        try:
            for name, value in changes.items():
                if value is None:
                    os.environ.pop(name, None)
                else:
                    os.environ[name] = value
            yield
        finally:
            for name, value in saved.items():
                if value is None:
                    os.environ.pop(name, None)
                else:
                    os.environ[name] = value


def _unfix_global_start_method() -> None:
    """Undo a side effect of the standard library: starting a ``spawn`` process calls
    ``multiprocessing.get_start_method()``, which fixes the *global* default as if the
    application had chosen it. An embedding application that never chose must still be free to."""
    default = getattr(multiprocessing.context, "_default_context", None)
    if default is not None and hasattr(default, "_actual_context"):
        default._actual_context = None
