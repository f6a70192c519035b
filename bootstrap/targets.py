"""Resolve a dotted path (``pkg.mod.attr`` or ``pkg.mod:attr.sub``) to the object it names.

The bootstrap resolves the worker target and the ServerArgs class this way, after hooks are
applied, so a REPLACE hook that swapped the module attribute is what the child gets.
"""

from __future__ import annotations

import importlib


class TargetError(ImportError):
    """A dotted path does not name an importable object."""


def _is_prefix(missing: str | None, module_name: str) -> bool:
    """True when the missing module is ``module_name`` itself or one of its parent packages."""
    return bool(missing) and (module_name == missing or module_name.startswith(missing + "."))


def _walk(obj, attrs: list[str], path: str, module: str):
    for i, attr in enumerate(attrs):
        try:
            obj = getattr(obj, attr)
        except AttributeError:
            where = ".".join([module, *attrs[:i]])
            raise TargetError(
                f"{path!r}: {where} has no attribute {attr!r}; check the spelling of the dotted "
                "path (package.module.function or package.module:function)"
            ) from None
    return obj


def resolve(path: str):
    """Import and return the object ``path`` names; ``TargetError`` says what is missing.

    With a colon the module part is explicit. Without one, the longest importable module prefix
    is used; an ImportError raised *inside* an existing module is not masked.
    """
    if not isinstance(path, str) or not path.strip():
        raise TargetError(f"{path!r} is not a dotted path; pass package.module.function")
    path = path.strip()
    if ":" in path:
        module_name, _, attr = path.partition(":")
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as exc:
            if _is_prefix(exc.name, module_name):
                raise TargetError(
                    f"{path!r}: no module named {exc.name!r}; install the package that provides "
                    "it or fix the dotted path"
                ) from exc
            raise
        return _walk(module, attr.split(".") if attr else [], path, module_name)
    parts = path.split(".")
    for cut in range(len(parts) - 1, 0, -1):
        module_name = ".".join(parts[:cut])
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as exc:
            # Only "this prefix does not exist" means: try a shorter one.
            if _is_prefix(exc.name, module_name):
                continue
            raise
        return _walk(module, parts[cut:], path, module_name)
    raise TargetError(
        f"{path!r}: no module named {parts[0]!r}; pass an importable package.module.function "
        "(install the package that provides it, or put it on PYTHONPATH)"
    )


def module_of(path: str) -> str:
    """The module part of ``path`` as written (everything before the last dot or the colon)."""
    if ":" in path:
        return path.partition(":")[0]
    return path.rpartition(".")[0]
