"""Restart bookkeeping of scheduler replicas: the policy, the count per replica, the backoff.

A replica is the ``tp_size`` scheduler ranks of one data-parallel group; it restarts as a unit.
The supervisor asks ``Restarts.decide(dp_rank)`` each time a replica fails after the launch was
ready. The answer is a ``Decision``: restart after ``delay`` seconds (the ``attempt``-th restart of
that replica), or do not, and why. Under ``on-failure`` a replica may be restarted
``max_restarts`` times over the launch's life; the n-th restart waits
``backoff * 2 ** (n - 1)`` seconds, at most ``BACKOFF_CAP``. Under ``never`` nothing restarts.
A policy left to its default follows the number of replicas (``follow``: ``on-failure`` with
more than one, ``default_policy``), as a scale changes it.

``ReplicaRestart`` is the record of one restart in progress: ``DOWN`` while the replica's
surviving ranks are ended and the backoff runs, ``RESPAWNED`` once its ranks are spawned again,
until all of them report ready.

``launcher.supervisor.healing`` does the restarts with this bookkeeping.

The policy names are ``launchspec.server_args``'s (``--restart-policy``).
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field

from launchspec.server_args import NEVER, ON_FAILURE, RESTART_POLICIES

BACKOFF_CAP = 30.0  # seconds: the longest wait before a restart
DOWN, RESPAWNED = "down", "respawned"


def replica_name(dp_rank: int) -> str:
    """How events, logs and ``/ready`` name a replica: ``"scheduler dp=1"``."""
    return f"scheduler dp={dp_rank}"


@dataclass(frozen=True)
class Decision:
    """Whether to restart a failed replica: ``restart``; if so, its ``attempt`` (1 for the
    first restart of that replica) and the ``delay`` in seconds before respawning; if not,
    ``reason`` and whether the budget was ``exhausted`` (as opposed to the policy saying never)."""

    restart: bool
    attempt: int = 0
    delay: float = 0.0
    reason: str = ""
    exhausted: bool = False


def default_policy(replicas: int) -> str:
    """The policy of a launch that left ``--restart-policy`` to its default, with ``replicas``
    replicas on one node: the others serve while one restarts, so ``on-failure`` from two."""
    return ON_FAILURE if replicas > 1 else NEVER


class Restarts:
    """The restart policy of one launch and how often each replica was restarted.
    ``follows_replicas``: the policy was left to its default, and ``follow`` changes it."""

    def __init__(
        self, policy: str, max_restarts: int, backoff: float, *, follows_replicas: bool = False
    ) -> None:
        if policy not in RESTART_POLICIES:
            raise ValueError(
                f"restart policy {policy!r} is not one of {', '.join(RESTART_POLICIES)}"
            )
        self.policy = policy
        self.follows_replicas = follows_replicas
        self.max_restarts = max(0, int(max_restarts))
        self.backoff = max(0.0, float(backoff))
        self._counts: dict[int, int] = {}

    def follow(self, replicas: int) -> str:
        """The launch has (or is about to have) ``replicas`` replicas: the policy in effect from
        now on (a default one follows the count; one given on the command line stays)."""
        if self.follows_replicas:
            self.policy = default_policy(replicas)
        return self.policy

    def count(self, dp_rank: int) -> int:
        """Restarts of replica ``dp_rank`` decided so far."""
        return self._counts.get(dp_rank, 0)

    def forget(self, dp_rank: int) -> None:
        """Replica ``dp_rank`` is gone for good: a replica started later under that dp rank is a
        new one, with every restart to come."""
        self._counts.pop(dp_rank, None)

    @property
    def total(self) -> int:
        """Restarts decided so far, all replicas together."""
        return sum(self._counts.values())

    def delay(self, attempt: int) -> float:
        """Seconds to wait before restart number ``attempt`` (1-based) of a replica."""
        return min(self.backoff * 2.0 ** max(attempt - 1, 0), BACKOFF_CAP)

    def would_restart(self, dp_rank: int) -> bool:
        """Whether a failure of replica ``dp_rank`` now would be restarted (nothing is counted)."""
        return self.policy == ON_FAILURE and self.count(dp_rank) < self.max_restarts

    def decide(self, dp_rank: int) -> Decision:
        """Replica ``dp_rank`` failed after the launch was ready: restart it? A ``restart``
        decision counts as one restart of that replica."""
        if self.policy == NEVER:
            return Decision(False, reason="--restart-policy is never")
        done = self.count(dp_rank)
        if done >= self.max_restarts:
            return Decision(
                False,
                reason=(
                    f"{replica_name(dp_rank)} was restarted {done} time(s) already "
                    f"(--max-restarts {self.max_restarts})"
                ),
                exhausted=True,
            )
        attempt = done + 1
        self._counts[dp_rank] = attempt
        return Decision(True, attempt=attempt, delay=self.delay(attempt))


@dataclass(eq=False)
class ReplicaRestart:
    """One restart of replica ``dp_rank`` in progress (see the module docstring)."""

    dp_rank: int
    attempt: int
    cause_summary: str
    because_of: str | None = None  # the worker whose failure started it
    died_at: float = field(default_factory=time.monotonic)
    stage: str = DOWN
    task: asyncio.Task[None] | None = None
    timer: asyncio.TimerHandle | None = None

    @property
    def name(self) -> str:
        return replica_name(self.dp_rank)

    def cancel(self) -> None:
        """Stop the restart's task and start-up timer (the launch is stopping)."""
        if self.task is not None and not self.task.done():
            self.task.cancel()
        if self.timer is not None:
            self.timer.cancel()
