"""What an entry point imports when it runs, read from source with ``ast``; nothing is imported.

``reached(ep, package)`` follows the imports an entry point of ``package``'s distribution would
run, and yields each import of a module outside the distribution (``Reached``: where, which
module, and which alternatives a guarded import had). Followed, within the distribution only:

- the entry point's module and the packages above it, at module scope (their top-level code runs
  when the module is imported; function bodies do not, class bodies do);
- every module of the distribution one of those imports, at module scope, transitively;
- the body of the callback the entry point names, and of every function of the distribution it
  calls by name (``helper()``, or a name it imported: ``from pkg.mod import helper``);
- for a platform entry point, the class its callback returns as a string literal
  (``"pkg.platform.MyPlatform"``): that class's module, and the body of its ``__init__``.

An import inside ``try:`` whose ``except`` catches ``ImportError`` is the plugin's own fallback: it
is not yielded, and the imports of its handlers are yielded with the guarded ones as their
``alternatives`` (they run only when one of those is missing). ``if TYPE_CHECKING:`` blocks are
never run. Paths are relative to the folder that holds the distribution's top-level packages
(``sglang_tenstorrent/models/deepseek_r1_0528.py``), so two files of one name are told apart.
"""

from __future__ import annotations

import ast
import importlib.util
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from platforms.entrypoints import EntryPoint

_GUARDS = {"ImportError", "ModuleNotFoundError", "Exception", "BaseException"}
_FUNCTIONS = (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)


@dataclass(frozen=True)
class Reached:
    """One import of a module outside the distribution that running the entry point reaches."""

    path: str  # relative to the distribution's root, e.g. "pkg/models/m.py"
    line: int
    module: str
    alternatives: tuple[str, ...] = ()  # the guarded imports this one stands in for

    @property
    def where(self) -> str:
        return f"{self.path}:{self.line}"


@dataclass
class _Module:
    name: str
    path: Path
    relative: str
    tree: ast.Module | None
    error: str | None = None
    defs: dict[str, ast.AST] = field(default_factory=dict)  # module-level functions and classes


def _guarded(node: ast.Try) -> bool:
    for handler in node.handlers:
        if handler.type is None:
            return True
        types = handler.type.elts if isinstance(handler.type, ast.Tuple) else [handler.type]
        if any(isinstance(t, ast.Name) and t.id in _GUARDS for t in types):
            return True
    return False


def _import_names(node: ast.AST, package: str) -> list[tuple[str, list[str]]]:
    """``[(module, names)]`` an import statement binds from (relative ones resolved against
    ``package``, the importing module's package); empty for anything else."""
    if isinstance(node, ast.Import):
        return [(alias.name, []) for alias in node.names]
    if isinstance(node, ast.ImportFrom):
        if node.level:
            parts = package.split(".") if package else []
            if node.level - 1 > len(parts):
                return []
            base = ".".join(parts[: len(parts) - (node.level - 1)])
            module = f"{base}.{node.module}" if node.module else base
        else:
            module = node.module or ""
        return [(module, [alias.name for alias in node.names])] if module else []
    return []


class _Walker:
    """The imports one body of code runs, in source order; the bodies of functions it defines
    (nested ``def``, ``lambda``) do not run with it and are not walked."""

    def walk(
        self, nodes: list[ast.stmt] | list[ast.AST], alternatives: tuple[ast.AST, ...] = ()
    ) -> Iterator[tuple[ast.AST, tuple[ast.AST, ...], bool]]:
        """``(import node, the guarded imports it stands in for, guarded)`` for each import."""
        for node in nodes:
            yield from self._node(node, alternatives)

    def _node(
        self, node: ast.AST, alternatives: tuple[ast.AST, ...]
    ) -> Iterator[tuple[ast.AST, tuple[ast.AST, ...], bool]]:
        if isinstance(node, _FUNCTIONS):
            return
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            yield from self.walk(node.orelse, alternatives)
            return
        if isinstance(node, ast.Try) and _guarded(node):
            guarded = [found for found, _, _ in self.walk(node.body)]
            for found in guarded:
                yield found, (), True
            for part in node.handlers:
                yield from self.walk(part.body, tuple(guarded))
            yield from self.walk([*node.orelse, *node.finalbody], alternatives)
            return
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node, alternatives, False
            return
        yield from self.walk(list(ast.iter_child_nodes(node)), alternatives)


