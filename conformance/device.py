"""Device and memory checks: the device, a real computation on it, names, memory figures."""

from __future__ import annotations

import numbers
from typing import TYPE_CHECKING, Any

from .catalog import check
from .rows import CheckFailed, Missing, Skip

if TYPE_CHECKING:
    from .probe import Probe

_MIB = float(1 << 20)
_GIB = float(1 << 30)
# Allocation steps for the memory-usage check (MiB); kept alive, so the total grows.
_ALLOCATION_STEPS_MIB = (16, 64, 256)


def _is_int(value: Any) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


@check(
    "device.get_device",
    "get_device(0) is a torch.device of device_type",
    "get_device(local_rank) returns a torch.device whose .type is the platform's device_type",
    required=(
        "get_device",
        "every scheduler worker loads the model onto get_device(local_rank) (SRT, where it is "
        "not implemented: onto torch.device(device_type, local_rank))",
    ),
)
def get_device(probe: Probe) -> str:
    torch = probe.torch
    try:
        device = probe.platform.get_device(0)
    except NotImplementedError:
        if probe.runtime != "srt":
            raise  # the diffusion worker binds get_device(local_rank) itself
        from platforms.device_mixin import placement

        try:
            fallback = placement(probe.platform, 0)
        except NotImplementedError:  # a failure: a launch cannot place the model
            raise NotImplementedError(
                f"device_type {probe.platform.device_type!r} is not a torch device type either "
                f"(no torch.device(device_type, local_rank) to use instead)"
            ) from None
        probe.values["device"] = fallback
        raise Missing(
            f"not implemented (SGLang marks it planned); an SRT worker places the model on "
            f"torch.device({probe.platform.device_type!r}, local_rank) instead: {fallback!r}"
        ) from None
    if not isinstance(device, torch.device):
        raise CheckFailed(
            f"get_device(0) returned {type(device).__name__} {device!r}, not a torch.device"
        )
    if device.type != probe.platform.device_type:
        raise CheckFailed(
            f"get_device(0) is {device} but device_type is {probe.platform.device_type!r}"
        )
    probe.values["device"] = device
    return repr(device)


@check(
    "device.set_device",
    "set_device(get_device(0)) is accepted",
    "set_device(device) makes that device current and returns None",
    optional=True,
    needs=("device.get_device",),
)
def set_device(probe: Probe) -> str:
    probe.platform.set_device(probe.device)
    return f"set_device({probe.device}) returned"


@check(
    "device.tensor",
    "a tensor on the device; a matmul there matches the CPU",
    "tensors can be allocated on get_device(0) and a matmul there gives the CPU's result",
    needs=("device.get_device",),
)
def tensor(probe: Probe) -> str:
    torch = probe.torch
    # Small integers: exact in every float format a device might use for matmul (tf32 included).
    a = torch.arange(24, dtype=torch.float32).reshape(4, 6) % 7
    b = torch.arange(18, dtype=torch.float32).reshape(6, 3) % 5
    want = a @ b
    on_device = a.to(probe.device) @ b.to(probe.device)
    if on_device.device.type != probe.device.type:
        raise CheckFailed(f"the result landed on {on_device.device}, not on {probe.device}")
    probe.platform.synchronize()
    got = on_device.cpu()
    if not torch.allclose(got, want):
        raise CheckFailed(
            f"a 4x6 @ 6x3 matmul on {probe.device} differs from the CPU result: {got.tolist()} != {want.tolist()}"
        )
    return f"4x6 @ 6x3 float32 on {probe.device} equals the CPU result"


@check(
    "device.name",
    "get_device_name(0) names the device",
    "get_device_name(device_id) returns a non-empty human-readable string",
    optional=True,
)
def name(probe: Probe) -> str:
    value = probe.platform.get_device_name(0)
    if not isinstance(value, str) or not value.strip():
        raise CheckFailed(f"get_device_name(0) returned {value!r}")
    return repr(value)


@check(
    "device.uuid",
    "get_device_uuid(0) identifies the device",
    "get_device_uuid(device_id) returns a non-empty, stable string",
    optional=True,
)
def uuid(probe: Probe) -> str:
    first = probe.platform.get_device_uuid(0)
    if not isinstance(first, str) or not first.strip():
        raise CheckFailed(f"get_device_uuid(0) returned {first!r}")
    again = probe.platform.get_device_uuid(0)
    if again != first:
        raise CheckFailed(f"get_device_uuid(0) changed between calls: {first!r}, then {again!r}")
    return repr(first)


@check(
    "device.capability",
    "get_device_capability(0) is a DeviceCapability or None",
    "get_device_capability(device_id) returns platforms.DeviceCapability(major, minor), or None "
    "where the notion does not apply",
    optional=True,
)
def capability(probe: Probe) -> str:
    from platforms import DeviceCapability

    value = probe.platform.get_device_capability(0)
    if value is None:
        return "None (no compute capability on this device)"
    if not isinstance(value, DeviceCapability):
        raise CheckFailed(f"returned {type(value).__name__} {value!r}")
    if not (_is_int(value.major) and _is_int(value.minor)):
        raise CheckFailed(f"returned {value!r}; major and minor must be integers")
    return f"{value.as_version_str()} ({value!r})"


@check(
    "device.total_memory",
    "get_device_total_memory(0) is a positive byte count",
    "get_device_total_memory(device_id) returns the device's total memory in bytes (an int > 0)",
    optional=True,
)
def total_memory(probe: Probe) -> str:
    value = probe.platform.get_device_total_memory(0)
    if not _is_int(value) or value <= 0:
        raise CheckFailed(f"returned {value!r}")
    probe.values["total_memory"] = int(value)
    return f"{value / _GIB:.2f} GiB"


