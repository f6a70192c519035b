"""Reloads and scaling: the replicas of a running launch replaced, added or removed one at a time.

``Rollouts`` carries out every change of the set of scheduler replicas an operator asks for while
the launch serves (``sglang-launch reload`` / ``scale``, SIGHUP, SIGTTIN / SIGTTOU,
``Launcher.reload()`` / ``scale()``), one change at a time, on one node:

- a reload replaces each replica in turn. With ``--reload-surge 1`` the new replica (a free dp
  rank, the devices of the one it replaces) starts beside the old one; once its ranks are ready
  and it answered one request (the HTTP child's probe) it takes requests, and only then is the
  old one drained (the HTTP child lets what it holds finish, streams to their end) and stopped.
  With ``--reload-surge 0`` the old one is drained and stopped first and the new one takes its
  dp rank. When a new replica fails (its start, its probe, ``--startup-timeout``) the reload
  stops there: the replicas it already replaced are replaced back, the same way, with what they
  served before, and the reload fails with that root cause. The old replicas serve throughout.
- a scale adds replicas (each takes requests once it answered its probe) or removes the newest
  ones, drained first. Where the restart policy was left to its default, it follows the number of
  replicas (``on-failure`` with more than one).

One replica at a time is started, retired or discarded by ``launcher.supervisor.replicas``
(``ReplicaSet``): while a change starts or retires a replica, its ranks' news is the change's,
never the launch's failure. Once a replica serves it is like any other: the restart policy and
the watchdog cover it.

The HTTP child takes part when its ready report says ``probes_replicas``: on ``replica.joining``
it probes the replica and reports the answer (``{"query": "replica.probed", "dp_rank", "ok",
"error"}`` on the query socket), on ``replica.draining`` it routes nothing more there and reports
``replica.drained`` once the replica holds no request. Without such an HTTP child a replica
serves as soon as its ranks are ready, and an old one gets its stop at once.
"""

from __future__ import annotations

import asyncio
import copy
import dataclasses
import itertools
import logging
import time
import traceback
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from launcher.supervisor.changes import ChangeRefused, Generation, next_generation
from launcher.supervisor.replicas import ReplicaFailed, ReplicaSet
from launcher.supervisor.restarts import NEVER, ON_FAILURE, replica_name
from launcher.supervisor.state import READY, ChangeState
from launchspec import events
from launchspec.causes import ExitCode, RootCause

if TYPE_CHECKING:
    from launcher.supervisor.launch import Launch
    from launchspec.server_args import ServerArgs
    from platforms import Selection

log = logging.getLogger("launcher")

RELOAD, SCALE, ROLLBACK = "reload", "scale", "rollback"
Reply = dict[str, object]


@dataclass(eq=False)
class Change:
    """One reload or scale: its ``kind``, ``id``, ``state`` (in the snapshot while it runs),
    ``after`` (the sequence number before its first event) and ``done``, its ending event."""

    kind: str
    id: int
    state: ChangeState
    after: int
    done: asyncio.Future[events.Event]
    task: asyncio.Task[None] | None = None


