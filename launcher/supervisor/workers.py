"""One child of a running launch as every part of the supervisor sees it: ``Worker``.

A ``Worker`` pairs the spawned ``Child`` (``bootstrap.children``) with its record in the
``LaunchState`` that ops tooling reads. ``launcher.supervisor.launch`` makes them and owns the
list; healing, the replica set and the rollouts are handed workers (and the callables that act on
them), never the launch, so this module is the one they share and it imports none of them.
"""

from __future__ import annotations

from collections.abc import Awaitable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    import multiprocessing.process

    from bootstrap import ProcessSpec, messages
    from bootstrap.children import Child
    from launcher.supervisor.state import WorkerState


@dataclass(eq=False)
class Worker:
    """One child of this node: the spawned ``Child`` and its record in the ``LaunchState``."""

    child: Child
    state: WorkerState
    # Killed with no grace period: it was starting when the launch failed.
    stopped_at_once: bool = False

    @property
    def name(self) -> str:
        return self.state.name

    @property
    def spec(self) -> ProcessSpec:
        return self.child.spec

    @property
    def process(self) -> multiprocessing.process.BaseProcess | None:
        return self.child.process

    @property
    def failure(self) -> messages.Failed | None:
        return self.child.failure

    @property
    def dp_rank(self) -> int | None:
        """The replica a scheduler rank belongs to; None for other roles."""
        if self.spec.role != "scheduler":
            return None
        return self.spec.rank // max(self.spec.tp_size, 1)


def snapshot_order(worker: Worker) -> tuple[bool, str, int]:
    """The HTTP child first, then the other roles, each by rank (the order of the snapshot)."""
    return (worker.spec.role != "http", worker.spec.role, worker.spec.rank)


class EndAtOnce(Protocol):
    """``end_at_once(workers, because_of=..., restart=...)``: what runs of ``workers`` gets
    SIGKILL (their replica finishes nothing more), each recorded as stopped because of
    ``because_of`` (``restart``: for its replica's restart; else at once), every one reaped and
    whatever they left behind ended."""

    def __call__(
        self, workers: list[Worker], *, because_of: str | None, restart: bool = False
    ) -> Awaitable[None]: ...
