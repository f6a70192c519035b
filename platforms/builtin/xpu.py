"""Intel XPU, for both runtimes (diffusion selects it automatically only)."""

from __future__ import annotations

from typing import Any

from ..device_mixin import PlatformEnum
from ..diffusion.interface import Platform
from ..diffusion.interface import PlatformEnum as DiffusionPlatformEnum
from ..interface import SRTPlatform
from ._accelerator import TorchAccelerator, api_available, linux_device_nodes
from .stock_memory import StockMemory

DEVICE_NODES = ("/dev/dri/renderD*",)  # DRM render nodes, one per GPU


def available() -> bool:
    """torch sees an Intel GPU. On Linux that needs a DRM render node (``/dev/dri/renderD*``);
    without one torch is not imported to find that out."""
    if linux_device_nodes(*DEVICE_NODES) is False:
        return False
    return api_available("xpu")


class XpuDevice(TorchAccelerator):
    device_name = "xpu"
    device_type = "xpu"
    _torch_module = "xpu"
    _distributed_backend = "xccl"
    _has_capability = False


class XpuSRTPlatform(StockMemory, SRTPlatform, XpuDevice):
    _enum = PlatformEnum.XPU

    def get_default_attention_backend(self) -> str:
        return "intel_xpu"

    def get_dispatch_key_name(self) -> str:
        return "xpu"


class XpuPlatform(Platform, XpuDevice):
    _enum = DiffusionPlatformEnum.XPU
    dispatch_key = "XPU"

    def get_dispatch_key_name(self) -> str:
        return "xpu"

    def get_attn_backend_cls_str(
        self, selected_backend: Any = None, head_size: int = 0, dtype: Any = None
    ) -> str:
        return "torch.nn.functional.scaled_dot_product_attention"
