"""The launch's state as ops tooling sees it: one record per worker plus the server's phase.

The supervisor is the only writer (from its event loop); ``snapshot()`` returns plain JSON-able
data, the same thing the status query socket answers, ``sglang-launch status`` prints and
``Launcher.status()`` returns.
"""

from __future__ import annotations

import os
import time
from dataclasses import asdict, dataclass, field

# Server phases, in order of a normal life.
STARTING, READY, FAILED, STOPPING, STOPPED = "starting", "ready", "failed", "stopping", "stopped"


@dataclass
class WorkerState:
    """One child process: who it is, where it is in start-up, how it ended.

    ``phase`` is the last phase the worker reported (``"starting"`` until it reports one; then
    the bootstrap's phases, the worker's own, ``"ready"``, and ``"stopped"`` once it wound down
    on request); ``phases`` maps each reported phase to its duration in seconds. ``error`` holds
    its ``failed`` report; ``exited``, ``exitcode`` and ``signal`` say whether and how the
    process ended. ``restarts`` counts how often it was started again with its replica
    (``--restart-policy on-failure``); each restart starts the record afresh but for that count.
    """

    role: str
    rank: int
    local_rank: int
    node_rank: int
    pid: int | None = None
    phase: str = "starting"
    phases: dict[str, float] = field(default_factory=dict)
    platform: str | None = None
    exited: bool = False
    exitcode: int | None = None
    signal: str | None = None
    info: dict = field(default_factory=dict)
    error: dict | None = None
    ready: bool = False
    started_at: float = field(default_factory=time.time)
    ready_at: float | None = None
    restarts: int = 0

    @property
    def name(self) -> str:
        return f"{self.role}.{self.rank}"

    def restarted(self, pid: int | None) -> None:
        """The worker was started again as process ``pid``: a fresh record, one more restart."""
        fresh = WorkerState(self.role, self.rank, self.local_rank, self.node_rank, pid=pid)
        fresh.restarts = self.restarts + 1
        self.__dict__.update(fresh.__dict__)

    def to_dict(self) -> dict:
        data = asdict(self)
        data["name"] = self.name
        return data


@dataclass
class LaunchState:
    """The whole launch: server phase, URL, platform, workers, and the root cause if it failed."""

    runtime: str
    platform: str
    platform_reason: str
    url: str | None
    node_rank: int
    nnodes: int
    workers: list[WorkerState]
    phase: str = STARTING
    pid: int = field(default_factory=os.getpid)
    started_at: float = field(default_factory=time.time)
    ready_at: float | None = None
    root_cause: dict | None = None
    seq: int = 0  # sequence number of the last event published

    def worker(self, role: str, rank: int) -> WorkerState | None:
        for w in self.workers:
            if w.role == role and w.rank == rank:
                return w
        return None

    def all_ready(self) -> bool:
        return all(w.ready for w in self.workers)

    def snapshot(self) -> dict:
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
            "root_cause": self.root_cause,
            "seq": self.seq,
            "workers": [w.to_dict() for w in self.workers],
        }
