"""One running launch: what the supervisor holds from open to close, and what happens to it.

A ``Launch`` exists while one launch runs (``Supervisor.run`` makes it once the runtime directory
and the plan exist). It holds the ``LaunchState`` ops tooling sees, one ``Worker`` per child, the
``Children`` watcher and its status socket, the workers' output pipes, the watchdog, and the
inbox the supervisor waits on; its events leave through the ``publish`` it is given. It composes
the launch's parts, each handed only the callables it acts through: the restarts
(``healing.Healing``), the replicas in service, starting and retiring (``replicas.ReplicaSet``)
and the reloads and scales (``rollout.Rollouts``).

It turns what happens into state, events and inbox items: a status message updates the worker's
record and is published as an event; a failure, an exit, a silent worker or every worker ready
becomes an ``Input`` in the inbox (``Failure``, ``Exit``, ``AllReady``; ``Stop`` comes from a stop
request). The first failure names the worker that is to blame (``blamed``): what other workers
report after it is a consequence, and they are recorded as stopped. What to do about an input
(fail, heal, stop) is decided by the supervisor and by ``Healing``. A worker of a replica that
healing restarts is healing's (``Healing.stage``), and one of a replica that a reload or a scale
is starting or retiring is the replica set's (``ReplicaSet.stage``): their news goes there,
never to the inbox.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from bootstrap import manifest, messages, phases
from bootstrap import proctree as _proctree
from bootstrap.children import Child, Children
from bootstrap.phases import signal_name
from launcher.supervisor import diagnose
from launcher.supervisor.healing import Healing
from launcher.supervisor.replicas import RETIRING, STARTING, ReplicaSet
from launcher.supervisor.restarts import DOWN, RESPAWNED, Restarts
from launcher.supervisor.rollout import Rollouts
from launcher.supervisor.secrets import API_KEY_ENV
from launcher.supervisor.state import READY, WorkerState
from launcher.supervisor.watchdog import Watchdog
from launcher.supervisor.workers import Worker, snapshot_order
from launchspec import events
from launchspec.causes import RootCause

if TYPE_CHECKING:
    import multiprocessing.process

    import zmq.asyncio

    from bootstrap import ProcessSpec
    from launcher.supervisor.output import WorkerOutput
    from launcher.supervisor.revision import Revision
    from launcher.supervisor.state import ChangeState, LaunchState
    from launchspec.server_args import ServerArgs
    from platforms import Selection

log = logging.getLogger("launcher")

__all__ = ["AllReady", "Exit", "Failure", "Input", "Launch", "Stop", "Timeout", "Worker"]


# -- what the supervisor waits for ------------------------------------------------------------------
@dataclass(frozen=True)
class Stop:
    """A stop was requested (a signal, ``request_stop``)."""

    reason: str


@dataclass(frozen=True)
class Failure:
    """Something failed; ``cause`` says what."""

    cause: RootCause


@dataclass(frozen=True)
class Exit:
    """``process``, ``worker``'s process when its sentinel fired, ended."""

    worker: Worker
    process: multiprocessing.process.BaseProcess | None


@dataclass(frozen=True)
class AllReady:
    """Every worker of this node reported ready."""


@dataclass(frozen=True)
class Timeout:
    """The deadline ``Launch.next`` was given passed first."""


Input = Stop | Failure | Exit | AllReady | Timeout