class Package:
    """The source of one distribution's top-level packages, found as ``import`` would find them
    (``importlib.util.find_spec`` of the top-level names only, which imports nothing)."""

    def __init__(self, tops: set[str]) -> None:
        self.tops = set(tops)
        self._modules: dict[str, _Module | None] = {}
        self._roots: dict[str, tuple[list[Path], Path]] = {}
        for top in sorted(tops):
            try:
                spec = importlib.util.find_spec(top)
            except (ImportError, ValueError):
                continue
            if spec is None:
                continue
            if spec.submodule_search_locations:
                locations = [Path(p) for p in spec.submodule_search_locations]
                if locations:
                    self._roots[top] = (locations, locations[0].parent)
            elif spec.origin and spec.origin.endswith(".py"):
                self._roots[top] = ([], Path(spec.origin).parent)
                self._modules[top] = self._read(top, Path(spec.origin), Path(spec.origin).parent)

    def owns(self, module: str) -> bool:
        return module.split(".")[0] in self.tops

    def module(self, name: str) -> _Module | None:
        """The parsed source of module ``name`` of this distribution, or None."""
        if name in self._modules:
            return self._modules[name]
        found = self._locate(name)
        self._modules[name] = found
        return found

    def _locate(self, name: str) -> _Module | None:
        parts = name.split(".")
        if parts[0] not in self._roots:
            return None
        locations, root = self._roots[parts[0]]
        for location in locations:
            folder = location.joinpath(*parts[1:])
            for candidate in (folder / "__init__.py", folder.with_suffix(".py")):
                if len(parts) == 1 and candidate != folder / "__init__.py":
                    continue
                if candidate.is_file():
                    return self._read(name, candidate, root)
        return None

    @staticmethod
    def _read(name: str, path: Path, root: Path) -> _Module:
        try:
            relative = path.relative_to(root).as_posix()
        except ValueError:
            relative = path.as_posix()
        try:
            tree = ast.parse(path.read_text(encoding="utf-8"))
        except (OSError, SyntaxError, UnicodeDecodeError) as exc:
            return _Module(
                name, path, relative, None, f"{relative} cannot be read as Python ({exc})"
            )
        defs: dict[str, ast.AST] = {
            node.name: node
            for node in tree.body
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
        }
        return _Module(name, path, relative, tree, defs=defs)

    def is_package(self, module: _Module) -> bool:
        return module.path.name == "__init__.py"


