"""Selection checks: where the platform came from, construction, identity, names."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from platforms.entrypoints import import_object
from platforms.runtimes import RUNTIMES

from . import surface
from .catalog import check
from .rows import CheckFailed

if TYPE_CHECKING:
    from .probe import Probe

# Identity query -> the PlatformEnum member names for which it must answer True.
IDENTITY = {
    "is_cuda": {"CUDA"},
    "is_rocm": {"ROCM"},
    "is_npu": {"NPU"},
    "is_cpu": {"CPU"},
    "is_xpu": {"XPU"},
    "is_musa": {"MUSA"},
    "is_mps": {"MPS"},
    "is_tpu": {"TPU"},
    "is_cuda_alike": {"CUDA", "ROCM", "MUSA"},
    "is_out_of_tree": {"OOT"},
}
_UNSET = {"", "unspecified"}


def _enum_text(platform: Any) -> str:
    member = platform._enum
    return f"PlatformEnum.{getattr(member, 'name', member)}"


@check(
    "selection.source",
    "selected as a launch would (entry point, distribution)",
    "the runtime's selector variables pick one platform; a plugin comes from one installed entry point",
)
def source(probe: Probe) -> str:
    sel = probe.selection
    if sel.entry_point is not None:
        where = f"plugin {sel.entry_point.describe()}"
    else:
        where = f"built-in {sel.name!r}"
    return f"{where} -> {sel.qualname}; selected by {sel.reason}"


@check(
    "selection.construct",
    "constructed with no arguments, from the runtime's base class",
    "the platform class derives from the runtime's base class and is constructible with no arguments",
)
def construct(probe: Probe) -> str:
    cls = type(probe.platform)
    base = probe.base_class
    if not isinstance(probe.platform, base):
        raise CheckFailed(
            f"{cls.__qualname__} does not derive from {base.__module__}.{base.__qualname__}"
        )
    return f"{cls.__module__}.{cls.__qualname__}() with _enum = {_enum_text(probe.platform)}"


@check(
    "selection.identity",
    "_enum agrees with every is_*() identity query",
    "each identity query answers from _enum (is_cuda() is True exactly when _enum is CUDA, "
    "is_cuda_alike() for CUDA, ROCm and MUSA, is_out_of_tree() for OOT)",
)
def identity(probe: Probe) -> str:
    p = probe.platform
    name = getattr(p._enum, "name", None)
    wrong, true = [], []
    for query, members in IDENTITY.items():
        method = getattr(p, query, None)
        if method is None:
            continue
        answer = method()
        want = name in members
        if answer is not want:
            wrong.append(f"{query}() returned {answer!r}, expected {want}")
        elif answer:
            true.append(f"{query}()")
    if wrong:
        raise CheckFailed(f"_enum is {_enum_text(p)} but " + "; ".join(wrong))
    return f"{_enum_text(p)}: " + (
        ", ".join(true) + " True, the rest False" if true else "every query False"
    )


@check(
    "selection.out_of_tree",
    "is_out_of_tree() is True for a plugin platform",
    "a plugin platform sets _enum = PlatformEnum.OOT (its runtime's own enum), so is_out_of_tree() "
    "is True; built-in platforms are not out of tree",
)
def out_of_tree(probe: Probe) -> str:
    plugin = probe.selection.is_plugin
    answer = probe.platform.is_out_of_tree()
    if answer is not plugin:
        kind = "a plugin platform" if plugin else "a built-in platform"
        raise CheckFailed(
            f"{kind} answered is_out_of_tree() = {answer!r} (_enum is {_enum_text(probe.platform)})"
        )
    return f"{answer} ({'plugin' if plugin else 'built-in'})"


@check(
    "selection.names",
    "device_name and device_type are set",
    "device_name is a human label and device_type the torch device type, both set by the class",
)
def names(probe: Probe) -> str:
    p = probe.platform
    bad = [
        f"{attr} is {getattr(p, attr, None)!r}"
        for attr in ("device_name", "device_type")
        if not isinstance(getattr(p, attr, None), str) or getattr(p, attr).strip().lower() in _UNSET
    ]
    if bad:
        hint = ""
        if probe.selection.key == "builtin:base":
            hint = (
                " (this is the base SRTPlatform, the fallback when no plugin activated and no "
                "accelerator was found; set SGLANG_USE_CPU_ENGINE=1 to check the CPU platform)"
            )
        raise CheckFailed("; ".join(bad) + hint)
    return f"device_name={p.device_name!r}, device_type={p.device_type!r}"


@check(
    "selection.contract_names",
    "every public name of the platform class is a contract name",
    "a platform class's public methods and attributes are its runtime's contract names (the base "
    "class's); the runtime calls nothing else, so a typo or a name from another runtime or from "
    "SGLang's older interface leaves the contract method it meant at its default",
)
def contract_names(probe: Probe) -> str:
    cls, base = type(probe.platform), probe.base_class
    others = [import_object(s.base_class) for s in RUNTIMES.values() if s.name != probe.runtime]
    stray = surface.stray_names(cls, base, others)
    if stray:
        raise CheckFailed("; ".join(stray))
    own = surface.own_public_names(cls, base)
    return f"{len(own)} public name(s) of {cls.__qualname__}'s own classes, all contract names"


@check(
    "selection.signatures",
    "every overridden contract method accepts what the runtime passes",
    "an override takes every call its base method accepts: the same parameters, positionally and "
    "by keyword, with no new required one",
)
def signatures(probe: Probe) -> str:
    cls = type(probe.platform)
    problems, compared = surface.incompatible_overrides(cls, probe.base_class)
    if problems:
        raise CheckFailed("; ".join(problems))
    return f"{compared} overridden contract method(s), each accepts the base signature's calls"
