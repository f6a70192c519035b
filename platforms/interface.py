"""``SRTPlatform``: the SRT runtime's platform contract.

A platform class is a ``DeviceMixin`` (identity and device operations) plus what the SRT runtime
asks of the hardware: capability flags, factories for the subsystems that differ per device, and
two lifecycle hooks. The base class is itself the last fallback of SRT selection, so every default
here is safe: flags are False and factories raise ``NotImplementedError`` naming what to override.
"""

from __future__ import annotations

from typing import Any, NamedTuple

from .device_mixin import DeviceMixin


class DefaultDtype(NamedTuple):
    """What ``--dtype auto`` computes in on a platform: ``dtype`` (``"bfloat16"``,
    ``"float32"``, ...) and ``reason``, the hardware fact behind it, as ``/get_server_info``
    shows it."""

    dtype: str
    reason: str


class SRTPlatform(DeviceMixin):
    """Base class of every SRT platform (built-in or out-of-tree); constructible with no arguments.

    It sets no ``_enum`` (``DeviceMixin``'s default, ``UNSPECIFIED``, applies), so a device mixin
    listed after it (``class P(SRTPlatform, MyDeviceMixin)``) supplies the identity.

    ``supported_quantization`` (SGLang's attribute): the weight schemes the platform serves
    (``"int8wo"``, ``"int4wo"`` for every group size, ``"int4wo-128"``, ``"gguf"``); empty: every
    scheme the runtime implements, subject to ``get_quantization_config``.
    """

    supported_quantization: list[str] = []

    # -- capability flags ------------------------------------------------------------------
    def support_cuda_graph(self) -> bool:
        """Whether plain device-graph capture is supported."""
        return False

    def support_piecewise_cuda_graph(self) -> bool:
        """Whether piecewise graph capture (a torch.compile backend) is supported."""
        return False

    def supports_fp8(self) -> bool:
        """Whether FP8 quantization is supported."""
        return False

    # -- subsystem factories ---------------------------------------------------------------
    def get_default_attention_backend(self) -> str:
        """The attention backend used when the operator names none."""
        raise self._missing("get_default_attention_backend")

    def get_graph_runner_cls(self) -> type:
        raise self._missing("get_graph_runner_cls")

    def get_mha_kv_pool_cls(self) -> type:
        raise self._missing("get_mha_kv_pool_cls")

    def get_mla_kv_pool_cls(self) -> type:
        raise self._missing("get_mla_kv_pool_cls")

    def get_dsa_kv_pool_cls(self) -> type:
        raise self._missing("get_dsa_kv_pool_cls")

    def get_paged_allocator_cls(self) -> type:
        raise self._missing("get_paged_allocator_cls")

    def get_quantization_config(self, quantization: str) -> Any:
        """A hardware-specific config for ``quantization``; None means the default config; raise
        when the scheme is unsupported."""
        raise self._missing("get_quantization_config")

    def get_default_dtype(self) -> DefaultDtype | None:
        """What ``--dtype auto`` computes a generation model in here, and why (an extension of
        the contract); None (the default): the checkpoint's dtype on an accelerator, float32 on
        the CPU."""
        return None

    def get_piecewise_backend_cls(self) -> type:
        raise self._missing("get_piecewise_backend_cls")

    def get_compile_backend(self, mode: str | None = None) -> str:
        """The torch.compile backend name."""
        return "inductor"

    def get_dispatch_key_name(self) -> str:
        """The key that picks fused/custom-op implementations (``forward_<key>``)."""
        return "native"

    # -- lifecycle -------------------------------------------------------------------------
    def apply_server_args_defaults(self, server_args: Any) -> None:
        """Fill platform-specific defaults into ``server_args`` after parsing (default: none)."""

    def init_backend(self) -> None:
        """One-time backend set-up in each worker, before any model code (default: none).

        Called through ``platforms.initialize_current_platform()``, at most once per process.
        """
