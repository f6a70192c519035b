"""SRT subsystem factories and capability flags, listed with their values.

A factory whose contract default raises ``NotImplementedError`` shows as missing when the
platform does not override it, except ``get_default_attention_backend``, which every launch
calls (required: missing fails). A factory that returns SGLang's own class (it imports an SGLang
module outside the plugin surface, which is not here) shows as missing too: no launch here
builds those subsystems. ``get_graph_runner_cls`` is what a launch decodes through when
``support_cuda_graph()`` is true (``serving.srt.model_executor.decode_runner``): its row fails
when such a launch could not. The memory factories a launch does call, ``get_mha_kv_pool_cls`` and
``get_paged_allocator_cls``, pass when a launch would use the class (SGLang's stock class, which
is this project's, or a subclass of it that constructs with SGLang's parameters, on the device)
and fail naming why when it could not (``serving.srt.mem_cache.platform_classes``). A flag must
answer a bool.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .catalog import check
from .rows import CheckFailed, Missing

if TYPE_CHECKING:
    from .probe import Probe

SRT = ("srt",)


def _class_row(probe: Probe, method: str) -> str:
    from hooks.compat import NotProvidedError

    try:
        value = getattr(probe.platform, method)()
    except NotProvidedError as exc:
        # SGLang's own subsystem class, which no launch here builds: not this platform's fault.
        raise Missing(
            f"returns a class from SGLang's {exc.name}, which sglang-launch does not provide (it "
            f"provides SGLang's plugin surface only); no launch here calls {method}()"
        ) from None
    if not isinstance(value, type):
        raise CheckFailed(f"{method}() returned {type(value).__name__} {value!r}, not a class")
    return f"{value.__module__}.{value.__qualname__}"


# The factories a launch calls (serving.srt.mem_cache.platform_classes).
_LAUNCH_USES = ("get_mha_kv_pool_cls", "get_paged_allocator_cls")


def _memory_row(probe: Probe, method: str) -> str:
    from serving.srt.mem_cache.platform_classes import PlatformClassUnusable, check_factory

    try:
        return check_factory(probe.platform, method, probe.values.get("device", "cpu"))
    except PlatformClassUnusable as exc:
        raise CheckFailed(f"a launch would stop (exit 5): {exc}") from None


def _graph_runner_row(probe: Probe) -> str:
    """``get_graph_runner_cls()``: what a launch decodes through when ``support_cuda_graph()``
    is true (``serving.srt.model_executor.decode_runner``); unused otherwise."""
    from hooks.compat import NotProvidedError

    uses = probe.platform.support_cuda_graph() is True
    way_out = "a launch would stop (exit 5) unless started with --disable-cuda-graph"
    try:
        cls = probe.platform.get_graph_runner_cls()
    except NotImplementedError:
        if uses:
            raise CheckFailed(
                f"support_cuda_graph() is true but get_graph_runner_cls() is not implemented: "
                f"{way_out}"
            ) from None
        raise
    except NotProvidedError as exc:
        if uses:
            raise CheckFailed(
                f"returns a class from SGLang's {exc.name}, which sglang-launch does not "
                f"provide: {way_out}"
            ) from None
        raise Missing(
            f"returns a class from SGLang's {exc.name}, which sglang-launch does not provide; "
            f"no launch here uses it (support_cuda_graph() is false)"
        ) from None
    if not isinstance(cls, type):
        raise CheckFailed(
            f"get_graph_runner_cls() returned {type(cls).__name__} {cls!r}, not a class"
        )
    name = f"{cls.__module__}.{cls.__qualname__}"
    missing = [m for m in ("can_run", "replay") if not callable(getattr(cls, m, None))]
    if missing and uses:
        raise CheckFailed(f"{name} has no {' or '.join(missing)}(): {way_out}")
    if uses:
        return f"{name}: a launch decodes through it (support_cuda_graph() is true)"
    return f"{name}: not used (support_cuda_graph() is false)"


def _factory(method: str, what: str) -> None:
    contract = (
        f"{method}() returns the platform's {what} class (default: raises NotImplementedError)"
    )
    if method in _LAUNCH_USES:
        contract += (
            "; a launch uses it: SGLang's class or a subclass that constructs with SGLang's "
            "parameters"
        )
    if method == "get_graph_runner_cls":
        contract += (
            "; a launch decodes through it when support_cuda_graph() is true: a class with "
            "can_run(forward_batch) and replay(forward_batch), constructed with the model runner"
        )

    @check(
        f"subsystems.{method}",
        f"{method}() returns the {what} class",
        contract,
        runtimes=SRT,
        optional=True,
    )
    def factory(probe: Probe) -> str:
        if method in _LAUNCH_USES:
            return _memory_row(probe, method)
        if method == "get_graph_runner_cls":
            return _graph_runner_row(probe)
        return _class_row(probe, method)


@check(
    "subsystems.get_default_attention_backend",
    "get_default_attention_backend() names a backend",
    "get_default_attention_backend() returns the name of the attention backend used when the "
    "operator names none",
    runtimes=SRT,
    required=(
        "get_default_attention_backend",
        "every scheduler worker picks the model's attention from it unless --attention-backend is given",
    ),
)
def default_attention_backend(probe: Probe) -> str:
    value = probe.platform.get_default_attention_backend()
    if not isinstance(value, str) or not value.strip():
        raise CheckFailed(f"returned {value!r}, not a backend name")
    return repr(value)


for _method, _what in (
    ("get_graph_runner_cls", "graph runner"),
    ("get_mha_kv_pool_cls", "MHA KV cache pool"),
    ("get_mla_kv_pool_cls", "MLA KV cache pool"),
    ("get_dsa_kv_pool_cls", "DSA KV cache pool"),
    ("get_paged_allocator_cls", "paged allocator"),
    ("get_piecewise_backend_cls", "piecewise compilation backend"),
):
    _factory(_method, _what)


@check(
    "subsystems.get_quantization_config",
    "get_quantization_config('fp8') answers",
    "get_quantization_config(quantization) returns a hardware-specific config, None for the "
    "default config, or raises for an unsupported scheme",
    runtimes=SRT,
    optional=True,
)
def quantization_config(probe: Probe) -> str:
    try:
        value = probe.platform.get_quantization_config("fp8")
    except NotImplementedError:
        raise
    except Exception as exc:  # noqa: BLE001 - refusing a scheme is the contract's way to say no
        return f"'fp8' refused: {type(exc).__name__}: {exc}"
    return "'fp8' -> default config (None)" if value is None else f"'fp8' -> {value!r}"


@check(
    "subsystems.get_communicator_class",
    "get_communicator_class() is a class or None",
    "get_communicator_class() returns a platform-specific communicator class, or None for the default",
    runtimes=SRT,
)
def communicator_class(probe: Probe) -> str:
    value = probe.platform.get_communicator_class()
    if value is None:
        return "None (the default communicator)"
    if not isinstance(value, type):
        raise CheckFailed(f"returned {type(value).__name__} {value!r}, not a class or None")
    return f"{value.__module__}.{value.__qualname__}"


@check(
    "subsystems.get_dispatch_key_name",
    "get_dispatch_key_name() names the fused-op key",
    "get_dispatch_key_name() returns the key that picks fused/custom-op implementations "
    "(forward_<key>); the default is 'native'",
    runtimes=SRT,
)
def dispatch_key_name(probe: Probe) -> str:
    value = probe.platform.get_dispatch_key_name()
    if not isinstance(value, str) or not value.strip():
        raise CheckFailed(f"returned {value!r}, not a key name")
    return repr(value)


def _flag(method: str, what: str, runtimes: tuple[str, ...]) -> None:
    @check(
        f"subsystems.{method}",
        f"{method}() is a bool",
        f"{method}() answers True or False: {what}",
        runtimes=runtimes,
    )
    def flag(probe: Probe) -> str:
        value = getattr(probe.platform, method)()
        if not isinstance(value, bool):
            raise CheckFailed(f"returned {type(value).__name__} {value!r}, not a bool")
        return str(value)


for _method, _what, _runtimes in (
    ("support_cuda_graph", "whether device graph capture is supported", SRT),
    ("support_piecewise_cuda_graph", "whether piecewise graph capture is supported", SRT),
    ("supports_fp8", "whether FP8 quantization is supported", SRT),
    (
        "supports_distributed_device_id",
        "whether init_process_group(device_id=...) may bind the device",
        ("diffusion",),
    ),
    (
        "enable_dit_layerwise_offload_by_default",
        "whether DiT layer-wise offload is on by default",
        ("diffusion",),
    ),
):
    _flag(_method, _what, _runtimes)
