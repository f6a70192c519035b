"""General plugins for SRT: discovery, filtering, hook registration and application.

Public API (the spec's ``sglang.srt.plugins``):

* ``load_plugins()``: register and apply in one call (the spec's SRT activation step);
* ``register_plugins()`` and ``apply_plugin_hooks()``: the same two phases apart, for the
  bootstrap (platform initialized, then plugins registered, then hooks applied);
* ``load_plugins_by_group(group, excluded_dists=None)``: import the admitted plugins of a hook
  group and return ``{name: callback}`` without running them;
* ``HookRegistry``, ``HookType``, ``plugin_hook`` (from ``hooks.hook_registry``), ``PluginError``,
  ``HookError``;
* ``describe(runtime)``: what ``sglang-launch plugins`` reports;
* ``blame(exc)`` and ``result_culprit(cls, name)``: the hook (a ``Culprit``: plugin, hook,
  target) whose code raised ``exc``, or that decides what ``cls.name`` returns (``hooks._blame``);
* ``runtime(name)``: the ``PluginRuntime`` of any runtime of ``platforms.runtimes`` (its two
  phases, ``register_plugins()`` and ``apply_plugin_hooks()``), for the bootstrap and the launcher.

Filtering: ``SGLANG_PLUGINS`` (comma-separated entry-point names) admits only the plugins it
names. When ``SGLANG_PLATFORM`` names a platform, plugins shipped by any *other* distribution
that provides an ``sglang.srt.platforms`` entry point are skipped, from metadata alone. Importing
this package imports no torch and no platform code; the diffusion API is ``hooks.diffusion``.
"""

from __future__ import annotations

from collections.abc import Iterable

from ._blame import Culprit, blame, result_culprit
from ._core import HookError, PluginError
from ._loader import PluginRuntime, all_runtimes, runtime_of
from .hook_registry import HookRegistry, HookType, plugin_hook

__all__ = [
    "Culprit",
    "HookError",
    "HookRegistry",
    "HookType",
    "PluginError",
    "PluginRuntime",
    "apply_plugin_hooks",
    "blame",
    "describe",
    "load_plugins",
    "load_plugins_by_group",
    "manifest",
    "plugin_hook",
    "register_plugins",
    "result_culprit",
    "runtime",
]


def runtime(name: str) -> PluginRuntime:
    """The plugin loading of runtime ``name`` (a ``platforms.runtimes`` name: "srt" or
    "diffusion"); ``ValueError`` names the known runtimes."""
    return runtime_of(name)


def register_plugins() -> None:
    """Discover, filter and run SRT plugin callbacks, once per process; resolves no target.

    Raises ``PluginError`` when a plugin of the selected platform's distribution fails.
    """
    runtime_of("srt").register_plugins()


def apply_plugin_hooks() -> None:
    """``register_plugins()`` if needed, then apply every registered hook, once per process; a
    later call applies only the hooks registered since (logged at INFO)."""
    runtime_of("srt").apply_plugin_hooks()


def load_plugins() -> None:
    """Register SRT plugins and apply their hooks (both phases), once per process; a later call
    applies only the hooks registered since (logged at INFO)."""
    runtime_of("srt").apply_plugin_hooks()


def load_plugins_by_group(group: str, excluded_dists: Iterable[str] | None = None) -> dict:
    """Import the plugins of hook ``group`` that ``SGLANG_PLUGINS`` admits and that no unselected
    platform distribution ships (or none of ``excluded_dists``, when given), with each plugin
    recorded as the source of hooks registered while it imports; returns ``{name: callback}``,
    callbacks not run. Failures follow the same rules as ``load_plugins()``."""
    runtimes = all_runtimes()
    for plugins in runtimes:
        if plugins.plugin_group == group:
            return plugins.load_group(excluded_dists)
    known = ", ".join(r.plugin_group for r in runtimes)
    raise ValueError(f"{group!r} is not a hook entry-point group; use one of {known}")


def manifest(runtime: str = "srt") -> dict:
    """What this process really has of ``runtime``'s general plugins (each installed plugin's
    status and why, each hook's target, type, plugin and whether it is applied or failed, with
    the error); see ``PluginRuntime.manifest``. Runs nothing: a process that never loaded
    plugins says "not run"."""
    return runtime_of(runtime).manifest()


def describe(runtime: str = "srt", probe: bool = False, timeout: float | None = None) -> dict:
    """A JSON-able report of ``runtime``'s ("srt" or "diffusion") platforms and plugins: every
    installed entry point with its distribution, whether ``SGLANG_PLUGINS`` allows it (for SRT
    platforms: admits it to automatic selection, None while ``SGLANG_PLATFORM`` selects), whether it
    is skipped as part of an unselected platform, the platform selection (or its error), and each
    loaded plugin's hooks with conflicts. Runs the registration phase (callbacks, no targets).
    Without ``probe`` no built-in hardware probe runs (they import torch): when selection would
    reach them, the report lists them in probing order instead of naming one. The selected
    platform's class is constructed as a launch constructs it, so a class a launch refuses is the
    report's selection error. ``timeout``: plugin code (an ``activate()``, a platform constructor,
    a registration callback) that does not return within that many seconds is reported as stuck,
    naming it (None: no limit)."""
    from ._report import describe as _describe

    return _describe(runtime_of(runtime), probe=probe, timeout=timeout)
