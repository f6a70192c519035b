"""The project's layering, enforced: every import in every module of the four packages is checked.

The rules (DESIGN.md, docs/internals.md):

- ``platforms`` imports no other package of the project;
- ``hooks`` imports only ``platforms``' public API;
- ``bootstrap`` imports only ``platforms`` (it reaches ``hooks`` by a dotted-path string);
- ``launcher`` outside ``launcher/workers`` never imports ``launcher.workers``, not even lazily;
- ``launcher/workers`` imports only public APIs;
- no private module or name (``_x``) is imported from another package; a package's own private
  modules are fine within it. ``launcher.workers`` counts as a package of its own here.

Every ``import`` and ``from ... import`` statement counts, wherever it stands: module scope,
inside functions, under ``if TYPE_CHECKING``. A dotted path in a string (``importlib``) is not
parsed: that is how ``bootstrap`` reaches ``hooks`` and the worker targets on purpose.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TOP = ("platforms", "hooks", "bootstrap", "launcher")
WORKERS = "launcher.workers"


@dataclass(frozen=True)
class Import:
    """One imported module path (``name`` is the imported name for ``from m import name``)."""

    module: str
    name: str | None
    line: int


def _module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _is_private(part: str) -> bool:
    return part.startswith("_") and not (part.startswith("__") and part.endswith("__"))


def _owner(module: str) -> str | None:
    """The package a project module belongs to for these rules (None: not the project's)."""
    if module == WORKERS or module.startswith(WORKERS + "."):
        return WORKERS
    top = module.split(".")[0]
    return top if top in TOP else None


def imports_of(path: Path, root: Path = ROOT) -> list[Import]:
    """Every import in the file at ``path`` (under ``root``), relative imports made absolute."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    here = _module_name(path, root)
    package = here if path.name == "__init__.py" else here.rpartition(".")[0]
    found: list[Import] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.extend(Import(alias.name, None, node.lineno) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            found.extend(Import(module, alias.name, node.lineno) for alias in node.names)
    return sorted(found, key=lambda imp: imp.line)


def violations_of(path: Path, root: Path = ROOT) -> list[str]:
    """The layering rules ``path`` (under ``root``) breaks, one ``file:line: rule: import`` each."""
    here = _module_name(path, root)
    mine = _owner(here)
    assert mine is not None, here
    out: list[str] = []
    for imp in imports_of(path, root):
        # ``from pkg import sub`` may name a submodule: judge the longest path it could be.
        full = f"{imp.module}.{imp.name}" if imp.name and imp.name != "*" else imp.module
        theirs = _owner(full)
        if theirs is None:
            continue
        shown = f"from {imp.module} import {imp.name}" if imp.name else f"import {imp.module}"
        where = f"{path.relative_to(root)}:{imp.line}"
        private = any(_is_private(part) for part in full.split("."))
        rule = None
        if mine == "platforms" and theirs != "platforms":
            rule = "platforms imports no other project package"
        elif mine == "hooks" and (
            theirs not in ("hooks", "platforms") or theirs != mine and private
        ):
            rule = "hooks imports only platforms' public API"
        elif mine == "bootstrap" and theirs not in ("bootstrap", "platforms"):
            rule = "bootstrap imports only platforms (hooks and targets by dotted-path string)"
        elif mine == "launcher" and theirs == WORKERS:
            rule = "launcher never imports launcher.workers (not even lazily)"
        elif mine == WORKERS and theirs != WORKERS and private:
            rule = "workers import only public APIs"
        elif theirs != mine and private:
            rule = f"no private module or name is imported from another package ({theirs})"
        if rule:
            out.append(f"{where}: {rule}: {shown}")
    return out


def project_modules() -> list[Path]:
    """Every ``.py`` file of the four packages, ``launcher/workers`` included."""
    return sorted(p for top in TOP for p in (ROOT / top).rglob("*.py"))


def test_the_tree_keeps_its_layering() -> None:
    modules = project_modules()
    assert len(modules) > 50, "the scan found too few modules: is ROOT right?"
    broken = [v for path in modules for v in violations_of(path)]
    assert not broken, "forbidden imports:\n" + "\n".join(broken)


def _check_snippet(tmp_path: Path, module: str, source: str) -> list[str]:
    """Run the rules over ``source`` as if it were the project module ``module``."""
    parts = module.split(".")
    path = tmp_path.joinpath(*parts[:-1], parts[-1] + ".py")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(source, encoding="utf-8")
    return violations_of(path, tmp_path)


def test_the_checker_sees_each_rule(tmp_path: Path) -> None:
    cases = {
        ("platforms.x", "import hooks\n"): "platforms imports no other",
        ("hooks.x", "def f():\n    from platforms import _selection\n"): "hooks imports only",
        ("hooks.x", "from launcher import cli\n"): "hooks imports only",
        ("bootstrap.x", "import hooks.hook_registry\n"): "bootstrap imports only",
        (
            "launcher.x",
            "def f():\n    from .workers import app\n",
        ): "never imports launcher.workers",
        ("launcher.commands.x", "from .. import workers\n"): "never imports launcher.workers",
        ("launcher.workers.x", "from launcher._plan import Plan\n"): "workers import only public",
        ("launcher.x", "from platforms._state import X\n"): "no private module",
        ("bootstrap.x", "from platforms.interface import _helper\n"): "no private module",
    }
    for (module, source), rule in cases.items():
        found = _check_snippet(tmp_path, module, source)
        assert len(found) == 1 and rule in found[0], (module, source, found)
    allowed = {
        ("platforms.builtin.cpu", "from .._state import X\nfrom . import _accelerator\n"),
        ("launcher.conformance.x", "from .._plan import Plan\n"),
        ("launcher.workers.x", "from ._y import z\nfrom launcher.server_args import ServerArgs\n"),
        ("hooks.x", "from platforms.entrypoints import allowlist\nimport importlib\n"),
        ("bootstrap.x", "import importlib\nimportlib.import_module('hooks')\n"),
    }
    for module, source in allowed:
        assert _check_snippet(tmp_path, module, source) == [], (module, source)
