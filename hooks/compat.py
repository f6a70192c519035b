"""Plugins written for SGLang, unchanged: SGLang's module paths and hook targets, aliased.

SGLang's plugin documentation tells authors to import ``sglang.srt.platforms.interface``,
``sglang.srt.plugins.hook_registry`` and their diffusion counterparts, and to hook targets such
as ``sglang.srt.server_args.ServerArgs.__post_init__``. This project implements that contract
under its own packages. ``install(table)`` makes SGLang's names resolve to this project's objects
in this process, from a table the composition root hands in (the launcher builds it; children
get it in their ``ProcessSpec``):

- ``modules``: SGLang module path -> this project's module. The path and every module below it
  resolve to the *same module objects* (``import sglang.srt.platforms.interface`` is
  ``platforms.interface``), so ``issubclass`` and identity checks hold. Packages between
  ``sglang`` and an aliased path are empty packages.
- ``names``: SGLang dotted name -> this project's, for what was renamed (a class, a method): a
  module import sees the SGLang name as an attribute, and a hook target is translated.
- ``absent``: SGLang targets without an equivalent here -> the nearest target of this project,
  named in the error a hook on them gets.
- ``version``: the SGLang release whose plugin surface the table provides; the aliased ``sglang``
  package carries it as ``__version__``, so a plugin that checks the host's version reads it.

Any other module under ``sglang`` (SGLang's internals: layers, distributed,
the model registry, ...) is not provided: importing it raises ``ModuleNotFoundError`` (its
``name`` the module asked for) saying that sglang-launch provides SGLang's plugin surface only,
and listing that surface. ``importlib.util.find_spec`` of such a name raises the same error,
where it would return None for a module that is simply absent: a plugin probing for SGLang's
internals with ``try``/``except ImportError`` finds them missing either way.

A hook target under an aliased module is translated at registration (``translate_target``), so
hooks on ``sglang.srt.server_args.ServerArgs.__post_init__`` and on its own path share one patch;
a target under ``sglang`` that nothing matches is an error naming the nearest known target.

Where a real ``sglang`` package is importable, ``install`` aliases nothing and
``translate_target`` changes nothing: SGLang's own names mean SGLang's own code. Installing is
once per process; importing this module imports nothing of the project.
"""

from __future__ import annotations

import difflib
import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import sys
import threading
import types
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

ROOT = "sglang"


