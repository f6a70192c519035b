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

A dp rank is free again once its replica is gone, and a started replica takes the lowest free
one; each replica has a group of devices of its own (``LOCAL_RANK`` = group x ranks + rank),
the one of the replica it replaces, or the lowest free group.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar

from bootstrap import phases
from launcher.supervisor import diagnose
from launcher.supervisor.plan import replica_specs
from launcher.supervisor.restarts import replica_name
from launchspec import events

if TYPE_CHECKING:
    from bootstrap import ProcessSpec
    from launcher.supervisor.changes import Generation
    from launcher.supervisor.launch import Launch, Worker
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


@dataclass(eq=False)
class ReplicaSet:
    """The replicas of one launch (see the module docstring); ``changed()`` is called whenever
    the replicas in service change."""

    def __init__(self, launch: Launch, args: ServerArgs, changed: Callable[[], None]) -> None:
        self._launch = launch
        self._changed = changed
        self._startup_timeout = args.startup_timeout
        self._request_timeout = args.request_timeout
        self._grace = args.stop_grace_period
        self._joining: dict[int, _Joining] = {}
        self._retiring: dict[int, _Retiring] = {}
        self._devices: dict[int, int] = {}  # dp rank -> its device group
        self._incarnations = itertools.count(1)
        self.template: ProcessSpec | None = None  # a scheduler spec of the launch
        for worker in launch.workers:
            dp = worker.dp_rank
            if dp is None:
                continue
            self.template = self.template or worker.spec
            if worker.spec.rank % max(worker.spec.tp_size, 1) == 0:
                self._devices[dp] = worker.spec.local_rank // max(worker.spec.tp_size, 1)
        self.in_service: list[int] = sorted(self._devices)
        self._serving_since: dict[int, int] = {dp: 0 for dp in self.in_service}
        self._joins = itertools.count(1)

    def devices(self, dp: int) -> int:
        """The device group of replica ``dp``."""
        return self._devices[dp]

    def newest(self) -> int:
        """The dp rank of the replica in service that began serving last (a scale removes it)."""
        return max(self.in_service, key=lambda dp: (self._serving_since.get(dp, 0), dp))

    def pids(self, dp: int) -> list[int | None]:
        return [w.state.pid for w in self._launch.replica(dp)]

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
        self.rank_failed(worker, await self._launch.exit_cause(worker))

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
    async def join(self, dp: int, devices: int, generation: Generation, change: str) -> Joined:
        """Start replica ``dp`` on device group ``devices`` serving ``generation`` and return once
        it serves; ``ReplicaFailed`` (it is gone again) when it fails before."""
        launch = self._launch
        assert self.template is not None  # the change made sure there is one
        specs = replica_specs(
            self.template,
            dp,
            devices,
            payload=generation.payload,
            entry_points=generation.entry_points,
            dp_size=max(len(self.in_service), 1),
            incarnation=f"r{next(self._incarnations)}",
        )
        workers = [launch.add_worker(spec) for spec in specs]
        joining = _Joining(dp, workers, change, asyncio.get_running_loop().create_future())
        self._joining[dp] = joining
        self._devices[dp] = devices
        deadline = joining.spawned_at + self._startup_timeout
        try:
            try:
                for worker in workers:
                    launch.spawn(worker)
            except Exception as exc:  # noqa: BLE001 - the change fails with it, not the launch
                raise ReplicaFailed(diagnose.spawn_failed(replica_name(dp), exc)) from exc
            await self._unless_failed(joining, joining.ready.wait(), deadline)
            startup_s = time.monotonic() - joining.spawned_at
            probes = self.http_probes()
            if probes:
                joining.probe = asyncio.get_running_loop().create_future()
            pids = [w.state.pid for w in workers]
            launch.publish(
                events.ReplicaJoining(
                    replica=replica_name(dp),
                    dp_rank=dp,
                    change=change,
                    pids=pids,
                    startup_s=startup_s,
                    model_path=generation.model_path,
                    served_name=generation.served_name,
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
        self.in_service = sorted({*self.in_service, dp})
        self._serving_since[dp] = next(self._joins)
        self._changed()
        launch.publish(
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
        launch = self._launch
        if not joining.failed.done():
            joining.failed.set_result(cause)  # what its ranks do from now on changes nothing
        try:
            await self._end_at_once(joining.workers, because_of=cause.worker)
        finally:
            self._joining.pop(joining.dp_rank, None)
            self._forget(joining.workers)
        self._devices.pop(joining.dp_rank, None)
        launch.publish(
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
        launch = self._launch
        workers = launch.replica(dp)
        retiring = _Retiring(dp, workers)
        self._retiring[dp] = retiring
        self.in_service = [d for d in self.in_service if d != dp]
        self._changed()
        started = time.monotonic()
        try:
            for worker in workers:
                launch.watchdog.forget(worker.name)
            launch.publish(
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
            await launch.stop([w for w in workers if w.process is not None], self._grace)
            for worker in workers:
                launch.record_exit(worker)
            await launch.sweep_adopted()
        finally:
            self._retiring.pop(dp, None)
            self._forget(workers)
        self._devices.pop(dp, None)
        launch.healing.restarts.forget(dp)
        return time.monotonic() - started

    def others_serve(self, dp: int) -> bool:
        """A replica other than ``dp`` is in service and not being restarted."""
        restarting = set(self._launch.healing.in_progress)
        return any(d != dp and d not in restarting for d in self.in_service)

    def set_aside(self, dp: int, cause: RootCause, reason: str) -> asyncio.Task[None]:
        """Take replica ``dp``, which failed with ``cause`` after using its restarts
        (``reason``), out of service for good while the others serve: from now on its ranks'
        news is the task's, which kills what is left of it at once (a group that lost a rank
        finishes nothing) and frees its dp rank and devices (a later scale takes them)."""
        launch = self._launch
        workers = launch.replica(dp)
        self._retiring[dp] = _Retiring(dp, workers)
        self.in_service = [d for d in self.in_service if d != dp]
        self._serving_since.pop(dp, None)
        self._changed()
        pids = self.pids(dp)

        async def end() -> None:
            try:
                await self._end_at_once(workers, because_of=cause.worker)
            finally:
                self._retiring.pop(dp, None)
                self._forget(workers)
            self._devices.pop(dp, None)
            launch.healing.restarts.forget(dp)
            launch.publish(
                events.ReplicaRemoved(
                    replica=replica_name(dp),
                    dp_rank=dp,
                    change=SET_ASIDE,
                    pids=pids,
                    cause=f"{cause.summary}; {reason}",
                )
            )

        return asyncio.create_task(end())

    async def _end_at_once(self, workers: list[Worker], because_of: str | None) -> None:
        """SIGKILL what runs of ``workers`` (their replica finishes nothing more), reap them all
        and whatever they left behind."""
        launch = self._launch
        for worker in workers:
            launch.watchdog.forget(worker.name)
            if worker.child.running and worker.state.phase != phases.STOPPED:
                launch.stopped(worker, because_of=because_of, at_once=True)
        await launch.stop([w for w in workers if w.child.running], 0)
        for worker in workers:
            if worker.process is not None:
                await launch.reap(worker)
        await launch.sweep_adopted()

    def _forget(self, workers: list[Worker]) -> None:
        """Drop the records of ``workers`` that are gone (one still running stays, and the
        launch's stop ends it)."""
        for worker in workers:
            if not worker.child.running:
                self._launch.remove_worker(worker)

    async def until_healed(self, dp: int) -> None:
        """Wait while replica ``dp`` is being restarted (the launch's restart policy)."""
        while dp in self._launch.healing.in_progress:
            await asyncio.sleep(0.1)

    # ------------------------------------------------------------------ bookkeeping
    def http_probes(self) -> bool:
        """The HTTP child probes joining replicas and reports draining ones drained."""
        return any(
            w.spec.role == "http" and w.state.ready and w.state.info.get("probes_replicas") is True
            for w in self._launch.workers
        )

    def free_dp(self) -> int:
        used = {*self.in_service, *self._joining, *self._retiring}
        return next(dp for dp in itertools.count() if dp not in used)

    def devices_short(self, dp_size: int) -> str | None:
        """Why ``dp_size`` replicas cannot fit the devices this node's schedulers see (each
        replica a group of ``tp_size`` devices, the new ones on the lowest free groups); None
        when they fit, or when no scheduler counts its devices (the CPU)."""
        seen: list[int] = []
        for w in self._launch.workers:
            count = w.state.info.get("devices")
            if w.dp_rank in self.in_service and isinstance(count, int):
                seen.append(count)
        if not seen or self.template is None:
            return None
        visible, tp = min(seen), max(self.template.tp_size, 1)
        groups = set(self._devices.values())
        for _ in range(dp_size - len(self.in_service)):
            groups.add(next(g for g in itertools.count() if g not in groups))
        needed = (max(groups, default=-1) + 1) * tp
        if needed <= visible:
            return None
        return (
            f"--dp-size {dp_size} needs devices 0-{needed - 1} on this node (--tp-size {tp} "
            f"each), and its schedulers see {visible}; scale to at most {visible // tp} or "
            f"make more devices visible (CUDA_VISIBLE_DEVICES or your platform's equivalent) "
            f"and restart"
        )

    def free_devices(self) -> int:
        used = set(self._devices.values())
        return next(group for group in itertools.count() if group not in used)
