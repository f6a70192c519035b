"""Healing: the restarts of a running launch's scheduler replicas.

``Healing`` takes a failure of a ready launch's scheduler and, when the policy allows
(``launcher.supervisor.restarts.Restarts``: ``--restart-policy``, ``--max-restarts``,
``--restart-backoff``), ends what is left of that replica (the ``tp_size`` ranks of one
data-parallel group, restarted as a unit), waits the backoff and spawns all its ranks again
through the same bootstrap, while the other replicas and the HTTP child keep serving. Events
``replica.<dp>.restarting`` and ``replica.<dp>.ready`` tell the HTTP child to route around the
replica and back to it. While a replica is ``DOWN``, what its ranks report and how they exit is
a consequence of its restart, not a new failure; once ``RESPAWNED``, a failure of a rank is
decided again; a restarted replica not ready within ``--startup-timeout`` has failed again.
A replica that fails once more after its ``--max-restarts`` is taken out of service while
another serves (``replica.<dp>.removed``, its ``cause`` saying why) and ends the launch only when
it was the last.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from typing import TYPE_CHECKING

from bootstrap import phases
from launcher.supervisor import diagnose
from launcher.supervisor.restarts import DOWN, RESPAWNED, ReplicaRestart, Restarts
from launchspec import events
from launchspec.causes import ExitCode

if TYPE_CHECKING:
    from launcher.supervisor.launch import Launch, Worker
    from launchspec.causes import RootCause

log = logging.getLogger("launcher")


class Healing:
    """The replica restarts of one running launch (see the module docstring). ``stage``,
    ``because_of`` and ``is_stale`` tell the launch what a worker's news means while its replica
    restarts; ``take`` decides on a failure; ``rank_ready`` notices a replica back."""

    def __init__(self, launch: Launch, restarts: Restarts, startup_timeout: float) -> None:
        self._launch = launch
        self.restarts = restarts
        self._startup_timeout = startup_timeout
        self._in_progress: dict[int, ReplicaRestart] = {}  # dp rank -> its restart
        self._set_aside_pids: set[int] = set()  # processes of replicas taken out of service
        self._tasks: set[asyncio.Task[None]] = set()  # replicas being taken out of service

    @property
    def in_progress(self) -> list[int]:
        """The dp ranks of the replicas restarting now."""
        return sorted(self._in_progress)

    def stage(self, worker: Worker) -> str | None:
        """``DOWN`` or ``RESPAWNED`` while ``worker``'s replica restarts, else None."""
        restart = self._restart_of(worker)
        return restart.stage if restart is not None else None

    def because_of(self, worker: Worker) -> str | None:
        """The worker whose failure restarts ``worker``'s replica."""
        restart = self._restart_of(worker)
        return restart.because_of if restart is not None else None

    def is_stale(self, cause: RootCause) -> bool:
        """``cause`` concerns a process that a replica restart ended or replaced."""
        if cause.pid is not None and cause.pid in self._set_aside_pids:
            return True  # a rank of a replica taken out of service: its end is under way
        worker = self._launch.worker_named(cause.worker)
        if worker is None:
            return False
        replaced = cause.pid is not None and worker.state.pid != cause.pid
        return replaced or self.stage(worker) == DOWN

    def take(self, cause: RootCause) -> bool:
        """Start restarting the replica of ``cause.worker`` when the policy allows (True); else
        False, and ``cause`` (whose hint then says restarts ran out) ends the launch. During a
        stop nothing is restarted, but a failure the policy would have healed is still True."""
        launch = self._launch
        worker = launch.worker_named(cause.worker)
        dp = worker.dp_rank if worker is not None else None
        if dp is None:
            return False
        if launch.stop_reason is not None:
            # A stop was asked for before this failure was handled: nothing is restarted, and a
            # replica the policy would have restarted is no failure of the launch (it exits 0).
            if not self.restarts.would_restart(dp):
                return False
            launch.blamed = None
            return True
        decision = self.restarts.decide(dp)
        if decision.exhausted and launch.replicas.others_serve(dp):
            self._set_aside(dp, cause, decision.reason)
            return True
        if not decision.restart:
            if decision.exhausted:
                cause.exit_code = ExitCode.WORKER_DIED  # the server was ready before this
                cause.hint = f"{cause.hint}; {decision.reason}" if cause.hint else decision.reason
            return False
        previous = self._in_progress.get(dp)
        if previous is not None:  # its restarted ranks failed while starting: once more
            previous.cancel()
        restart = ReplicaRestart(dp, decision.attempt, cause.summary, because_of=cause.worker)
        self._in_progress[dp] = restart
        launch.blamed = None  # the launch goes on: the next failure is a root cause again
        restart.task = asyncio.create_task(self._restart(restart, cause, decision.delay))
        return True

    def _set_aside(self, dp: int, cause: RootCause, reason: str) -> None:
        """Replica ``dp`` used its restarts but others serve: it leaves the launch, which goes on
        with one replica fewer (a scale brings the count back)."""
        launch = self._launch
        launch.blamed = None  # the launch goes on: the next failure is a root cause again
        self._set_aside_pids.update(p for p in launch.replicas.pids(dp) if p is not None)
        log.error(
            "%s: %s; it is taken out of service and the other replicas serve on "
            "(sglang-launch scale --dp-size N starts a fresh one)",
            cause.summary,
            reason,
        )
        task = launch.replicas.set_aside(dp, cause, reason)
        self._tasks.add(task)
        task.add_done_callback(self._set_aside_done)

    def _set_aside_done(self, task: asyncio.Task[None]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.error("a replica could not be taken out of service: %r", task.exception())

    def rank_ready(self, worker: Worker) -> None:
        """A rank of a restarting replica is ready: once all are, the replica serves again."""
        launch = self._launch
        restart = self._restart_of(worker)
        if restart is None or launch.stopping:
            return
        workers = launch.replica(restart.dp_rank)
        if not all(w.state.ready for w in workers):
            return
        del self._in_progress[restart.dp_rank]
        if restart.timer is not None:
            restart.timer.cancel()
        down = time.monotonic() - restart.died_at
        log.debug(
            "%s serves again (restart %d, %.1fs after it failed)",
            restart.name,
            restart.attempt,
            down,
        )
        launch.publish(
            events.ReplicaReady(
                replica=restart.name,
                dp_rank=restart.dp_rank,
                attempt=restart.attempt,
                down_s=down,
                pids=[w.state.pid for w in workers],
            )
        )

    def cancel(self) -> None:
        """Stop every restart in progress (the launch is stopping)."""
        for restart in self._in_progress.values():
            restart.cancel()

    def _restart_of(self, worker: Worker) -> ReplicaRestart | None:
        dp = worker.dp_rank
        return self._in_progress.get(dp) if dp is not None else None

    async def _restart(self, restart: ReplicaRestart, cause: RootCause, delay: float) -> None:
        """Kill what is left of the replica, wait ``delay`` s, spawn all its ranks again; a
        restart that cannot be done is the launch's root cause."""
        try:
            await self._respawn(restart, cause, delay)
        except Exception as exc:  # noqa: BLE001 - reported as the root cause, never lost
            log.exception("%s could not be restarted", restart.name)
            self._launch.fail(diagnose.restart_impossible(restart.name, cause, exc))

    async def _respawn(self, restart: ReplicaRestart, cause: RootCause, delay: float) -> None:
        launch = self._launch
        workers = launch.replica(restart.dp_rank)
        max_restarts = self.restarts.max_restarts
        log.debug(
            "%s restarts (attempt %d of %d, in %.1fs): %s",
            restart.name,
            restart.attempt,
            max_restarts,
            delay,
            cause.summary,
        )
        launch.publish(
            events.ReplicaRestarting(
                replica=restart.name,
                dp_rank=restart.dp_rank,
                workers=[w.name for w in workers],
                attempt=restart.attempt,
                max_restarts=max_restarts,
                backoff_s=delay,
                cause=cause.summary,
                root_cause=dataclasses.replace(cause),
            )
        )
        survivors = [w for w in workers if w.child.running]
        for worker in workers:
            launch.watchdog.forget(worker.name)
        for worker in survivors:
            if worker.state.phase != phases.STOPPED:
                launch.stopped(worker, because_of=restart.because_of, restart=True)
        await launch.stop(survivors, 0)  # a broken group drains nothing
        for worker in workers:
            if worker.process is not None:
                await launch.reap(worker)
        await launch.sweep_adopted()
        await asyncio.sleep(delay)
        restart.stage = RESPAWNED
        for worker in workers:
            spec = worker.child.spec
            env = {**spec.env, "SGLANG_LAUNCH_RESTART": str(restart.attempt)}
            worker.child.spec = dataclasses.replace(spec, env=env)
            launch.spawn(worker)
            launch.restarted(worker, restart.attempt)
        restart.timer = launch.loop.call_later(self._startup_timeout, self._timed_out, restart)

    def _timed_out(self, restart: ReplicaRestart) -> None:
        """The restarted replica was not ready within ``--startup-timeout``: it failed again."""
        launch = self._launch
        if self._in_progress.get(restart.dp_rank) is not restart or launch.stopping:
            return
        waiting = [w.state for w in launch.replica(restart.dp_rank) if not w.state.ready]
        if waiting:
            launch.fail(diagnose.restart_timeout(restart.name, waiting, self._startup_timeout))
