"""Moore Threads MUSA through the ``torch_musa`` extension (diffusion)."""

from __future__ import annotations

from typing import Any

from ..diffusion.interface import Platform
from ..diffusion.interface import PlatformEnum as DiffusionPlatformEnum
from ._accelerator import TorchAccelerator, api_available


def available() -> bool:
    return api_available("musa", "torch_musa")


class MusaDevice(TorchAccelerator):
    device_name = "musa"
    device_type = "musa"
    _torch_module = "musa"
    _extension = "torch_musa"
    _distributed_backend = "mccl"


class MusaPlatform(Platform, MusaDevice):
    _enum = DiffusionPlatformEnum.MUSA
    dispatch_key = "PrivateUse1"

    def get_dispatch_key_name(self) -> str:
        return "musa"

    def get_attn_backend_cls_str(
        self, selected_backend: Any = None, head_size: int = 0, dtype: Any = None
    ) -> str:
        return "torch.nn.functional.scaled_dot_product_attention"
