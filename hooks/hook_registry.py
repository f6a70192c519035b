"""The SRT hook registry: ``HookRegistry``, ``HookType`` and the ``plugin_hook`` decorator.

A general plugin registers hooks from its ``sglang.srt.plugins`` callback::

    from hooks.hook_registry import HookRegistry, HookType, plugin_hook

    HookRegistry.register("my_app.settings.Settings.validate", my_check, HookType.AFTER)

    @plugin_hook("my_app.worker:run", type=HookType.AROUND)
    def timed(original_fn, *args, **kwargs):
        return original_fn(*args, **kwargs)

``HookRegistry`` is this runtime's instance of the one registry implementation (``hooks._core``);
diffusion has its own in ``hooks.diffusion``. ``HookRegistry.apply_hooks()`` patches targets; the
plugin loader (``hooks.load_plugins``) calls it, so plugins rarely need to.
"""

from __future__ import annotations

from ._core import HookError, HookType, PluginError, make_plugin_hook
from ._loader import registry_of

__all__ = ["HookError", "HookRegistry", "HookType", "PluginError", "plugin_hook"]

HookRegistry = registry_of("srt")

plugin_hook = make_plugin_hook(HookRegistry)
