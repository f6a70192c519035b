"""The scheduler replicas of a running launch as reloads and scales see them: which serve, and
one replica started, retired or discarded.

A replica (the ``tp_size`` ranks of one dp rank) is in one of three hands. ``in_service`` ones
take requests and are the launch's (its restart policy and watchdog cover them). One that
``join`` starts is ``STARTING`` until it serves: its ranks are spawned, all must report ready,
then (when the HTTP child probes, its ready report saying ``probes_replicas``) it must answer one
request, all within ``--startup-timeout``; a failure on the way (a rank that reports one, exits,
goes silent, or the probe) ends it at once (``ReplicaFailed``), never the launch. One that
``retire`` stops is ``RETIRING``: it takes no new request, the HTTP child reports it drained once
it holds none (or ``--request-timeout`` passes), then it gets SIGTERM and the grace period.

Where each replica is (its dp rank, its device group) is a ``steps.Layout``, and the choices of
a free dp rank or device group are ``launcher.supervisor.steps``'s.

The replica set is handed the callables it acts through (publish an event, a replica's ranks, add
and drop a worker, spawn, stop, end at once, explain an exit, stop watching one), never the
launch. It tells the others what changes through two more: ``in_service_changed(dp_ranks)``
whenever the replicas in service change, and ``left(dp)`` once a replica is gone for good (its
restarts are forgotten: a later replica of that dp rank is a new one).
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar

from launcher.supervisor import diagnose
from launcher.supervisor.plan import replica_specs
from launcher.supervisor.restarts import replica_name
from launcher.supervisor.steps import Layout, devices_short
from launchspec import events

if TYPE_CHECKING:
    from bootstrap import ProcessSpec
    from launcher.supervisor.revision import Revision
    from launcher.supervisor.workers import EndAtOnce, Worker
    from launchspec.causes import RootCause
    from launchspec.server_args import ServerArgs

log = logging.getLogger("launcher")

STARTING, RETIRING = "starting", "retiring"
# The ``change`` of a replica removed because it used all its restarts.
SET_ASIDE = "restarts used"
# After --request-timeout, how long a drained report may still take to come.
DRAIN_MARGIN = 5.0

_T = TypeVar("_T")


class ReplicaFailed(Exception):
    """A replica a change started failed before it served: ``cause``. ``vacated`` is the dp rank
    and device group left without a replica (``--reload-surge 0``: the old one was gone)."""

    def __init__(self, cause: RootCause) -> None:
        super().__init__(cause.summary)
        self.cause = cause
        self.vacated: tuple[int, int] | None = None


@dataclass(eq=False)
class _Joining:
    dp_rank: int
    workers: list[Worker]
    change: str
    failed: asyncio.Future[RootCause]
    spawned_at: float = field(default_factory=time.monotonic)
    ready: asyncio.Event = field(default_factory=asyncio.Event)
    probe: asyncio.Future[str | None] | None = None  # None: it answered; else what went wrong


@dataclass(frozen=True)
class Joined:
    """A replica that serves now: its dp rank, processes, and how long it took."""

    dp_rank: int
    pids: list[int | None]
    startup_s: float
    probe_s: float | None


@dataclass(eq=False)
class _Retiring:
    dp_rank: int
    workers: list[Worker]
    drained: asyncio.Event = field(default_factory=asyncio.Event)


class ReplicaSet:
    """The replicas of one launch (see the module docstring). ``schedulers`` are the launch's
    scheduler ranks as it starts; the keyword arguments are the callables it acts through."""

    def __init__(
        self,
        schedulers: list[Worker],
        args: ServerArgs,
        *,
        publish: Callable[[events.Event], object],
        ranks: Callable[[int], list[Worker]],
        add_worker: Callable[[ProcessSpec], Worker],
        drop_worker: Callable[[Worker], None],
        spawn: Callable[[Worker], None],
        stop: Callable[[list[Worker], float], Awaitable[None]],
        end_at_once: EndAtOnce,
        exit_cause: Callable[[Worker], Awaitable[RootCause]],
        unwatch: Callable[[str], None],
        http_probes: Callable[[], bool],
        in_service_changed: Callable[[list[int]], None],
        left: Callable[[int], None],
    ) -> None:
        self._publish = publish
        self._ranks = ranks
        self._add_worker = add_worker
        self._drop_worker = drop_worker
        self._spawn = spawn
        self._stop = stop
        self._end_at_once = end_at_once
        self._exit_cause = exit_cause
        self._unwatch = unwatch
        self.http_probes = http_probes
        self._in_service_changed = in_service_changed
        self._left = left
        self._startup_timeout = args.startup_timeout
        self._request_timeout = args.request_timeout
        self._grace = args.stop_grace_period
        self._joining: dict[int, _Joining] = {}
        self._retiring: dict[int, _Retiring] = {}
        self._incarnations = itertools.count(1)
        self._joins = itertools.count(1)
        self.template: ProcessSpec | None = None  # a scheduler spec of the launch
        self._groups: dict[int, int] = {}  # dp rank -> its device group
        for worker in schedulers:
            dp = worker.dp_rank
            if dp is None:
                continue
            self.template = self.template or worker.spec
            if worker.spec.rank % max(worker.spec.tp_size, 1) == 0:
                self._groups[dp] = worker.spec.local_rank // max(worker.spec.tp_size, 1)
        self.in_service: list[int] = sorted(self._groups)  # the dp ranks taking requests
        self._serving_since: dict[int, int] = {dp: 0 for dp in self.in_service}

    def layout(self) -> Layout:
        """Where the replicas are now (a copy, for ``launcher.supervisor.steps``)."""
        return Layout(
            in_service=list(self.in_service),
            busy={*self._joining, *self._retiring},
            groups=dict(self._groups),
            serving_since=dict(self._serving_since),
        )

    def serving(self) -> list[int]:
        """A copy of ``in_service`` (for whoever is handed it as a callable)."""
        return list(self.in_service)

    def _set_in_service(self, dp_ranks: list[int]) -> None:
        self.in_service = dp_ranks
        self._in_service_changed(list(dp_ranks))

    def pids(self, dp: int) -> list[int | None]:
        return [w.state.pid for w in self._ranks(dp)]

    def stage(self, worker: Worker) -> str | None:
        """``STARTING`` or ``RETIRING`` while a change owns ``worker``'s replica, else None."""
        dp = worker.dp_rank
        if dp is None:
            return None
        joining = self._joining.get(dp)
        if joining is not None and worker in joining.workers:
            return STARTING
        retiring = self._retiring.get(dp)
        if retiring is not None and worker in retiring.workers:
            return RETIRING
        return None

    # ------------------------------------------------------------------ the news of its ranks
    def rank_ready(self, worker: Worker) -> None:
        """A rank of a starting replica reported ready."""
        joining = self._joining_of(worker)
        if joining is not None and all(w.state.ready for w in joining.workers):
            joining.ready.set()

    def rank_failed(self, worker: Worker, cause: RootCause) -> None:
        """A rank of a starting replica failed (reported, went silent, exited): so did its
        replica, and the change that started it."""
        joining = self._joining_of(worker)
        if joining is not None and not joining.failed.done():
            joining.failed.set_result(cause)

    def rank_exited(self, worker: Worker) -> None:
        """The process of a rank the change owns ended."""
        joining = self._joining_of(worker)
        if joining is not None:
            if not joining.failed.done():
                asyncio.ensure_future(self._exited_while_starting(worker))
            return
        retiring = self._retiring.get(worker.dp_rank if worker.dp_rank is not None else -1)
        if retiring is not None and not any(w.child.running for w in retiring.workers):
            retiring.drained.set()  # nothing left to drain

    async def _exited_while_starting(self, worker: Worker) -> None:
        self.rank_failed(worker, await self._exit_cause(worker))

    def _joining_of(self, worker: Worker) -> _Joining | None:
        joining = self._joining.get(worker.dp_rank if worker.dp_rank is not None else -1)
        return joining if joining is not None and worker in joining.workers else None

    def probed(self, dp: int, error: str | None) -> None:
        """The HTTP child's probe of joining replica ``dp`` answered (``error`` None) or not."""
        joining = self._joining.get(dp)
        if joining is not None and joining.probe is not None and not joining.probe.done():
            joining.probe.set_result(error)

    def drained(self, dp: int) -> None:
        """The HTTP child holds no request of retiring replica ``dp`` any more."""
        retiring = self._retiring.get(dp)
        if retiring is not None:
            retiring.drained.set()

    # ------------------------------------------------------------------ one replica
    async def join(self, dp: int, group: int, revision: Revision, change: str) -> Joined:
        """Start replica ``dp`` on device group ``group`` serving ``revision`` and return once
        it serves; ``ReplicaFailed`` (it is gone again) when it fails before."""
        assert self.template is not None  # the change made sure there is one
        specs = replica_specs(
            self.template,
            dp,
            group,
            payload=revision.payload,
            entry_points=revision.entry_points,
            dp_size=max(len(self.in_service), 1),
            incarnation=f"r{next(self._incarnations)}",
        )
        workers = [self._add_worker(spec) for spec in specs]
        joining = _Joining(dp, workers, change, asyncio.get_running_loop().create_future())
        self._joining[dp] = joining
        self._groups[dp] = group
        deadline = joining.spawned_at + self._startup_timeout
        try:
            try:
                for worker in workers:
                    self._spawn(worker)
            except Exception as exc:  # noqa: BLE001 - the change fails with it, not the launch
                raise ReplicaFailed(diagnose.spawn_failed(replica_name(dp), exc)) from exc
            await self._unless_failed(joining, joining.ready.wait(), deadline)
            startup_s = time.monotonic() - joining.spawned_at
            probes = self.http_probes()
            if probes:
                joining.probe = asyncio.get_running_loop().create_future()
            pids = [w.state.pid for w in workers]
            self._publish(
                events.ReplicaJoining(
                    replica=replica_name(dp),
                    dp_rank=dp,
                    change=change,
                    pids=pids,
                    startup_s=startup_s,
                    model_path=revision.model_path,
                    served_name=revision.served_name,
                    probe=probes,
                )
            )
            probe_s = None
            if joining.probe is not None:
                asked = time.monotonic()
                error = await self._unless_failed(joining, joining.probe, deadline)
                if error is not None:
                    raise ReplicaFailed(diagnose.probe_failed(replica_name(dp), error))
                probe_s = time.monotonic() - asked
        except TimeoutError:
            waiting = [w.state for w in workers if not w.state.ready]
            cause = diagnose.join_timeout(replica_name(dp), waiting, self._startup_timeout)
            await self._discard(joining, cause)
            raise ReplicaFailed(cause) from None
        except ReplicaFailed as exc:
            await self._discard(joining, exc.cause)
            raise
        except BaseException:
            self._joining.pop(dp, None)
            raise
        self._joining.pop(dp, None)
        self._serving_since[dp] = next(self._joins)
        self._set_in_service(sorted({*self.in_service, dp}))
        self._publish(
            events.ReplicaServing(
                replica=replica_name(dp), dp_rank=dp, change=change, probe_s=probe_s
            )
        )
        return Joined(dp, pids, startup_s, probe_s)

    async def _unless_failed(
        self, joining: _Joining, awaitable: Awaitable[_T], deadline: float
    ) -> _T:
        """``awaitable``'s result, unless ``joining`` fails first (``ReplicaFailed``) or
        ``deadline`` passes (``TimeoutError``)."""
        waited = asyncio.ensure_future(awaitable)
        racing: set[asyncio.Future[Any]] = {waited, joining.failed}
        try:
            done, _ = await asyncio.wait(
                racing,
                timeout=max(0.0, deadline - time.monotonic()),
                return_when=asyncio.FIRST_COMPLETED,
            )
        except BaseException:
            waited.cancel()
            raise
        if joining.failed.done():
            waited.cancel()
            raise ReplicaFailed(joining.failed.result())
        if waited not in done:
            waited.cancel()
            raise TimeoutError
        return waited.result()

    async def _discard(self, joining: _Joining, cause: RootCause) -> None:
        """End a replica that failed before it served, at once: it holds no request."""
        if not joining.failed.done():
            joining.failed.set_result(cause)  # what its ranks do from now on changes nothing
        try:
            await self._end_at_once(joining.workers, because_of=cause.worker)
        finally:
            self._joining.pop(joining.dp_rank, None)
            self._drop_gone(joining.workers)
        self._groups.pop(joining.dp_rank, None)
        self._publish(
            events.ReplicaRemoved(
                replica=replica_name(joining.dp_rank),
                dp_rank=joining.dp_rank,
                change=joining.change,
                pids=[w.state.pid for w in joining.workers],
                cause=cause.summary,
            )
        )

    async def retire(self, dp: int, change: str, *, in_place: bool) -> float:
        """Drain replica ``dp`` and stop it; the seconds that took."""
        workers = self._ranks(dp)
        retiring = _Retiring(dp, workers)
        self._retiring[dp] = retiring
        self._set_in_service([d for d in self.in_service if d != dp])
        started = time.monotonic()
        try:
            for worker in workers:
                self._unwatch(worker.name)
            self._publish(
                events.ReplicaDraining(
                    replica=replica_name(dp), dp_rank=dp, change=change, in_place=in_place
                )
            )
            if self.http_probes() and any(w.child.running for w in workers):
                limit = self._request_timeout + DRAIN_MARGIN if self._request_timeout > 0 else None
                try:
                    await asyncio.wait_for(retiring.drained.wait(), limit)
                except TimeoutError:
                    log.warning(
                        "%s did not report drained within %.0fs; stopping it anyway",
                        replica_name(dp),
                        limit,
                    )
            await self._stop(workers, self._grace)
        finally:
            self._retiring.pop(dp, None)
            self._drop_gone(workers)
        self._gone(dp)
        return time.monotonic() - started

    def set_aside(self, dp: int, cause: RootCause, reason: str) -> asyncio.Task[None]:
        """Take replica ``dp``, which failed with ``cause`` after using its restarts
        (``reason``), out of service for good while the others serve: from now on its ranks'
        news is the task's, which kills what is left of it at once (a group that lost a rank
        finishes nothing) and frees its dp rank and devices (a later scale takes them)."""
        workers = self._ranks(dp)
        self._retiring[dp] = _Retiring(dp, workers)
        self._serving_since.pop(dp, None)
        self._set_in_service([d for d in self.in_service if d != dp])
        pids = self.pids(dp)

        async def end() -> None:
            try:
                await self._end_at_once(workers, because_of=cause.worker)
            finally:
                self._retiring.pop(dp, None)
                self._drop_gone(workers)
            self._gone(dp)
            self._publish(
                events.ReplicaRemoved(
                    replica=replica_name(dp),
                    dp_rank=dp,
                    change=SET_ASIDE,
                    pids=pids,
                    cause=f"{cause.summary}; {reason}",
                )
            )

        return asyncio.create_task(end())

    def _gone(self, dp: int) -> None:
        """Replica ``dp`` left the launch: its dp rank and devices are free again."""
        self._groups.pop(dp, None)
        self._left(dp)

    def _drop_gone(self, workers: list[Worker]) -> None:
        """Drop the records of ``workers`` that are gone (one still running stays, and the
        launch's stop ends it)."""
        for worker in workers:
            if not worker.child.running:
                self._drop_worker(worker)

    # ------------------------------------------------------------------ bookkeeping
    def devices_short(self, dp_size: int) -> str | None:
        """Why ``dp_size`` replicas cannot fit the devices this node's schedulers see; None when
        they fit, or when no scheduler counts its devices (the CPU)."""
        seen: list[int] = []
        for dp in self.in_service:
            for worker in self._ranks(dp):
                count = worker.state.info.get("devices")
                if isinstance(count, int):
                    seen.append(count)
        if not seen or self.template is None:
            return None
        return devices_short(self.layout(), dp_size, self.template.tp_size, min(seen))