class _Follower:
    """One entry point's reach (see the module docstring)."""

    def __init__(self, package: Package) -> None:
        self.package = package
        self.scoped: set[str] = set()  # modules whose module scope was followed
        self.bodies: set[tuple[str, str]] = set()  # (module, function) bodies followed
        self.found: list[Reached] = []
        self.errors: list[str] = []

    # -- modules -----------------------------------------------------------------------------
    def import_module(self, name: str) -> None:
        """Follow what importing ``name`` runs: each package above it, then the module."""
        parts = name.split(".")
        for end in range(1, len(parts) + 1):
            self._module_scope(".".join(parts[:end]))

    def _module_scope(self, name: str) -> None:
        if name in self.scoped:
            return
        self.scoped.add(name)
        module = self.package.module(name)
        if module is None:
            return
        if module.tree is None:
            self.errors.append(module.error or f"{module.relative} cannot be read")
            return
        self._imports(module, module.tree.body)

    def _own_package(self, module: _Module) -> str:
        return module.name if self.package.is_package(module) else module.name.rpartition(".")[0]

    def _imports(self, module: _Module, body: list[ast.stmt]) -> dict[str, str]:
        """Follow the imports in ``body``; returns the names they bind to functions of this
        distribution (``{name: "module:function"}``) for call following."""
        bound: dict[str, str] = {}
        context = self._own_package(module)
        for node, alternatives, guarded in _Walker().walk(body):
            line = getattr(node, "lineno", 0)
            alts = tuple(m for alt in alternatives for m, _ in _import_names(alt, context))
            for target, names in _import_names(node, context):
                if self.package.owns(target):
                    if guarded:
                        continue  # a fallback of the plugin's own: not followed either
                    self.import_module(target)
                    for name in names:
                        sub = f"{target}.{name}"
                        if self.package.module(sub) is not None:
                            self.import_module(sub)
                        else:
                            bound[name] = f"{target}:{name}"
                elif not guarded:
                    self.found.append(Reached(module.relative, line, target, alts))
        return bound

    # -- callbacks ---------------------------------------------------------------------------
    def call(self, module_name: str, qualname: str) -> None:
        """Follow the body of ``module_name``'s ``qualname`` (a function, or a class, whose
        ``__init__`` runs), and of the functions of this distribution it calls by name."""
        if (module_name, qualname) in self.bodies:
            return
        self.bodies.add((module_name, qualname))
        self.import_module(module_name)
        module = self.package.module(module_name)
        if module is None or module.tree is None:
            return
        node: ast.AST | None = module.defs.get(qualname.split(".")[0])
        for part in qualname.split(".")[1:]:
            if not isinstance(node, ast.ClassDef):
                node = None
                break
            node = next(
                (
                    n
                    for n in node.body
                    if getattr(n, "name", None) == part and not isinstance(n, ast.Assign)
                ),
                None,
            )
        if isinstance(node, ast.ClassDef):
            node = next((n for n in node.body if getattr(n, "name", None) == "__init__"), None)
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            return
        bound = self._imports(module, node.body)
        for called in self._called_names(node.body):
            if called in bound:
                target, _, function = bound[called].partition(":")
                self.call(target, function)
            elif called in module.defs:
                self.call(module_name, called)

    @staticmethod
    def _called_names(body: list[ast.stmt]) -> list[str]:
        """The plain names ``body`` calls (``helper()``), outside the functions it defines."""
        names: list[str] = []
        todo: list[ast.AST] = list(body)
        while todo:
            node = todo.pop(0)
            if isinstance(node, _FUNCTIONS):
                continue
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
                names.append(node.func.id)
            todo.extend(ast.iter_child_nodes(node))
        return names

    def returned_classes(self, module_name: str, function: str) -> list[tuple[str, str]]:
        """``(module, class)`` of each string literal ``function`` returns that names a class of
        this distribution (``"pkg.mod.Cls"`` or ``"pkg.mod:Cls"``)."""
        module = self.package.module(module_name)
        node = module.defs.get(function) if module is not None else None
        if node is None:
            return []
        found = []
        for ret in ast.walk(node):
            value = ret.value if isinstance(ret, ast.Return) else None
            if isinstance(value, ast.Constant) and isinstance(value.value, str):
                text = value.value.strip()
                if ":" in text:
                    mod, _, cls = text.partition(":")
                else:
                    mod, _, cls = text.rpartition(".")
                if mod and cls and self.package.owns(mod) and self.package.module(mod) is not None:
                    found.append((mod, cls))
        return found


def reached(ep: EntryPoint, package: Package, platform: bool) -> tuple[list[Reached], list[str]]:
    """What running ``ep`` imports from outside its distribution, and the files of it that could
    not be read. ``platform``: ``ep`` is a platform entry point (the class it returns is followed)."""
    follower = _Follower(package)
    module, _, attr = ep.value.partition(":")
    module, attr = module.strip(), attr.strip()
    follower.import_module(module)
    if attr:
        follower.call(module, attr)
        if platform and "." not in attr:
            for cls_module, cls in follower.returned_classes(module, attr):
                follower.call(cls_module, cls)
    return follower.found, follower.errors
