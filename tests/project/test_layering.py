"""The project's layering: import-linter's contracts (pyproject.toml), and what no import shows.

The packages stack ``platforms < hooks < bootstrap < launchspec``, the shared floor; above it the
supervisor's ``launcher`` and the workers' ``serving`` (with ``conformance`` over ``serving``) know
nothing of each other. Each may import the ones below it, never one above or beside it, and nobody
imports another package's private modules.
import-linter checks every import statement (function-level ones included) against the contracts
in ``[tool.importlinter]``. What it cannot see is checked here:

- a module named in a string: ``importlib.import_module("x")`` (or ``__import__``) with a literal
  counts as an import and must respect the layers; and no string constant in ``platforms``,
  ``hooks`` or ``bootstrap`` (docstrings and messages included) names a module of a package above
  it, so the lower packages know nothing of the upper ones even by name;
- a private name (``from platforms.interface import _helper``) taken from another package.
"""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# What each package may import besides itself, lowest first.
_FLOOR = ("platforms", "hooks", "bootstrap", "launchspec")
MAY_IMPORT: dict[str, tuple[str, ...]] = {
    "platforms": (),
    "hooks": _FLOOR[:1],
    "bootstrap": _FLOOR[:2],
    "launchspec": _FLOOR[:3],
    "launcher": _FLOOR,
    "serving": _FLOOR,
    "conformance": (*_FLOOR, "serving"),
}
LAYERS = tuple(MAY_IMPORT)
NAMED = ("platforms", "hooks", "bootstrap")  # the packages whose strings may name nothing above


def _above(package: str) -> tuple[str, ...]:
    """The packages ``package`` may not import: those above or beside it."""
    return tuple(p for p in LAYERS if p != package and p not in MAY_IMPORT[package])


def _package_of(path: Path, root: Path) -> str:
    return path.relative_to(root).parts[0]


def _module_literals(tree: ast.AST) -> list[tuple[str, int]]:
    """``(literal, line)`` of every ``import_module("x")`` / ``__import__("x")`` call."""
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call) or not node.args:
            continue
        func = node.func
        name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
        arg = node.args[0]
        if name in ("import_module", "__import__") and isinstance(arg, ast.Constant):
            if isinstance(arg.value, str):
                found.append((arg.value, node.lineno))
    return found


def _is_private(part: str) -> bool:
    return part.startswith("_") and not (part.startswith("__") and part.endswith("__"))


def violations_of(path: Path, root: Path = ROOT) -> list[str]:
    """What ``path`` (a module under ``root``) breaks of the rules import-linter cannot check."""
    mine = _package_of(path, root)
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    where = path.relative_to(root)
    out = []
    for literal, line in _module_literals(tree):
        top = literal.split(".")[0].split(":")[0]
        if top in _above(mine):
            out.append(
                f"{where}:{line}: {mine} imports {literal!r} by name, a package above or beside it"
            )
    if mine in NAMED:
        upper = _above(mine)
        pattern = re.compile(r"\b(" + "|".join(upper) + r")[.:][A-Za-z_]")
        for node in ast.walk(tree):
            if isinstance(node, ast.Constant) and isinstance(node.value, str):
                hit = pattern.search(node.value)
                if hit:
                    out.append(
                        f"{where}:{node.lineno}: a string in {mine} names {hit.group(0)}..., a "
                        f"module of a package above it"
                    )
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and not node.level:
            theirs = node.module.split(".")[0]
            if theirs in LAYERS and theirs != mine:
                for alias in node.names:
                    if _is_private(alias.name):
                        out.append(
                            f"{where}:{node.lineno}: private name {alias.name} imported from "
                            f"{node.module}"
                        )
    return out


def project_modules(root: Path = ROOT) -> list[Path]:
    return sorted(p for top in LAYERS for p in (root / top).rglob("*.py"))


def test_import_linter_contracts_hold() -> None:
    lint = Path(sys.executable).with_name("lint-imports")
    proc = subprocess.run(
        [str(lint), "--no-cache"], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "broken" in proc.stdout and "0 broken" in proc.stdout, proc.stdout


def test_no_module_is_named_against_the_layers() -> None:
    modules = project_modules()
    assert len(modules) > 80, "the scan found too few modules: is ROOT right?"
    broken = [v for path in modules for v in violations_of(path)]
    assert not broken, "\n".join(broken)


def _check_snippet(tmp_path: Path, module: str, source: str) -> list[str]:
    """The rules over ``source`` as if it were the project module ``module``."""
    parts = module.split(".")
    path = tmp_path.joinpath(*parts[:-1], parts[-1] + ".py")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(source, encoding="utf-8")
    return violations_of(path, tmp_path)


def test_the_checker_sees_each_rule(tmp_path: Path) -> None:
    broken = {
        ("platforms.x", "import importlib\nimportlib.import_module('hooks')\n"): "by name",
        ("launcher.x", "def f():\n    __import__('serving.wire')\n"): "by name",
        ("bootstrap.x", "TARGET = 'launchspec.server_args:ServerArgs'\n"): "names launchspec.s",
        ("serving.x", "import importlib\nimportlib.import_module('launcher.prepare')\n"): "by name",
        ("launcher.x", "def f():\n    __import__('conformance.command')\n"): "by name",
        ("hooks.x", '"""Hook serving.srt.scheduler.Scheduler here."""\n'): "names serving.s",
        ("serving.x", "from platforms.interface import _helper\n"): "private name _helper",
    }
    for (module, source), rule in broken.items():
        found = _check_snippet(tmp_path, module, source)
        assert len(found) == 1 and rule in found[0], (module, source, found)
    allowed = {
        ("serving.x", "import importlib\nimportlib.import_module('launchspec.server_args')\n"),
        ("launcher.x", "WORKER = 'serving.srt.scheduler.run_scheduler_process'\n"),
        ("hooks.x", '"""The launcher. It names nothing here."""\n'),
        ("platforms.x", "from ._state import X\nfrom .interface import _helper\n"),
    }
    for module, source in allowed:
        assert _check_snippet(tmp_path, module, source) == [], (module, source)
