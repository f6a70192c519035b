"""The diffusion runtime's platform contract: its own ``PlatformEnum`` and ``Platform`` base.

Diffusion keeps an identity type apart from SRT's (a package that supports both runtimes defines
one class per runtime, each with its runtime's ``PlatformEnum.OOT``). Device operations are the
shared ``DeviceMixin``'s; this class adds the diffusion-only interfaces with safe defaults.

``dispatch_key`` (a class attribute) is the PyTorch dispatcher key for direct ``torch.library``
registrations; ``get_dispatch_key_name()`` is a different thing: the key that picks
``CustomOp`` implementations (see ``platforms.custom_op``).
"""

from __future__ import annotations

import enum
import os
from typing import TYPE_CHECKING, Any

from ..device_mixin import DeviceMixin
from ..device_mixin import PlatformEnum as _SRTPlatformEnum

if TYPE_CHECKING:
    import torch


def _copy_enum(source: type[enum.Enum], name: str) -> Any:
    """A new enum type called ``name`` with ``source``'s members (typed ``Any``: a type checker
    cannot list members made at run time)."""
    members = [(member.name, member.value) for member in source]
    return enum.Enum(name, members, module=__name__, qualname=name)


# The same members as SRT's enum, as a distinct type: the runtimes' identities never compare equal.
PlatformEnum = _copy_enum(_SRTPlatformEnum, "PlatformEnum")
PlatformEnum.__doc__ = (
    "The diffusion runtime's platform identities. Out-of-tree platforms use ``OOT``."
)

_GIB = float(1 << 30)


class Platform(DeviceMixin):
    """Base class of every diffusion platform; constructible with no arguments.

    It sets no ``_enum``, so a device mixin listed after it (``class P(Platform, MyDeviceMixin)``)
    supplies the identity. A class that sets none answers ``UNSPECIFIED`` to the identity queries
    (``DeviceMixin``'s default, an SRT member), which diffusion selection rejects: a diffusion
    platform sets this runtime's ``PlatformEnum`` member itself (``OOT`` for a plugin).
    """

    dispatch_key: str | None = None

    # -- initialization and configuration --------------------------------------------------
    def init_backend(self) -> None:
        """One-time backend set-up in each worker, before any pipeline module is constructed.

        Register ``CustomOp`` implementations here. Runs at most once per process through
        ``platforms.diffusion.initialize_current_platform()``; raising aborts start-up.
        """

    def apply_server_args_defaults(self, server_args: Any) -> None:
        """Fill platform-specific defaults into ``server_args`` (default: none)."""

    # -- device and memory -----------------------------------------------------------------
    def get_local_torch_device(self) -> torch.device:
        """This process's ``torch.device``: ``get_device(LOCAL_RANK)`` (``LOCAL_RANK`` default 0)."""
        return self.get_device(int(os.environ.get("LOCAL_RANK", "0") or 0))

    def get_available_gpu_memory(
        self,
        device_id: int = 0,
        distributed: bool = False,
        empty_cache: bool = True,
        cpu_group: Any = None,
    ) -> float:
        """Free memory of device ``device_id`` in GiB; with ``distributed`` the minimum over the
        ranks of ``cpu_group`` (a gloo process group)."""
        if empty_cache:
            self.empty_cache()
        free, _total = self.get_available_memory(device_id)
        free_gib = free / _GIB
        if distributed:
            import torch
            import torch.distributed as dist

            value = torch.tensor(free_gib, dtype=torch.float64)
            dist.all_reduce(value, op=dist.ReduceOp.MIN, group=cpu_group)
            free_gib = float(value.item())
        return free_gib

    # -- distributed -----------------------------------------------------------------------
    def supports_distributed_device_id(self) -> bool:
        """Whether ``init_process_group(device_id=...)`` may bind this device (default False)."""
        return False

    def get_device_communicator_cls(self) -> str | None:
        """Compatibility: the communicator class path older platforms override (default None)."""
        return None

    def get_all_to_all_communicator_cls(self) -> str | None:
        """The communicator used by ``all_to_all_4D()``; falls back to
        ``get_device_communicator_cls()`` for existing subclasses."""
        return self.get_device_communicator_cls()

    # -- dispatch and model ----------------------------------------------------------------
    def get_torch_library_dispatch_key(self) -> str:
        """``dispatch_key``, for direct ``torch.library`` registrations."""
        if not self.dispatch_key:
            raise NotImplementedError(
                f"{type(self).__qualname__} sets no dispatch_key; set the class attribute to the "
                "PyTorch dispatcher key of its device (e.g. 'PrivateUse1')"
            )
        return self.dispatch_key

    def get_dispatch_key_name(self) -> str:
        """The key that picks ``CustomOp`` implementations (``forward_<key>``)."""
        return "native"

    def get_attn_backend_cls_str(
        self, selected_backend: Any = None, head_size: int = 0, dtype: Any = None
    ) -> str:
        """The dotted path of the attention backend to use."""
        raise self._missing("get_attn_backend_cls_str")

    def verify_model_arch(self, model_arch: str) -> None:
        """Raise if ``model_arch`` cannot run on this platform (default: accept)."""

    def optimize_vae(self, vae: Any) -> Any:
        """Return ``vae`` prepared for this device (default: unchanged)."""
        return vae

    # -- execution -------------------------------------------------------------------------
    def get_compile_backend(self) -> str:
        """The torch.compile backend name."""
        return "inductor"

    def get_compile_options(self) -> dict[str, Any]:
        """Extra keyword arguments for ``torch.compile`` (default none)."""
        return {}

    def enable_dit_layerwise_offload_by_default(self) -> bool:
        """Whether DiT layer-wise offload is on unless the operator says otherwise."""
        return False
