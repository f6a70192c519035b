"""Huawei Ascend NPU through the ``torch_npu`` extension (diffusion)."""

from __future__ import annotations

from typing import Any

from ..diffusion.interface import Platform
from ..diffusion.interface import PlatformEnum as DiffusionPlatformEnum
from ._accelerator import TorchAccelerator, api_available


def available() -> bool:
    return api_available("npu", "torch_npu")


class NpuDevice(TorchAccelerator):
    device_name = "npu"
    device_type = "npu"
    _torch_module = "npu"
    _extension = "torch_npu"
    _distributed_backend = "hccl"
    _has_capability = False


class NpuPlatform(Platform, NpuDevice):
    _enum = DiffusionPlatformEnum.NPU
    dispatch_key = "PrivateUse1"

    def get_dispatch_key_name(self) -> str:
        return "npu"

    def get_attn_backend_cls_str(
        self, selected_backend: Any = None, head_size: int = 0, dtype: Any = None
    ) -> str:
        return "torch.nn.functional.scaled_dot_product_attention"
