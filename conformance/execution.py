"""Execution checks: inference mode, seeding, the compile backend, the CPU architecture."""

from __future__ import annotations

import random
from typing import TYPE_CHECKING

from .catalog import check
from .rows import CheckFailed

if TYPE_CHECKING:
    from .probe import Probe

_SEED = 1234


@check(
    "execution.inference_mode",
    "inference_mode() enables inference mode",
    "inference_mode() returns a context manager inside which torch is in inference mode "
    "(the default is torch.inference_mode(True))",
)
def inference_mode(probe: Probe) -> str:
    torch = probe.torch
    manager = probe.platform.inference_mode()
    with manager:
        enabled = torch.is_inference_mode_enabled()
        inference_tensor = torch.ones(2).is_inference()
    if not (enabled and inference_tensor):
        raise CheckFailed(
            f"inside {type(manager).__name__}: torch.is_inference_mode_enabled() is {enabled}, "
            f"a new tensor's is_inference() is {inference_tensor}"
        )
    if torch.is_inference_mode_enabled():
        raise CheckFailed("inference mode stayed on after the context manager exited")
    return f"{type(manager).__module__}.{type(manager).__qualname__}"


def _draws(probe: Probe) -> dict[str, list]:
    torch = probe.torch
    draws = {"random": [random.random() for _ in range(3)], "torch": torch.rand(3).tolist()}
    device = probe.values.get("device")
    if device is not None and device.type != "cpu":
        draws[f"torch on {device}"] = torch.rand(3, device=device).cpu().tolist()
    return draws


@check(
    "execution.seed",
    "seed_everything() makes two draws equal",
    "seed_everything(seed) seeds Python's random, numpy and torch (and the device), so the "
    "same seed gives the same draws",
)
def seed(probe: Probe) -> str:
    probe.platform.seed_everything(_SEED)
    first = _draws(probe)
    probe.platform.seed_everything(_SEED)
    second = _draws(probe)
    differ = [name for name in first if first[name] != second[name]]
    if differ:
        raise CheckFailed(
            f"after seed_everything({_SEED}) twice, these draws differ: {', '.join(differ)}"
        )
    return f"seed {_SEED}: equal draws from {', '.join(first)}"


@check(
    "execution.compile_backend",
    "get_compile_backend() is a torch.compile backend",
    "get_compile_backend() names a backend torch.compile knows (torch._dynamo.list_backends(), "
    "entry-point backends included)",
)
def compile_backend(probe: Probe) -> str:
    name = probe.platform.get_compile_backend()
    if not isinstance(name, str) or not name.strip():
        raise CheckFailed(f"returned {name!r}, not a backend name")
    import torch._dynamo

    known = torch._dynamo.list_backends(exclude_tags=())
    if name not in known:
        raise CheckFailed(f"torch.compile knows no backend {name!r} (known: {', '.join(known)})")
    return repr(name)


@check(
    "execution.cpu_architecture",
    "get_cpu_architecture() is a CpuArchEnum",
    "get_cpu_architecture() returns a platforms.CpuArchEnum member (X86, ARM or UNSPECIFIED)",
)
def cpu_architecture(probe: Probe) -> str:
    from platforms import CpuArchEnum

    value = probe.platform.get_cpu_architecture()
    if not isinstance(value, CpuArchEnum):
        raise CheckFailed(f"returned {type(value).__name__} {value!r}")
    return f"CpuArchEnum.{value.name}"


@check(
    "execution.compile_options",
    "get_compile_options() is a dict of torch.compile arguments",
    "get_compile_options() returns a dict of extra keyword arguments for torch.compile",
    runtimes=("diffusion",),
)
def compile_options(probe: Probe) -> str:
    value = probe.platform.get_compile_options()
    if not isinstance(value, dict) or not all(isinstance(k, str) for k in value):
        raise CheckFailed(f"returned {value!r}, not a dict with string keys")
    return repr(value)
