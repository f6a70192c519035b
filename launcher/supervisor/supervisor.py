"""The supervisor: start every child of this node, watch them, stop them all, say why.

One implementation serves ``sglang-launch`` and the embedded ``Launcher``: ``Supervisor.run()``
is a coroutine on a uvloop event loop (the CLI runs it in the main thread with signal handlers;
the ``Launcher`` runs it in a background thread of its own and calls ``request_stop()``).

Its life, top to bottom, as ``run`` reads:

1. open: a private runtime directory, the plan of children (``plan``), the status PULL socket,
   the ops PUB and query sockets (``ops``), the state file that lets ``sglang-launch status``
   find us; everything one running launch holds is a ``Launch`` (``launch``);
2. spawn: every child through a local ``spawn`` context with ``bootstrap.run`` as the target and
   a ``ProcessSpec`` as the argument;
3. wait for start-up: status messages and every child's sentinel are watched at once, under one
   deadline (``startup_timeout``); the first failure is the root cause (``diagnose``);
4. serve: until a stop request, a signal, or a child's exit or failure. A scheduler replica that
   fails now heals when ``--restart-policy`` allows (``healing.Healing``), while the other
   replicas and the HTTP child keep serving; any other failure is the root cause. Reloads and
   scales (``rollout.Rollouts``: the query socket's ``reload`` and ``scale``, SIGHUP, SIGTTIN,
   SIGTTOU, ``request_change``) replace, add and remove replicas meanwhile;
5. stop: HTTP child first, then the schedulers; SIGTERM, the grace period, then SIGKILL of every
   remaining process tree;
6. close: the sockets, the runtime directory.

Every state change is an ops event (``launchspec.events``); the terminal display, systemd and the
``Launcher``'s streams are listeners of those events.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import dataclasses
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import zmq.asyncio

from bootstrap import orphan, phases
from launcher.prepare import is_cpu_fallback
from launcher.supervisor import diagnose
from launcher.supervisor import secrets as _secrets
from launcher.supervisor import signals as _signals
from launcher.supervisor.launch import AllReady, Exit, Failure, Launch, Stop, Timeout
from launcher.supervisor.notify import SystemdNotifier
from launcher.supervisor.ops import Listener, OpsChannel
from launcher.supervisor.output import WorkerOutput
from launcher.supervisor.plan import Endpoints, PlanError, plan_children
from launcher.supervisor.restarts import DOWN, Restarts
from launcher.supervisor.revision import ChangeRefused, first_revision
from launcher.supervisor.rundir import RuntimeDir, RuntimeDirError
from launcher.supervisor.state import FAILED, READY, STOPPED, STOPPING, LaunchState, WorkerState
from launchspec import events
from launchspec.causes import ExitCode, LaunchError, RootCause

if TYPE_CHECKING:
    from launcher.supervisor.rollout import Change, Rollouts
    from launcher.supervisor.workers import Worker
    from launchspec.server_args import ServerArgs
    from platforms import Selection

log = logging.getLogger("launcher")


@dataclass
class LaunchOutcome:
    """How a launch ended: ``exit_code`` (``ExitCode``), the root cause if it failed, the final state."""

    exit_code: int
    root_cause: RootCause | None
    snapshot: dict[str, object]
    was_ready: bool = False


class Supervisor:
    """Runs one node's launch. ``args`` is a checked ``ServerArgs``; ``selection`` the platform's.

    ``worker_output``: when given, each worker's ``output_streams`` (stdout and stderr, fds 1 and
    2, by default) go to a pipe of its own that the supervisor reads, and every line is passed to
    ``worker_output(line)`` (the live terminal display draws it above its table); otherwise, and
    for the other stream, workers write to this process's stdout and stderr directly. Only for a
    supervisor in the main thread: the workers' output is set up by pointing this process's fds
    1 and 2 at the pipe while each is spawned.

    ``state`` is the launch's ``LaunchState`` once ``run`` opened it (it stays after the end);
    ``opened`` is set once ``state`` exists and the loop takes requests (or the launch ended
    before that).
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
        self.selection = selection
        self.runtime = args.runtime
        self._payload = payload
        self._listeners: list[Listener] = [*listeners, SystemdNotifier()]
        self._worker_output = worker_output
        self._output_streams = output_streams
        self._restarts = Restarts(
            args.restart_policy_in_effect(),
            args.max_restarts,
            args.restart_backoff,
            follows_replicas=args.restart_policy is None,
        )
        self._lock = threading.Lock()
        self._launch: Launch | None = None  # while ``run`` runs, from open to close
        self._early_stop: str | None = None  # a stop requested before the launch was open
        self.state: LaunchState | None = None
        self.opened = threading.Event()

    @property
    def loop(self) -> asyncio.AbstractEventLoop | None:
        """The loop the launch runs on, while it runs."""
        launch = self._launch
        return launch.loop if launch is not None else None

    # ----------------------------------------------------------------- requests from outside
    def request_stop(self, reason: str = "stop requested") -> None:
        """Ask for a graceful stop; safe from any thread, a no-op once the launch has ended."""
        with self._lock:
            launch = self._launch
            if launch is None:
                self._early_stop = self._early_stop or reason
                return
        try:
            launch.loop.call_soon_threadsafe(launch.post, Stop(reason))
        except RuntimeError:  # the loop closed in between: the launch is over
            pass

    def request_change(
        self, start: Callable[[Rollouts], Change]
    ) -> concurrent.futures.Future[events.Event]:
        """Begin a reload or a scale from another thread (``start`` calls ``Rollouts.start_reload``
        or ``start_scale``); the future ends with the change's last event (``reload.finished``,
        ``reload.failed``, ...) or ``ChangeRefused``. ``RuntimeError`` once the launch ended."""
        result: concurrent.futures.Future[events.Event] = concurrent.futures.Future()
        launch = self._launch
        if launch is None:
            raise RuntimeError("the launch is not running")

        def begin() -> None:
            try:
                change = start(launch.rollouts)
            except ChangeRefused as exc:
                result.set_exception(exc)
                return
            change.done.add_done_callback(
                lambda done: (
                    result.cancel() if done.cancelled() else result.set_result(done.result())
                )
            )

        try:
            launch.loop.call_soon_threadsafe(begin)
        except RuntimeError:  # the loop closed in between
            raise RuntimeError("the launch is not running") from None
        return result

    def install_signal_handlers(self) -> None:
        """SIGINT, SIGTERM and SIGQUIT stop gracefully, a second one ends the grace period;
        SIGHUP reloads once the server is ready (it stops before, or when the terminal went
        away), SIGTTIN and SIGTTOU add and remove a replica; other would-be-fatal signals are
        logged (see ``launcher.supervisor.signals``). Call from ``run``'s thread, the main
        thread, once the launch is open."""
        loop = self.loop
        if loop is None:
            raise RuntimeError("the supervisor is not running (run() installs its handlers)")
        _signals.install_on_loop(loop, self._on_stop_signal, on_change=self._on_change_signal)
        for signame in _signals.take_pending():
            self._on_stop_signal(signame)

    def _on_change_signal(self, signame: str) -> None:
        """SIGHUP, SIGTTIN or SIGTTOU (see ``install_signal_handlers``)."""
        launch = self._launch
        if launch is None:
            return
        if signame == "SIGHUP":
            if _signals.terminal_hung_up():
                _signals.silence_terminal()
                log.warning("received SIGHUP: the terminal went away; stopping")
                self._on_stop_signal(signame)
            elif launch.state.phase != READY:
                self._on_stop_signal(signame)  # nothing to reload yet (or stopping already)
            else:
                launch.rollouts.reload_on_signal(signame)
            return
        if launch.state.phase != READY:
            log.warning("ignored %s: the server is %s, not ready", signame, launch.state.phase)
            return
        if signame == "SIGTTOU" and _signals.terminal_sends_sigttou():
            signal.signal(signal.SIGTTOU, signal.SIG_IGN)
            log.warning(
                "ignored SIGTTOU, and ignoring it from now on: this launcher runs in the "
                "background of a terminal with 'stty tostop', which sends SIGTTOU on every "
                "write; use sglang-launch scale --dp-size N instead"
            )
            return
        launch.rollouts.scale_by(1 if signame == "SIGTTIN" else -1, f"received {signame}")

    def _on_stop_signal(self, signame: str) -> None:
        launch = self._launch
        if launch is None:
            return
        if launch.stop_reason is None and launch.state.phase != STOPPING:
            launch.post(Stop(f"received {signame}"))
        elif not launch.grace_over.is_set():
            log.warning(
                "received %s while stopping: the grace period is over, ending the workers now",
                signame,
            )
            launch.grace_over.set()

    # ----------------------------------------------------------------- the launch
    async def run(self, *, handle_signals: bool = False) -> LaunchOutcome:
        """The launch from open to close (see the module docstring)."""
        release = contextlib.ExitStack()  # what ``_open`` made, released in reverse order
        release.callback(self._closed)
        try:
            launch = self._open(release)
            if handle_signals:
                self.install_signal_handlers()
                release.callback(_signals.restore, launch.loop)
                launch.subreaper = orphan.become_subreaper()
            self.opened.set()

            self._announce_starting(launch)
            if launch.stop_reason is None:
                for worker in launch.workers:
                    launch.spawn(worker)
            started = time.monotonic()
            cause = await self._until_ready(launch, started + self.args.startup_timeout)
            was_ready = cause is None and launch.stop_reason is None
            if was_ready:
                self._announce_ready(launch, time.monotonic() - started)
                launch.start_watching()
                cause = await self._serve(launch)
            return await self._stop(launch, cause, was_ready)
        finally:
            release.close()

    async def _until_ready(self, launch: Launch, deadline: float) -> RootCause | None:
        """Wait for every worker's ``ready``; None when ready (or stopped), else the root cause."""
        while True:
            match await launch.next(deadline):
                case AllReady() | Stop():
                    return None
                case Failure(cause):
                    return cause
                case Exit(worker):
                    return await launch.exit_cause(worker, server_ready=False)
                case Timeout():
                    waiting = [w.state for w in launch.workers if not w.state.ready]
                    return diagnose.startup_timeout(
                        waiting, len(launch.workers), self.args.startup_timeout
                    )

    async def _serve(self, launch: Launch) -> RootCause | None:
        """Serve until asked to stop (None) or until a worker fails or exits (its root cause),
        unless that worker's replica heals instead."""
        while True:
            match await launch.next(None):
                case Stop():
                    return None
                case Failure(cause):
                    pass
                case Exit(worker, process):
                    if worker.process is not process or launch.healing.stage(worker) == DOWN:
                        continue  # a process its replica's restart ends (or ended) anyway
                    cause = await launch.exit_cause(worker)
                case _:
                    continue
            if launch.healing.is_stale(cause):
                continue
            verdict = launch.healing.handle_failure(
                cause, stop_requested=launch.stop_reason is not None
            )
            if not verdict.launch_goes_on:
                return verdict.cause
            launch.blamed = None  # the next failure is a root cause again

    async def _stop(
        self, launch: Launch, cause: RootCause | None, was_ready: bool
    ) -> LaunchOutcome:
        """Say why the launch ends, stop every worker, say that they are gone."""
        state = launch.state
        launch.stopping = True
        launch.healing.cancel()
        launch.rollouts.cancel()
        launch.stop_watching()  # a worker slow to stop is not a new failure
        if cause is not None:
            launch.blamed = launch.blamed or cause.worker
            state.phase = FAILED
            state.root_cause = cause
            launch.publish(
                events.ServerFailed(
                    root_cause=dataclasses.replace(cause), root_cause_text=cause.format()
                )
            )
            reason = cause.summary
        else:
            reason = launch.stop_reason or "stop requested"
        state.phase = STOPPING
        launch.publish(events.ServerStopping(reason=reason))
        teardown = await self._stop_workers(
            launch,
            fail_fast=cause is not None,
            spare=None
            if cause is None or cause.exit_code == ExitCode.STARTUP_TIMEOUT
            else launch.blamed,
        )
        if cause is None:
            _warn_of_failures_while_winding_down(launch.workers)
            state.phase = STOPPED
        exit_code = int(cause.exit_code) if cause is not None else int(ExitCode.OK)
        if launch.output is not None:
            launch.output.drain()
        launch.publish(
            events.ServerStopped(
                exit_code=exit_code,
                teardown_s=teardown,
                phase=state.phase,
                requests_cut=launch.requests_cut,
            )
        )
        return LaunchOutcome(exit_code, cause, state.snapshot(), was_ready)

    async def _stop_workers(self, launch: Launch, fail_fast: bool, spare: str | None) -> float:
        """HTTP first, then schedulers: SIGTERM, grace period, SIGKILL of what remains of each tree.

        Each group is gone (and reaped, its ``exited`` events out) before the next is signalled.
        With ``fail_fast`` (the launch failed), every worker still starting is first killed at
        once, with no grace period: it holds nothing to drain. ``spare`` (the worker whose own
        failure is the root cause, on its way out by itself) is left to the ordered stop; a
        start-up timeout spares none, since the worker it names is only the first still starting.
        """
        started = time.monotonic()
        if fail_fast:
            starting = [
                w
                for w in launch.workers
                if w.child.running and not w.state.ready and w.name != spare
            ]
            for worker in starting:
                worker.stopped_at_once = True
                blamed = launch.blamed if launch.blamed != worker.name else None
                launch.mark_stopped(worker, because_of=blamed, at_once=True)
            await launch.stop(starting, 0)
            for worker in starting:
                launch.record_exit(worker)
        for roles in (("http",), ("scheduler",), None):
            group = [
                w
                for w in launch.workers
                if w.process is not None
                and not w.child.exit_seen
                and (roles is None or w.spec.role in roles)
            ]
            await launch.stop(group, self.args.stop_grace_period)
            for worker in group:
                launch.record_exit(worker)
        await launch.sweep_leftovers()
        return time.monotonic() - started

    # ----------------------------------------------------------------- open and close
    def _open(self, release: contextlib.ExitStack) -> Launch:
        """The runtime directory, the plan, the state, the sockets and the state file; each is
        released by ``release``, also when a later step fails."""
        try:
            rundir = RuntimeDir()
        except RuntimeDirError as exc:
            raise LaunchError(
                RootCause(
                    "cannot set up the runtime directory", ExitCode.SETUP_FAILED, message=str(exc)
                )
            ) from exc
        release.callback(rundir.remove)
        endpoints = Endpoints(
            runtime_dir=str(rundir.path),
            status=rundir.endpoint("launcher.status"),
            ops=rundir.endpoint("launcher.ops"),
            query=rundir.endpoint("launcher.query"),
        )
        args = self.args
        try:
            specs = plan_children(
                args,
                payload=self._payload,
                platform_key=self.selection.key,
                runtime=self.runtime,
                endpoints=endpoints,
            )
        except PlanError as exc:
            raise LaunchError(
                RootCause("invalid server arguments", ExitCode.USAGE, message=str(exc))
            ) from exc

        serves_http = any(s.role == "http" for s in specs)
        url = f"http://{_url_host(args.host)}:{args.port}" if serves_http else None
        state = self.state = LaunchState(
            runtime=self.runtime,
            platform=self.selection.key,
            platform_reason=self.selection.reason,
            url=url,
            node_rank=args.node_rank,
            nnodes=args.nnodes,
            workers=[WorkerState(s.role, s.rank, s.local_rank, args.node_rank) for s in specs],
        )
        zctx = zmq.asyncio.Context()
        release.callback(zctx.destroy, linger=500)
        try:
            ops = OpsChannel(zctx, state, endpoints.ops, endpoints.query)
        except zmq.ZMQError as exc:
            raise _ipc_error(rundir, exc) from exc
        release.callback(ops.close)  # after the launch's own release (last in, first out)
        for listener in self._listeners:
            ops.add_listener(listener)
        loop = asyncio.get_running_loop()
        output = None
        if self._worker_output is not None:
            output = WorkerOutput(loop, self._worker_output, self._output_streams)
        schedulers = [s for s in specs if s.role == "scheduler"]
        try:
            launch = Launch(
                zctx,
                endpoints.status,
                specs,
                state,
                ops.publish,
                args=args,
                selection=self.selection,
                revision=first_revision(
                    args, self._payload, schedulers[0].entry_points if schedulers else None
                ),
                restarts=self._restarts,
                output=output,
                tree_tag=endpoints.runtime_dir,
            )
        except zmq.ZMQError as exc:
            raise _ipc_error(rundir, exc) from exc
        release.callback(launch.close)
        rollouts = launch.rollouts
        ops.add_command("reload", rollouts.reload_command)
        ops.add_command("scale", rollouts.scale_command)
        ops.add_command("replica.probed", rollouts.probed_command)
        ops.add_command("replica.drained", rollouts.drained_command)
        ops.start()
        try:
            rundir.write_state(
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
        except RuntimeDirError as exc:
            raise LaunchError(
                RootCause(
                    "cannot write the launcher's state file",
                    ExitCode.SETUP_FAILED,
                    message=str(exc),
                )
            ) from exc
        with self._lock:
            self._launch = launch
            if self._early_stop:
                launch.post(Stop(self._early_stop))
        return launch

    def _closed(self) -> None:
        """The launch is over (or never started): requests from now on are no-ops."""
        with self._lock:
            self._launch = None
        self.opened.set()

    # ----------------------------------------------------------------- server events
    def _announce_starting(self, launch: Launch) -> None:
        state = launch.state
        launch.publish(
            events.ServerStarting(
                platform=self.selection.key,
                platform_reason=self.selection.reason,
                cpu_fallback=is_cpu_fallback(self.selection),
                runtime=self.runtime,
                url=state.url,
                node_rank=state.node_rank,
                nnodes=state.nnodes,
                workers=[w.name for w in state.workers],
            )
        )

    def _announce_ready(self, launch: Launch, startup_s: float) -> None:
        state = launch.state
        state.phase = READY
        state.ready_at = time.time()
        launch.publish(
            events.ServerReady(
                url=state.url,
                node_rank=state.node_rank,
                worker_count=len(state.workers),
                startup_s=startup_s,
            )
        )


def _ipc_error(rundir: RuntimeDir, exc: zmq.ZMQError) -> LaunchError:
    """The launcher's own sockets cannot be bound in ``rundir`` (a full or read-only state
    directory, say): a set-up failure that names the directory and the fix."""
    base = rundir.path.parent
    return LaunchError(
        RootCause(
            "cannot set up the launcher's IPC sockets",
            ExitCode.SETUP_FAILED,
            message=f"binding a socket in {rundir.path} failed: {exc.strerror or exc}",
            hint=f"make {base} writable and free some space there, or set XDG_RUNTIME_DIR to "
            "another private directory of yours (mkdir -m 700 DIR)",
        )
    )


def _warn_of_failures_while_winding_down(workers: list[Worker]) -> None:
    """Stopping was asked for and everything is gone; a crash on the way out is worth a warning
    (its report is in the snapshot), not a failed exit."""
    for worker in workers:
        failure = worker.failure
        if failure is not None and failure.phase == phases.STOPPING:
            log.warning(
                "%s failed while winding down: %s: %s",
                worker.name,
                failure.exc_type,
                failure.message,
            )


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
