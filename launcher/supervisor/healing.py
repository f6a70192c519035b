"""Healing: the restarts of a running launch's scheduler replicas.

``Healing.handle_failure`` takes a failure of a ready launch's scheduler and answers with a
``Verdict`` (``judge``, a pure function of the restart bookkeeping and what serves): when the
policy allows (``launcher.supervisor.restarts.Restarts``: ``--restart-policy``,
``--max-restarts``, ``--restart-backoff``) the replica restarts: what is left of it (the
``tp_size`` ranks of one data-parallel group, restarted as a unit) is ended, the backoff runs and
all its ranks are spawned again through the same bootstrap, while the other replicas and the HTTP
child keep serving. Events ``replica.<dp>.restarting`` and ``replica.<dp>.ready`` tell the HTTP
child to route around the replica and back to it. While a replica is ``DOWN``, what its ranks
report and how they exit is a consequence of its restart, not a new failure; once ``RESPAWNED``,
a failure of a rank is judged again; a restarted replica not ready within ``--startup-timeout``
has failed again. A replica that fails once more after its ``--max-restarts`` is taken out of
service while another serves (``replica.<dp>.removed``, its ``cause`` saying why) and ends the
launch only when it was the last.

Healing is handed the callables it acts through (publish an event, report a failure, find a
worker or a replica's ranks, end ranks at once, spawn one again, the replicas in service, take
one out of service), never the launch. Who waits for a replica to serve again (a reload that
reaches it) awaits ``healed(dp)``.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from launcher.supervisor import diagnose
from launcher.supervisor.plan import INCARNATION_ENV
from launcher.supervisor.restarts import DOWN, RESPAWNED, Decision, ReplicaRestart, Restarts
from launchspec import events
from launchspec.causes import ExitCode

if TYPE_CHECKING:
    from launcher.supervisor.workers import EndAtOnce, Worker
    from launchspec.causes import RootCause

log = logging.getLogger("launcher")

# What becomes of a failed replica (``Verdict.action``).
RESTART = "restart"  # it restarts; the launch goes on
SET_ASIDE = "set aside"  # it used its restarts and leaves; the others serve on
EXCUSED = "excused"  # a stop is under way and the policy would have restarted it: no failure
FATAL = "fatal"  # the failure ends the launch with ``Verdict.cause``


@dataclass(frozen=True)
class Verdict:
    """What a failure of a ready launch's worker leads to: ``action`` (above) and the ``cause``
    the launch ends with when it is ``FATAL`` (the failure's own, or one whose hint says the
    restarts ran out); ``decision`` is the restart bookkeeping's answer, when it was asked."""

    action: str
    cause: RootCause
    decision: Decision | None = None

    @property
    def launch_goes_on(self) -> bool:
        return self.action != FATAL


def judge(
    cause: RootCause,
    dp: int | None,
    restarts: Restarts,
    *,
    stop_requested: bool,
    others_serve: bool,
) -> Verdict:
    """What becomes of the failure ``cause`` of a worker of replica ``dp`` (None: not a
    scheduler, which no policy restarts). ``stop_requested``: a stop was asked for before the
    failure was handled, so nothing restarts, and a replica the policy would have restarted is
    no failure of the launch. ``others_serve``: another replica serves (and is not restarting),
    so one past its restarts can leave instead of ending the launch. A restart decided counts
    in ``restarts``; nothing else changes."""
    if dp is None:
        return Verdict(FATAL, cause)
    if stop_requested:
        return Verdict(EXCUSED if restarts.would_restart(dp) else FATAL, cause)
    decision = restarts.decide(dp)
    if decision.restart:
        return Verdict(RESTART, cause, decision)
    if decision.exhausted and others_serve:
        return Verdict(SET_ASIDE, cause, decision)
    if decision.exhausted:
        hint = f"{cause.hint}; {decision.reason}" if cause.hint else decision.reason
        # The server was ready before this, whatever the worker's own report said.
        cause = dataclasses.replace(cause, exit_code=ExitCode.WORKER_DIED, hint=hint)
    return Verdict(FATAL, cause, decision)


