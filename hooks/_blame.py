"""Which hook is to blame for what went wrong at run time.

A plugin's hook runs inside the code it hooks, so when a step of a server fails the traceback
alone says ``RuntimeError: policy bug`` in some file; the operator needs the plugin, the hook and
the target. Two questions are answered here, from the hook registries of this process (every
runtime's), with no cost until they are asked:

* ``blame(exc)``: the hook whose code raised ``exc``, or None when no hook did. The traceback is
  read from the outermost frame in: a frame of a hook's function (or of a method of a class a
  ``REPLACE`` hook installed) makes that hook the culprit; a frame of a hooked target's original
  code (an ``AROUND`` hook that called ``original_fn``, a ``BEFORE`` hook's target) makes the
  target itself the culprit again. The innermost such frame decides, so a hook that raised, or
  that called library code that raised, is blamed, and a model that failed under a hook that only
  wrapped it is not.
* ``result_culprit(cls, name)``: the hook that decides what ``cls.name`` returns (its ``REPLACE``,
  else its outermost ``AROUND``, else its last ``AFTER``; or the ``REPLACE`` of the class the
  method comes from), for a caller that found the returned value unusable.

A ``Culprit`` describes itself as ``the plugin 'myplug' (AROUND hook on
Scheduler.get_next_batch_to_run)``.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from types import CodeType, FunctionType, MethodType

from ._core import _registries
from ._model import Hook, HookType


@dataclass(frozen=True)
class Culprit:
    """A hook found to blame: ``plugin`` (its entry-point name; None for a hook registered
    outside any plugin), ``distribution``, ``hook`` (its function's qualified name), ``type``
    (``AROUND``, ``REPLACE``...) and ``target`` (as the plugin wrote it)."""

    plugin: str | None
    distribution: str | None
    hook: str
    type: str
    target: str

    @property
    def short_target(self) -> str:
        """The target's last two names (``Scheduler.get_next_batch_to_run``)."""
        return ".".join(self.target.replace(":", ".").split(".")[-2:])

    def describe(self) -> str:
        """``the plugin 'myplug' (AROUND hook on Scheduler.get_next_batch_to_run)``, or for a hook
        of no plugin ``the hook mod.fn (AROUND hook on ..., registered outside any plugin)``."""
        on = f"{self.type} hook on {self.short_target}"
        if self.plugin is None:
            return f"the hook {self.hook} ({on}, registered outside any plugin)"
        return f"the plugin {self.plugin!r} ({on})"

    @classmethod
    def of(cls, hook: Hook) -> Culprit:
        source = hook.source
        return cls(
            plugin=source.name if source else None,
            distribution=source.distribution if source else None,
            hook=hook.name,
            type=hook.type.name,
            target=hook.path.text,
        )


def _codes_of(obj: object) -> list[CodeType]:
    """The code objects a hook (or a target's original) runs as: a function's, a method's, a
    partial's function's, or every function defined in a class's own body."""
    if isinstance(obj, (staticmethod, classmethod)):
        obj = obj.__func__
    if isinstance(obj, functools.partial):
        obj = obj.func
    if isinstance(obj, MethodType):
        obj = obj.__func__
    if isinstance(obj, FunctionType):
        return [obj.__code__]
    if isinstance(obj, type):
        codes: list[CodeType] = []
        for value in vars(obj).values():
            if isinstance(value, property):
                value = value.fget
            if not isinstance(value, type):  # nested classes are not the class's own code
                codes.extend(_codes_of(value))
        return codes
    return []


def _code_map() -> tuple[dict[CodeType, Hook], set[CodeType]]:
    """``(hook code -> its hook, the code of every hooked target's original)``, now."""
    hooks: dict[CodeType, Hook] = {}
    originals: set[CodeType] = set()
    for registry in list(_registries):
        with registry._lock:
            for patch in registry._patches.values():
                originals.update(_codes_of(patch.original))
                for hook in patch.hooks:
                    for code in _codes_of(hook.func):
                        hooks[code] = hook
    return hooks, originals


def blame(exc: BaseException) -> Culprit | None:
    """The hook whose code raised ``exc`` (see the module docstring), or None."""
    hooks, originals = _code_map()
    if not hooks:
        return None
    culprit: Hook | None = None
    tb = exc.__traceback__
    while tb is not None:
        code = tb.tb_frame.f_code
        found = hooks.get(code)
        if found is not None:
            culprit = found
        elif code in originals:
            culprit = None
        tb = tb.tb_next
    return Culprit.of(culprit) if culprit is not None else None


# Which hook's return value is the target's: a REPLACE decides it, an AROUND returns what it
# likes (the last registered is outermost), an AFTER's non-None value replaces it (the last
# registered runs last). BEFORE hooks never see it.
_DECIDES = (HookType.REPLACE, HookType.AROUND, HookType.AFTER)


def result_culprit(cls: type, name: str) -> Culprit | None:
    """The hook that decides what ``cls.name`` returns (see the module docstring), or None when
    no hook does."""
    for registry in list(_registries):
        with registry._lock:
            for patch in registry._patches.values():
                owner = patch.owner
                if patch.name != name or not isinstance(owner, type):
                    continue
                if not issubclass(cls, owner):
                    continue
                for kind in _DECIDES:
                    deciding = [h for h in patch.hooks if h.type is kind]
                    if deciding:
                        return Culprit.of(max(deciding, key=lambda h: h.seq))
    for klass in cls.__mro__:
        if name in vars(klass):
            hooks, _ = _code_map()
            for code in _codes_of(vars(klass)[name]):
                if code in hooks:
                    return Culprit.of(hooks[code])
            return None
    return None
