"""Resolve a dotted path (``pkg.mod.attr`` or ``pkg.mod:attr.sub``) to the object it names.

The bootstrap resolves the plugin steps, the ServerArgs class and the worker target this way,
after hooks are applied where it matters, so a REPLACE hook that swapped a module attribute is
what the child gets. The import rule itself is the project's one (``platforms.entrypoints
.import_object``: the longest importable module prefix; an ImportError raised *inside* an existing
module is not mistaken for a wrong path); this module adds the error that says what to fix.
"""

from __future__ import annotations

from typing import Any


class TargetError(ImportError):
    """A dotted path does not name an importable object."""


def resolve(path: str) -> Any:
    """Import and return the object ``path`` names; ``TargetError`` says what is missing."""
    if not isinstance(path, str) or not path.strip():
        raise TargetError(f"{path!r} is not a dotted path; pass package.module.function")
    from platforms.entrypoints import import_object

    try:
        return import_object(path.strip())
    except (ImportError, AttributeError) as exc:
        raise TargetError(
            f"{path!r} cannot be imported ({type(exc).__name__}: {exc}); pass an importable "
            "package.module.function (or package.module:function) and make sure the package "
            "that provides it is installed in the children's environment"
        ) from exc


def module_of(path: str) -> str:
    """The module part of ``path`` as written (everything before the colon or the last dot)."""
    if ":" in path:
        return path.partition(":")[0]
    return path.rpartition(".")[0]
