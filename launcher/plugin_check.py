"""``sglang-launch plugins --check``: what each installed plugin will do, without running it.

Everything here is read from metadata and source, never imported: each distribution's entry
points, its ``Requires-Dist``, its modules' source (parsed with ``ast``) and its ``RECORD``. For
every platform and general plugin of both runtimes the report says:

- the verdict: the platform that would be selected (or the candidates, when only their
  ``activate()`` can decide), a general plugin that would load, or what skips it
  (``SGLANG_PLUGINS``, a platform distribution that is not the selected one, a name another
  distribution also uses, a name reserved for a built-in platform);
- what makes it incompatible here: a ``Requires-Dist`` this environment does not satisfy (a
  pinned ``sglang`` that is not installed, say); an import of a module that neither this
  project, its alias table of SGLang's names (``launchspec.compat``), nor any installed package
  provides (an import guarded by ``try``/``except ImportError`` is the plugin's own fallback and
  is not counted); a ``.pth`` file it installs that runs code at every interpreter start.

``check(environ)`` returns the report as plain data; ``main`` of ``launcher.commands.plugins``
prints it.
"""

from __future__ import annotations

import ast
import importlib.metadata as metadata
import importlib.util
import os
import sys
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from platforms import entrypoints
from platforms.entrypoints import EntryPoint
from platforms.runtimes import RUNTIMES, RuntimeSpec

_GUARDS = {"ImportError", "ModuleNotFoundError", "Exception", "BaseException"}


@dataclass
class Finding:
    """One installed entry point and what a launch would do with it."""

    runtime: str
    kind: str  # "platform" or "plugin"
    name: str
    value: str
    distribution: str | None
    version: str | None
    verdict: str  # selected, candidate, loaded, skipped, not considered, rejected
    why: str
    problems: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def incompatible(self) -> bool:
        return bool(self.problems)


# -- modules, found without importing them ------------------------------------------------------
def module_exists(name: str) -> bool:
    """Whether module ``name`` can be found on this interpreter's path, importing nothing: the
    top-level package is found as ``import`` would find it, the rest in the file system."""
    parts = name.split(".")
    if parts[0] in sys.builtin_module_names or parts[0] in sys.stdlib_module_names:
        return True
    try:
        spec = importlib.util.find_spec(parts[0])  # a top-level name: found, not imported
    except (ImportError, ValueError):
        return False
    if spec is None:
        return False
    locations = list(spec.submodule_search_locations or [])
    for part in parts[1:]:
        if not locations:
            return False
        found: list[str] | None = None
        for location in locations:
            folder = Path(location, part)
            if folder.is_dir():
                found = [str(folder)]
                break
            if Path(location, part + ".py").is_file() or any(Path(location).glob(part + ".*.so")):
                found = []
                break
        if found is None:
            return False
        locations = found
    return True


def _guarded(node: ast.Try) -> bool:
    for handler in node.handlers:
        if handler.type is None:
            return True
        types = handler.type.elts if isinstance(handler.type, ast.Tuple) else [handler.type]
        if any(isinstance(t, ast.Name) and t.id in _GUARDS for t in types):
            return True
    return False


def imports_in(source: str) -> Iterator[tuple[str, int]]:
    """``(module, line)`` of every absolute import in ``source`` that is not guarded by a
    ``try`` catching ``ImportError`` and not under ``if TYPE_CHECKING:``."""
    tree = ast.parse(source)

    def walk(node: ast.AST, skip: bool) -> Iterator[tuple[str, int]]:
        if isinstance(node, ast.Try) and _guarded(node):
            for statement in node.body:
                yield from walk(statement, True)
            for part in (*node.handlers, *node.orelse, *node.finalbody):
                yield from walk(part, skip)
            return
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            for part in node.orelse:
                yield from walk(part, skip)
            return
        if not skip:
            if isinstance(node, ast.Import):
                for alias in node.names:
                    yield alias.name, node.lineno
            elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
                yield node.module, node.lineno
        for inner in ast.iter_child_nodes(node):
            yield from walk(inner, skip)

    yield from walk(tree, False)


