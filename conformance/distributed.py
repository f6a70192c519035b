"""Distributed checks: the backend name, and a one-rank process group that all-reduces."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from .catalog import check
from .rows import CheckFailed

if TYPE_CHECKING:
    from .probe import Probe

_GROUP_TIMEOUT_S = 60


def backends_in(spec: str) -> list[str]:
    """The backend names in a torch.distributed backend string: ``"gloo"`` or
    ``"cpu:gloo,cuda:nccl"``."""
    return [part.rpartition(":")[2].strip().lower() for part in spec.split(",") if part.strip()]


def unavailable(name: str) -> str | None:
    """Why torch cannot use backend ``name`` here, or None when it can."""
    import torch.distributed as dist

    if not dist.is_available():
        return "this torch build has no torch.distributed"
    probe = getattr(dist, f"is_{name}_available", None)
    if callable(probe):
        return None if probe() else f"torch.distributed.is_{name}_available() is False"
    known = [b for b in dist.Backend.backend_list if b != "undefined"]
    if name in known:  # a backend registered by an extension (Backend.register_backend)
        return None
    return f"torch knows no backend {name!r} (available: {', '.join(b for b in known if unavailable(b) is None)})"


@check(
    "distributed.backend",
    "get_torch_distributed_backend_str() names an available backend",
    "get_torch_distributed_backend_str() names a torch.distributed backend this torch has "
    "available (built in, like 'nccl' or 'gloo', or registered by the vendor's extension)",
    required=(
        "get_torch_distributed_backend_str",
        "a launch with --tp-size > 1 joins each replica's ranks in a process group on it",
    ),
)
def backend(probe: Probe) -> str:
    value = probe.platform.get_torch_distributed_backend_str()
    if not isinstance(value, str) or not value.strip():
        raise CheckFailed(f"returned {value!r}, not a backend name")
    problems = [why for why in map(unavailable, backends_in(value)) if why]
    if problems:
        raise CheckFailed(f"returned {value!r}: " + "; ".join(problems))
    probe.values["backend"] = value
    from platforms.device_mixin import DeviceMixin

    own = type(probe.platform).get_torch_distributed_backend_str
    if own is DeviceMixin.get_torch_distributed_backend_str:
        return f"{value!r} (not overridden: the default for device_type {probe.platform.device_type!r}, as in SGLang)"
    return repr(value)


@check(
    "distributed.process_group",
    "a one-rank process group initialises and all-reduces",
    "init_process_group() on that backend works for one rank, and all_reduce of a tensor on "
    "get_device(0) returns it unchanged",
    needs=("distributed.backend", "device.get_device"),
)
def process_group(probe: Probe) -> str:
    import datetime

    import torch.distributed as dist

    torch = probe.torch
    kwargs = {}
    # The diffusion contract's seam: bind the group to the device where the platform says so.
    supports = getattr(probe.platform, "supports_distributed_device_id", None)
    bind = callable(supports) and bool(supports())
    if bind:
        kwargs["device_id"] = probe.device
    store = os.path.join(probe.workdir, "process-group-store")
    dist.init_process_group(
        backend=probe.values["backend"],
        init_method=f"file://{store}",
        rank=0,
        world_size=1,
        timeout=datetime.timedelta(seconds=_GROUP_TIMEOUT_S),
        **kwargs,
    )
    try:
        value = torch.tensor([1.0, 2.0, 3.0], device=probe.device)
        dist.all_reduce(value)
        probe.platform.synchronize()
        got = value.cpu().tolist()
    finally:
        dist.destroy_process_group()
    if got != [1.0, 2.0, 3.0]:
        raise CheckFailed(f"all_reduce over one rank turned [1.0, 2.0, 3.0] into {got}")
    bound = " (bound with device_id)" if bind else ""
    return f"{probe.values['backend']}: 1 rank, all_reduce on {probe.device}{bound}"