class Rollouts:
    """The reloads and scales of one launch (see the module docstring)."""

    def __init__(
        self,
        launch: Launch,
        replicas: ReplicaSet,
        generation: Generation,
        selection: Selection,
        args: ServerArgs,
    ) -> None:
        self._launch = launch
        self.replicas = replicas
        self.current = generation
        self._selection = selection
        self._surge = args.reload_surge
        self._explicit_policy = args.restart_policy
        self._nnodes = args.nnodes
        self._ids = itertools.count(1)
        self.active: Change | None = None
        self.show()

    # ------------------------------------------------------------------ the query socket's commands
    def reload_command(self, request: dict[str, Any]) -> Reply:
        """``{"query": "reload", "model_path": P, "served_model_name": N}`` (both optional)."""
        fields = {k: request.get(k) for k in ("model_path", "served_model_name")}
        if any(v is not None and not isinstance(v, str) for v in fields.values()):
            return {"ok": False, "error": '"model_path" and "served_model_name" must be strings'}
        return self._reply(
            lambda: self.start_reload(
                fields["model_path"], fields["served_model_name"], "reload command"
            )
        )

    def scale_command(self, request: dict[str, Any]) -> Reply:
        """``{"query": "scale", "dp_size": N}``."""
        dp_size = request.get("dp_size")
        if not isinstance(dp_size, int) or isinstance(dp_size, bool):
            return {"ok": False, "error": '"dp_size" must be an integer'}
        return self._reply(lambda: self.start_scale(dp_size, "scale command"))

    def probed_command(self, request: dict[str, Any]) -> Reply:
        """The HTTP child's ``{"query": "replica.probed", "dp_rank", "ok", "error"}``."""
        error = None if request.get("ok") is True else str(request.get("error") or "failed")
        self.replicas.probed(_int(request.get("dp_rank")), error)
        return {"ok": True}

    def drained_command(self, request: dict[str, Any]) -> Reply:
        """The HTTP child's ``{"query": "replica.drained", "dp_rank"}``."""
        self.replicas.drained(_int(request.get("dp_rank")))
        return {"ok": True}

    @staticmethod
    def _reply(start: Callable[[], Change]) -> Reply:
        try:
            change = start()
        except ChangeRefused as exc:
            return {"ok": False, "refused": True, "error": str(exc)}
        return {"ok": True, "id": change.id, "kind": change.kind, "after": change.after}

    # ------------------------------------------------------------------ starting a change
    def start_reload(
        self, model_path: str | None, served_model_name: str | None, reason: str
    ) -> Change:
        """Begin a reload (``model_path`` / ``served_model_name``: None keeps them); refused
        (``ChangeRefused``) when it cannot be made now or with these arguments."""
        self._check_can_change(RELOAD)
        generation, changes = next_generation(
            self.current,
            self._selection,
            model_path=model_path,
            served_model_name=served_model_name,
        )
        change = self._begin(RELOAD, reason)
        old = self.current
        self._launch.publish(
            events.ReloadStarted(
                id=change.id,
                reason=reason,
                replicas=list(self.replicas.in_service),
                surge=self._surge,
                model_path=generation.model_path,
                served_name=generation.served_name,
                previous_model_path=old.model_path,
                previous_served_name=old.served_name,
                changes=changes,
            )
        )
        log.info(
            "reload %d (%s): %d replica(s) to %s%s",
            change.id,
            reason,
            len(self.replicas.in_service),
            generation.model_path,
            f"; {', '.join(changes)}" if changes else "",
        )
        self._run(change, self._reload(change, generation))
        return change

    def start_scale(self, dp_size: int, reason: str) -> Change:
        """Begin scaling to ``dp_size`` replicas; refused (``ChangeRefused``) when it cannot work."""
        self._check_can_change(SCALE)
        if dp_size < 1:
            raise ChangeRefused(
                f"--dp-size {dp_size} must be at least 1 (to stop the server, send it SIGTERM)"
            )
        short = self.replicas.devices_short(dp_size)
        if short is not None:
            raise ChangeRefused(short)
        change = self._begin(SCALE, reason)
        previous = len(self.replicas.in_service)
        policy = self._follow_policy(max(previous, dp_size))
        self._launch.publish(
            events.ScaleStarted(
                id=change.id,
                reason=reason,
                dp_size=dp_size,
                previous_dp_size=previous,
                restart_policy=policy,
            )
        )
        log.info("scale %d (%s): %d -> %d replica(s)", change.id, reason, previous, dp_size)
        self._run(change, self._scale(change, dp_size))
        return change

    def scale_by(self, delta: int, reason: str) -> None:
        """One replica more (``delta`` 1) or fewer (-1): SIGTTIN / SIGTTOU. A refusal is logged."""
        try:
            self.start_scale(len(self.replicas.in_service) + delta, reason)
        except ChangeRefused as exc:
            log.warning("%s: not scaling: %s", reason, exc)

    def reload_on_signal(self, signame: str) -> None:
        """SIGHUP: a reload with the same model (fresh processes). A refusal is logged."""
        try:
            self.start_reload(None, None, f"received {signame}")
        except ChangeRefused as exc:
            log.warning("received %s: not reloading: %s", signame, exc)

    def cancel(self) -> None:
        """Stop the change in progress (the launch is stopping; its workers are stopped with it)."""
        change = self.active
        if change is not None and change.task is not None and not change.task.done():
            change.task.cancel()

    def _check_can_change(self, kind: str) -> None:
        launch = self._launch
        if self._nnodes > 1:
            raise ChangeRefused(
                f"a {kind} works on one node only, and this launch has --nnodes {self._nnodes}; "
                "restart every node with the new settings instead"
            )
        if launch.stopping or launch.stop_reason is not None:
            raise ChangeRefused("the launcher is stopping")
        if launch.state.phase != READY:
            raise ChangeRefused(
                f"the server is {launch.state.phase}, not ready; wait until it is ready"
            )
        if self.active is not None:
            raise ChangeRefused(
                f"{self.active.kind} {self.active.id} is in progress ({self.active.state.step or 'starting'}); "
                "wait for it to end (sglang-launch status shows it), then try again"
            )
        restarting = launch.healing.in_progress
        if restarting:
            names = ", ".join(replica_name(dp) for dp in restarting)
            raise ChangeRefused(f"{names} is restarting; try again once it serves")
        if self.replicas.template is None or not self.replicas.in_service:
            raise ChangeRefused(f"this launch has no scheduler replica on this node to {kind}")

    def _begin(self, kind: str, reason: str) -> Change:
        loop = asyncio.get_running_loop()
        state = ChangeState(kind=kind, id=next(self._ids), reason=reason)
        change = Change(kind, state.id, state, self._launch.state.seq, loop.create_future())
        self.active = change
        self._launch.state.change = state
        return change

    def _run(self, change: Change, work: Awaitable[events.Event]) -> None:
        async def run() -> None:
            try:
                event = await work
            except asyncio.CancelledError:
                change.done.cancel()
                raise
            except Exception as exc:  # noqa: BLE001 - a bug fails the change, never the launch
                log.exception("%s %d failed unexpectedly", change.kind, change.id)
                event = self._unexpected(change, exc)
            finally:
                self.active = None
                self._launch.state.change = None
            if not change.done.done():
                change.done.set_result(event)

        change.task = asyncio.create_task(run())

    def _unexpected(self, change: Change, exc: Exception) -> events.Event:
        cause = RootCause(
            summary=f"the {change.kind} failed unexpectedly",
            exit_code=ExitCode.WORKER_FAILED,
            error_type=type(exc).__name__,
            message=str(exc),
            traceback="".join(traceback.format_exception(exc)),
        )
        if change.kind == RELOAD:
            return self._reload_failed(change, cause, [], [])
        return self._scale_ended(change, [], [], cause)

    # ------------------------------------------------------------------ a reload
    async def _reload(self, change: Change, generation: Generation) -> events.Event:
        started = time.monotonic()
        previous = self.current
        order = list(self.replicas.in_service)
        replaced: list[int] = []
        try:
            for number, dp in enumerate(order, 1):
                await self.replicas.until_healed(dp)
                change.state.step = f"replacing {replica_name(dp)} ({number} of {len(order)})"
                replaced.append(await self._replace(dp, generation, RELOAD))
        except ReplicaFailed as exc:
            return await self._roll_back(change, exc, replaced, previous)
        self.current = generation
        self.show()
        event = events.ReloadFinished(
            id=change.id,
            replicas=list(self.replicas.in_service),
            model_path=generation.model_path,
            served_name=generation.served_name,
            seconds=time.monotonic() - started,
        )
        self._launch.publish(event)
        log.info("reload %d done in %.1fs", change.id, event.seconds)
        return event

    async def _replace(self, dp: int, generation: Generation, change: str) -> int:
        """Replace replica ``dp`` by one serving ``generation``; the new replica's dp rank."""
        launch = self._launch
        devices = self.replicas.devices(dp)
        previous_pids = self.replicas.pids(dp)
        started = time.monotonic()
        if self._surge:
            joined = await self.replicas.join(self.replicas.free_dp(), devices, generation, change)
            drain_s = await self.replicas.retire(dp, change, in_place=False)
        else:
            drain_s = await self.replicas.retire(dp, change, in_place=True)
            try:
                joined = await self.replicas.join(dp, devices, generation, change)
            except ReplicaFailed as exc:
                exc.vacated = (dp, devices)
                raise
        launch.publish(
            events.ReplicaReplaced(
                replica=replica_name(dp),
                dp_rank=dp,
                change=change,
                by=joined.dp_rank,
                pids=joined.pids,
                previous_pids=previous_pids,
                model_path=generation.model_path,
                served_name=generation.served_name,
                seconds=time.monotonic() - started,
                startup_s=joined.startup_s,
                probe_s=joined.probe_s,
                drain_s=drain_s,
            )
        )
        return joined.dp_rank

    async def _roll_back(
        self, change: Change, failure: ReplicaFailed, replaced: list[int], previous: Generation
    ) -> events.Event:
        """Put back what the failed reload changed: the replica it left out (``--reload-surge 0``)
        and the replicas it replaced, with ``previous``."""
        cause = failure.cause
        log.error("reload %d failed: %s; rolling back", change.id, cause.summary)
        rolled_back: list[int] = []
        failures: list[str] = []
        if failure.vacated is not None:
            dp, devices = failure.vacated
            change.state.step = f"rolling back: starting {replica_name(dp)} again"
            try:
                rolled_back.append(
                    (await self.replicas.join(dp, devices, previous, ROLLBACK)).dp_rank
                )
            except ReplicaFailed as again:
                failures.append(
                    f"{replica_name(dp)} could not be started again: {again.cause.summary}"
                )
        for dp in replaced:
            change.state.step = f"rolling back {replica_name(dp)}"
            try:
                rolled_back.append(await self._replace(dp, previous, ROLLBACK))
            except ReplicaFailed as again:
                where = "is gone" if again.vacated else "still serves the new model"
                failures.append(f"{replica_name(dp)} {where}: {again.cause.summary}")
        self.show()
        return self._reload_failed(change, cause, rolled_back, failures)

    def _reload_failed(
        self, change: Change, cause: RootCause, rolled_back: list[int], failures: list[str]
    ) -> events.Event:
        event = events.ReloadFailed(
            id=change.id,
            root_cause=dataclasses.replace(cause),
            root_cause_text=cause.format(),
            rolled_back=rolled_back,
            replicas=list(self.replicas.in_service),
            model_path=self.current.model_path,
            served_name=self.current.served_name,
            rollback_failures=failures,
        )
        self._launch.publish(event)
        return event

    # ------------------------------------------------------------------ a scale
    async def _scale(self, change: Change, dp_size: int) -> events.Event:
        started = time.monotonic()
        added: list[int] = []
        removed: list[int] = []
        try:
            while len(self.replicas.in_service) < dp_size:
                dp = self.replicas.free_dp()
                change.state.step = (
                    f"adding {replica_name(dp)} ({len(self.replicas.in_service) + 1} of {dp_size})"
                )
                added.append(
                    (
                        await self.replicas.join(
                            dp, self.replicas.free_devices(), self.current, SCALE
                        )
                    ).dp_rank
                )
            while len(self.replicas.in_service) > dp_size:
                dp = self.replicas.newest()
                await self.replicas.until_healed(dp)
                change.state.step = f"removing {replica_name(dp)}"
                pids = self.replicas.pids(dp)
                await self.replicas.retire(dp, SCALE, in_place=False)
                self._launch.publish(
                    events.ReplicaRemoved(
                        replica=replica_name(dp), dp_rank=dp, change=SCALE, pids=pids
                    )
                )
                removed.append(dp)
        except ReplicaFailed as exc:
            log.error("scale %d failed: %s", change.id, exc.cause.summary)
            return self._scale_ended(change, added, removed, exc.cause)
        return self._scale_ended(change, added, removed, None, time.monotonic() - started)

    def _scale_ended(
        self,
        change: Change,
        added: list[int],
        removed: list[int],
        cause: RootCause | None,
        seconds: float = 0.0,
    ) -> events.Event:
        count = len(self.replicas.in_service)
        policy = self._follow_policy(count)
        args = copy.copy(self.current.args)
        args.dp_size = count
        self.current = dataclasses.replace(self.current, args=args)
        self.show()
        event: events.Event
        if cause is None:
            event = events.ScaleFinished(
                id=change.id,
                dp_size=count,
                replicas=list(self.replicas.in_service),
                added=added,
                removed=removed,
                restart_policy=policy,
                seconds=seconds,
            )
        else:
            event = events.ScaleFailed(
                id=change.id,
                root_cause=dataclasses.replace(cause),
                root_cause_text=cause.format(),
                dp_size=count,
                replicas=list(self.replicas.in_service),
                added=added,
                removed=removed,
                restart_policy=policy,
            )
        self._launch.publish(event)
        return event

    def _follow_policy(self, replicas: int) -> str:
        """The restart policy in effect with ``replicas`` replicas (a default one follows it)."""
        restarts = self._launch.healing.restarts
        if self._explicit_policy is None:
            restarts.policy = ON_FAILURE if replicas > 1 else NEVER
        return restarts.policy

    # ------------------------------------------------------------------ bookkeeping
    def show(self) -> None:
        """Bring the snapshot's model and replicas up to date."""
        state = self._launch.state
        state.model_path = self.current.model_path
        state.served_model_name = self.current.served_name
        state.replicas = list(self.replicas.in_service)


def _int(value: object) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else -1
