"""AMD ROCm (HIP builds of torch expose the device as ``cuda``), for both runtimes."""

from __future__ import annotations

from typing import Any

from ..device_mixin import PlatformEnum
from ..diffusion.interface import Platform
from ..diffusion.interface import PlatformEnum as DiffusionPlatformEnum
from ..interface import SRTPlatform
from ._accelerator import TorchAccelerator, api_available, linux_device_nodes
from .stock_memory import StockGraphRunner, StockMemory

DEVICE_NODES = ("/dev/kfd",)  # the AMD GPU kernel driver's compute interface


def available() -> bool:
    """This torch is a HIP build and sees an AMD device. On Linux that needs the AMD GPU kernel
    driver's ``/dev/kfd``; without it torch is not imported to find that out."""
    if linux_device_nodes(*DEVICE_NODES) is False:
        return False
    import torch

    return torch.version.hip is not None and api_available("cuda")


class RocmDevice(TorchAccelerator):
    device_name = "rocm"
    device_type = "cuda"
    _torch_module = "cuda"
    _distributed_backend = "nccl"  # RCCL answers to the NCCL backend name


class RocmSRTPlatform(StockMemory, StockGraphRunner, SRTPlatform, RocmDevice):
    _enum = PlatformEnum.ROCM

    def support_cuda_graph(self) -> bool:
        return True

    def get_default_attention_backend(self) -> str:
        return "triton"

    def get_dispatch_key_name(self) -> str:
        return "hip"


class RocmPlatform(Platform, RocmDevice):
    _enum = DiffusionPlatformEnum.ROCM
    dispatch_key = "CUDA"

    def get_dispatch_key_name(self) -> str:
        return "hip"

    def get_attn_backend_cls_str(
        self, selected_backend: Any = None, head_size: int = 0, dtype: Any = None
    ) -> str:
        return "torch.nn.functional.scaled_dot_product_attention"
