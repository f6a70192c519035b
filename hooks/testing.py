"""Tests in one process: a block in which general plugins load afresh and hooks are undone after.

Plugin loading runs once per process (``hooks.load_plugins()``, the diffusion runtime's
``hooks.diffusion.load_plugins()``), and applying a hook rebinds its target for the rest of the
process. ``fresh_plugins()`` gives a block in which both runtimes load their plugins as a fresh
process would, and afterwards puts every hook target back::

    import hooks
    from hooks.testing import fresh_plugins

    def test_my_plugin_hooks_the_target(monkeypatch):
        monkeypatch.setenv("SGLANG_PLATFORM", "my_device")
        with fresh_plugins():
            hooks.load_plugins()
            assert my_app.settings.Settings().validated_by_my_plugin

Inside the block, for every runtime of ``platforms.runtimes``:

* platform selection is fresh, exactly as in ``platforms.testing.fresh_platforms``, which this
  block includes and whose keyword arguments it takes (``srt="builtin:cpu"``): which plugins load
  depends on the selected platform;
* neither plugin phase (registration, hook application) has run, so the next call runs it, with
  the entry points installed on the ``sys.path`` of that moment;
* hooks registered before the block (a module's ``@plugin_hook`` decorators run once, when it is
  first imported) stay registered, and a plugin loaded in the block claims those of its modules
  as a first import would have.

When the block ends, raised or not, every target a hook patched in the block is restored, each
hook registry holds what it held when the block began (applied where it was applied then, with
the plugin it was attributed to then), and both phases and the per-plugin outcomes
(``hooks.describe``) are as they were. Blocks nest. Modules imported in the block stay imported:
a plugin module's own state is the test's to reset. Enter and leave the block from one thread,
while no other thread loads plugins or applies hooks. Importing this module imports nothing but
``hooks`` and ``platforms``.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator

from platforms.testing import fresh_platforms

from ._loader import PluginRuntime, all_runtimes

__all__ = ["fresh_plugins"]


@contextlib.contextmanager
def fresh_plugins(**pins: str | None) -> Iterator[None]:
    """Run the block as a process that has loaded no plugin and selected no platform (see the
    module docstring); ``runtime="<key>"`` pins that runtime's platform, as in
    ``platforms.testing.fresh_platforms``."""
    with fresh_platforms(**pins):
        restores = [_clear(runtime) for runtime in all_runtimes()]
        try:
            yield
        finally:
            for restore in reversed(restores):
                restore()


def _clear(runtime: PluginRuntime) -> Callable[[], None]:
    """Give ``runtime`` phases that have not run; return what undoes the block's hooks and puts
    the runtime's state back."""
    registry = runtime.registry
    with registry._lock:
        held = registry.hooks()
        sources = [hook.source for hook in held]
        applied = [hook for hook in held if hook.location is not None]
        was_applied = registry._applied
        failed = list(registry._failed)
    saved = (
        runtime._phases,
        runtime.outcomes,
        dict(runtime._callback_marks),
        runtime._assumed_selection,
        runtime._stopped,
    )
    runtime._phases = None
    runtime.outcomes = {}
    runtime._stopped = None
    # The callbacks' marks stay: a callback that ran before the block and runs again in it has
    # its earlier hooks replaced, not doubled (the rule of a forked child).

    def restore() -> None:
        with registry._lock:
            registry.reset()  # restores every patched target, forgets every hook
            for hook, source in zip(held, sources, strict=True):
                hook.source, hook.location = source, None
            if applied:
                registry._hooks = list(applied)
                registry.apply_hooks()
            registry._hooks = list(held)
            registry._applied = was_applied
            registry._failed = failed
        (
            runtime._phases,
            runtime.outcomes,
            runtime._callback_marks,
            runtime._assumed_selection,
            runtime._stopped,
        ) = saved

    return restore
