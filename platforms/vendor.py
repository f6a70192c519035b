"""Whose code an exception came from: ``plugin_code(exc)`` names the installed plugin.

A traceback that passes through a module of a distribution that ships a platform or plugin entry
point (``platforms.entrypoints``) came from that vendor's code: a platform's
``apply_server_args_defaults``, a hook a general plugin registered, a helper either calls. The
launcher reports such an error as the vendor's (a set-up failure naming the class or plugin),
never as a bad command line; check-platform names it in the row. Reads metadata already scanned;
imports nothing.
"""

from __future__ import annotations

import traceback
from pathlib import Path
from typing import NamedTuple

from . import entrypoints
from .entrypoints import EntryPoint


class PluginCode(NamedTuple):
    """Where in a vendor's code an exception was raised.

    ``distribution`` shipped the code; ``entry_point`` is its entry point the code belongs to (a
    platform one for a method of its platform class, else a general plugin one where the
    distribution has one); ``platform_class`` (``"pkg.mod.Class"``) and ``method`` are set when
    the outermost vendor frame is a method of a platform instance; ``where`` is the innermost
    vendor frame, ``"pkg/mod.py:15, in function"``, relative to the distribution's root.
    """

    distribution: str | None
    entry_point: EntryPoint | None
    platform_class: str | None
    method: str | None
    where: str

    def describe(self) -> str:
        """``"the platform class pkg.Cls (from dist), in apply_server_args_defaults() at
        pkg/mod.py:15, in f"`` or ``"plugin 'name' (from dist), at pkg/mod.py:15, in f"``."""
        dist = f"from {self.distribution}" if self.distribution else "of an unknown distribution"
        if self.platform_class:
            return (
                f"the platform class {self.platform_class} ({dist}), in {self.method}() at "
                f"{self.where}"
            )
        if self.entry_point is not None and not self.entry_point.group.endswith(".platforms"):
            return f"plugin {self.entry_point.name!r} ({dist}), at {self.where}"
        return f"code of {self.distribution or 'a plugin'} ({dist}), at {self.where}"


def _owners() -> dict[str, list[EntryPoint]]:
    """Top-level package name -> the installed entry points whose module lives under it."""
    owners: dict[str, list[EntryPoint]] = {}
    for group in entrypoints.GROUPS:
        for ep in entrypoints.entry_points(group):
            owners.setdefault(ep.module.split(".")[0], []).append(ep)
    return owners


def _relative(filename: str, module: str) -> str:
    path = Path(filename)
    depth = len(module.split(".")) - (0 if path.name == "__init__.py" else 1)
    try:
        return path.relative_to(path.parents[depth]).as_posix()
    except (IndexError, ValueError):
        return path.as_posix()


def _chain(exc: BaseException) -> list[BaseException]:
    """``exc`` and what it was raised from or during, innermost cause first."""
    seen: list[BaseException] = []
    current: BaseException | None = exc
    while current is not None and current not in seen:
        seen.append(current)
        current = current.__cause__ or current.__context__
    return list(reversed(seen))


def plugin_code(exc: BaseException) -> PluginCode | None:
    """The vendor code ``exc`` (or what it was raised from) passed through, or None when no frame
    of its traceback is an installed plugin distribution's."""
    from .device_mixin import DeviceMixin

    owners = _owners()
    if not owners:
        return None
    for error in _chain(exc):
        frames = [
            (frame, line)
            for frame, line in traceback.walk_tb(error.__traceback__)
            if str(frame.f_globals.get("__name__", "")).split(".")[0] in owners
        ]
        if not frames:
            continue
        outer, _ = frames[0]
        inner, line = frames[-1]
        module = str(inner.f_globals.get("__name__", ""))
        where = f"{_relative(inner.f_code.co_filename, module)}:{line}, in {inner.f_code.co_name}"
        eps = owners[str(outer.f_globals.get("__name__", "")).split(".")[0]]
        instance = outer.f_locals.get("self")
        if isinstance(instance, DeviceMixin):
            cls = type(instance)
            platform_ep = next((ep for ep in eps if ep.group.endswith(".platforms")), eps[0])
            return PluginCode(
                platform_ep.distribution,
                platform_ep,
                f"{cls.__module__}.{cls.__qualname__}",
                outer.f_code.co_name,
                where,
            )
        plugin_ep = next((ep for ep in eps if ep.group.endswith(".plugins")), eps[0])
        return PluginCode(plugin_ep.distribution, plugin_ep, None, None, where)
    return None