@check(
    "device.available_memory",
    "total memory >= available memory >= 0",
    "get_available_memory(device_id) returns (free_bytes, total_bytes) with "
    "0 <= free <= get_device_total_memory()",
    optional=True,
)
def available_memory(probe: Probe) -> str:
    value = probe.platform.get_available_memory(0)
    if not (isinstance(value, tuple) and len(value) == 2 and all(_is_int(v) for v in value)):
        raise CheckFailed(f"returned {value!r}, not a (free_bytes, total_bytes) pair of ints")
    free, total = value
    limit = probe.values.get("total_memory", total)
    if not 0 <= free <= limit:
        raise CheckFailed(f"free {free} bytes is outside 0..{limit} (the total memory)")
    if total > limit:
        raise CheckFailed(f"its total {total} exceeds get_device_total_memory() = {limit}")
    probe.values["free_memory"] = int(free)
    return f"{free / _GIB:.2f} GiB free of {total / _GIB:.2f} GiB"


@check(
    "device.memory_usage",
    "get_current_memory_usage() rises after an allocation",
    "get_current_memory_usage(device) reports the peak bytes used on the device, so it rises "
    "when tensors are allocated there",
    optional=True,
    needs=("device.get_device",),
)
def memory_usage(probe: Probe) -> str:
    torch, p = probe.torch, probe.platform
    before = p.get_current_memory_usage(probe.device)
    if not _is_number(before) or before < 0:
        raise CheckFailed(f"returned {before!r}, not a byte count")
    budget = probe.values.get("free_memory", 1 << 62) // 4
    held, total_mib = [], 0
    for mib in _ALLOCATION_STEPS_MIB:
        if (total_mib + mib) * _MIB > budget:
            break
        held.append(torch.ones(mib * (1 << 18), dtype=torch.float32, device=probe.device))
        total_mib += mib
        p.synchronize()
        after = p.get_current_memory_usage(probe.device)
        if _is_number(after) and after > before:
            return f"{before / _MIB:.1f} MiB -> {after / _MIB:.1f} MiB after allocating {total_mib} MiB"
    if not held:
        raise Skip("too little free device memory to allocate 16 MiB for the check")
    raise CheckFailed(
        f"stayed at {before!r} -> {after!r} after allocating {total_mib} MiB on {probe.device}"
    )


@check(
    "device.empty_cache",
    "empty_cache() is callable",
    "empty_cache() releases cached device memory and returns (the default does nothing)",
)
def empty_cache(probe: Probe) -> str:
    probe.platform.empty_cache()
    return "returned"


@check(
    "device.synchronize",
    "synchronize() is callable",
    "synchronize() waits for queued device work and returns (the default does nothing)",
)
def synchronize(probe: Probe) -> str:
    probe.platform.synchronize()
    return "returned"


@check(
    "device.pin_memory",
    "is_pin_memory_available() agrees with pinning a tensor",
    "is_pin_memory_available() returns a bool, and True only where a host tensor can be pinned",
)
def pin_memory(probe: Probe) -> str:
    torch = probe.torch
    says = probe.platform.is_pin_memory_available(probe.values.get("device"))
    if not isinstance(says, bool):
        raise CheckFailed(f"returned {says!r}, not a bool")
    try:
        pinned = torch.empty(1024).pin_memory().is_pinned()
        why = "" if pinned else "is_pinned() is False after pin_memory()"
    except Exception as exc:  # noqa: BLE001 - a torch without an accelerator cannot pin
        first_line = (str(exc).strip().splitlines() or [""])[0]
        pinned, why = False, f"{type(exc).__name__}: {first_line}"
    if says and not pinned:
        raise CheckFailed(f"says True but pinning a host tensor failed ({why})")
    if says:
        return "True, and a host tensor was pinned"
    return (
        "False (pinning would work here; False is the safe answer)"
        if pinned
        else f"False, and pinning indeed fails ({why})"
    )


@check(
    "device.local_device",
    "get_local_torch_device() is get_device(LOCAL_RANK)",
    "get_local_torch_device() returns get_device(LOCAL_RANK) (LOCAL_RANK defaults to 0)",
    runtimes=("diffusion",),
    optional=True,
    needs=("device.get_device",),
)
def local_device(probe: Probe) -> str:
    import os

    rank = int(os.environ.get("LOCAL_RANK", "0") or 0)
    got = probe.platform.get_local_torch_device()
    want = probe.platform.get_device(rank)
    if got != want:
        raise CheckFailed(f"returned {got!r}, but get_device({rank}) is {want!r}")
    return f"{got!r} (LOCAL_RANK={rank})"


@check(
    "device.available_gpu_memory",
    "get_available_gpu_memory() is free GiB within the total",
    "get_available_gpu_memory(device_id) returns the free memory in GiB, between 0 and the total",
    runtimes=("diffusion",),
    optional=True,
)
def available_gpu_memory(probe: Probe) -> str:
    value = probe.platform.get_available_gpu_memory(0)
    if not _is_number(value) or value < 0:
        raise CheckFailed(f"returned {value!r}, not a number of GiB >= 0")
    total = probe.values.get("total_memory")
    if total is not None and value * _GIB > total * 1.0001:
        raise CheckFailed(f"{value:.2f} GiB is more than the device's total {total / _GIB:.2f} GiB")
    return f"{value:.2f} GiB"
