"""What the hook registry is made of: hook types, where a hook came from, the errors, a hook.

``HookType`` (SGLang's four kinds), ``PluginSource`` (the entry point and distribution a hook came
from; ``plugin_source()`` sets it around a plugin's import and callback, ``register`` reads it),
``HookError`` / ``PluginError``, and ``Hook``, one registration.
"""

from __future__ import annotations

import contextlib
import enum
from collections.abc import Callable, Iterator
from contextvars import ContextVar
from dataclasses import dataclass

from ._targets import TargetPath


class HookType(enum.Enum):
    """How a hook attaches to its target (the spec's table)."""

    BEFORE = "before"  # fn(*args, **kwargs) -> (args, kwargs) | None
    AFTER = "after"  # fn(result, *args, **kwargs) -> new_result | None
    AROUND = "around"  # fn(original_fn, *args, **kwargs) -> result
    REPLACE = "replace"  # fn(*args, **kwargs) -> result, or a class

    @classmethod
    def coerce(cls, value: object) -> HookType:
        """A ``HookType`` from itself or its name/value ("around", "AROUND"); ``TypeError`` else."""
        if isinstance(value, cls):
            return value
        if isinstance(value, str):
            for member in cls:
                if value.strip().lower() == member.value:
                    return member
        names = ", ".join(f"HookType.{m.name}" for m in cls)
        raise TypeError(f"hook type must be one of {names}, not {value!r}")


@dataclass(frozen=True)
class PluginSource:
    """The plugin a hook came from: its entry point and the distribution that shipped it."""

    name: str
    distribution: str | None
    group: str
    value: str = ""

    def __str__(self) -> str:
        return f"plugin {self.name!r} ({self.distribution or 'unknown distribution'})"


# Set by the plugin loader around each plugin's import and callback, read by ``register``.
current_plugin_source: ContextVar[PluginSource | None] = ContextVar(
    "current_plugin_source", default=None
)


@contextlib.contextmanager
def plugin_source(source: PluginSource | None) -> Iterator[None]:
    """Attribute hooks registered inside the block to ``source``."""
    token = current_plugin_source.set(source)
    try:
        yield
    finally:
        current_plugin_source.reset(token)


class HookError(RuntimeError):
    """A hook could not be registered or applied; the message names the hook and the fix."""


class PluginError(HookError):
    """A plugin shipped in the selected platform's distribution failed (to load, to run its
    callback or to apply a hook): part of the platform's contract, so start-up must stop.
    ``plugin`` is the entry-point name, ``distribution`` its distribution, ``__cause__`` the error."""

    def __init__(self, message: str, *, plugin: str, distribution: str | None) -> None:
        super().__init__(message)
        self.plugin = plugin
        self.distribution = distribution


@dataclass(eq=False)
class Hook:
    """One registered hook."""

    path: TargetPath
    func: Callable
    type: HookType
    source: PluginSource | None
    seq: int
    location: tuple | None = None  # (id(owner), name) once applied

    @property
    def name(self) -> str:
        module = getattr(self.func, "__module__", None)
        qualname = getattr(self.func, "__qualname__", None) or repr(self.func)
        return f"{module}.{qualname}" if module else qualname

    def __str__(self) -> str:
        origin = str(self.source) if self.source else "no plugin"
        return f"{self.type.name} hook {self.name} on {self.path.dotted!r} from {origin}"
