"""The decisions of a reload or a scale, as pure functions of where the replicas are.

Nothing here starts, stops or waits for a process: ``Rollouts`` asks these functions what to do
next and ``ReplicaSet`` does it. A replica is named by its dp rank and runs on a device group of
its own (``LOCAL_RANK`` = group x ranks + rank); ``Layout`` is where the replicas of a launch are.

- which replica a reload replaces next (``next_to_replace``) and with which dp rank and devices
  (``replacement``): with ``--reload-surge 1`` the successor takes the lowest free dp rank and the
  old replica's devices, beside it; with 0 it takes the old one's place once it is gone;
- whether a scale is done, and if not, which replica it adds (the lowest free dp rank and device
  group) or removes (the one that began serving last) (``scale_step``);
- what a failed reload puts back (``rollback_steps``): the replica it left out, started again,
  then every replica it replaced, replaced back;
- whether replicas fit the devices the schedulers see (``devices_short``).
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable
from dataclasses import dataclass, field


def lowest_free(used: Iterable[int]) -> int:
    """The lowest number from 0 up that ``used`` does not hold."""
    taken = set(used)
    return next(n for n in itertools.count() if n not in taken)


@dataclass
class Layout:
    """Where the replicas of a launch are: ``in_service`` (the dp ranks that take requests),
    ``busy`` (those a change starts or retires meanwhile), ``groups`` (dp rank -> device group,
    of every replica the launch holds) and ``serving_since`` (dp rank -> the order in which it
    began serving)."""

    in_service: list[int] = field(default_factory=list)
    busy: set[int] = field(default_factory=set)
    groups: dict[int, int] = field(default_factory=dict)
    serving_since: dict[int, int] = field(default_factory=dict)

    def free_dp(self) -> int:
        """The dp rank a replica started now takes."""
        return lowest_free({*self.in_service, *self.busy})

    def free_group(self) -> int:
        """The device group a replica added now takes."""
        return lowest_free(self.groups.values())

    def newest(self) -> int:
        """The replica in service that began serving last (a scale down removes it first)."""
        return max(self.in_service, key=lambda dp: (self.serving_since.get(dp, 0), dp))


# -- a reload ---------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Replace:
    """Replica ``old`` is replaced by a fresh one, ``new``, on device group ``group``;
    ``in_place``: the old one is drained and stopped first and the new one takes its dp rank,
    else the new one starts beside it and the old one is drained once the new one serves."""

    old: int
    new: int
    group: int
    in_place: bool


def next_to_replace(order: list[int], done: list[int], in_service: list[int]) -> int | None:
    """The replica a reload replaces next: the first of ``order`` (the replicas in service when
    it began) that it has not replaced yet (``done``) and that still serves (one taken out of
    service meanwhile is skipped); None once there is none: the reload is done."""
    return next((dp for dp in order if dp not in done and dp in in_service), None)


def replacement(old: int, layout: Layout, *, surge: int) -> Replace:
    """How replica ``old`` is replaced now (``--reload-surge`` ``surge``)."""
    group = layout.groups[old]
    if surge:
        return Replace(old, layout.free_dp(), group, in_place=False)
    return Replace(old, old, group, in_place=True)


@dataclass(frozen=True)
class Rejoin:
    """Start replica ``dp`` on device group ``group`` again with what it served before (a reload
    in place had stopped it, and its successor failed)."""

    dp: int
    group: int


@dataclass(frozen=True)
class ReplaceBack:
    """Replace replica ``dp``, which serves the failed reload's model, by one serving the model
    from before (``replacement`` decides how when it is its turn)."""

    dp: int


def rollback_steps(
    replaced: list[int], vacated: tuple[int, int] | None
) -> list[Rejoin | ReplaceBack]:
    """What a failed reload puts back, in order: the replica it left without a successor
    (``vacated``: its dp rank and device group, ``--reload-surge 0``), then each replica it had
    replaced (``replaced``: the successors' dp ranks)."""
    steps: list[Rejoin | ReplaceBack] = []
    if vacated is not None:
        steps.append(Rejoin(*vacated))
    steps.extend(ReplaceBack(dp) for dp in replaced)
    return steps


# -- a scale ----------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Add:
    """Start replica ``dp`` on device group ``group``."""

    dp: int
    group: int


@dataclass(frozen=True)
class Remove:
    """Drain and stop replica ``dp``."""

    dp: int


def scale_step(layout: Layout, dp_size: int) -> Add | Remove | None:
    """The next step of a scale to ``dp_size`` replicas; None once that many serve."""
    if len(layout.in_service) < dp_size:
        return Add(layout.free_dp(), layout.free_group())
    if len(layout.in_service) > dp_size:
        return Remove(layout.newest())
    return None


def devices_short(layout: Layout, dp_size: int, tp_size: int, visible: int) -> str | None:
    """Why ``dp_size`` replicas of ``tp_size`` ranks cannot fit the ``visible`` devices this
    node's schedulers see (each replica a group of ``tp_size`` devices, the new ones on the
    lowest free groups); None when they fit."""
    tp = max(tp_size, 1)
    groups = set(layout.groups.values())
    for _ in range(dp_size - len(layout.in_service)):
        groups.add(lowest_free(groups))
    needed = (max(groups, default=-1) + 1) * tp
    if needed <= visible:
        return None
    return (
        f"--dp-size {dp_size} needs devices 0-{needed - 1} on this node (--tp-size {tp} "
        f"each), and its schedulers see {visible}; scale to at most {visible // tp} or "
        f"make more devices visible (CUDA_VISIBLE_DEVICES or your platform's equivalent) "
        f"and restart"
    )
