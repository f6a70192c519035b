"""The diffusion runtime's hardware platform: ``Platform``, ``PlatformEnum``, ``current_platform``.

Selection, on first use of ``current_platform``: ``SGLANG_DIFFUSION_PLATFORM_OVERRIDE`` naming
cpu, cuda, rocm, mps, npu or musa selects that built-in without probing (XPU is automatic only);
any other value loads only the ``sglang.multimodal_gen.platforms`` entry point of that name.
Unset, every installed diffusion platform plugin is activated (reserved and duplicate names are
rejected, a raising callback aborts start-up); none active falls through to the built-ins in the
order MPS, XPU, ROCm, CUDA, NPU, MUSA, CPU. ``current_selection().distribution`` records which
distribution supplied the platform. Importing this package imports no torch and no plugin.
"""

from __future__ import annotations

from .._selection import (
    PlatformAttributeError,
    PlatformImportError,
    PlatformNotFoundError,
    PlatformSelectionError,
    PlatformTypeError,
    PlatformValueError,
    ProbeRequired,
    Selection,
)
from .._state import LazyPlatform, PlatformSlot
from ..device_mixin import CpuArchEnum, DeviceCapability
from ..runtimes import DIFFUSION
from .interface import Platform, PlatformEnum

__all__ = [
    "CpuArchEnum",
    "DeviceCapability",
    "Platform",
    "PlatformEnum",
    "PlatformAttributeError",
    "PlatformImportError",
    "PlatformNotFoundError",
    "PlatformSelectionError",
    "PlatformTypeError",
    "PlatformValueError",
    "ProbeRequired",
    "Selection",
    "current_platform",
    "current_selection",
    "initialize_current_platform",
    "pin_selection",
    "use_serving_fallback",
]

_slot = PlatformSlot(DIFFUSION)

current_platform: Platform = LazyPlatform(_slot)  # type: ignore[assignment]


def current_selection(probe: bool = True) -> Selection:
    """What diffusion selected in this process (resolving it if nothing has yet); ``probe=False``
    as in ``platforms.current_selection``."""
    return _slot.selection(probe)


def pin_selection(key: str) -> None:
    """Make this process select exactly ``key``; same contract as ``platforms.pin_selection``."""
    _slot.pin(key)


def use_serving_fallback() -> None:
    """Same contract as ``platforms.use_serving_fallback``; diffusion's chain already ends at the
    CPU platform, so this changes nothing today and exists so callers need no runtime switch."""
    _slot.serve()


def initialize_current_platform() -> Platform:
    """Run the diffusion platform's ``init_backend()`` at most once in this process; same
    contract as ``platforms.initialize_current_platform``."""
    return _slot.initialize()