# -- one distribution --------------------------------------------------------------------------
def _distribution(name: str | None) -> metadata.Distribution | None:
    if not name:
        return None
    try:
        return metadata.distribution(name)
    except metadata.PackageNotFoundError:
        return None


def _top_packages(dist: metadata.Distribution, eps: Iterable[EntryPoint]) -> set[str]:
    tops = {ep.module.split(".")[0] for ep in eps}
    for path in dist.files or ():
        first = path.parts[0] if path.parts else ""
        if path.suffix == ".py" and first and not first.endswith((".dist-info", ".egg-info")):
            tops.add(first[:-3] if first.endswith(".py") else first)
    return {t for t in tops if t.isidentifier()}


def _sources(tops: set[str]) -> Iterator[Path]:
    """The ``.py`` files of the distribution's top-level packages (editable installs too)."""
    for top in sorted(tops):
        try:
            spec = importlib.util.find_spec(top)
        except (ImportError, ValueError):
            continue
        if spec is None:
            continue
        if spec.submodule_search_locations:
            for location in spec.submodule_search_locations:
                yield from sorted(Path(location).rglob("*.py"))
        elif spec.origin and spec.origin.endswith(".py"):
            yield Path(spec.origin)


def _requirement_problems(dist: metadata.Distribution) -> list[str]:
    from packaging.requirements import InvalidRequirement, Requirement

    problems = []
    for text in dist.requires or ():
        try:
            req = Requirement(text)
        except InvalidRequirement:
            problems.append(f"its Requires-Dist {text!r} cannot be parsed")
            continue
        if req.marker is not None and not req.marker.evaluate({"extra": ""}):
            continue
        try:
            installed = metadata.version(req.name)
        except metadata.PackageNotFoundError:
            extra = (
                " (sglang-launch answers to SGLang's plugin module names, but it is not the "
                "sglang distribution)"
                if req.name.lower() == "sglang"
                else ""
            )
            problems.append(f"it requires {text}, which is not installed{extra}")
            continue
        if req.specifier and not req.specifier.contains(installed, prereleases=True):
            problems.append(f"it requires {text}, and {req.name} {installed} is installed")
    return problems


def _aliased(module: str) -> bool:
    """Whether the alias table of SGLang's names provides ``module`` (an aliased module that
    exists here, or a package on the way to one)."""
    from hooks.compat import translate_name
    from launchspec.compat import TABLE

    ours = translate_name(module, TABLE)
    if ours is not None:
        return module_exists(ours)
    return any(alias == module or alias.startswith(module + ".") for alias in TABLE.modules)


def _import_problems(tops: set[str], aliases_active: bool) -> list[str]:
    problems, seen = [], set()
    for path in _sources(tops):
        try:
            found = list(imports_in(path.read_text(encoding="utf-8")))
        except (OSError, SyntaxError, UnicodeDecodeError) as exc:
            problems.append(f"{path.name} cannot be read as Python source ({exc})")
            continue
        for module, line in found:
            if module in seen or module.split(".")[0] in tops:
                continue
            seen.add(module)
            if aliases_active and (module == "sglang" or module.startswith("sglang.")):
                if not _aliased(module):
                    problems.append(
                        f"{path.name}:{line} imports {module}, which neither sglang-launch nor "
                        f"its aliases of SGLang's names provide (SGLang's internals are not here)"
                    )
            elif not module_exists(module):
                problems.append(f"{path.name}:{line} imports {module}, which is not installed")
    return problems


def _pth_findings(dist: metadata.Distribution) -> tuple[list[str], list[str]]:
    problems, notes = [], []
    for path in dist.files or ():
        if path.suffix != ".pth":
            continue
        try:
            text = Path(str(dist.locate_file(path))).read_text(encoding="utf-8")
        except OSError:
            continue
        runs = [ln for ln in text.splitlines() if ln.startswith(("import ", "import\t"))]
        if not runs:
            continue
        if path.name.startswith("__editable__"):
            notes.append(f"installed in editable mode ({path.name} adds a finder at start-up)")
        else:
            problems.append(
                f"it installs {path.name}, which runs code at every interpreter start, whatever "
                f"the launcher decides"
            )
    return problems, notes


