"""NVIDIA CUDA, for both runtimes."""

from __future__ import annotations

from typing import Any

from ..device_mixin import DeviceCapability, PlatformEnum
from ..diffusion.interface import Platform
from ..diffusion.interface import PlatformEnum as DiffusionPlatformEnum
from ..interface import SRTPlatform
from ._accelerator import TorchAccelerator, api_available, driver_loadable
from .stock_memory import StockGraphRunner, StockMemory

DRIVER_LIBRARIES = ("libcuda.so.1", "libcuda.so", "nvcuda.dll")  # the NVIDIA driver's user side


def available() -> bool:
    """A CUDA device is usable and this torch is a CUDA (not a HIP) build. Without the NVIDIA
    driver library no CUDA device can be, and torch is not imported to find that out."""
    if not driver_loadable(*DRIVER_LIBRARIES):
        return False
    import torch

    return torch.version.hip is None and api_available("cuda")


class CudaDevice(TorchAccelerator):
    device_name = "cuda"
    device_type = "cuda"
    _torch_module = "cuda"
    _distributed_backend = "nccl"


class CudaSRTPlatform(StockMemory, StockGraphRunner, SRTPlatform, CudaDevice):
    _enum = PlatformEnum.CUDA

    def support_cuda_graph(self) -> bool:
        return True

    def support_piecewise_cuda_graph(self) -> bool:
        return True

    def supports_fp8(self) -> bool:
        capability = self.get_device_capability()
        return capability is not None and capability >= DeviceCapability(8, 9)

    def get_default_attention_backend(self) -> str:
        return "flashinfer"

    def get_dispatch_key_name(self) -> str:
        return "cuda"


class CudaPlatform(Platform, CudaDevice):
    _enum = DiffusionPlatformEnum.CUDA
    dispatch_key = "CUDA"

    def get_dispatch_key_name(self) -> str:
        return "cuda"

    def supports_distributed_device_id(self) -> bool:
        return True

    def get_attn_backend_cls_str(
        self, selected_backend: Any = None, head_size: int = 0, dtype: Any = None
    ) -> str:
        return "torch.nn.functional.scaled_dot_product_attention"
