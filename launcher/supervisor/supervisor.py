"""The supervisor: start every child of this node, watch them, stop them all, say why.

One implementation serves ``sglang-launch`` and the embedded ``Launcher``: ``Supervisor.run()``
is a coroutine on a uvloop event loop (the CLI runs it in the main thread with signal handlers;
the ``Launcher`` runs it in a background thread of its own and calls ``request_stop()``).

Its life, top to bottom:

1. open: a private runtime directory, the status PULL socket, the ops PUB and query sockets, the
   state file that lets ``sglang-launch status`` find us;
2. spawn: every child through a local ``spawn`` context with ``bootstrap.run`` as the target and
   a ``ProcessSpec`` as the argument (see ``launcher.supervisor.plan``);
3. wait for start-up: status messages and every child's sentinel are watched at once, under one
   deadline (``startup_timeout``); the first failure is the root cause;
4. serve: until a stop request, a signal, or a child's exit or failure. A scheduler replica (the
   tp ranks of one dp group) that fails now is restarted as a unit when ``--restart-policy``
   allows (``launcher.supervisor.restarts`` keeps the counts and the backoff): its surviving ranks are
   killed, and after the backoff all its ranks are spawned again the same way, while the other
   replicas and the HTTP child keep serving. Events ``replica.<dp>.restarting`` and
   ``replica.<dp>.ready`` tell the HTTP child to route around it and back to it;
5. stop: HTTP child first, then the schedulers; SIGTERM, the grace period, then SIGKILL of every
   remaining process tree; close the sockets, remove the runtime directory.

Every state change is an ops event (``launcher.supervisor.ops``); the terminal display, systemd and the
``Launcher``'s streams are listeners of those events.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import multiprocessing.process
import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import zmq.asyncio

from bootstrap import ProcessSpec, messages, orphan, phases
from launcher.prepare import is_cpu_fallback
from launcher.supervisor import proctree as _proctree
from launcher.supervisor import secrets as _secrets
from launcher.supervisor import signals as _signals
from launcher.supervisor.causes import ExitCode, LaunchError, RootCause, signal_name
from launcher.supervisor.children import Child, Children, describe_exit
from launcher.supervisor.notify import SystemdNotifier
from launcher.supervisor.ops import Listener, OpsChannel
from launcher.supervisor.plan import Endpoints, PlanError, plan_children
from launcher.supervisor.restarts import DOWN, RESPAWNED, ReplicaRestart, Restarts
from launcher.supervisor.rundir import RuntimeDir, RuntimeDirError
from launcher.supervisor.state import FAILED, READY, STOPPED, STOPPING, LaunchState, WorkerState
from launcher.supervisor.watchdog import Watchdog

if TYPE_CHECKING:
    import multiprocessing.process

    from bootstrap import ProcessSpec
    from launcher.server_args import ServerArgs
    from platforms import Selection

log = logging.getLogger("launcher")


@dataclass
class LaunchOutcome:
    """How a launch ended: ``exit_code`` (``ExitCode``), the root cause if it failed, the final state."""

    exit_code: int
    root_cause: RootCause | None
    snapshot: dict
    was_ready: bool = False


@dataclass(eq=False)
class _Worker:
    """One child of this node as the supervisor tracks it: the spawned ``Child`` and its state."""

    child: Child
    state: WorkerState
    stopped_at_once: bool = (
        False  # killed with no grace period: it was starting when the launch failed
    )

    @property
    def spec(self) -> ProcessSpec:
        return self.child.spec

    @property
    def process(self) -> multiprocessing.process.BaseProcess | None:
        return self.child.process

    @property
    def failure(self) -> messages.Failed | None:
        return self.child.failure


class Supervisor:
    """Runs one node's launch. ``args`` is a checked ``ServerArgs``; ``selection`` the platform's.

    ``worker_output``: when given, each worker's ``output_streams`` (stdout and stderr, fds 1 and
    2, by default) go to a pipe of its own that the supervisor reads, and every line is passed to
    ``worker_output(line)`` (the live terminal display draws it above its table); otherwise, and
    for the other stream, workers write to this process's stdout and stderr directly. Only for a supervisor in the main thread: the workers' output is set up by
    pointing this process's fds 1 and 2 at the pipe while each is spawned.
    """

    def __init__(
        self,
        args: ServerArgs,
        selection: Selection,
        *,
        payload: bytes,
        listeners: tuple[Listener, ...] = (),
        worker_output: Callable[[str], None] | None = None,
        output_streams: tuple[int, ...] = (1, 2),
    ) -> None:
        self.args = args
        self._worker_output = worker_output
        self._output_streams = output_streams
        self._pipes: dict[int, bytearray] = {}  # read end of a worker's output pipe -> partial line
        self.selection = selection
        self.runtime = args.runtime
        self._payload = payload
        self._listeners: list[Listener] = [*listeners, SystemdNotifier()]
        self._loop: asyncio.AbstractEventLoop | None = None
        self._inbox: asyncio.Queue | None = None
        self._stop_reason: str | None = None
        # The worker whose failure or exit is the root cause, from the moment it is known: what
        # other workers report after it is a consequence (they are reported as stopped).
        self._blamed: str | None = None
        self._stopping = False
        self._requests_cut: int | None = None  # the HTTP child's count, from its stopped report
        self._early_stop: str | None = None  # a stop requested before the loop ran
        self._lock = threading.Lock()
        self._children: list[_Worker] = []
        self._kids: Children | None = None
        self._rundir: RuntimeDir | None = None
        self._subreaper = False  # adopts the orphans of workers that die (the CLI's process only)
        self._restarts = Restarts(
            args.restart_policy_in_effect(),
            int(getattr(args, "max_restarts", 0) or 0),
            float(getattr(args, "restart_backoff", 0) or 0),
        )
        self._healing: dict[int, ReplicaRestart] = {}  # dp rank -> its restart in progress
        self.state: LaunchState | None = None
        self.ops: OpsChannel | None = None
        # Set once ``state`` exists and the loop takes requests (or the launch ended before).
        self.opened = threading.Event()

    # ----------------------------------------------------------------- what ``run`` set up
    @property
    def _launch(self) -> LaunchState:
        """``state``, which ``_open`` made (everything that reads it runs after that)."""
        if self.state is None:
            raise RuntimeError("the supervisor has no launch state yet (run() opens it)")
        return self.state

    @property
    def _channel(self) -> OpsChannel:
        """``ops``, which ``_open`` made."""
        if self.ops is None:
            raise RuntimeError("the supervisor has no ops channel yet (run() opens it)")
        return self.ops

    @property
    def _watcher(self) -> Children:
        """The ``Children`` that ``_open`` made."""
        if self._kids is None:
            raise RuntimeError("the supervisor watches no children yet (run() opens it)")
        return self._kids

    @property
    def _running_loop(self) -> asyncio.AbstractEventLoop:
        """The loop ``run`` runs on."""
        if self._loop is None:
            raise RuntimeError("the supervisor is not running")
        return self._loop

    @property
    def _queue(self) -> asyncio.Queue:
        """The inbox ``run`` made on its loop."""
        if self._inbox is None:
            raise RuntimeError("the supervisor is not running (run() makes its inbox)")
        return self._inbox

    # ----------------------------------------------------------------- requests from outside
    def request_stop(self, reason: str = "stop requested") -> None:
        """Ask for a graceful stop; safe from any thread, a no-op once the launch has ended."""
        with self._lock:
            loop = self._loop
            if loop is None:
                self._early_stop = self._early_stop or reason
                return
        try:
            loop.call_soon_threadsafe(self._post, "stop", reason)
        except RuntimeError:  # the loop closed in between: the launch is over
            pass

    def install_signal_handlers(self) -> None:
        """SIGINT, SIGTERM, SIGHUP and SIGQUIT stop gracefully, a second one ends the grace
        period; other would-be-fatal signals are logged (see ``launcher.supervisor.signals``). Call from
        ``run``'s thread, the main thread."""
        _signals.install_on_loop(self._running_loop, self._on_stop_signal)
        for signame in _signals.take_pending():
            self._on_stop_signal(signame)

    def _on_stop_signal(self, signame: str) -> None:
        stopping = self._stop_reason is not None or (
            self.state is not None and self.state.phase == STOPPING
        )
        if not stopping:
            self._post("stop", f"received {signame}")
        elif not self._hurry.is_set():
            log.warning(
                "received %s while stopping: the grace period is over, ending the workers now",
                signame,
            )
            self._hurry.set()

    # ----------------------------------------------------------------- the launch
    async def run(self, *, handle_signals: bool = False) -> LaunchOutcome:
        with self._lock:
            self._loop = asyncio.get_running_loop()
            self._inbox = asyncio.Queue()
            self._hurry = asyncio.Event()
            if self._early_stop:
                self._post("stop", self._early_stop)
        zctx = zmq.asyncio.Context()
        watchdog_task = None
        self._watchdog = Watchdog(
            float(getattr(self.args, "watchdog_timeout", 0) or 0), self._on_hung
        )
        try:
            self._open(zctx)
            if handle_signals:
                self.install_signal_handlers()
                self._subreaper = orphan.become_subreaper()
            self.opened.set()

            self._emit_starting()
            if self._stop_reason is None:
                self._spawn_all()
            started = time.monotonic()
            cause = await self._until_ready(started + self.args.startup_timeout)
            was_ready = cause is None and self._stop_reason is None
            if was_ready:
                self._emit_ready(time.monotonic() - started)
                watchdog_task = asyncio.create_task(self._watchdog.run())
                cause = await self._until_stop()
            return await self._shutdown(cause, was_ready)
        finally:
            if watchdog_task is not None:
                watchdog_task.cancel()
            self._close(zctx, handle_signals)

    async def _until_ready(self, deadline: float) -> RootCause | None:
        """Wait for every worker's ``ready``; None when ready (or stopped), else the root cause."""
        while True:
            kind, item = await self._next(deadline)
            if kind == "all_ready" or kind == "stop":
                return None
            if kind == "failed":
                return item
            if kind == "exit":
                return await self._exit_cause(item[0])
            if kind == "timeout":
                return self._timeout_cause()

    async def _until_stop(self) -> RootCause | None:
        """Serve until asked to stop (None) or until a worker fails or exits (its root cause),
        unless that worker's replica is restarted instead."""
        while True:
            kind, item = await self._next(None)
            if kind == "stop":
                return None
            if kind == "failed":
                cause = item
            elif kind == "exit":
                worker, process = item
                if worker.process is not process or self._stage(worker) == DOWN:
                    continue  # a process its replica's restart ends (or ended) anyway
                cause = await self._exit_cause(worker)
            else:
                continue
            if self._is_stale(cause):
                continue
            if not self._restart_replica_of(cause):
                return cause

    async def _shutdown(self, cause: RootCause | None, was_ready: bool) -> LaunchOutcome:
        state = self._launch
        self._stopping = True
        for restart in self._healing.values():
            restart.cancel()
        self._watchdog = Watchdog(0, self._on_hung)  # a worker slow to stop is not a new failure
        if cause is not None:
            self._blamed = self._blamed or cause.worker
            state.phase = FAILED
            state.root_cause = cause.to_dict()
            self._channel.emit(
                "server.failed", root_cause=cause.to_dict(), root_cause_text=cause.format()
            )
            reason = cause.summary
        else:
            reason = self._stop_reason or "stop requested"
        state.phase = STOPPING
        self._channel.emit("server.stopping", reason=reason)
        teardown = await self._stop_children(fail_fast=cause is not None)
        for child in self._children:
            failure = child.failure
            if cause is None and failure is not None and failure.phase == phases.STOPPING:
                # Stopping was asked for and everything is gone; a crash on the way out is worth
                # a warning (its report is in the snapshot), not a failed exit.
                log.warning(
                    "%s failed while winding down: %s: %s",
                    child.state.name,
                    failure.exc_type,
                    failure.message,
                )
        if cause is None:
            state.phase = STOPPED
        exit_code = int(cause.exit_code) if cause is not None else int(ExitCode.OK)
        self._drain_pipes()
        self._channel.emit(
            "server.stopped",
            exit_code=exit_code,
            teardown_s=teardown,
            phase=state.phase,
            requests_cut=self._requests_cut,
        )
        return LaunchOutcome(exit_code, cause, state.snapshot(), was_ready)

    # ----------------------------------------------------------------- set-up and release
    def _open(self, zctx: zmq.asyncio.Context) -> None:
        """Runtime directory, child plan, state, state file, the status socket and the ops sockets."""
        try:
            self._rundir = RuntimeDir()
            endpoints = Endpoints(
                runtime_dir=str(self._rundir.path),
                status=self._rundir.endpoint("launcher.status"),
                ops=self._rundir.endpoint("launcher.ops"),
                query=self._rundir.endpoint("launcher.query"),
            )
            specs = plan_children(
                self.args,
                payload=self._payload,
                platform_key=self.selection.key,
                runtime=self.runtime,
                endpoints=endpoints,
            )
        except PlanError as exc:
            raise LaunchError(
                RootCause("invalid server arguments", ExitCode.USAGE, message=str(exc))
            ) from exc
        except RuntimeDirError as exc:
            raise LaunchError(
                RootCause(
                    "cannot set up the runtime directory", ExitCode.SETUP_FAILED, message=str(exc)
                )
            ) from exc

        args = self.args
        url = (
            f"http://{_url_host(args.host)}:{args.port}"
            if any(s.role == "http" for s in specs)
            else None
        )
        state = self.state = LaunchState(
            runtime=self.runtime,
            platform=self.selection.key,
            platform_reason=self.selection.reason,
            url=url,
            node_rank=args.node_rank,
            nnodes=args.nnodes,
            workers=[WorkerState(s.role, s.rank, s.local_rank, args.node_rank) for s in specs],
        )
        kids = self._kids = Children(zctx, endpoints.status, self._on_message, self._on_sentinel)
        self._children = [
            _Worker(kids.add(spec), ws) for spec, ws in zip(specs, state.workers, strict=True)
        ]
        ops = self.ops = OpsChannel(zctx, state, endpoints.ops, endpoints.query)
        for listener in self._listeners:
            ops.add_listener(listener)
        ops.start()
        self._rundir.write_state(
            {
                "pid": os.getpid(),
                "started_at": state.started_at,
                "url": url,
                "node_rank": args.node_rank,
                "runtime_dir": endpoints.runtime_dir,
                "ops_endpoint": endpoints.ops,
                "query_endpoint": endpoints.query,
                "argv": _secrets.redact_argv(sys.argv),
            }
        )

    def _close(self, zctx: zmq.asyncio.Context, handle_signals: bool) -> None:
        """Release everything ``_open`` made; the launch is over (or never started)."""
        if handle_signals and self._loop is not None:
            _signals.restore(self._loop)
        if self._kids is not None:
            self._kids.close()  # kills leftovers only after an unexpected error: normally all are gone
        self._drain_pipes()
        if self.ops is not None:
            self.ops.close()
        zctx.destroy(linger=500)
        if self._rundir is not None:
            self._rundir.remove()
        with self._lock:
            self._loop = None
        self.opened.set()

    def _spawn_all(self) -> None:
        if self._worker_output is not None:
            os.environ["PYTHONUNBUFFERED"] = "1"  # a worker's prints reach its pipe line by line
        for worker in self._children:
            self._spawn(worker)

    def _spawn(self, worker: _Worker) -> None:
        """Start ``worker`` (at launch, or again when its replica restarts)."""
        kids, loop = self._kids, self._loop
        assert kids is not None and loop is not None, "spawning needs _open() and the running loop"
        if self._worker_output is None:
            kids.spawn(worker.child)
        else:
            read_end, write_end = os.pipe()
            try:
                kids.spawn(worker.child, output=write_end, streams=self._output_streams)
            finally:
                os.close(write_end)
            os.set_blocking(read_end, False)
            self._pipes[read_end] = bytearray()
            loop.add_reader(read_end, self._read_output, read_end)
        worker.state.pid = worker.child.pid

    def _read_output(self, fd: int) -> None:
        """Pass the complete lines a worker wrote to ``worker_output``; at the end of its output
        (every process holding the pipe is gone) the rest, and close the pipe."""
        try:
            data = os.read(fd, 65536)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        pending = self._pipes[fd]
        pending += data
        *lines, rest = pending.split(b"\n")
        self._pipes[fd] = bytearray(rest)
        if self._worker_output is not None:
            for line in lines:
                self._worker_output(line.decode(errors="replace"))
        if not data:
            self._close_pipe(fd)

    def _close_pipe(self, fd: int) -> None:
        if self._loop is not None:
            self._loop.remove_reader(fd)
        rest = self._pipes.pop(fd)
        if rest and self._worker_output is not None:
            self._worker_output(rest.decode(errors="replace"))
        os.close(fd)

    def _drain_pipes(self) -> None:
        """Pass on what the workers wrote last (their pipes hold it after they are gone)."""
        for fd in list(self._pipes):
            while fd in self._pipes:
                before = len(self._pipes[fd])
                self._read_output(fd)
                if fd in self._pipes and len(self._pipes[fd]) == before and not self._readable(fd):
                    self._close_pipe(fd)

    @staticmethod
    def _readable(fd: int) -> bool:
        import select

        return bool(select.select([fd], [], [], 0)[0])

    # ----------------------------------------------------------------- inputs
    def _post(self, kind: str, item: Any = None) -> None:
        if kind == "stop" and self._stop_reason is None:
            self._stop_reason = item
            log.debug("stopping: %s", item)
        self._queue.put_nowait((kind, item))

    async def _next(self, deadline: float | None) -> tuple[str, Any]:
        if deadline is None:
            return await self._queue.get()
        try:
            return await asyncio.wait_for(self._queue.get(), max(0.0, deadline - time.monotonic()))
        except TimeoutError:
            return "timeout", None

    def _on_sentinel(self, child: Child) -> None:
        worker = self._worker_of(child)
        self._watchdog.forget(worker.state.name)
        if self._stage(worker) == DOWN:
            return  # its replica's restart ends and reaps it
        if self._blamed is None and not self._stopping and self._stop_reason is None:
            self._blamed = worker.state.name
        self._post("exit", (worker, child.process))

    def _on_message(self, spawned: Child, message: messages.Message) -> None:
        child = self._worker_of(spawned)
        ws = child.state
        self._watchdog.heard(ws.name)
        if child.stopped_at_once and isinstance(message, (messages.Phase, messages.Ready)):
            return  # sent before it was killed, read after: old news about a stopped worker
        if self._stage(child) == DOWN:
            if isinstance(message, messages.Failed) and ws.phase != "stopped":
                # Its replica is restarting because of a peer: a consequence, kept, not a cause.
                ws.error = _error_of(message)
                ws.phase = "stopped"
                self._emit_worker(
                    child, "stopped", error=ws.error, because_of=self._cause_of(child)
                )
            return
        if isinstance(message, messages.Phase):
            ws.phase = message.phase
            ws.phases[message.phase] = message.duration
            self._emit_worker(
                child, message.phase, duration=message.duration, early_imports=message.early_imports
            )
        elif isinstance(message, messages.Ready):
            ws.phase, ws.ready, ws.ready_at = phases.READY, True, message.time
            ws.phases[phases.READY] = message.duration
            ws.platform, ws.info = message.platform, dict(message.info)
            if not self._stopping:
                self._watchdog.watch(ws.name)
            self._emit_worker(child, phases.READY, duration=message.duration, info=ws.info)
            if message.platform != self.selection.key:
                self._blamed = self._blamed or ws.name
                self._post("failed", self._mismatch_cause(child, message.platform))
            elif self._stage(child) == RESPAWNED:
                self._replica_ready_again(child)
            elif self._launch.all_ready():
                self._post("all_ready")
        elif isinstance(message, messages.Failed):
            ws.error = _error_of(message)
            if self._blamed is not None and self._blamed != ws.name:
                # A consequence of the root cause (a peer gone, a stop on the way): its report
                # is kept in the snapshot, and the worker counts as stopped, not failed.
                if ws.phase != "stopped":
                    ws.phase = "stopped"
                    self._emit_worker(child, "stopped", error=ws.error, because_of=self._blamed)
                return
            if self._stop_reason is None and not self._stopping:
                self._blamed = ws.name
            self._emit_worker(child, "failed", error=ws.error)
            self._post("failed", self._failure_cause(child, message.exit_code))
        elif isinstance(message, messages.Stopped):
            ws.phase = "stopped"
            cut = message.info.get("requests_cut")
            if isinstance(cut, int):  # requests still running when the grace period ran out
                self._requests_cut = (self._requests_cut or 0) + cut
            extra = {"info": dict(message.info)} if message.info else {}
            self._emit_worker(child, "stopped", **extra)
        # Heartbeats need no action: a stalled child is caught by the deadline or its sentinel.

    def _worker_of(self, child: Child) -> _Worker:
        return next(w for w in self._children if w.child is child)

    # ----------------------------------------------------------------- root causes
    def _on_hung(self, name: str, quiet: float) -> None:
        """The watchdog found ``name`` silent: the launch fails with it as the root cause."""
        if self._stopping or self._stop_reason is not None:
            return
        child = next(w for w in self._children if w.state.name == name)
        if self._stage(child) == DOWN:
            return  # its replica is being restarted already
        ws = child.state
        self._blamed = self._blamed or name
        self._post(
            "failed",
            RootCause(
                summary=f"{name} stopped answering: no heartbeat for {quiet:.1f}s after the server was ready",
                exit_code=ExitCode.WORKER_DIED,
                worker=name,
                pid=ws.pid,
                node_rank=ws.node_rank,
                phase=phases.SERVING,
                error_type="WatchdogTimeout",
                message=f"--watchdog-timeout is {self._watchdog.timeout:g}s; the process is alive but silent",
                hint="a stopped process (SIGSTOP, a debugger) or one hung holding the GIL; raise "
                "--watchdog-timeout if a worker can legitimately stall longer",
            ),
        )

    async def _exit_cause(self, child: _Worker) -> RootCause:
        """A child exited on its own: record how, wait for its report if it sent one, explain."""
        code = await self._reap(child)
        await self._watcher.settle(child.child)
        await self._sweep_adopted()
        if child.failure is not None:
            return self._failure_cause(child, code)
        ws = child.state
        after_ready = ws.ready
        phase = phases.SERVING if after_ready else _phase_in_progress(ws.phase)
        return RootCause(
            summary=(
                f"{ws.name} {describe_exit(code)} after the server was ready"
                if after_ready
                else f"{ws.name} {describe_exit(code)} while {phases.DOING.get(phase, phase)}"
            ),
            exit_code=ExitCode.WORKER_DIED if after_ready else ExitCode.WORKER_FAILED,
            worker=ws.name,
            pid=ws.pid,
            node_rank=ws.node_rank,
            phase=phase,
            exitcode=code,
            signal=signal_name(code),
            message=(
                f"the worker sent no error report (the last phase it reported: {ws.phase}); "
                "its own output above may say more"
            ),
            hint=_exit_hint(code),
        )

    def _failure_cause(self, child: _Worker, code: int | None) -> RootCause:
        failure, ws = child.failure, child.state
        if failure is None:  # called once the child's ``failed`` report arrived
            raise RuntimeError(f"{ws.name} sent no failure report")
        after_ready = failure.phase in (phases.SERVING, phases.STOPPING)
        return RootCause(
            summary=f"{ws.name} failed while {phases.DOING.get(failure.phase, failure.phase)}",
            exit_code=ExitCode.WORKER_DIED if after_ready else ExitCode.WORKER_FAILED,
            worker=ws.name,
            pid=ws.pid,
            node_rank=ws.node_rank,
            phase=failure.phase,
            exitcode=code if code is not None else failure.exit_code,
            signal=signal_name(code),
            error_type=failure.exc_type,
            message=failure.message,
            traceback=failure.traceback,
        )

    def _mismatch_cause(self, child: _Worker, platform: str) -> RootCause:
        ws = child.state
        return RootCause(
            summary=f"{ws.name} selected platform {platform!r}, the launcher selected {self.selection.key!r}",
            worker=ws.name,
            pid=ws.pid,
            node_rank=ws.node_rank,
            phase=phases.READY,
            hint="the launcher and its workers must see the same installed plugins and SGLANG_* variables",
        )

    def _timeout_cause(self) -> RootCause:
        waiting = [c.state for c in self._children if not c.state.ready]
        first = waiting[0]
        phase = _phase_in_progress(first.phase)
        stuck = ", ".join(f"{w.name} in {_phase_in_progress(w.phase)}" for w in waiting)
        return RootCause(
            summary=f"start-up did not finish within {self.args.startup_timeout:g}s",
            exit_code=ExitCode.STARTUP_TIMEOUT,
            worker=first.name,
            pid=first.pid,
            node_rank=first.node_rank,
            phase=phase,
            error_type="StartupTimeout",
            message=f"{len(waiting)} of {len(self._children)} workers not ready: {stuck}",
            hint=f"raise --startup-timeout if {phase} is just slow, or look at why {first.name} hangs there",
        )

    async def _reap(self, child: _Worker) -> int | None:
        """The exit code of a child whose sentinel fired; its ``exited`` event the first time."""
        if not child.child.exit_seen:
            await self._watcher.reap(child.child)
        self._emit_exited(child)
        return child.child.exitcode

    def _emit_exited(self, child: _Worker) -> None:
        """Record how a reaped child ended and say so, once."""
        ws = child.state
        if ws.exited:
            return
        code = child.child.exitcode
        ws.exited, ws.exitcode, ws.signal = True, code, signal_name(code)
        self._emit_worker(child, "exited", exitcode=code, signal=ws.signal)

    # ----------------------------------------------------------------- healing replicas
    def _replica(self, dp_rank: int) -> list[_Worker]:
        """The scheduler ranks of replica ``dp_rank`` on this node."""
        return [
            w
            for w in self._children
            if w.spec.role == "scheduler" and w.spec.rank // max(w.spec.tp_size, 1) == dp_rank
        ]

    def _stage(self, worker: _Worker) -> str | None:
        """``DOWN`` or ``RESPAWNED`` while ``worker``'s replica restarts, else None."""
        if worker.spec.role != "scheduler":
            return None
        restart = self._healing.get(worker.spec.rank // max(worker.spec.tp_size, 1))
        return restart.stage if restart is not None else None

    def _cause_of(self, worker: _Worker) -> str | None:
        """The worker whose failure restarts ``worker``'s replica."""
        restart = self._healing.get(worker.spec.rank // max(worker.spec.tp_size, 1))
        return restart.because_of if restart is not None else None

    def _is_stale(self, cause: RootCause) -> bool:
        """``cause`` concerns a process that a replica restart ended or replaced."""
        worker = next((w for w in self._children if w.state.name == cause.worker), None)
        if worker is None:
            return False
        replaced = cause.pid is not None and worker.state.pid != cause.pid
        return replaced or self._stage(worker) == DOWN

    def _restart_replica_of(self, cause: RootCause) -> bool:
        """Start restarting the replica of ``cause.worker`` when the policy allows (True); else
        False, and ``cause`` (whose hint then says restarts ran out) ends the launch. During a
        stop nothing is restarted, but a failure the policy would have healed is still True."""
        worker = next((w for w in self._children if w.state.name == cause.worker), None)
        if worker is None or worker.spec.role != "scheduler":
            return False
        dp = worker.spec.rank // max(worker.spec.tp_size, 1)
        if self._stop_reason is not None:
            # A stop was asked for before this failure was handled: nothing is restarted, and a
            # replica the policy would have restarted is no failure of the launch (it exits 0).
            if not self._restarts.would_restart(dp):
                return False
            self._blamed = None
            return True
        decision = self._restarts.decide(dp)
        if not decision.restart:
            if decision.exhausted:
                cause.exit_code = ExitCode.WORKER_DIED  # the server was ready before this
                cause.hint = f"{cause.hint}; {decision.reason}" if cause.hint else decision.reason
            return False
        previous = self._healing.get(dp)
        if previous is not None:  # its restarted ranks failed while starting: once more
            previous.cancel()
        restart = ReplicaRestart(dp, decision.attempt, cause.summary, because_of=cause.worker)
        self._healing[dp] = restart
        self._blamed = None  # the launch goes on: the next failure is a root cause again
        restart.task = asyncio.create_task(self._restart(restart, cause, decision.delay))
        return True

    async def _restart(self, restart: ReplicaRestart, cause: RootCause, delay: float) -> None:
        """Kill what is left of the replica, wait ``delay`` s, spawn all its ranks again; a
        restart that cannot be done is the launch's root cause."""
        try:
            await self._respawn(restart, cause, delay)
        except Exception as exc:  # noqa: BLE001 - reported as the root cause, never lost
            log.exception("%s could not be restarted", restart.name)
            self._post(
                "failed",
                RootCause(
                    summary=f"{restart.name} could not be restarted after: {cause.summary}",
                    exit_code=ExitCode.WORKER_DIED,
                    error_type=type(exc).__name__,
                    message=str(exc),
                ),
            )

    async def _respawn(self, restart: ReplicaRestart, cause: RootCause, delay: float) -> None:
        workers = self._replica(restart.dp_rank)
        log.debug(
            "%s restarts (attempt %d of %d, in %.1fs): %s",
            restart.name,
            restart.attempt,
            self._restarts.max_restarts,
            delay,
            cause.summary,
        )
        self._channel.emit(
            f"replica.{restart.dp_rank}.restarting",
            replica=restart.name,
            dp_rank=restart.dp_rank,
            workers=[w.state.name for w in workers],
            attempt=restart.attempt,
            max_restarts=self._restarts.max_restarts,
            backoff_s=delay,
            cause=cause.summary,
            root_cause=cause.to_dict(),
        )
        survivors = [w for w in workers if w.child.running]
        for worker in workers:
            self._watchdog.forget(worker.state.name)
        for worker in survivors:
            if worker.state.phase != "stopped":
                worker.state.phase = "stopped"
                self._emit_worker(worker, "stopped", because_of=restart.because_of, restart=True)
        await self._watcher.stop([w.child for w in survivors], 0)  # a broken group drains nothing
        for worker in workers:
            if worker.process is not None:
                await self._reap(worker)
        await self._sweep_adopted()
        await asyncio.sleep(delay)
        restart.stage = RESPAWNED
        for worker in workers:
            spec = worker.child.spec
            env = {**spec.env, "SGLANG_LAUNCH_RESTART": str(restart.attempt)}
            worker.child.spec = dataclasses.replace(spec, env=env)
            self._spawn(worker)
            worker.state.restarted(worker.child.pid)
            self._emit_worker(worker, "restarted", restart=restart.attempt)
        restart.timer = self._running_loop.call_later(
            float(self.args.startup_timeout), self._restart_timed_out, restart
        )

    def _replica_ready_again(self, worker: _Worker) -> None:
        """A rank of a restarting replica is ready: once all are, the replica serves again."""
        dp = worker.spec.rank // max(worker.spec.tp_size, 1)
        restart = self._healing.get(dp)
        workers = self._replica(dp)
        if restart is None or self._stopping or not all(w.state.ready for w in workers):
            return
        del self._healing[dp]
        if restart.timer is not None:
            restart.timer.cancel()
        down = time.monotonic() - restart.died_at
        log.debug(
            "%s serves again (restart %d, %.1fs after it failed)",
            restart.name,
            restart.attempt,
            down,
        )
        self._channel.emit(
            f"replica.{dp}.ready",
            replica=restart.name,
            dp_rank=dp,
            attempt=restart.attempt,
            down_s=down,
            pids=[w.state.pid for w in workers],
        )

    def _restart_timed_out(self, restart: ReplicaRestart) -> None:
        """The restarted replica was not ready within ``--startup-timeout``: it failed again."""
        if self._healing.get(restart.dp_rank) is not restart or self._stopping:
            return
        waiting = [w.state for w in self._replica(restart.dp_rank) if not w.state.ready]
        if not waiting:
            return
        first = waiting[0]
        self._post(
            "failed",
            RootCause(
                summary=f"{restart.name} did not become ready again within "
                f"{self.args.startup_timeout:g}s of its restart",
                exit_code=ExitCode.WORKER_DIED,
                worker=first.name,
                pid=first.pid,
                node_rank=first.node_rank,
                phase=_phase_in_progress(first.phase),
                error_type="StartupTimeout",
                message=", ".join(f"{w.name} in {_phase_in_progress(w.phase)}" for w in waiting),
                hint="raise --startup-timeout if a restart is just slow",
            ),
        )

    # ----------------------------------------------------------------- stopping
    async def _stop_children(self, fail_fast: bool) -> float:
        """HTTP first, then schedulers: SIGTERM, grace period, SIGKILL of what remains of each tree.

        Each group is gone (and reaped, its ``exited`` events out) before the next is signalled.
        With ``fail_fast`` (the launch failed), every worker still starting other than the root
        cause's is first killed at once, with no grace period: it holds nothing to drain.
        """
        started = time.monotonic()
        grace = float(self.args.stop_grace_period)
        if fail_fast:
            starting = [
                w
                for w in self._children
                if w.child.running and not w.state.ready and w.state.name != self._blamed
            ]
            for worker in starting:
                worker.stopped_at_once = True
                worker.state.phase = "stopped"
                self._emit_worker(worker, "stopped", because_of=self._blamed, at_once=True)
            await self._watcher.stop([w.child for w in starting], 0)
            for worker in starting:
                self._emit_exited(worker)
        for roles in (("http",), ("scheduler",), None):
            group = [
                c
                for c in self._children
                if c.process is not None
                and not c.child.exit_seen
                and (roles is None or c.spec.role in roles)
            ]
            await self._watcher.stop([c.child for c in group], grace, hurry=self._hurry)
            for child in group:
                self._emit_exited(child)
        await self._sweep_adopted()
        return time.monotonic() - started

    async def _sweep_adopted(self) -> None:
        """As a subreaper, end and reap what a dead worker left behind (re-parented to us)."""
        if self._subreaper:
            workers = {c.child.pid for c in self._children if c.child.pid is not None}
            swept = await _proctree.sweep_adopted(workers)
            if swept:
                log.debug(
                    "ended %d process(es) left behind by exited workers: %s", len(swept), swept
                )

    # ----------------------------------------------------------------- events
    def _emit_starting(self) -> None:
        self._channel.emit(
            "server.starting",
            platform=self.selection.key,
            platform_reason=self.selection.reason,
            cpu_fallback=is_cpu_fallback(self.selection),
            runtime=self.runtime,
            url=self._launch.url,
            node_rank=self._launch.node_rank,
            nnodes=self._launch.nnodes,
            workers=[w.name for w in self._launch.workers],
        )

    def _emit_worker(self, child: _Worker, phase: str, **extra: object) -> None:
        ws = child.state
        ready = sum(w.ready for w in self._launch.workers)
        self._channel.emit(
            f"worker.{ws.role}.{ws.rank}.{phase}",
            worker=ws.name,
            role=ws.role,
            rank=ws.rank,
            pid=ws.pid,
            phase=phase,
            ready_count=ready,
            worker_count=len(self._launch.workers),
            **extra,
        )

    def _emit_ready(self, startup_s: float) -> None:
        self._launch.phase = READY
        self._launch.ready_at = time.time()
        self._channel.emit(
            "server.ready",
            url=self._launch.url,
            node_rank=self._launch.node_rank,
            worker_count=len(self._launch.workers),
            startup_s=startup_s,
        )


def _error_of(message: messages.Failed) -> dict:
    """A worker's ``failed`` report as its state's ``error``."""
    return {
        "phase": message.phase,
        "type": message.exc_type,
        "message": message.message,
        "traceback": message.traceback,
    }


def _phase_in_progress(last: str) -> str:
    """The bootstrap phase a worker was working towards, given the last one it reported."""
    if last in phases.PHASES[:-1]:
        return phases.PHASES[phases.PHASES.index(last) + 1]
    if last == phases.READY:
        return phases.SERVING
    if last == "starting":
        return phases.SPAWNED
    return phases.READY  # a worker's own phase (e.g. model_loaded): still on its way to ready


def _exit_hint(code: int | None) -> str | None:
    if code == -signal.SIGKILL:
        return "SIGKILL from outside is often the kernel's OOM killer: check `dmesg` and the memory in use"
    if code == 0:
        return "a worker target must keep running until ctx.stopping is set"
    return None


def _url_host(host: str) -> str:
    if host in ("0.0.0.0", "::", ""):
        return "127.0.0.1"
    return f"[{host}]" if ":" in host else host


def run_supervisor(supervisor: Supervisor, *, handle_signals: bool = False) -> LaunchOutcome:
    """Run ``supervisor`` to the end on a fresh uvloop loop in the calling thread."""
    try:
        import uvloop

        loop: asyncio.AbstractEventLoop = uvloop.new_event_loop()
    except ImportError:  # uvloop does not exist on Windows
        loop = asyncio.new_event_loop()
    try:
        return loop.run_until_complete(supervisor.run(handle_signals=handle_signals))
    finally:
        loop.close()
