"""Torch's CPU threads in a scheduler process (either runtime): how many it starts, and the report
of them that ``/get_server_info`` shows under ``model.cpu_threads``."""

from __future__ import annotations

import os

from serving.wire import CpuThreads


def share_cpu_threads(ranks_on_node: int) -> None:
    """Size torch's intra-op thread pool for a scheduler rank computing on the CPU: the cores are
    shared among this node's ``ranks_on_node`` ranks. Without this every rank starts one thread
    per core, and the ranks slow each other down. No core is kept back for the HTTP child, whose
    work per request is small beside the model's: the launch starts scheduler children with
    ``OMP_WAIT_POLICY=PASSIVE`` and a short ``GOMP_SPINCOUNT`` (unless set), so a waiting pool
    thread spins only through the gaps of a running batch, then sleeps, and the HTTP child gets
    a core when it needs one. An explicit ``OMP_NUM_THREADS`` wins
    (set it lower when other work shares the cores)."""
    if os.environ.get("OMP_NUM_THREADS"):
        return
    import torch

    cores = (
        len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    )
    torch.set_num_threads(max(1, cores // max(ranks_on_node, 1)))


def cpu_threads() -> CpuThreads:
    """This process's torch CPU thread settings: the intra-op thread count and the OpenMP wait
    policy its thread pool started with (``OMP_WAIT_POLICY``, which the launch sets to
    ``PASSIVE`` unless the environment sets it; None when unset)."""
    import torch

    return CpuThreads(torch.get_num_threads(), os.environ.get("OMP_WAIT_POLICY"))
