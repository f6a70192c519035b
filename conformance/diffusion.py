"""Diffusion extras: dispatch keys, custom-op dispatch, the attention backend, the communicator."""

from __future__ import annotations

from typing import TYPE_CHECKING

from .catalog import check
from .rows import CheckFailed

if TYPE_CHECKING:
    from platforms.custom_op import CustomOp

    from .probe import Probe

DIFFUSION = ("diffusion",)


@check(
    "diffusion.dispatch_key",
    "dispatch_key is a torch dispatcher key, apart from get_dispatch_key_name()",
    "the class attribute dispatch_key is a PyTorch dispatcher key (e.g. 'PrivateUse1') returned by "
    "get_torch_library_dispatch_key(); get_dispatch_key_name() separately picks CustomOp "
    "implementations",
    runtimes=DIFFUSION,
    optional=True,
)
def dispatch_key(probe: Probe) -> str:
    torch, p = probe.torch, probe.platform
    key = p.get_torch_library_dispatch_key()
    if not isinstance(key, str) or not hasattr(torch._C.DispatchKey, key):
        raise CheckFailed(f"dispatch_key is {key!r}, which is not a torch._C.DispatchKey name")
    name = p.get_dispatch_key_name()
    if not isinstance(name, str) or not name.strip():
        raise CheckFailed(f"get_dispatch_key_name() returned {name!r}, not a key name")
    return f"dispatch_key={key!r} (torch.library), get_dispatch_key_name()={name!r} (CustomOp)"


def _probe_op_class() -> tuple[type[CustomOp], type[CustomOp]]:
    from platforms.custom_op import CustomOp

    class ConformanceProbeOp(CustomOp):
        """An operation whose every implementation says which one ran."""

        def forward_native(self) -> str:
            return "forward_native"

        def forward_oot(self) -> str:
            return "forward_oot"

        def forward_cuda(self) -> str:
            return "forward_cuda"

    return CustomOp, ConformanceProbeOp


@check(
    "diffusion.custom_op",
    "custom-op dispatch resolves to the expected forward",
    "a CustomOp resolves, for the key get_dispatch_key_name(), to a function registered with "
    "register_oot_forward(op, fn, key), else its forward_<key>(), else forward_oot()",
    runtimes=DIFFUSION,
)
def custom_op(probe: Probe) -> str:
    key = probe.platform.get_dispatch_key_name()
    if not isinstance(key, str) or not key.strip():
        raise CheckFailed(f"get_dispatch_key_name() returned {key!r}, not a key name")
    CustomOp, Op = _probe_op_class()
    own = f"forward_{key}"
    want = own if key.isidentifier() and callable(getattr(Op, own, None)) else "forward_oot"
    got = Op()()
    if got != want:
        raise CheckFailed(
            f"with key {key!r} and no registration the probe op ran {got}, expected {want}"
        )
    CustomOp.register_oot_forward(Op, fn=lambda op: "registered", platform_key=key)
    got = Op()()
    if got != "registered":
        raise CheckFailed(
            f"after register_oot_forward(..., platform_key={key!r}) the probe op ran {got}"
        )
    return f"key {key!r}: {want} without a registration, the registered function with one"


@check(
    "diffusion.attn_backend",
    "get_attn_backend_cls_str() names an importable backend",
    "get_attn_backend_cls_str() returns the dotted path of an importable attention backend",
    runtimes=DIFFUSION,
    optional=True,
)
def attn_backend(probe: Probe) -> str:
    from platforms.entrypoints import import_object

    path = probe.platform.get_attn_backend_cls_str()
    if not isinstance(path, str) or not path.strip():
        raise CheckFailed(f"returned {path!r}, not a dotted path")
    try:
        import_object(path)
    except Exception as exc:  # noqa: BLE001
        raise CheckFailed(f"{path!r} cannot be imported: {type(exc).__name__}: {exc}") from None
    return repr(path)


@check(
    "diffusion.communicator",
    "all-to-all communicator, with the compatibility fallback",
    "get_all_to_all_communicator_cls() returns an importable class path or None; without an "
    "override it falls back to get_device_communicator_cls()",
    runtimes=DIFFUSION,
)
def communicator(probe: Probe) -> str:
    from platforms.entrypoints import import_object

    p = probe.platform
    base = probe.platforms.Platform
    value = p.get_all_to_all_communicator_cls()
    legacy = p.get_device_communicator_cls()
    overridden = type(p).get_all_to_all_communicator_cls is not base.get_all_to_all_communicator_cls
    if not overridden and value != legacy:
        raise CheckFailed(
            f"returned {value!r}, but the fallback get_device_communicator_cls() is {legacy!r}"
        )
    if value is not None:
        if not isinstance(value, str):
            raise CheckFailed(
                f"returned {type(value).__name__} {value!r}, not a class path or None"
            )
        try:
            import_object(value)
        except Exception as exc:  # noqa: BLE001
            raise CheckFailed(
                f"{value!r} cannot be imported: {type(exc).__name__}: {exc}"
            ) from None
    how = (
        "overridden"
        if overridden
        else f"via the fallback get_device_communicator_cls() = {legacy!r}"
    )
    return (
        f"{value!r} ({how})"
        if value is not None
        else f"None: the default all_to_all_4D path ({how})"
    )
