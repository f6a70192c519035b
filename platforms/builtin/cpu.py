"""The CPU platform for both runtimes: works on any machine, used by SRT when
``SGLANG_USE_CPU_ENGINE=1`` and by diffusion when no accelerator is found."""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Any

from ..device_mixin import DeviceCapability, DeviceMixin, PlatformEnum
from ..diffusion.interface import Platform
from ..diffusion.interface import PlatformEnum as DiffusionPlatformEnum
from ..interface import SRTPlatform
from .stock_memory import StockMemory

if TYPE_CHECKING:
    import torch


def available() -> bool:
    """A CPU is always there."""
    return True


def _cpu_model_name() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key.strip() in ("model name", "Model", "cpu model") and value.strip():
                    return value.strip()
    except OSError:
        pass
    import platform

    return platform.processor() or platform.machine() or "cpu"


class CpuDevice(DeviceMixin):
    """Device operations of the host CPU (memory figures from psutil, device from torch)."""

    device_name = "cpu"
    device_type = "cpu"

    def get_device(self, local_rank: int = 0) -> torch.device:
        import torch

        return torch.device("cpu")

    def set_device(self, device: torch.device) -> None:
        """Nothing to switch: there is one CPU device."""

    def get_device_name(self, device_id: int = 0) -> str:
        return _cpu_model_name()

    def get_device_uuid(self, device_id: int = 0) -> str:
        import uuid

        return f"cpu-{uuid.getnode():012x}"

    def get_device_capability(self, device_id: int = 0) -> DeviceCapability | None:
        return None

    def get_device_total_memory(self, device_id: int = 0) -> int:
        import psutil

        return int(psutil.virtual_memory().total)

    def get_available_memory(self, device_id: int = 0) -> tuple[int, int]:
        import psutil

        mem = psutil.virtual_memory()
        return int(mem.available), int(mem.total)

    def get_current_memory_usage(self, device: torch.device | None = None) -> float:
        """Peak resident memory of this process, in bytes."""
        import resource

        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        return float(peak if sys.platform == "darwin" else peak * 1024)

    def is_pin_memory_available(self, device: torch.device | str | None = None) -> bool:
        """Pinned host memory only speeds up copies to an accelerator; a CPU target has none."""
        return False

    def get_torch_distributed_backend_str(self) -> str:
        return "gloo"


class CpuSRTPlatform(StockMemory, SRTPlatform, CpuDevice):
    """SRT on the CPU."""

    _enum = PlatformEnum.CPU

    def get_default_attention_backend(self) -> str:
        return "torch_native"


class CpuPlatform(Platform, CpuDevice):
    """Diffusion on the CPU."""

    _enum = DiffusionPlatformEnum.CPU
    dispatch_key = "CPU"

    def get_attn_backend_cls_str(
        self, selected_backend: Any = None, head_size: int = 0, dtype: Any = None
    ) -> str:
        return "torch.nn.functional.scaled_dot_product_attention"