class Launch:
    """The state of one running launch (see the module docstring). Made on the running loop.

    It is the composition root of the launch's parts: ``healing`` (``Healing``), ``replicas``
    (``ReplicaSet``) and ``rollouts`` (``Rollouts``) are each handed the few callables they act
    through (its methods, and each other's where one needs another's news), never the launch.
    ``publish`` is how its events leave (``OpsChannel.publish``)."""

    def __init__(
        self,
        zctx: zmq.asyncio.Context,
        status_endpoint: str,
        specs: list[ProcessSpec],
        state: LaunchState,
        publish: Callable[[events.Event], object],
        *,
        args: ServerArgs,
        selection: Selection,
        revision: Revision,
        restarts: Restarts,
        output: WorkerOutput | None,
        tree_tag: str,
    ) -> None:
        self.loop = asyncio.get_running_loop()
        self.state = state
        self.publish = publish
        self.output = output
        self.platform = selection.key  # the key of the platform the supervisor selected
        self.inbox: asyncio.Queue[Input] = asyncio.Queue()
        self.grace_over = asyncio.Event()  # set: the grace period of a stop is over
        self.stop_reason: str | None = None
        self.stopping = False
        # The worker whose failure or exit is the root cause, from the moment it is known: what
        # other workers report after it is a consequence (they are reported as stopped).
        self.blamed: str | None = None
        self.requests_cut: int | None = None  # the HTTP child's count, from its stopped report
        self.subreaper = False  # adopts the orphans of workers that die (the CLI's process only)
        # Every worker, and all it starts, carries the launch's tag; no worker inherits the key.
        self.tree_tag = tree_tag
        environment = {_proctree.TREE_VARIABLE: tree_tag, API_KEY_ENV: None}
        self.children = Children(
            zctx, status_endpoint, self._on_message, self._on_exit, environment=environment
        )
        self.workers = [
            Worker(self.children.add(spec), ws)
            for spec, ws in zip(specs, state.workers, strict=True)
        ]
        self.watchdog = Watchdog(args.watchdog_timeout, self._on_hung, self._on_stuck)
        self._watching: asyncio.Task[None] | None = None
        self.replicas = ReplicaSet(
            [w for w in self.workers if w.dp_rank is not None],
            args,
            publish=publish,
            ranks=self.ranks,
            add_worker=self.add_worker,
            drop_worker=self.drop_worker,
            spawn=self.spawn,
            stop=self.stop_in_turn,
            end_at_once=self.end_at_once,
            exit_cause=self.exit_cause,
            unwatch=self.watchdog.forget,
            http_probes=self._http_probes,
            in_service_changed=self._show_replicas,
            left=restarts.forget,
        )
        self.healing = Healing(
            restarts,
            args.startup_timeout,
            publish=publish,
            fail=self.fail,
            worker_named=self.worker_named,
            ranks=self.ranks,
            end_at_once=self.end_at_once,
            spawn_again=self.spawn_again,
            in_service=self.replicas.serving,
            set_aside=self.replicas.set_aside,
        )
        self.rollouts = Rollouts(
            self.replicas,
            revision,
            selection,
            args,
            publish=publish,
            refusal=self._change_refusal,
            restarting=self.healing.restarting,
            until_healed=self.healing.healed,
            follow_replicas=restarts.follow,
            show_revision=self._show_revision,
            show_change=self._show_change,
            last_seq=lambda: self.state.seq,
        )
        self._show_replicas(self.replicas.serving())

    # ------------------------------------------------------------------ the inbox
    def post(self, item: Input) -> None:
        if isinstance(item, Stop) and self.stop_reason is None:
            self.stop_reason = item.reason
            log.debug("stopping: %s", item.reason)
        self.inbox.put_nowait(item)

    def fail(self, cause: RootCause) -> None:
        """Report a failure to the supervisor."""
        self.post(Failure(cause))

    async def next(self, deadline: float | None) -> Input:
        """The next input; ``Timeout`` once ``deadline`` (``time.monotonic()``) passed."""
        if deadline is None:
            return await self.inbox.get()
        try:
            return await asyncio.wait_for(self.inbox.get(), max(0.0, deadline - time.monotonic()))
        except TimeoutError:
            return Timeout()

    # ------------------------------------------------------------------ the workers
    def worker_named(self, name: str | None) -> Worker | None:
        return next((w for w in self.workers if w.name == name), None)

    def ranks(self, dp_rank: int) -> list[Worker]:
        """The scheduler ranks of replica ``dp_rank`` on this node."""
        return [w for w in self.workers if w.dp_rank == dp_rank]

    def add_worker(self, spec: ProcessSpec) -> Worker:
        """A new worker of the running launch (a replica a reload or a scale starts), to spawn."""
        worker = Worker(
            self.children.add(spec),
            WorkerState(spec.role, spec.rank, spec.local_rank, self.state.node_rank),
        )
        self.workers.append(worker)
        self.workers.sort(key=snapshot_order)
        self.state.workers = [w.state for w in self.workers]
        return worker

    def drop_worker(self, worker: Worker) -> None:
        """Forget ``worker``, whose process ended and was reaped (its replica was retired)."""
        self.watchdog.forget(worker.name)
        self.children.forget(worker.child)
        if worker in self.workers:
            self.workers.remove(worker)
        self.state.workers = [w.state for w in self.workers]

    def spawn(self, worker: Worker) -> None:
        """Start ``worker`` (at launch, or as a rank of a replica a change starts)."""
        if self.output is None:
            self.children.spawn(worker.child)
        else:
            self.output.spawn(self.children, worker.child)
        worker.state.pid = worker.child.pid

    def spawn_again(self, worker: Worker, attempt: int, cause: str | None = None) -> None:
        """Start ``worker`` again for restart ``attempt`` of its replica (after the failure
        ``cause``), and say so."""
        self.spawn(worker)
        worker.state.restarted(worker.child.pid, cause)
        self.publish(events.WorkerRestarted(**self._fields(worker), restart=attempt))

    async def reap(self, worker: Worker) -> int | None:
        """The exit code of a worker whose process ended; its ``exited`` event the first time."""
        if not worker.child.exit_seen:
            await self.children.reap(worker.child)
        self.record_exit(worker)
        return worker.child.exitcode

    def record_exit(self, worker: Worker) -> None:
        """Record how a reaped worker's process ended and say so, once."""
        ws = worker.state
        if ws.exited:
            return
        code = worker.child.exitcode
        ws.exited, ws.exitcode, ws.signal = True, code, signal_name(code)
        self.publish(events.WorkerExited(**self._fields(worker), exitcode=code, signal=ws.signal))

    async def stop(self, workers: list[Worker], grace: float) -> None:
        """End ``workers`` (SIGTERM, ``grace`` s or until ``grace_over``, SIGKILL; 0: SIGKILL at
        once)."""
        await self.children.stop([w.child for w in workers], grace, hurry=self.grace_over)

    async def stop_in_turn(self, workers: list[Worker], grace: float) -> None:
        """Stop ``workers`` (a replica that drained) with the grace period, record how each
        ended, and end what they left behind."""
        await self.stop([w for w in workers if w.process is not None], grace)
        for worker in workers:
            self.record_exit(worker)
        await self.sweep_leftovers()

    async def end_at_once(
        self, workers: list[Worker], *, because_of: str | None, restart: bool = False
    ) -> None:
        """SIGKILL what runs of ``workers`` (their replica finishes nothing more), each recorded
        as stopped because of ``because_of`` (``restart``: for its replica's restart), then reap
        them all and end whatever they left behind."""
        for worker in workers:
            self.watchdog.forget(worker.name)
        running = [w for w in workers if w.child.running]
        for worker in running:
            if worker.state.phase != phases.STOPPED:
                self.mark_stopped(
                    worker, because_of=because_of, restart=restart, at_once=not restart
                )
        await self.stop(running, 0)
        for worker in workers:
            if worker.process is not None:
                await self.reap(worker)
        await self.sweep_leftovers()

    async def sweep_leftovers(self) -> None:
        """End what a dead worker left behind: as a subreaper, what was re-parented to us (and
        reap it); in any case, what carries the launch's tag outside our tree (a supervisor that
        is no subreaper sees a dead worker's children re-parented away from it)."""
        swept = []
        if self.subreaper:
            pids = {w.child.pid for w in self.workers if w.child.pid is not None}
            swept = await _proctree.sweep_adopted(pids)
        swept += _proctree.sweep_strays(self.tree_tag)
        if swept:
            log.debug("ended %d process(es) left behind by exited workers: %s", len(swept), swept)

    async def exit_cause(self, worker: Worker, server_ready: bool = True) -> RootCause:
        """``worker`` exited on its own: record how, wait for its report if it sent one, explain.
        ``server_ready`` False: the launch is still starting, so the server counts as ready only
        when every worker's ready report (a late one included) is in."""
        code = await self.reap(worker)
        await self.children.settle(worker.child)
        await self.sweep_leftovers()
        if worker.failure is not None:
            return diagnose.failed(worker.state, worker.failure, code)
        return diagnose.exited(worker.state, code, server_ready or self.state.all_ready())

    # ------------------------------------------------------------------ events and the snapshot
    def mark_stopped(
        self,
        worker: Worker,
        *,
        because_of: str | None = None,
        error: events.WorkerError | None = None,
        restart: bool = False,
        at_once: bool = False,
        info: dict[str, object] | None = None,
    ) -> None:
        """Record ``worker`` as stopped and say so (see ``events.WorkerStopped``)."""
        worker.state.phase = phases.STOPPED
        self.publish(
            events.WorkerStopped(
                **self._fields(worker),
                because_of=because_of,
                error=error,
                restart=restart,
                at_once=at_once,
                info=dict(info or {}),
            )
        )

    def _fields(self, worker: Worker) -> events.WorkerFields:
        return self.state.worker_fields(worker.state)

    def _show_replicas(self, dp_ranks: list[int]) -> None:
        self.state.replicas = list(dp_ranks)

    def _show_revision(self, revision: Revision) -> None:
        self.state.model_path = revision.model_path
        self.state.served_model_name = revision.served_name

    def _show_change(self, change: ChangeState | None) -> None:
        self.state.change = change

    def _change_refusal(self) -> str | None:
        """Why the launch takes no reload or scale now (None: it does)."""
        if self.stopping or self.stop_reason is not None:
            return "the launcher is stopping"
        if self.state.phase != READY:
            return f"the server is {self.state.phase}, not ready; wait until it is ready"
        return None

    def _http_probes(self) -> bool:
        """The HTTP child probes joining replicas and reports draining ones drained."""
        return any(
            w.spec.role == "http" and w.state.ready and w.state.info.get("probes_replicas") is True
            for w in self.workers
        )

    # ------------------------------------------------------------------ the watchdog
    def start_watching(self) -> None:
        """Start the watchdog over the workers that reported ready (the server is ready)."""
        self._watching = asyncio.create_task(self.watchdog.run())

    def stop_watching(self) -> None:
        """From here a silent worker is no failure (the launch is stopping)."""
        if self._watching is not None:
            self._watching.cancel()

    # ------------------------------------------------------------------ what happens
    def _on_message(self, child: Child, message: messages.Message) -> None:
        worker = self._worker_of(child)
        ws = worker.state
        self.watchdog.heard(ws.name)
        if isinstance(message, messages.Heartbeat):
            self.watchdog.busy(ws.name, message.busy_s)
            return  # a stalled child is caught by the deadline, its sentinel or the watchdog
        if worker.stopped_at_once and isinstance(message, (messages.Phase, messages.Ready)):
            return  # sent before it was killed, read after: old news about a stopped worker
        if self.healing.stage(worker) == DOWN or self.replicas.stage(worker) == RETIRING:
            if isinstance(message, messages.Failed) and ws.phase != phases.STOPPED:
                # Its replica is restarting because of a peer, or being retired: a consequence,
                # kept, not a cause.
                ws.error = _error_of(message)
                self.mark_stopped(
                    worker, error=ws.error, because_of=self.healing.because_of(worker)
                )
            elif isinstance(message, messages.Stopped) and self.healing.stage(worker) != DOWN:
                self.mark_stopped(worker)
            return
        if isinstance(message, messages.Phase):
            ws.phase = message.phase
            ws.phases[message.phase] = message.duration
            self.publish(
                events.WorkerPhase(
                    **self._fields(worker),
                    phase=message.phase,
                    duration=message.duration,
                    early_imports=message.early_imports,
                )
            )
        elif isinstance(message, messages.Ready):
            self._on_ready(worker, message)
        elif isinstance(message, messages.Failed):
            self._on_failed(worker, message)
        elif isinstance(message, messages.Stopped):
            cut = message.info.get("requests_cut")
            if isinstance(cut, int):  # requests still running when the grace period ran out
                self.requests_cut = (self.requests_cut or 0) + cut
            self.mark_stopped(worker, info=message.info)

    def _on_ready(self, worker: Worker, message: messages.Ready) -> None:
        ws = worker.state
        ws.phase, ws.ready, ws.ready_at = phases.READY, True, message.time
        ws.phases[phases.READY] = message.duration
        ws.platform, ws.info = message.platform, dict(message.info)
        ws.manifest = message.manifest
        ws.manifest_differs = self._manifest_differences(ws)
        if not self.stopping:
            self.watchdog.watch(ws.name)
        self.publish(
            events.WorkerReady(
                **self._fields(worker),
                duration=message.duration,
                info=ws.info,
                manifest=ws.manifest,
                differs=ws.manifest_differs,
            )
        )
        starting = self.replicas.stage(worker) == STARTING
        if message.platform != self.platform:
            cause = diagnose.wrong_platform(ws, message.platform, self.platform)
            if starting:
                self.replicas.rank_failed(worker, cause)
                return
            self.blamed = self.blamed or ws.name
            self.fail(cause)
        elif starting:
            self.replicas.rank_ready(worker)
        elif self.healing.stage(worker) == RESPAWNED:
            self.healing.rank_ready(worker)
        elif self.state.all_ready():
            self.post(AllReady())

    def _manifest_differences(self, ws: WorkerState) -> list[str]:
        """How ``ws``'s manifest differs from the first ready peer's of its role (logged once)."""
        if ws.manifest is None:
            return []
        for peer in self.state.workers:
            if peer is ws or peer.role != ws.role or not peer.ready or peer.manifest is None:
                continue
            found = manifest.differences(ws.manifest, peer.manifest, peer.name)
            if found:
                log.warning(
                    "%s has other plugins than %s: %s", ws.name, peer.name, "; ".join(found)
                )
            return found
        return []

    def _on_failed(self, worker: Worker, message: messages.Failed) -> None:
        ws = worker.state
        ws.error = _error_of(message)
        if self.replicas.stage(worker) == STARTING and not self.stopping:
            self.publish(events.WorkerFailed(**self._fields(worker), error=ws.error))
            self.replicas.rank_failed(worker, diagnose.failed(ws, message, message.exit_code))
            return
        if self.blamed is not None and self.blamed != ws.name:
            # A consequence of the root cause (a peer gone, a stop on the way): its report is
            # kept in the snapshot, and the worker counts as stopped, not failed.
            if ws.phase != phases.STOPPED:
                self.mark_stopped(worker, error=ws.error, because_of=self.blamed)
            return
        if self.stop_reason is None and not self.stopping:
            self.blamed = ws.name
        self.publish(events.WorkerFailed(**self._fields(worker), error=ws.error))
        # A worker that reported while it goes on running (``alive``) has not exited (yet).
        self.fail(diagnose.failed(ws, message, None if message.alive else message.exit_code))

    def _on_exit(self, child: Child) -> None:
        worker = self._worker_of(child)
        self.watchdog.forget(worker.name)
        if self.healing.stage(worker) == DOWN:
            return  # its replica's restart ends and reaps it
        if self.replicas.stage(worker) is not None and not self.stopping:
            self.replicas.rank_exited(worker)  # the change that owns its replica decides
            return
        if self.blamed is None and not self.stopping and self.stop_reason is None:
            self.blamed = worker.name
        self.post(Exit(worker, child.process))

    def _on_hung(self, name: str, quiet: float) -> None:
        """The watchdog found ``name`` silent: the launch fails with it as the root cause."""
        self._on_watchdog(name, diagnose.hung, quiet)

    def _on_stuck(self, name: str, busy: float) -> None:
        """The watchdog found ``name``'s step running past the timeout: as a silent worker."""
        self._on_watchdog(name, diagnose.stuck, busy)

    def _on_watchdog(
        self, name: str, cause_of: Callable[[WorkerState, float, float], RootCause], seconds: float
    ) -> None:
        worker = self.worker_named(name)
        if worker is None or self.stopping or self.stop_reason is not None:
            return
        if self.healing.stage(worker) == DOWN:
            return  # its replica is being restarted already
        stage = self.replicas.stage(worker)
        if stage is not None:
            if stage == STARTING:
                self.replicas.rank_failed(
                    worker, cause_of(worker.state, seconds, self.watchdog.timeout)
                )
            return
        self.blamed = self.blamed or name
        self.fail(cause_of(worker.state, seconds, self.watchdog.timeout))

    def _worker_of(self, child: Child) -> Worker:
        return next(w for w in self.workers if w.child is child)

    def close(self) -> None:
        """Release what the launch holds (the supervisor stopped every worker before)."""
        self.stop_watching()
        self.healing.cancel()
        self.rollouts.cancel()
        self.children.close()  # kills leftovers only after an unexpected error
        if self.output is not None:
            self.output.drain()


def _error_of(message: messages.Failed) -> events.WorkerError:
    """A worker's ``failed`` report as its record's ``error``."""
    return events.WorkerError(
        phase=message.phase,
        type=message.exc_type,
        message=message.message,
        traceback=message.traceback,
    )
