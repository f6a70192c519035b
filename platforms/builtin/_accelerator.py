"""``TorchAccelerator``: device operations for any accelerator torch exposes as a ``torch.<name>``
module with the CUDA-style API (cuda, xpu, npu, musa). A device family is a subclass that names
its module, extension package and distributed backend; the operations are written once here."""

from __future__ import annotations

import importlib
import importlib.util
from typing import TYPE_CHECKING, Any

from ..device_mixin import DeviceCapability, DeviceMixin, targets_cpu

if TYPE_CHECKING:
    import torch


def torch_api(module_name: str, extension: str | None = None) -> Any:
    """``torch.<module_name>`` after importing the vendor ``extension`` (e.g. ``torch_npu``);
    None when either is missing."""
    if extension is not None:
        if importlib.util.find_spec(extension) is None:
            return None
        importlib.import_module(extension)
    import torch

    return getattr(torch, module_name, None)


def driver_loadable(*names: str) -> bool:
    """Whether one of the shared libraries ``names`` loads (a device driver's user-space part).
    Probes call this before importing torch: torch can use no device whose driver is absent,
    and a failed ``dlopen`` costs microseconds where importing torch costs seconds."""
    import ctypes

    for name in names:
        try:
            ctypes.CDLL(name)
        except OSError:
            continue
        return True
    return False


def linux_device_nodes(*paths: str) -> bool | None:
    """On Linux, whether any of the device files ``paths`` (globs allowed) exists; None on
    other systems, where the probe must ask torch."""
    import glob
    import sys

    if not sys.platform.startswith("linux"):
        return None
    return any(glob.glob(path) for path in paths)


def api_available(module_name: str, extension: str | None = None) -> bool:
    """Whether ``torch.<module_name>`` exists and reports a usable device."""
    api = torch_api(module_name, extension)
    return bool(api is not None and api.is_available())


class TorchAccelerator(DeviceMixin):
    """Device operations over ``torch.<torch_module>``."""

    _torch_module: str = "cuda"
    _extension: str | None = None  # vendor package that adds the torch module, imported first
    _distributed_backend: str = "nccl"
    _has_capability: bool = True

    @property
    def _api(self) -> Any:
        api = torch_api(self._torch_module, self._extension)
        if api is None:
            needed = self._extension or "a torch build with " + self._torch_module
            raise RuntimeError(
                f"{type(self).__qualname__} needs torch.{self._torch_module}; install {needed}"
            )
        return api

    def get_device(self, local_rank: int = 0) -> torch.device:
        import torch

        return torch.device(self.device_type, local_rank)

    def set_device(self, device: torch.device) -> None:
        self._api.set_device(device)

    def get_device_name(self, device_id: int = 0) -> str:
        return str(self._api.get_device_name(device_id))

    def get_device_uuid(self, device_id: int = 0) -> str:
        props = self._api.get_device_properties(device_id)
        uuid = getattr(props, "uuid", None)
        if uuid is None:
            raise NotImplementedError(f"torch.{self._torch_module} reports no device UUID")
        return str(uuid)

    def get_device_capability(self, device_id: int = 0) -> DeviceCapability | None:
        if not self._has_capability:
            return None
        major, minor = self._api.get_device_capability(device_id)
        return DeviceCapability(int(major), int(minor))

    def empty_cache(self) -> None:
        self._api.empty_cache()

    def synchronize(self) -> None:
        self._api.synchronize()

    def get_device_total_memory(self, device_id: int = 0) -> int:
        return int(self._api.get_device_properties(device_id).total_memory)

    def get_available_memory(self, device_id: int = 0) -> tuple[int, int]:
        free, total = self._api.mem_get_info(device_id)
        return int(free), int(total)

    def get_current_memory_usage(self, device: torch.device | None = None) -> float:
        return float(self._api.max_memory_allocated(device))

    def is_pin_memory_available(self, device: torch.device | str | None = None) -> bool:
        """True for transfers to this accelerator; False when ``device`` is the CPU."""
        return not targets_cpu(device)

    def get_torch_distributed_backend_str(self) -> str:
        return self._distributed_backend