class _Inspector:
    """Per-distribution findings, each distribution read once."""

    def finding(
        self,
        runtime: str,
        kind: str,
        ep: EntryPoint,
        verdict: str,
        why: str,
        all_eps: list[EntryPoint],
    ) -> Finding:
        """The ``Finding`` of ``ep`` with ``verdict`` and what its distribution brings along."""
        version, problems, notes = self.inspect(ep, all_eps)
        return Finding(
            runtime,
            kind,
            ep.name,
            ep.value,
            ep.distribution,
            version,
            verdict,
            why,
            list(problems),
            list(notes),
        )

    def __init__(self, aliases_active: bool) -> None:
        self.aliases_active = aliases_active
        self.cache: dict[str | None, tuple[str | None, list[str], list[str]]] = {}

    def inspect(
        self, ep: EntryPoint, all_eps: list[EntryPoint]
    ) -> tuple[str | None, list[str], list[str]]:
        if ep.distribution not in self.cache:
            dist = _distribution(ep.distribution)
            if dist is None:
                self.cache[ep.distribution] = (None, [], ["its distribution's metadata is gone"])
            else:
                mine = [e for e in all_eps if e.distribution == ep.distribution]
                tops = _top_packages(dist, mine)
                pth_problems, notes = _pth_findings(dist)
                problems = (
                    _requirement_problems(dist)
                    + _import_problems(tops, self.aliases_active)
                    + pth_problems
                )
                self.cache[ep.distribution] = (dist.version, problems, notes)
        return self.cache[ep.distribution]


# -- verdicts ------------------------------------------------------------------------------------
def _platform_verdicts(
    spec: RuntimeSpec, environ: Mapping[str, str]
) -> tuple[list[tuple[EntryPoint, str, str]], set[str | None], str]:
    """``(entry point, verdict, why)`` for each platform entry point, the distributions that may
    ship the selected platform, and one sentence on the selection."""
    eps = sorted(
        entrypoints.entry_points(spec.platform_group), key=lambda e: (e.name, e.distribution or "")
    )
    var = spec.selector_env
    chosen = environ.get(var, "").strip()
    out: list[tuple[EntryPoint, str, str]] = []
    if chosen:
        if chosen.lower() in spec.explicit_builtins:
            why = f"{var}={chosen} selects the built-in {chosen.lower()!r}"
            return [(ep, "not considered", why) for ep in eps], set(), why
        matches = [ep for ep in eps if ep.name == chosen]
        for ep in eps:
            if ep in matches:
                out.append((ep, "selected", f"{var}={chosen}, if its activate() returns a class"))
            else:
                out.append((ep, "not considered", f"{var}={chosen} selects another"))
        if not matches:
            return out, set(), f"{var}={chosen} names no installed platform plugin: start-up stops"
        return out, {m.distribution for m in matches}, f"{var}={chosen}"
    allowed = (
        entrypoints.allowlist(spec.auto_allowlist_env, environ) if spec.auto_allowlist_env else None
    )
    admitted = []
    for ep in eps:
        if allowed is not None and ep.name not in allowed:
            out.append((ep, "skipped", f"{spec.auto_allowlist_env} does not name it"))
        elif ep.name.lower() in spec.reserved_names:
            out.append(
                (ep, "rejected", f"{ep.name!r} is reserved for a built-in platform: start-up stops")
            )
        else:
            admitted.append(ep)
    names = [ep.name for ep in admitted]
    for ep in admitted:
        if spec.reject_duplicate_names and names.count(ep.name) > 1:
            out.append((ep, "rejected", "another distribution uses the same name: start-up stops"))
        elif len(admitted) == 1:
            out.append(
                (
                    ep,
                    "selected",
                    "the only platform plugin: selected if its activate() returns a class, else the built-ins",
                )
            )
        else:
            out.append(
                (
                    ep,
                    "candidate",
                    f"one of {len(admitted)} activated: exactly one may return a class (else set {var})",
                )
            )
    if not admitted:
        return out, set(), "no platform plugin is admitted: a built-in platform is selected"
    if len(admitted) == 1:
        return (
            out,
            {admitted[0].distribution},
            f"automatic: {admitted[0].name!r} is the only candidate",
        )
    return (
        out,
        {ep.distribution for ep in admitted},
        f"automatic: {len(admitted)} candidates, decided by their activate()",
    )


