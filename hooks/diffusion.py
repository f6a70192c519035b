"""The diffusion runtime's plugins and hooks: its own ``HookRegistry``, ``HookType``,
``plugin_hook``, ``load_plugins()`` and ``apply_plugin_hooks()``.

Registration and target resolution are separate phases here, because resolving a hook target can
import that target's whole module graph:

* ``load_plugins()`` discovers ``sglang.multimodal_gen.plugins`` entry points, filters them
  (``SGLANG_PLUGINS``; plugins of installed platform distributions other than the selected
  diffusion platform's are always skipped) and runs their callbacks. It resolves no target, so it
  imports nothing of the runtime.
* ``apply_plugin_hooks()`` runs ``load_plugins()`` if that has not happened, then resolves every
  target and patches it.

Each runs once per process (see ``hooks._loader``). Hooks registered here never run in SRT, and
SRT's never run here.
"""

from __future__ import annotations

from ._core import HookError, HookType, PluginError, make_plugin_hook
from ._loader import registry_of, runtime_of

__all__ = [
    "HookError",
    "HookRegistry",
    "HookType",
    "PluginError",
    "apply_plugin_hooks",
    "load_plugins",
    "plugin_hook",
]

HookRegistry = registry_of("diffusion")

plugin_hook = make_plugin_hook(HookRegistry)


def load_plugins() -> None:
    """Discover diffusion plugins and run their callbacks (registration only), once per process.

    Raises ``PluginError`` when a plugin of the selected platform's distribution fails.
    """
    runtime_of("diffusion").register_plugins()


def apply_plugin_hooks() -> None:
    """``load_plugins()`` if needed, then resolve and patch every registered target, once per
    process; a later call applies only the hooks registered since (logged at INFO). Raises
    ``PluginError`` as ``load_plugins()`` does, also for a hook that cannot apply."""
    runtime_of("diffusion").apply_plugin_hooks()
