"""The SRT runtime's hardware platform: the contract types and the lazy ``current_platform``.

``current_platform`` resolves on first use (attribute access, ``str()``, ``isinstance``), once per
process, by the SRT selection chart: ``SGLANG_PLATFORM`` names a plugin explicitly (only that
plugin's callback is imported); otherwise every ``sglang.srt.platforms`` entry point admitted by
``SGLANG_PLUGINS`` is activated, exactly one may activate, and with none the built-ins follow:
CPU when ``SGLANG_USE_CPU_ENGINE=1``, then CUDA, ROCm, XPU, then the base ``SRTPlatform``.
Importing this package imports no torch and no plugin.
"""

from __future__ import annotations

from ._selection import (
    PlatformAttributeError,
    PlatformImportError,
    PlatformNotFoundError,
    PlatformSelectionError,
    PlatformTypeError,
    PlatformValueError,
    ProbeRequired,
    Selection,
)
from ._state import LazyPlatform, PlatformSlot
from .device_mixin import CpuArchEnum, DeviceCapability, DeviceMixin, PlatformEnum
from .interface import SRTPlatform
from .runtimes import SRT

__all__ = [
    "CpuArchEnum",
    "DeviceCapability",
    "DeviceMixin",
    "PlatformEnum",
    "PlatformAttributeError",
    "PlatformImportError",
    "PlatformNotFoundError",
    "PlatformSelectionError",
    "PlatformTypeError",
    "PlatformValueError",
    "ProbeRequired",
    "SRTPlatform",
    "Selection",
    "current_platform",
    "current_selection",
    "initialize_current_platform",
    "pin_selection",
    "use_serving_fallback",
]

_slot = PlatformSlot(SRT)

current_platform: SRTPlatform = LazyPlatform(_slot)  # type: ignore[assignment]


def current_selection(probe: bool = True) -> Selection:
    """What SRT selected in this process (resolving it if nothing has yet); imports no class.

    ``probe=False`` runs no built-in platform's hardware probe (probes import torch): when nothing
    is resolved yet, the selection is decided without them and not remembered (activation
    callbacks do run), and where only a probe could decide, ``ProbeRequired`` is raised naming
    the built-ins start-up would probe, in order. ``sglang-launch plugins`` uses it.
    """
    return _slot.selection(probe)


def pin_selection(key: str) -> None:
    """Make this process select exactly ``key`` (a ``Selection.key`` from the supervisor).

    Call it before anything touches ``current_platform``. A plugin key still calls that plugin's
    ``activate()``, which must return a class; a built-in key selects without probing. Raises
    ``PlatformSelectionError`` for a malformed key or if this process already resolved another.
    """
    _slot.pin(key)


def use_serving_fallback() -> None:
    """Resolve ``current_platform`` as a model server does: where the SRT chart ends at the bare
    ``SRTPlatform`` (no plugin activated, nothing selected explicitly, no accelerator found),
    select the CPU platform instead, which can run a model. Every other branch of the chart is
    unchanged. Call it before anything touches ``current_platform``; the launcher does, in its
    own process and (through ``ProcessSpec.serving_fallback``) in tools' worker processes.
    """
    _slot.serve()


def initialize_current_platform() -> SRTPlatform:
    """Resolve ``current_platform`` and run its ``init_backend()`` at most once in this process.

    A re-entrant call (from inside ``init_backend``) returns at once; another thread waits for
    the first; a failure is re-raised to every later caller; a forked child runs it afresh.
    Returns the platform instance.
    """
    return _slot.initialize()
