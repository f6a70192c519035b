"""The tensor-parallel group of one data-parallel replica, and rank 0's broadcasts to it.

The ``tp_size`` ranks of replica ``dp_rank`` form their own ``torch.distributed`` world (transformers'
tensor parallelism shards over the default group), rendezvousing through a file store in the
launch's private runtime directory: no port to pick, nothing reachable from outside. Rank 0 takes
requests and broadcasts each unit of work as bytes; the other ranks follow in lockstep.
"""

from __future__ import annotations

import os
from datetime import timedelta
from pathlib import Path


def init_tp_group(backend: str, runtime_dir: str, dp_rank: int, tp_rank: int, tp_size: int,
                  timeout_s: float = 300.0) -> None:
    """Join replica ``dp_rank``'s group on ``backend`` (the platform's distributed backend)."""
    import torch.distributed as dist

    store = Path(runtime_dir) / f"tp-store-{dp_rank}"
    # transformers reads these when it builds its device mesh.
    os.environ.update(RANK=str(tp_rank), LOCAL_RANK=str(tp_rank), WORLD_SIZE=str(tp_size))
    dist.init_process_group(
        backend=backend,
        init_method=f"file://{store}",
        rank=tp_rank,
        world_size=tp_size,
        timeout=timedelta(seconds=timeout_s),
    )


def close_tp_group() -> None:
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


def broadcast_bytes(data: bytes | None) -> bytes:
    """Rank 0 passes ``data``; every rank returns it (length first, then the bytes)."""
    import torch
    import torch.distributed as dist

    size = torch.tensor([len(data) if data is not None else 0], dtype=torch.int64)
    dist.broadcast(size, src=0)
    buf = torch.empty(int(size.item()), dtype=torch.uint8)
    if data is not None:
        buf.copy_(torch.frombuffer(bytearray(data), dtype=torch.uint8))
    if buf.numel():
        dist.broadcast(buf, src=0)
    return buf.numpy().tobytes()


def broadcast_flags(flags: list[bool]) -> list[bool]:
    """Rank 0's per-sequence flags (e.g. cancelled) to every rank, once per decode step."""
    import torch
    import torch.distributed as dist

    t = torch.tensor(flags, dtype=torch.uint8)
    dist.broadcast(t, src=0)
    return [bool(x) for x in t.tolist()]