@dataclass(frozen=True)
class AliasTable:
    """What ``install`` aliases (see the module docstring); ``known`` are this project's hook
    targets, the candidates for "the nearest target"."""

    modules: Mapping[str, str] = field(default_factory=dict)
    names: Mapping[str, str] = field(default_factory=dict)
    absent: Mapping[str, str] = field(default_factory=dict)
    known: Sequence[str] = ()
    version: str = ""

    def to_dict(self) -> dict[str, Any]:
        """Standard-library data for a ``ProcessSpec``."""
        return {
            "modules": dict(self.modules),
            "names": dict(self.names),
            "absent": dict(self.absent),
            "known": list(self.known),
            "version": self.version,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> AliasTable:
        return cls(
            dict(data.get("modules", {})),
            dict(data.get("names", {})),
            dict(data.get("absent", {})),
            tuple(data.get("known", ())),
            str(data.get("version", "")),
        )

    def surface(self) -> str:
        """The SGLang modules this table provides, for messages: ``"sglang.srt.platforms, ..."``."""
        return ", ".join(sorted(self.modules))


class NotProvidedError(ModuleNotFoundError):
    """An SGLang module outside the plugin surface this project provides (``name``: the module
    asked for); the message lists the surface."""


def not_provided(name: str, table: AliasTable) -> NotProvidedError:
    """The error an import of SGLang's module ``name`` gets where the table does not provide it."""
    release = f"SGLang {table.version}'s" if table.version else "SGLang's"
    return NotProvidedError(
        f"No module named {name!r}: sglang-launch provides {release} plugin surface only "
        f"({table.surface()}), not the rest of SGLang; a plugin that imports {name} needs SGLang "
        f"itself (docs/plugins.md, Porting an SGLang plugin)",
        name=name,
    )


class NoEquivalentError(ValueError):
    """A hook target of SGLang's that this project has nothing to match; the message names the
    nearest target it has."""


_lock = threading.Lock()
_table: AliasTable | None = None
_real: bool | None = None


def real_sglang_installed() -> bool:
    """Whether a real ``sglang`` package can be imported from ``sys.path`` (then nothing is
    aliased)."""
    return importlib.machinery.PathFinder.find_spec(ROOT) is not None


def install(table: AliasTable | Mapping[str, Any]) -> bool:
    """Alias SGLang's names in this process as ``table`` says, once; True when aliases are in
    effect (False where a real ``sglang`` is importable, or the table is empty). A later call
    with another table changes nothing: the first one stands."""
    global _table, _real
    if not isinstance(table, AliasTable):
        table = AliasTable.from_dict(table)
    with _lock:
        if _table is not None:
            return True
        if _real is None:
            _real = real_sglang_installed()
        if _real or not table.modules:
            return False
        _table = table
        sys.meta_path.insert(0, _Finder(table))
        return True


def installed() -> AliasTable | None:
    """The table in effect in this process, or None."""
    return _table


def _longest(prefixes: Mapping[str, str], name: str) -> tuple[str, str] | None:
    best = None
    for alias in prefixes:
        if name == alias or name.startswith(alias + "."):
            if best is None or len(alias) > len(best):
                best = alias
    return (best, prefixes[best]) if best is not None else None


def translate_name(name: str, table: AliasTable) -> str | None:
    """This project's dotted path for SGLang's dotted ``name``, or None when no alias covers it."""
    for mapping in (table.names, table.modules):
        hit = _longest(mapping, name)
        if hit is not None:
            alias, ours = hit
            return ours + name[len(alias) :]
    return None


def translate_target(target: str) -> str:
    """A hook target with SGLang's names made this project's (unchanged when no alias table is
    installed, or ``target`` is not under ``sglang``). ``NoEquivalentError`` for an SGLang target
    this project has nothing to match, naming the nearest one it has."""
    table = _table
    dotted = target.strip().replace(":", ".")
    if table is None or not (dotted == ROOT or dotted.startswith(ROOT + ".")):
        return target
    if dotted in table.absent:
        raise NoEquivalentError(
            f"hook target {target!r} (SGLang's) has no equivalent in sglang-launch; the nearest "
            f"target here is {table.absent[dotted]!r}: hook that one, with its own signature"
        )
    ours = translate_name(dotted, table)
    if ours is None:
        close = difflib.get_close_matches(dotted, list(table.known), n=1, cutoff=0.0)
        nearest = f"; the nearest target here is {close[0]!r}" if close else ""
        raise NoEquivalentError(
            f"hook target {target!r} names SGLang internals that sglang-launch does not have"
            f"{nearest} (docs/plugins.md lists the targets with their SGLang names)"
        )
    return ours


class _Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Resolves every module name under ``sglang`` from the alias table: an aliased module (the
    project's own module object), an empty package between, or ``NotProvidedError``."""

    def __init__(self, table: AliasTable) -> None:
        self.table = table
        parents: set[str] = {ROOT}
        for alias in table.modules:
            parts = alias.split(".")
            parents.update(".".join(parts[:i]) for i in range(1, len(parts)))
        self.parents = parents
        # The project's module's own __spec__ while importlib initialises it under its alias.
        self._saved: dict[str, Any] = {}

    def find_spec(
        self,
        fullname: str,
        path: Sequence[str] | None = None,
        target: types.ModuleType | None = None,
    ) -> importlib.machinery.ModuleSpec | None:
        if not (fullname == ROOT or fullname.startswith(ROOT + ".")):
            return None
        hit = _longest(self.table.modules, fullname)
        if hit is not None:
            alias, ours = hit
            real = ours + fullname[len(alias) :]
            try:
                found = importlib.util.find_spec(real)
            except ModuleNotFoundError as exc:
                if exc.name and not (real == exc.name or real.startswith(exc.name + ".")):
                    raise  # a package of this project lacks a dependency: that is the error
                found = None
            if found is None:
                raise not_provided(fullname, self.table)
            package = found.submodule_search_locations is not None
            return importlib.machinery.ModuleSpec(fullname, self, origin=real, is_package=package)
        if fullname in self.parents:
            return importlib.machinery.ModuleSpec(fullname, self, origin=None, is_package=True)
        raise not_provided(fullname, self.table)

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        if spec.origin is None:
            package = types.ModuleType(
                spec.name, "an SGLang package path, aliased by sglang-launch"
            )
            package.__path__ = []
            if spec.name == ROOT and self.table.version:
                package.__dict__["__version__"] = self.table.version
            return package
        module = importlib.import_module(spec.origin)
        renames = {
            name[len(spec.name) + 1 :]: ours
            for name, ours in self.table.names.items()
            if name.startswith(spec.name + ".") and "." not in name[len(spec.name) + 1 :]
        }
        if renames:
            return _Renamed(module, renames)
        # importlib sets __spec__ on what this returns; the module keeps its own (exec_module).
        self._saved[spec.name] = module.__spec__
        return module

    def exec_module(self, module: types.ModuleType) -> None:
        # Nothing to run: the alias is the project's module itself, already imported.
        saved = self._saved.pop(module.__spec__.name if module.__spec__ else "", None)
        if saved is not None:
            module.__spec__ = saved


class _Renamed(types.ModuleType):
    """An SGLang module whose names were renamed here: each SGLang name reads this project's
    object; every other attribute is the project's module's."""

    def __init__(self, module: types.ModuleType, renames: Mapping[str, str]) -> None:
        super().__init__(module.__name__, module.__doc__)
        self.__dict__["_module"] = module
        self.__dict__["_renames"] = dict(renames)

    def __getattr__(self, name: str) -> Any:
        renames: dict[str, str] = self.__dict__["_renames"]
        if name in renames:
            module_name, _, attr = renames[name].rpartition(".")
            return getattr(importlib.import_module(module_name), attr)
        return getattr(self.__dict__["_module"], name)

    def __dir__(self) -> list[str]:
        return sorted({*dir(self.__dict__["_module"]), *self.__dict__["_renames"]})
