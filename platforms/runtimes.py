"""The two runtimes, described once as data; every layer reads these records.

Everything that differs between SRT and diffusion lives here: entry-point groups, the selector
variable, which built-in names the selector accepts directly, reserved names, whether automatic
discovery honours ``SGLANG_PLUGINS`` or rejects duplicate names, the built-in fallback chain and
the base class every selected platform must derive from (read by ``platforms._selection``); the
module holding the runtime's ``current_platform`` and its plugin steps (read by the launcher and
the bootstrap); and the serving side (read by ``ServerArgs`` and the HTTP child): the default
worker target, the check that turns ``--model-path`` into a served model, and the function that
adds the runtime's API routes. Those are dotted-path strings, resolved only where they are used,
so this module stays free of imports.
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
    # Where the runtime's ``current_platform`` lives, and its plugin steps ("module:function"):
    # registration only, registration plus hook application (what a launcher calls).
    platform_module: str = "platforms"
    register_plugins: str = "hooks:register_plugins"
    apply_hooks: str = "hooks:apply_plugin_hooks"
    # Serving: the default worker target ("module.function", started once per rank), the check of
    # ``--model-path`` ("module:function(model_path, served_model_name) -> ModelSource", standard
    # library only, run by ``check_server_args`` before any worker starts and by the HTTP child),
    # the API routes the HTTP child adds ("module:function(kit)"; None: the text routes only),
    # and the file that marks a model directory of this runtime.
    worker_target: str = "launcher.workers.scheduler.run_scheduler_process"
    model_check: str = "launcher.model_source:resolve_model"
    api_routes: str | None = None
    model_marker: str = "config.json"
    tensor_parallel: bool = True  # whether a replica may span several ranks (--tp-size > 1)
    # Whether --enable-cfg-parallel applies: each replica is two ranks that split classifier-free
    # guidance (rank 0 the conditional, rank 1 the unconditional noise prediction of each step).
    cfg_parallel: bool = False

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
    register_plugins="hooks.diffusion:load_plugins",
    apply_hooks="hooks.diffusion:apply_plugin_hooks",
    worker_target="launcher.workers.diffusion.worker.run_diffusion_worker",
    model_check="launcher.model_source:resolve_pipeline",
    api_routes="launcher.workers.diffusion.routes:add_image_routes",
    model_marker="model_index.json",
    tensor_parallel=False,
    cfg_parallel=True,
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