class Healing:
    """The replica restarts of one running launch (see the module docstring). ``stage``,
    ``because_of`` and ``is_stale`` tell the launch what a worker's news means while its replica
    restarts; ``handle_failure`` judges a failure and acts on it; ``rank_ready`` notices a
    replica back."""

    def __init__(
        self,
        restarts: Restarts,
        startup_timeout: float,
        *,
        publish: Callable[[events.Event], object],
        fail: Callable[[RootCause], None],
        worker_named: Callable[[str | None], Worker | None],
        ranks: Callable[[int], list[Worker]],
        end_at_once: EndAtOnce,
        spawn_again: Callable[[Worker, int, str], None],
        in_service: Callable[[], list[int]],
        set_aside: Callable[[int, RootCause, str], asyncio.Future[None]],
    ) -> None:
        self._restarts = restarts
        self._startup_timeout = startup_timeout
        self._publish = publish
        self._fail = fail
        self._worker_named = worker_named
        self._ranks = ranks
        self._end_at_once = end_at_once
        self._spawn_again = spawn_again
        self._in_service = in_service
        self._set_aside = set_aside
        self._in_progress: dict[int, ReplicaRestart] = {}  # dp rank -> its restart
        self._healed: dict[int, asyncio.Future[None]] = {}  # dp rank -> done once it serves
        self._set_aside_pids: set[int] = set()  # processes of replicas taken out of service
        self._tasks: set[asyncio.Future[None]] = set()  # replicas being taken out of service
        self._cancelled = False

    # ------------------------------------------------------------------ what others ask
    def restarting(self) -> list[int]:
        """The dp ranks of the replicas restarting now."""
        return sorted(self._in_progress)

    def healed(self, dp: int) -> Awaitable[None]:
        """Done once replica ``dp`` serves again (at once when it is not restarting), or once it
        left the launch instead; cancelled when the launch stops first."""
        future = self._healed.get(dp)
        if future is None:
            future = asyncio.get_running_loop().create_future()
            future.set_result(None)
        return asyncio.shield(future)

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
        worker = self._worker_named(cause.worker)
        if worker is None:
            return False
        replaced = cause.pid is not None and worker.state.pid != cause.pid
        return replaced or self.stage(worker) == DOWN

    # ------------------------------------------------------------------ a failure
    def handle_failure(self, cause: RootCause, *, stop_requested: bool) -> Verdict:
        """Judge the failure ``cause`` (``judge``) and act on the verdict: start restarting the
        replica of ``cause.worker``, or take it out of service. The caller ends the launch with
        ``verdict.cause`` when the verdict is ``FATAL``."""
        worker = self._worker_named(cause.worker)
        dp = worker.dp_rank if worker is not None else None
        others = dp is not None and any(
            d != dp and d not in self._in_progress for d in self._in_service()
        )
        verdict = judge(
            cause, dp, self._restarts, stop_requested=stop_requested, others_serve=others
        )
        if dp is None or verdict.decision is None:
            return verdict
        if verdict.action == RESTART:
            self._begin_restart(dp, cause, verdict.decision)
        elif verdict.action == SET_ASIDE:
            self._take_out_of_service(dp, cause, verdict.decision.reason)
        return verdict

    def _begin_restart(self, dp: int, cause: RootCause, decision: Decision) -> None:
        previous = self._in_progress.get(dp)
        if previous is not None:  # its restarted ranks failed while starting: once more
            previous.cancel()
        restart = ReplicaRestart(dp, decision.attempt, cause.summary, because_of=cause.worker)
        self._in_progress[dp] = restart
        if dp not in self._healed:
            self._healed[dp] = asyncio.get_running_loop().create_future()
        restart.task = asyncio.create_task(self._restart(restart, cause, decision.delay))

    def _take_out_of_service(self, dp: int, cause: RootCause, reason: str) -> None:
        """Replica ``dp`` used its restarts but others serve: it leaves the launch, which goes on
        with one replica fewer (a scale brings the count back)."""
        previous = self._in_progress.pop(dp, None)
        if previous is not None:  # it failed again while restarting: that restart is over
            previous.cancel()
        self._settle(dp)
        self._set_aside_pids.update(w.state.pid for w in self._ranks(dp) if w.state.pid)
        log.error(
            "%s: %s; it is taken out of service and the other replicas serve on "
            "(sglang-launch scale --dp-size N starts a fresh one)",
            cause.summary,
            reason,
        )
        task = self._set_aside(dp, cause, reason)
        self._tasks.add(task)
        task.add_done_callback(self._set_aside_done)

    def _set_aside_done(self, task: asyncio.Future[None]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.error("a replica could not be taken out of service: %r", task.exception())

    # ------------------------------------------------------------------ a replica back
    def rank_ready(self, worker: Worker) -> None:
        """A rank of a restarting replica is ready: once all are, the replica serves again."""
        restart = self._restart_of(worker)
        if restart is None or self._cancelled:
            return
        workers = self._ranks(restart.dp_rank)
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
        self._publish(
            events.ReplicaReady(
                replica=restart.name,
                dp_rank=restart.dp_rank,
                attempt=restart.attempt,
                down_s=down,
                pids=[w.state.pid for w in workers],
            )
        )
        self._settle(restart.dp_rank)

    def _settle(self, dp: int) -> None:
        """Replica ``dp`` serves again or left: whoever waits for it goes on."""
        future = self._healed.pop(dp, None)
        if future is not None and not future.done():
            future.set_result(None)

    def cancel(self) -> None:
        """Stop every restart in progress (the launch is stopping)."""
        self._cancelled = True
        for restart in self._in_progress.values():
            restart.cancel()
        for future in self._healed.values():
            future.cancel()

    def _restart_of(self, worker: Worker) -> ReplicaRestart | None:
        dp = worker.dp_rank
        return self._in_progress.get(dp) if dp is not None else None

    # ------------------------------------------------------------------ the restart itself
    async def _restart(self, restart: ReplicaRestart, cause: RootCause, delay: float) -> None:
        """End what is left of the replica, wait ``delay`` s, spawn all its ranks again; a
        restart that cannot be done is the launch's root cause."""
        try:
            await self._respawn(restart, cause, delay)
        except Exception as exc:  # noqa: BLE001 - reported as the root cause, never lost
            log.exception("%s could not be restarted", restart.name)
            self._fail(diagnose.restart_impossible(restart.name, cause, exc))

    async def _respawn(self, restart: ReplicaRestart, cause: RootCause, delay: float) -> None:
        workers = self._ranks(restart.dp_rank)
        max_restarts = self._restarts.max_restarts
        log.debug(
            "%s restarts (attempt %d of %d, in %.1fs): %s",
            restart.name,
            restart.attempt,
            max_restarts,
            delay,
            cause.summary,
        )
        self._publish(
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
        # A broken group drains nothing: what runs of it is killed at once.
        await self._end_at_once(workers, because_of=restart.because_of, restart=True)
        await asyncio.sleep(delay)
        restart.stage = RESPAWNED
        for worker in workers:
            spec = worker.child.spec
            env = {**spec.env, INCARNATION_ENV: str(restart.attempt)}
            worker.child.spec = dataclasses.replace(spec, env=env)
            self._spawn_again(worker, restart.attempt, cause.summary)
        loop = asyncio.get_running_loop()
        restart.timer = loop.call_later(self._startup_timeout, self._timed_out, restart)

    def _timed_out(self, restart: ReplicaRestart) -> None:
        """The restarted replica was not ready within ``--startup-timeout``: it failed again."""
        if self._in_progress.get(restart.dp_rank) is not restart or self._cancelled:
            return
        waiting = [w.state for w in self._ranks(restart.dp_rank) if not w.state.ready]
        if waiting:
            self._fail(diagnose.restart_timeout(restart.name, waiting, self._startup_timeout))
