"""The launch's state as ops tooling sees it: one record per worker plus the server's phase.

The supervisor is the only writer (from its event loop). ``snapshot()`` returns it as plain
JSON-able data: the snapshot stays a dict (what the status query socket answers,
``sglang-launch status --json`` prints and ``Launcher.status()`` returns), each worker's record
with its ``name`` added. ``LaunchState.from_snapshot`` reads such a dict back into the typed
records (``sglang-launch status`` and ``events`` do, on the other side of the query socket).
"""

from __future__ import annotations

import os
import time

import msgspec

from bootstrap.manifest import Manifest
from launchspec.causes import RootCause
from launchspec.events import WorkerError, WorkerFields

# Server phases, in order of a normal life.
STARTING, READY, FAILED, STOPPING, STOPPED = "starting", "ready", "failed", "stopping", "stopped"


class WorkerState(msgspec.Struct):
    """One child process: who it is, where it is in start-up, how it ended.

    ``phase`` is the last phase the worker reported (``"starting"`` until it reports one; then
    the bootstrap's phases, the worker's own, ``"ready"``, and ``"stopped"`` once it wound down
    or was ended); ``phases`` maps each reported phase to its duration in seconds. ``error`` holds
    its ``failed`` report; ``exited``, ``exitcode`` and ``signal`` say whether and how the
    process ended. ``restarts`` counts how often it was started again with its replica
    (``--restart-policy on-failure``); each restart starts the record afresh but for that count
    and ``restart_cause``, the summary of the failure that restarted it the last time.
    ``manifest`` is what the process reported having of platform and plugins with its readiness,
    ``manifest_differs`` how that differs from a ready peer's of the same role.
    """

    role: str
    rank: int
    local_rank: int
    node_rank: int
    pid: int | None = None
    phase: str = "starting"
    phases: dict[str, float] = msgspec.field(default_factory=dict)
    platform: str | None = None
    exited: bool = False
    exitcode: int | None = None
    signal: str | None = None
    info: dict[str, object] = msgspec.field(default_factory=dict)
    error: WorkerError | None = None
    ready: bool = False
    started_at: float = msgspec.field(default_factory=time.time)
    ready_at: float | None = None
    restarts: int = 0
    restart_cause: str | None = None
    manifest: Manifest | None = None
    manifest_differs: list[str] = msgspec.field(default_factory=list)

    @property
    def name(self) -> str:
        return f"{self.role}.{self.rank}"

    def restarted(self, pid: int | None, cause: str | None = None) -> None:
        """The worker was started again as process ``pid`` after the failure ``cause``: a fresh
        record, one more restart."""
        fresh = WorkerState(self.role, self.rank, self.local_rank, self.node_rank, pid=pid)
        fresh.restarts = self.restarts + 1
        fresh.restart_cause = cause
        for name in self.__struct_fields__:
            setattr(self, name, getattr(fresh, name))

    def to_dict(self) -> dict[str, object]:
        data: dict[str, object] = msgspec.to_builtins(self)
        data["name"] = self.name
        return data


class ChangeState(msgspec.Struct):
    """A reload or a scale in progress: ``kind`` (``"reload"``, ``"scale"``), its ``id`` (the
    ``id`` of its ``reload.*`` / ``scale.*`` events), why it runs, since when, and ``step``, what
    it is doing now (``"replacing scheduler dp=1 (2 of 3)"``)."""

    kind: str
    id: int
    reason: str
    started_at: float = msgspec.field(default_factory=time.time)
    step: str = ""


class LaunchState(msgspec.Struct):
    """The whole launch: server phase, URL, platform, workers, and the root cause if it failed;
    the model its replicas serve (``model_path``, ``served_model_name``: None for the embedded
    default or the directory's name), the dp ranks of the replicas that serve (``replicas``) and
    the reload or scale in progress (``change``)."""

    runtime: str
    platform: str
    platform_reason: str
    url: str | None
    node_rank: int
    nnodes: int
    workers: list[WorkerState]
    phase: str = STARTING
    pid: int = msgspec.field(default_factory=os.getpid)
    started_at: float = msgspec.field(default_factory=time.time)
    ready_at: float | None = None
    root_cause: RootCause | None = None
    seq: int = 0  # sequence number of the last event published
    model_path: str | None = None
    served_model_name: str | None = None
    replicas: list[int] = msgspec.field(default_factory=list)
    change: ChangeState | None = None

    @classmethod
    def from_snapshot(cls, snapshot: object) -> LaunchState:
        """The state a ``snapshot()`` (as JSON came back) describes; ``ValueError`` if it is not one."""
        try:
            state: LaunchState = msgspec.convert(snapshot, cls)
        except msgspec.ValidationError as exc:
            raise ValueError(f"not an sglang-launch status snapshot: {exc}") from None
        return state

    def all_ready(self) -> bool:
        return all(w.ready for w in self.workers)

    def worker_fields(self, worker: WorkerState) -> WorkerFields:
        """What every event about ``worker`` says besides its phase."""
        return {
            "worker": worker.name,
            "role": worker.role,
            "rank": worker.rank,
            "pid": worker.pid,
            "ready_count": sum(w.ready for w in self.workers),
            "worker_count": len(self.workers),
        }

    def snapshot(self) -> dict[str, object]:
        return {
            "pid": self.pid,
            "phase": self.phase,
            "url": self.url,
            "runtime": self.runtime,
            "platform": self.platform,
            "platform_reason": self.platform_reason,
            "node_rank": self.node_rank,
            "nnodes": self.nnodes,
            "started_at": self.started_at,
            "ready_at": self.ready_at,
            "root_cause": self.root_cause.to_dict() if self.root_cause is not None else None,
            "seq": self.seq,
            "model_path": self.model_path,
            "served_model_name": self.served_model_name,
            "replicas": list(self.replicas),
            "change": msgspec.to_builtins(self.change) if self.change is not None else None,
            "workers": [w.to_dict() for w in self.workers],
        }
