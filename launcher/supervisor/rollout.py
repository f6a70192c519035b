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
- a reload to a model that serves another kind (embedding, generation, image) is refused before
  anything starts, unless asked for with ``allow_kind_change``; then ``reload.started`` says
  both kinds (``model_kind``, ``previous_model_kind``) and a warning is logged.

What to do next (which replica, which dp rank and devices, what a failure puts back, when it is
done) is decided by ``launcher.supervisor.steps``; one replica at a time is started, retired or
discarded by ``launcher.supervisor.replicas`` (``ReplicaSet``): while a change starts or retires
a replica, its ranks' news is the change's, never the launch's failure. Once a replica serves it
is like any other: the restart policy and the watchdog cover it.

``Rollouts`` is handed the replica set and the callables it needs of the rest (publish an event,
why the launch takes no change now, the replicas restarting and a future for each to serve
again, the restart policy for a number of replicas, the snapshot's model and change), never the
launch.

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

from launcher.supervisor import steps
from launcher.supervisor.replicas import ReplicaFailed, ReplicaSet
from launcher.supervisor.restarts import replica_name
from launcher.supervisor.revision import ChangeRefused, Revision, next_revision
from launcher.supervisor.state import ChangeState
from launchspec import events
from launchspec.causes import ExitCode, RootCause

if TYPE_CHECKING:
    from launchspec.server_args import ServerArgs
    from platforms import Selection

log = logging.getLogger("launcher")

RELOAD, SCALE, ROLLBACK = "reload", "scale", "rollback"
Reply = dict[str, object]


@dataclass(eq=False)
class Change:
    """One reload or scale: its ``kind``, ``id``, ``state`` (in the snapshot while it runs),
    ``after`` (the sequence number of the last event before its first) and ``done``, its
    ending event."""

    kind: str
    id: int
    state: ChangeState
    after: int
    done: asyncio.Future[events.Event]
    task: asyncio.Task[None] | None = None


class Rollouts:
    """The reloads and scales of one launch (see the module docstring); ``revision`` is what its
    replicas serve now. The keyword arguments are the callables it acts through:

    - ``publish(event)``; ``refusal()``: why the launch takes no change now (it is stopping, or
      not ready yet), None when it does;
    - ``restarting()``: the dp ranks of the replicas restarting now, and ``until_healed(dp)``,
      done once replica ``dp`` serves again (at once when it is not restarting);
    - ``follow_replicas(count)``: the launch is about to have ``count`` replicas; the restart
      policy in effect from then on;
    - ``show_revision(revision)`` and ``show_change(state)``: the snapshot's model and the change
      in progress (None: none); ``last_seq()``: the sequence number of the last event published.
    """

    def __init__(
        self,
        replicas: ReplicaSet,
        revision: Revision,
        selection: Selection,
        args: ServerArgs,
        *,
        publish: Callable[[events.Event], object],
        refusal: Callable[[], str | None],
        restarting: Callable[[], list[int]],
        until_healed: Callable[[int], Awaitable[None]],
        follow_replicas: Callable[[int], str],
        show_revision: Callable[[Revision], None],
        show_change: Callable[[ChangeState | None], None],
        last_seq: Callable[[], int],
    ) -> None:
        self.replicas = replicas
        self.revision = revision
        self._selection = selection
        self._surge = args.reload_surge
        self._nnodes = args.nnodes
        self._publish = publish
        self._refusal = refusal
        self._restarting = restarting
        self._until_healed = until_healed
        self._follow_replicas = follow_replicas
        self._show_revision = show_revision
        self._show_change = show_change
        self._last_seq = last_seq
        self._ids = itertools.count(1)
        self.in_progress: Change | None = None
        show_revision(revision)

    # ------------------------------------------------------------------ the query socket's commands
    def reload_command(self, request: dict[str, Any]) -> Reply:
        """``{"query": "reload", "model_path": P, "served_model_name": N, "allow_kind_change":
        B}`` (all optional)."""
        fields = {k: request.get(k) for k in ("model_path", "served_model_name")}
        if any(v is not None and not isinstance(v, str) for v in fields.values()):
            return {"ok": False, "error": '"model_path" and "served_model_name" must be strings'}
        allow = request.get("allow_kind_change", False)
        if not isinstance(allow, bool):
            return {"ok": False, "error": '"allow_kind_change" must be true or false'}
        return self._reply(
            lambda: self.start_reload(
                fields["model_path"],
                fields["served_model_name"],
                "reload command",
                allow_kind_change=allow,
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
        self,
        model_path: str | None,
        served_model_name: str | None,
        reason: str,
        *,
        allow_kind_change: bool = False,
    ) -> Change:
        """Begin a reload (``model_path`` / ``served_model_name``: None keeps them); refused
        (``ChangeRefused``) when it cannot be made now or with these arguments, or when the new
        model serves another kind than the current one and ``allow_kind_change`` is False."""
        self._check_can_change(RELOAD)
        revision, changes = next_revision(
            self.revision,
            self._selection,
            model_path=model_path,
            served_model_name=served_model_name,
            allow_kind_change=allow_kind_change,
        )
        change = self._begin(RELOAD, reason)
        old = self.revision
        self._publish(
            events.ReloadStarted(
                id=change.id,
                reason=reason,
                replicas=list(self.replicas.in_service),
                surge=self._surge,
                model_path=revision.model_path,
                served_name=revision.served_name,
                previous_model_path=old.model_path,
                previous_served_name=old.served_name,
                changes=changes,
                model_kind=revision.kind,
                previous_model_kind=old.kind,
            )
        )
        log.info(
            "reload %d (%s): %d replica(s) to %s%s",
            change.id,
            reason,
            len(self.replicas.in_service),
            revision.model_path,
            f"; {', '.join(changes)}" if changes else "",
        )
        if old.kind != revision.kind and old.kind is not None and revision.kind is not None:
            log.warning(
                "reload %d changes what the server serves, from %s (%s) to %s (%s), as asked "
                "(allow_kind_change); requests for %s fail once no replica of it serves",
                change.id,
                old.kind,
                old.model_path,
                revision.kind,
                revision.model_path,
                old.kind,
            )
        self._run(change, self._reload(change, revision))
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
        policy = self._follow_replicas(max(previous, dp_size))
        self._publish(
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
        change = self.in_progress
        if change is not None and change.task is not None and not change.task.done():
            change.task.cancel()

    def _check_can_change(self, kind: str) -> None:
        if self._nnodes > 1:
            raise ChangeRefused(
                f"a {kind} works on one node only, and this launch has --nnodes {self._nnodes}; "
                "restart every node with the new settings instead"
            )
        refusal = self._refusal()
        if refusal is not None:
            raise ChangeRefused(refusal)
        active = self.in_progress
        if active is not None:
            raise ChangeRefused(
                f"{active.kind} {active.id} is in progress ({active.state.step or 'starting'}); "
                "wait for it to end (sglang-launch status shows it), then try again"
            )
        restarting = self._restarting()
        if restarting:
            names = ", ".join(replica_name(dp) for dp in restarting)
            raise ChangeRefused(f"{names} is restarting; try again once it serves")
        if self.replicas.template is None or not self.replicas.in_service:
            raise ChangeRefused(f"this launch has no scheduler replica on this node to {kind}")

    def _begin(self, kind: str, reason: str) -> Change:
        loop = asyncio.get_running_loop()
        state = ChangeState(kind=kind, id=next(self._ids), reason=reason)
        change = Change(kind, state.id, state, self._last_seq(), loop.create_future())
        self.in_progress = change
        self._show_change(state)
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
                self.in_progress = None
                self._show_change(None)
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
    async def _reload(self, change: Change, revision: Revision) -> events.Event:
        started = time.monotonic()
        previous = self.revision
        order = list(self.replicas.in_service)
        replaced: list[int] = []  # the successors' dp ranks
        done: list[int] = []  # the replicas of ``order`` replaced
        try:
            while (dp := steps.next_to_replace(order, done, self.replicas.in_service)) is not None:
                await self._until_healed(dp)
                if dp not in self.replicas.in_service:
                    continue  # it left while it was restarting: it is not replaced
                change.state.step = (
                    f"replacing {replica_name(dp)} ({len(done) + 1} of {len(order)})"
                )
                replaced.append(await self._replace(dp, revision, RELOAD))
                done.append(dp)
        except ReplicaFailed as exc:
            return await self._roll_back(change, exc, replaced, previous)
        self.revision = revision
        self._show_revision(revision)
        event = events.ReloadFinished(
            id=change.id,
            replicas=list(self.replicas.in_service),
            model_path=revision.model_path,
            served_name=revision.served_name,
            seconds=time.monotonic() - started,
            model_kind=revision.kind,
        )
        self._publish(event)
        log.info("reload %d done in %.1fs", change.id, event.seconds)
        return event

    async def _replace(self, dp: int, revision: Revision, change: str) -> int:
        """Replace replica ``dp`` by one serving ``revision``; the new replica's dp rank."""
        step = steps.replacement(dp, self.replicas.layout(), surge=self._surge)
        previous_pids = self.replicas.pids(dp)
        started = time.monotonic()
        if not step.in_place:
            joined = await self.replicas.join(step.new, step.group, revision, change)
            drain_s = await self.replicas.retire(dp, change, in_place=False)
        else:
            drain_s = await self.replicas.retire(dp, change, in_place=True)
            try:
                joined = await self.replicas.join(step.new, step.group, revision, change)
            except ReplicaFailed as exc:
                exc.vacated = (dp, step.group)
                raise
        self._publish(
            events.ReplicaReplaced(
                replica=replica_name(dp),
                dp_rank=dp,
                change=change,
                by=joined.dp_rank,
                pids=joined.pids,
                previous_pids=previous_pids,
                model_path=revision.model_path,
                served_name=revision.served_name,
                seconds=time.monotonic() - started,
                startup_s=joined.startup_s,
                probe_s=joined.probe_s,
                drain_s=drain_s,
            )
        )
        return joined.dp_rank

    async def _roll_back(
        self, change: Change, failure: ReplicaFailed, replaced: list[int], previous: Revision
    ) -> events.Event:
        """Put back what the failed reload changed (``steps.rollback_steps``): the replica it
        left out (``--reload-surge 0``) and the replicas it replaced, with ``previous``."""
        cause = failure.cause
        log.error("reload %d failed: %s; rolling back", change.id, cause.summary)
        rolled_back: list[int] = []
        failures: list[str] = []
        for step in steps.rollback_steps(replaced, failure.vacated):
            if isinstance(step, steps.Rejoin):
                change.state.step = f"rolling back: starting {replica_name(step.dp)} again"
                try:
                    joined = await self.replicas.join(step.dp, step.group, previous, ROLLBACK)
                    rolled_back.append(joined.dp_rank)
                except ReplicaFailed as again:
                    failures.append(
                        f"{replica_name(step.dp)} could not be started again: {again.cause.summary}"
                    )
                continue
            change.state.step = f"rolling back {replica_name(step.dp)}"
            try:
                rolled_back.append(await self._replace(step.dp, previous, ROLLBACK))
            except ReplicaFailed as again:
                where = "is gone" if again.vacated else "still serves the new model"
                failures.append(f"{replica_name(step.dp)} {where}: {again.cause.summary}")
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
            model_path=self.revision.model_path,
            served_name=self.revision.served_name,
            rollback_failures=failures,
        )
        self._publish(event)
        return event

    # ------------------------------------------------------------------ a scale
    async def _scale(self, change: Change, dp_size: int) -> events.Event:
        started = time.monotonic()
        added: list[int] = []
        removed: list[int] = []
        try:
            while (step := steps.scale_step(self.replicas.layout(), dp_size)) is not None:
                if isinstance(step, steps.Add):
                    count = len(self.replicas.in_service) + 1
                    change.state.step = f"adding {replica_name(step.dp)} ({count} of {dp_size})"
                    joined = await self.replicas.join(step.dp, step.group, self.revision, SCALE)
                    added.append(joined.dp_rank)
                    continue
                dp = step.dp
                await self._until_healed(dp)
                if dp not in self.replicas.in_service:
                    continue  # it left while it was restarting: decide again
                change.state.step = f"removing {replica_name(dp)}"
                pids = self.replicas.pids(dp)
                await self.replicas.retire(dp, SCALE, in_place=False)
                self._publish(
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
        policy = self._follow_replicas(count)
        args = copy.copy(self.revision.args)
        args.dp_size = count
        self.revision = dataclasses.replace(self.revision, args=args)
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
        self._publish(event)
        return event


def _int(value: object) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else -1
