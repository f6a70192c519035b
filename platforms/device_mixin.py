"""Platform identity types and ``DeviceMixin``: what a platform says about its device.

``DeviceMixin`` holds the identity queries (answered from the class attribute ``_enum``) and the
device operations of the platform contract, with the contract's defaults: operations a platform
must supply raise ``NotImplementedError`` naming the class and the method; the optional ones do
nothing or answer conservatively. Nothing here imports torch at module scope; the defaults that
need it (``inference_mode``, ``seed_everything``) import it when called.
"""

from __future__ import annotations

import enum
import os
import random
from typing import TYPE_CHECKING, Any, NamedTuple

if TYPE_CHECKING:
    from contextlib import AbstractContextManager

    import torch


class PlatformEnum(enum.Enum):
    """The SRT runtime's platform identities. Out-of-tree platforms use ``OOT``."""

    CUDA = enum.auto()
    ROCM = enum.auto()
    CPU = enum.auto()
    XPU = enum.auto()
    MUSA = enum.auto()
    NPU = enum.auto()
    TPU = enum.auto()
    MPS = enum.auto()
    OOT = enum.auto()
    UNSPECIFIED = enum.auto()


class CpuArchEnum(enum.Enum):
    """The host CPU's instruction-set family."""

    X86 = enum.auto()
    ARM = enum.auto()
    UNSPECIFIED = enum.auto()


class DeviceCapability(NamedTuple):
    """A device's compute capability ``(major, minor)``; compares as a version (8, 0) < (9, 0)."""

    major: int
    minor: int

    def as_version_str(self) -> str:
        """``"8.9"`` for ``DeviceCapability(8, 9)``."""
        return f"{self.major}.{self.minor}"

    def to_int(self) -> int:
        """``89`` for ``DeviceCapability(8, 9)``: ``major * 10 + minor``, as CUDA's ``sm_89``."""
        return self.major * 10 + self.minor


# The torch.distributed backend of each torch device type, as SGLang's DeviceMixin answers
# get_torch_distributed_backend_str() for a platform that does not override it ("gloo" for any
# other type). NPU uses "zbal" instead while SGLANG_ZBAL_LOCAL_MEM_SIZE is above 0.
DISTRIBUTED_BACKENDS = {
    "cuda": "nccl",
    "xpu": "xccl",
    "hpu": "hccl",
    "cpu": "gloo",
    "npu": "hccl",
    "musa": "mccl",
}
DEFAULT_DISTRIBUTED_BACKEND = "gloo"


def default_distributed_backend(device_type: str) -> str:
    """The ``torch.distributed`` backend SGLang gives a platform of ``device_type`` that names
    none: ``DISTRIBUTED_BACKENDS``, else gloo; an NPU's is "zbal" where
    ``SGLANG_ZBAL_LOCAL_MEM_SIZE`` is a number above 0."""
    if device_type == "npu":
        try:
            zbal = int(os.environ.get("SGLANG_ZBAL_LOCAL_MEM_SIZE", "0") or 0)
        except ValueError:
            zbal = 0
        if zbal > 0:
            return "zbal"
    return DISTRIBUTED_BACKENDS.get(device_type, DEFAULT_DISTRIBUTED_BACKEND)


def placement(platform: Any, local_rank: int = 0) -> torch.device:
    """The ``torch.device`` a worker of ``local_rank`` puts the model on: ``get_device(local_rank)``,
    or, where the platform does not implement it (SGLang marks it planned and never calls it),
    ``torch.device(device_type, local_rank)``. ``NotImplementedError`` says so when neither
    works (no ``get_device`` and a ``device_type`` torch does not know)."""
    import torch

    try:
        return torch.device(platform.get_device(local_rank))
    except NotImplementedError as missing:
        device_type = str(getattr(platform, "device_type", ""))
        try:
            return torch.device(device_type, local_rank)
        except (RuntimeError, TypeError, ValueError):
            raise NotImplementedError(
                f"{missing}; without get_device() a worker places the model on "
                f"torch.device(device_type, local_rank), but device_type {device_type!r} is not "
                f"a torch device type"
            ) from missing


_X86_MACHINES = {"x86_64", "amd64", "i386", "i686", "x86"}
_ARM_MACHINES = {"aarch64", "arm64", "armv7l", "armv8l", "arm"}


def targets_cpu(device: object) -> bool:
    """Whether ``device`` (a ``torch.device``, a string such as ``"cpu"`` or ``"cpu:0"``, or None)
    names the host CPU; None means "this platform's own device", so it is not the CPU here."""
    if device is None:
        return False
    kind = getattr(device, "type", None)
    if not isinstance(kind, str):
        kind = str(device).partition(":")[0]
    return kind.strip().lower() == "cpu"


def host_cpu_architecture(machine: str | None = None) -> CpuArchEnum:
    """Classify ``platform.machine()`` (or ``machine``) as x86, ARM or unspecified."""
    if machine is None:
        machine = os.uname().machine if hasattr(os, "uname") else __import__("platform").machine()
    name = machine.lower()
    if name in _X86_MACHINES:
        return CpuArchEnum.X86
    if name in _ARM_MACHINES or name.startswith("arm"):
        return CpuArchEnum.ARM
    return CpuArchEnum.UNSPECIFIED


