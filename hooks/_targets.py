"""Hook targets: parse ``"pkg.mod.Cls.meth"`` / ``"pkg.mod:Cls.meth"`` and find what they name.

A target names an attribute of an owner: a module (functions, classes), a class (methods,
staticmethods, classmethods, nested classes) or any other object. Parsing happens at
registration and only checks the syntax; resolution happens when hooks are applied and may
import the target's module. Both forms import the longest importable module prefix (the colon is
treated as a dot; the entry-point form's part before it must be a module).
"""

from __future__ import annotations

from dataclasses import dataclass
from types import ModuleType


class TargetError(LookupError):
    """A hook target that does not name an existing attribute (the message says which part)."""


@dataclass(frozen=True)
class TargetPath:
    """A parsed target: ``module`` is set for the entry-point form, None for the dotted form."""

    text: str  # as the plugin wrote it
    dotted: str  # canonical dotted form, the key hooks on one target share
    module: str | None
    attrs: tuple[str, ...]  # for the entry-point form: the attribute path after the colon

    @property
    def depth(self) -> int:
        """How many names the path has; shallower targets are patched first (a class REPLACE
        before hooks on that class's methods, so those resolve on the class that is used)."""
        return self.dotted.count(".") + 1


_EXAMPLE = "write 'package.module.function', 'package.module.Class.method' or 'package.module:Class.method'"


def parse_target(target: object) -> TargetPath:
    """Check a target's syntax; raises ``TypeError``/``ValueError`` naming the problem. A target
    under ``sglang`` is translated to this project's path where SGLang's names are aliased
    (``hooks.compat``); one without an equivalent is a ``ValueError`` naming the nearest."""
    if not isinstance(target, str):
        raise TypeError(f"hook target must be a string, not {type(target).__name__}; {_EXAMPLE}")
    text = target.strip()
    if text.count(":") > 1:
        raise ValueError(f"hook target {target!r} has more than one ':'; {_EXAMPLE}")
    module_part, colon, attr_part = text.partition(":")
    names = module_part.split(".") + (attr_part.split(".") if colon else [])
    if not all(name.isidentifier() for name in names):
        raise ValueError(f"hook target {target!r} is not a dotted path of Python names; {_EXAMPLE}")
    from .compat import translate_target

    translated = translate_target(text)
    if translated != text:
        return TargetPath(target, translated, None, ())
    if colon:
        return TargetPath(target, ".".join(names), module_part, tuple(attr_part.split(".")))
    if len(names) < 2:
        raise ValueError(
            f"hook target {target!r} names a module, not an attribute of one; {_EXAMPLE}"
        )
    return TargetPath(target, text, None, ())


def _import(name: str) -> ModuleType | None:
    """Import module ``name``; None if no such module exists (``platforms.entrypoints``' rule:
    an import error raised inside an existing module propagates unchanged)."""
    from platforms.entrypoints import import_if_exists

    return import_if_exists(name)


def _describe(obj: object) -> str:
    if isinstance(obj, ModuleType):
        return f"module {obj.__name__!r}"
    if isinstance(obj, type):
        return f"class {obj.__module__}.{obj.__qualname__}"
    return f"{type(obj).__name__} object"


def resolve_owner(path: TargetPath) -> tuple[object, str]:
    """Import what is needed and return ``(owner, attribute name)`` for ``path``.

    Raises ``TargetError`` when a name along the path does not exist.
    """
    if path.module is not None:
        owner = _import(path.module)
        if owner is None:
            raise TargetError(f"no module named {path.module!r}")
        walk = path.attrs[:-1]
    else:
        parts = path.dotted.split(".")
        owner = _import(parts[0])
        if owner is None:
            raise TargetError(f"no module named {parts[0]!r}")
        walk = tuple(parts[1:-1])
    for name in walk:
        if isinstance(owner, ModuleType) and not hasattr(owner, name):
            sub = _import(f"{owner.__name__}.{name}")
            if sub is None:
                raise TargetError(f"{_describe(owner)} has no attribute or submodule {name!r}")
            owner = sub
            continue
        try:
            owner = getattr(owner, name)
        except AttributeError:
            raise TargetError(f"{_describe(owner)} has no attribute {name!r}") from None
    name = path.dotted.rsplit(".", 1)[1]
    if not hasattr(owner, name):
        raise TargetError(f"{_describe(owner)} has no attribute {name!r}")
    return owner, name


def lookup_raw(owner: object, name: str) -> tuple[object, bool]:
    """The attribute as stored, without descriptor binding, and whether ``owner`` itself holds it.

    For a class this walks the MRO, so a ``staticmethod``/``classmethod`` object is seen as such
    and an inherited method is found on the base that defines it (``own`` is then False: a hook
    goes onto the named class only, and removing it restores inheritance).
    """
    if isinstance(owner, type):
        for klass in owner.__mro__:
            if name in klass.__dict__:
                return klass.__dict__[name], klass is owner
        return getattr(owner, name), False
    namespace = getattr(owner, "__dict__", None)
    if isinstance(namespace, dict) and name in namespace:
        return namespace[name], True
    return getattr(owner, name), False
