"""Tests in one process: a block in which both runtimes' platforms are selected afresh.

A process selects its platform once: the first use of ``current_platform`` resolves it (for SRT,
``platforms``; for diffusion, ``platforms.diffusion``), ``pin_selection`` refuses once it has, and
``initialize_current_platform`` runs ``init_backend()`` once. A test of selection, of a platform
plugin, or of code that reads ``current_platform`` therefore needs a process that has selected
nothing. ``fresh_platforms()`` gives a block that::

    import platforms
    from platforms.testing import fresh_platforms

    def test_my_platform_is_selected(monkeypatch):
        monkeypatch.setenv("SGLANG_PLATFORM", "my_device")
        with fresh_platforms():
            assert platforms.current_platform.device_name == "my_device"

    def test_something_on_the_cpu():
        with fresh_platforms(srt="builtin:cpu", diffusion="builtin:cpu"):
            ...

Inside the block, for every runtime of ``platforms.runtimes``:

* nothing is selected, pinned or initialized, and the serving fallback is off: the runtime
  selects as a fresh process would, from ``os.environ`` at first use. A keyword argument named
  after the runtime (``srt=``, ``diffusion=``) pins it to a selection key instead
  (``"builtin:<name>"`` or ``"plugin:<entry-point name>"``, what ``pin_selection`` takes); a
  malformed key raises ``PlatformSelectionError`` and the block does not run;
* installed entry points are read on first need from the ``sys.path`` of that moment, so
  distributions a test has put on ``sys.path`` are found;
* ``init_backend()`` runs again on ``initialize_current_platform()``, and the functions it
  registers with ``platforms.custom_op.CustomOp.register_oot_forward`` last until the block ends.

When the block ends, raised or not, every runtime's selection, pin, serving fallback, platform
instance and backend initialization are as they were when it began, ``CustomOp``'s registrations
too; the entry-point reading is dropped again, so the next lookup reads the ``sys.path`` of then.
Blocks nest. Modules imported in the block stay imported (as in any process): a plugin module's
own state is the test's to reset. General plugins and their hooks are not covered here: the
``hooks`` package has the counterpart (its ``testing`` module), which includes this block.
Enter and leave the block from one thread, while no other thread uses ``current_platform``.
Importing this module imports nothing but ``platforms``.
"""

from __future__ import annotations

import contextlib
import importlib
import sys
from collections.abc import Callable, Iterator
from typing import Any

from . import _selection, entrypoints
from ._state import PlatformSlot
from .once import ProcessOnce
from .runtimes import RUNTIMES

__all__ = ["fresh_platforms"]


@contextlib.contextmanager
def fresh_platforms(**pins: str | None) -> Iterator[None]:
    """Run the block as a process that has selected no platform (see the module docstring);
    ``runtime="<key>"`` pins that runtime, None (the default) lets it select from the
    environment."""
    unknown = sorted(set(pins) - set(RUNTIMES))
    if unknown:
        raise ValueError(
            f"fresh_platforms() got {', '.join(unknown)}: pass a selection key for a runtime of "
            f"platforms.runtimes ({', '.join(RUNTIMES)})"
        )
    for name, key in pins.items():
        if key is not None:
            _selection.parse_key(RUNTIMES[name], key)  # before anything changes
    slots = {name: _slot(name) for name in RUNTIMES}
    restores = [_clear(slot) for slot in slots.values()]
    restores.append(_keep_custom_op_registrations())
    entrypoints.reset()
    try:
        for name, key in pins.items():
            if key is not None:
                slots[name].pin(key)
        yield
    finally:
        entrypoints.reset()
        for restore in reversed(restores):
            restore()


def _slot(runtime: str) -> PlatformSlot:
    """The ``PlatformSlot`` behind runtime ``runtime``'s ``current_platform``."""
    slot = importlib.import_module(RUNTIMES[runtime].platform_module)._slot
    assert isinstance(slot, PlatformSlot)
    return slot


def _clear(slot: PlatformSlot) -> Callable[[], None]:
    """Make ``slot`` as a fresh process has it; return what puts its state back."""
    with slot._lock:
        saved = (
            slot._pinned,
            slot._serving,
            slot._selection,
            slot._platform,
            slot._error,
            slot._init,
        )
        slot._pinned, slot._serving = None, False
        slot._selection, slot._platform, slot._error = None, None, None
        slot._init = ProcessOnce(slot._init.name)

    def restore() -> None:
        with slot._lock:
            (
                slot._pinned,
                slot._serving,
                slot._selection,
                slot._platform,
                slot._error,
                slot._init,
            ) = saved

    return restore


def _keep_custom_op_registrations() -> Callable[[], None]:
    """Return what puts ``CustomOp``'s registered forwards back as they are now. The module
    imports torch, so it is looked at only where something has imported it already."""
    module = sys.modules.get("platforms.custom_op")
    saved: dict[Any, Any] = dict(module.CustomOp._oot_forwards) if module is not None else {}

    def restore() -> None:
        current = sys.modules.get("platforms.custom_op")
        if current is None:
            return
        with current.CustomOp._registry_lock:
            current.CustomOp._oot_forwards.clear()
            current.CustomOp._oot_forwards.update(saved)

    return restore
