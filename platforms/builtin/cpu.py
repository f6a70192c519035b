"""The CPU platform for both runtimes: works on any machine, used by SRT when
``SGLANG_USE_CPU_ENGINE=1`` and by diffusion when no accelerator is found."""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Any

from ..device_mixin import DeviceCapability, DeviceMixin, PlatformEnum
from ..diffusion.interface import Platform
from ..diffusion.interface import PlatformEnum as DiffusionPlatformEnum
from ..interface import DefaultDtype, SRTPlatform
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


# CPU feature flags (as /proc/cpuinfo names them) that compute bfloat16 natively, and their names.
_BF16_FLAGS = {"avx512_bf16": "AVX512-BF16", "amx_bf16": "AMX-BF16", "bf16": "BF16 (Arm)"}


def _cpu_flags() -> set[str]:
    """The host CPU's feature flags from /proc/cpuinfo (x86 ``flags``, Arm ``Features``)."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key.strip() in ("flags", "Features"):
                    return set(value.split())
    except OSError:
        pass
    return set()


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
    supported_quantization = ["int8wo", "int4wo", "gguf"]

    def get_default_attention_backend(self) -> str:
        return "torch_native"

    def _bf16_feature(self) -> str | None:
        """The CPU feature that computes bfloat16 natively (``AVX512-BF16``, ``AMX-BF16``, Arm's
        ``BF16``), from /proc/cpuinfo; None where the CPU reports none."""
        flags = _cpu_flags()
        return next((name for flag, name in _BF16_FLAGS.items() if flag in flags), None)

    def get_default_dtype(self) -> DefaultDtype:
        """bfloat16 where the CPU computes it natively (as SGLang's CPU backend serves), else
        float32."""
        feature = self._bf16_feature()
        if feature:
            return DefaultDtype("bfloat16", f"the CPU has {feature}")
        return DefaultDtype(
            "float32", "the CPU reports no bfloat16 instructions (AVX512-BF16, AMX-BF16)"
        )

    def get_quantization_config(self, quantization: str) -> None:
        """The weight-only schemes of ``supported_quantization`` run with the runtime's own CPU
        kernels: no hardware-specific config (None); any other scheme is refused."""
        if str(quantization).lower().partition("-")[0] not in self.supported_quantization:
            raise ValueError(
                f"the CPU platform serves the weight-only schemes "
                f"{', '.join(self.supported_quantization)}, not {quantization!r}"
            )
        return None


class CpuPlatform(Platform, CpuDevice):
    """Diffusion on the CPU."""

    _enum = DiffusionPlatformEnum.CPU
    dispatch_key = "CPU"

    def get_attn_backend_cls_str(
        self, selected_backend: Any = None, head_size: int = 0, dtype: Any = None
    ) -> str:
        return "torch.nn.functional.scaled_dot_product_attention"
