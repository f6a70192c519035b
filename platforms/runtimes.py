"""The two runtimes, described once as data; every layer reads these records.

Everything about selecting a runtime's platform and loading its plugins lives here: entry-point
groups, the selector variable, which built-in names the selector accepts directly, reserved
names, whether automatic discovery honours ``SGLANG_PLUGINS`` or rejects duplicate names, the
built-in fallback chain, the base class every selected platform must derive from (read by
``platforms._selection``), the module holding the runtime's ``current_platform``, and how its
general plugins of unselected platform packages are skipped (read by ``hooks``). Layers above
extend a runtime's record with their own fields, keyed by the same ``name``: ``hooks`` builds one
plugin runtime per record, and the launcher adds what serving the runtime takes. No string here
names a module above ``platforms``.
"""

from __future__ import annotations

from typing import NamedTuple

from . import entrypoints


class Builtin(NamedTuple):
    """One built-in platform of a runtime's fallback chain.

    It is available when ``env_flag`` (if any) is set true and ``probe`` (if any; a
    ``"module:function"`` path returning bool, imported only when probed) says so.
    """

    name: str
    qualname: str
    probe: str | None = None
    env_flag: str | None = None
    why: str = ""  # how the fallback reason reads, e.g. "CUDA is available"


class RuntimeSpec(NamedTuple):
    """One runtime's platform-selection rules."""

    name: str
    platform_group: str
    plugin_group: str
    selector_env: str
    builtins: tuple[Builtin, ...]
    base_class: str  # "module:Class" every selected platform class must subclass
    enum_class: str  # "module:Enum" whose member the class's ``_enum`` must be
    explicit_builtins: frozenset[str] = frozenset()  # selector values naming a built-in directly
    reserved_names: frozenset[str] = frozenset()  # entry-point names plugins may not use
    auto_allowlist_env: str | None = None  # variable filtering automatic discovery by name
    reject_duplicate_names: bool = False
    # The built-in a *server* uses where the fallback chain ends at a platform that cannot run a
    # model (SRT's bare base class); only in processes that called ``use_serving_fallback()``.
    serving_fallback: str | None = None
    # Where the runtime's ``current_platform`` lives.
    platform_module: str = "platforms"
    # How general plugins shipped by an unselected platform distribution are known: the variable
    # that names the selected platform by entry-point name (SRT's ``SGLANG_PLATFORM``: unset, no
    # plugin is skipped), or None: always, by the distribution of the resolved selection.
    plugin_exclusion_env: str | None = None

    def builtin(self, name: str) -> Builtin | None:
        for entry in self.builtins:
            if entry.name == name:
                return entry
        return None


SRT = RuntimeSpec(
    name="srt",
    platform_group=entrypoints.SRT_PLATFORMS,
    plugin_group=entrypoints.SRT_PLUGINS,
    selector_env="SGLANG_PLATFORM",
    builtins=(
        Builtin(
            "cpu",
            "platforms.builtin.cpu.CpuSRTPlatform",
            env_flag="SGLANG_USE_CPU_ENGINE",
            why="SGLANG_USE_CPU_ENGINE is set",
        ),
        Builtin(
            "cuda",
            "platforms.builtin.cuda.CudaSRTPlatform",
            probe="platforms.builtin.cuda:available",
            why="CUDA is available",
        ),
        Builtin(
            "rocm",
            "platforms.builtin.rocm.RocmSRTPlatform",
            probe="platforms.builtin.rocm:available",
            why="ROCm is available",
        ),
        Builtin(
            "xpu",
            "platforms.builtin.xpu.XpuSRTPlatform",
            probe="platforms.builtin.xpu:available",
            why="XPU is available",
        ),
        Builtin(
            "base",
            "platforms.interface.SRTPlatform",
            why="neither SGLANG_USE_CPU_ENGINE nor CUDA, ROCm or XPU is available",
        ),
    ),
    base_class="platforms.interface:SRTPlatform",
    enum_class="platforms.device_mixin:PlatformEnum",
    auto_allowlist_env="SGLANG_PLUGINS",
    serving_fallback="cpu",
    plugin_exclusion_env="SGLANG_PLATFORM",
)

_DIFFUSION_BUILTINS = tuple(
    Builtin(
        name,
        f"platforms.builtin.{name}.{cls}",
        probe=f"platforms.builtin.{name}:available",
        why=f"{label} is available",
    )
    for name, cls, label in (
        ("mps", "MpsPlatform", "MPS"),
        ("xpu", "XpuPlatform", "XPU"),
        ("rocm", "RocmPlatform", "ROCm"),
        ("cuda", "CudaPlatform", "CUDA"),
        ("npu", "NpuPlatform", "an Ascend NPU"),
        ("musa", "MusaPlatform", "MUSA"),
    )
) + (Builtin("cpu", "platforms.builtin.cpu.CpuPlatform", why="no accelerator is available"),)

DIFFUSION = RuntimeSpec(
    name="diffusion",
    platform_group=entrypoints.DIFFUSION_PLATFORMS,
    plugin_group=entrypoints.DIFFUSION_PLUGINS,
    selector_env="SGLANG_DIFFUSION_PLATFORM_OVERRIDE",
    builtins=_DIFFUSION_BUILTINS,
    base_class="platforms.diffusion.interface:Platform",
    enum_class="platforms.diffusion.interface:PlatformEnum",
    explicit_builtins=frozenset(
        {"cpu", "cuda", "rocm", "mps", "npu", "musa"}
    ),  # XPU: automatic only
    reserved_names=frozenset(b.name for b in _DIFFUSION_BUILTINS),
    reject_duplicate_names=True,
    platform_module="platforms.diffusion",
)

RUNTIMES = {spec.name: spec for spec in (SRT, DIFFUSION)}


def runtime_spec(name: str) -> RuntimeSpec:
    """The ``RuntimeSpec`` called ``name`` ("srt" or "diffusion")."""
    try:
        return RUNTIMES[name]
    except KeyError:
        raise ValueError(
            f"unknown runtime {name!r}; known runtimes: {', '.join(RUNTIMES)}"
        ) from None
