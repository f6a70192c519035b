"""Apple MPS (unified memory) for diffusion."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..device_mixin import DeviceCapability, DeviceMixin
from ..diffusion.interface import Platform
from ..diffusion.interface import PlatformEnum as DiffusionPlatformEnum

if TYPE_CHECKING:
    import torch


def available() -> bool:
    """torch's MPS backend is usable: only on macOS (elsewhere torch is not imported)."""
    import sys

    if sys.platform != "darwin":
        return False
    import torch

    backend = getattr(torch.backends, "mps", None)
    return bool(backend is not None and backend.is_available())


class MpsDevice(DeviceMixin):
    device_name = "mps"
    device_type = "mps"

    def get_device(self, local_rank: int = 0) -> torch.device:
        import torch

        return torch.device("mps")

    def set_device(self, device: torch.device) -> None:
        """One MPS device per machine: nothing to switch."""

    def get_device_name(self, device_id: int = 0) -> str:
        return "Apple MPS"

    def get_device_capability(self, device_id: int = 0) -> DeviceCapability | None:
        return None

    def empty_cache(self) -> None:
        import torch

        torch.mps.empty_cache()

    def synchronize(self) -> None:
        import torch

        torch.mps.synchronize()

    def get_device_total_memory(self, device_id: int = 0) -> int:
        """The memory Metal recommends for one process (unified memory has no separate size)."""
        import torch

        return int(torch.mps.recommended_max_memory())

    def get_available_memory(self, device_id: int = 0) -> tuple[int, int]:
        import torch

        total = self.get_device_total_memory(device_id)
        return max(0, total - int(torch.mps.driver_allocated_memory())), total

    def get_current_memory_usage(self, device: torch.device | None = None) -> float:
        import torch

        return float(torch.mps.driver_allocated_memory())

    def get_torch_distributed_backend_str(self) -> str:
        return "gloo"


class MpsPlatform(Platform, MpsDevice):
    _enum = DiffusionPlatformEnum.MPS
    dispatch_key = "MPS"

    def get_dispatch_key_name(self) -> str:
        return "mps"

    def get_attn_backend_cls_str(
        self, selected_backend: Any = None, head_size: int = 0, dtype: Any = None
    ) -> str:
        return "torch.nn.functional.scaled_dot_product_attention"