def _norm(name: str | None) -> str | None:
    import re

    return re.sub(r"[-_.]+", "_", name).lower() if name else None


def _plugin_verdict(
    spec: RuntimeSpec,
    ep: EntryPoint,
    environ: Mapping[str, str],
    platform_dists: set[str | None],
    selected: set[str | None],
    names: list[str],
) -> tuple[str, str]:
    allowed = entrypoints.allowlist("SGLANG_PLUGINS", environ)
    if allowed is not None and ep.name not in allowed:
        return "skipped", "SGLANG_PLUGINS does not name it"
    if spec.reject_duplicate_names and names.count(ep.name) > 1:
        return "rejected", "another distribution uses the same plugin name: none of them loads"
    dist = _norm(ep.distribution)
    if dist in platform_dists:
        explicit = (
            spec.plugin_exclusion_env is None or environ.get(spec.plugin_exclusion_env, "").strip()
        )
        if explicit and selected and dist not in selected:
            return "skipped", "its distribution ships a platform that is not the selected one"
        if explicit and not selected:
            return "skipped", "its distribution ships a platform, and a built-in is selected"
        if len(selected) > 1 and dist in selected:
            return "loaded", "if its distribution's platform is the one selected (else skipped)"
    return "loaded", "admitted"


def check(environ: Mapping[str, str] | None = None) -> dict[str, Any]:
    """The report (see the module docstring) for ``environ`` (default: this process's)."""
    from hooks.compat import real_sglang_installed

    environ = os.environ if environ is None else environ
    real = real_sglang_installed()
    inspector = _Inspector(aliases_active=not real)
    all_eps = [ep for group in entrypoints.GROUPS for ep in entrypoints.entry_points(group)]
    runtimes = []
    for spec in RUNTIMES.values():
        findings: list[Finding] = []
        verdicts, selected_dists, selection = _platform_verdicts(spec, environ)
        selected = {_norm(d) for d in selected_dists}
        platform_dists = {_norm(ep.distribution) for ep, _, _ in verdicts if ep.distribution}
        for ep, verdict, why in verdicts:
            findings.append(inspector.finding(spec.name, "platform", ep, verdict, why, all_eps))
        plugin_eps = sorted(
            entrypoints.entry_points(spec.plugin_group),
            key=lambda e: (e.name, e.distribution or ""),
        )
        names = [ep.name for ep in plugin_eps]
        for ep in plugin_eps:
            verdict, why = _plugin_verdict(spec, ep, environ, platform_dists, selected, names)
            findings.append(inspector.finding(spec.name, "plugin", ep, verdict, why, all_eps))
        blocking = [
            f
            for f in findings
            if f.incompatible
            and _norm(f.distribution) in selected
            and f.verdict in ("selected", "candidate", "loaded")
        ]
        runtimes.append(
            {
                "runtime": spec.name,
                "selection": selection,
                "findings": [asdict(f) | {"incompatible": f.incompatible} for f in findings],
                "blocking": [f"{f.kind} {f.name} ({f.distribution})" for f in blocking],
            }
        )
    try:
        real_version = metadata.version("sglang") if real else None
    except metadata.PackageNotFoundError:
        real_version = None
    sglang = {
        "installed": real,
        "version": real_version,
        "aliased": not real,
        "note": (
            f"a real sglang{' ' + real_version if real_version else ''} is importable: nothing is "
            f"aliased, SGLang's names mean its own code"
            if real
            else "sglang is not installed: SGLang's plugin module paths and hook targets resolve "
            "to sglang-launch's own (docs/plugins.md, Plugins written for SGLang)"
        ),
    }
    return {"runtimes": runtimes, "sglang": sglang, "ok": not any(r["blocking"] for r in runtimes)}
