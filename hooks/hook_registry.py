"""The SRT hook registry: ``HookRegistry``, ``HookType`` and the ``plugin_hook`` decorator.

A general plugin registers hooks from its ``sglang.srt.plugins`` callback::

    from hooks.hook_registry import HookRegistry, HookType, plugin_hook

    HookRegistry.register("launcher.server_args.ServerArgs.check_server_args", my_check, HookType.AFTER)

    @plugin_hook("launcher.workers.scheduler:run_scheduler_process", type=HookType.AROUND)
    def timed(original_fn, server_args, ctx):
        return original_fn(server_args, ctx)

``HookRegistry`` is this runtime's instance of the one registry implementation (``hooks._core``);
diffusion has its own in ``hooks.diffusion``. ``HookRegistry.apply_hooks()`` patches targets; the
plugin loader (``hooks.load_plugins``) calls it, so plugins rarely need to.
"""

from __future__ import annotations

from ._core import HookError, HookType, PluginError, Registry, make_plugin_hook

__all__ = ["HookError", "HookRegistry", "HookType", "PluginError", "plugin_hook"]

HookRegistry = Registry("srt")

plugin_hook = make_plugin_hook(HookRegistry)