class DeviceMixin:
    """Identity queries and device operations shared by both runtimes' platform classes.

    A platform class sets ``_enum`` (its runtime's ``PlatformEnum`` member; ``OOT`` for a plugin),
    ``device_name`` (a human label) and ``device_type`` (the torch device type, e.g. ``"cuda"``).
    """

    _enum: Any = PlatformEnum.UNSPECIFIED
    device_name: str = "unspecified"
    device_type: str = "unspecified"

    # -- identity queries ------------------------------------------------------------------
    # Compared by member name so that both runtimes' PlatformEnum types answer the same way.
    def _is(self, member: str) -> bool:
        return getattr(self._enum, "name", None) == member

    def is_cuda(self) -> bool:
        return self._is("CUDA")

    def is_rocm(self) -> bool:
        return self._is("ROCM")

    def is_npu(self) -> bool:
        return self._is("NPU")

    def is_cpu(self) -> bool:
        return self._is("CPU")

    def is_xpu(self) -> bool:
        return self._is("XPU")

    def is_musa(self) -> bool:
        return self._is("MUSA")

    def is_mps(self) -> bool:
        return self._is("MPS")

    def is_tpu(self) -> bool:
        return self._is("TPU")

    def is_cuda_alike(self) -> bool:
        """True for platforms that speak CUDA-like APIs: CUDA, ROCm and MUSA."""
        return self.is_cuda() or self.is_rocm() or self.is_musa()

    def is_out_of_tree(self) -> bool:
        """True for a plugin platform (``_enum`` is ``OOT``)."""
        return self._is("OOT")

    # -- device operations -----------------------------------------------------------------
    def _missing(self, method: str) -> NotImplementedError:
        return NotImplementedError(
            f"{type(self).__qualname__} does not implement {method}(); "
            f"a platform for device {self.device_name!r} must override it"
        )

    def get_device(self, local_rank: int) -> torch.device:
        """The ``torch.device`` a worker of ``local_rank`` uses (every caller passes the rank:
        the spec's signature, which an override may keep without a default)."""
        raise self._missing("get_device")

    def set_device(self, device: torch.device) -> None:
        """Make ``device`` the current device of this process."""
        raise self._missing("set_device")

    def get_device_name(self, device_id: int = 0) -> str:
        """A human-readable name of device ``device_id``."""
        raise self._missing("get_device_name")

    def get_device_uuid(self, device_id: int = 0) -> str:
        """A stable unique identifier of device ``device_id``."""
        raise self._missing("get_device_uuid")

    def get_device_capability(self, device_id: int = 0) -> DeviceCapability | None:
        """The device's ``DeviceCapability``, or None where the notion does not apply."""
        raise self._missing("get_device_capability")

    def empty_cache(self) -> None:
        """Release cached device memory (default: nothing to release)."""

    def synchronize(self) -> None:
        """Wait for queued device work (default: nothing to wait for)."""

    def get_device_total_memory(self, device_id: int = 0) -> int:
        """Total memory of device ``device_id`` in bytes."""
        raise self._missing("get_device_total_memory")

    def get_available_memory(self, device_id: int = 0) -> tuple[int, int]:
        """``(free_bytes, total_bytes)`` of device ``device_id``."""
        raise self._missing("get_available_memory")

    def get_current_memory_usage(self, device: torch.device | None = None) -> float:
        """Peak memory used on ``device`` so far, in bytes."""
        raise self._missing("get_current_memory_usage")

    def is_pin_memory_available(self, device: torch.device | str | None = None) -> bool:
        """Whether pinned host memory can be used for transfers to ``device`` (default False).

        ``device`` is the transfer's target (a ``torch.device``, a device string, or None for this
        platform's device); pinned memory only helps copies to an accelerator, so a CPU target
        answers False on every platform."""
        return False

    def get_torch_distributed_backend_str(self) -> str:
        """The ``torch.distributed`` backend name for this device ("nccl", "gloo", ...); by
        default, as in SGLang, the backend of ``device_type`` (``DISTRIBUTED_BACKENDS``), else
        "gloo"."""
        return default_distributed_backend(self.device_type)

    def get_communicator_class(self) -> type | None:
        """A platform-specific communicator class, or None for the default (default None)."""
        return None

    def inference_mode(self) -> AbstractContextManager[Any]:
        """A context manager for inference (default ``torch.inference_mode(True)``)."""
        import torch

        return torch.inference_mode(True)

    @classmethod
    def seed_everything(cls, seed: int | None = None) -> None:
        """Seed Python's ``random``, numpy (when installed) and torch; None leaves them alone.

        A classmethod (as in SGLang): ``Platform.seed_everything(123)`` on the class seeds too."""
        if seed is None:
            return
        random.seed(seed)
        try:
            import numpy
        except ImportError:
            pass
        else:
            numpy.random.seed(seed)
        import torch

        torch.manual_seed(seed)

    def verify_quantization(self, quant: str) -> None:
        """Raise if quantization method ``quant`` is unsupported here (default: accept all)."""

    @classmethod
    def get_cpu_architecture(cls) -> CpuArchEnum:
        """The host CPU architecture, detected from ``platform.machine()`` (a classmethod, as in
        SGLang: callable on the class)."""
        return host_cpu_architecture()

    def __repr__(self) -> str:
        return f"{type(self).__qualname__}(device_type={self.device_type!r})"
