"""``sglang-launch plugins --check``: what each installed plugin will do, without running it.

Everything here is read from metadata and source, never imported: each distribution's entry
points, its ``Requires-Dist``, its modules' source (parsed with ``ast``) and its ``RECORD``. For
every platform and general plugin of both runtimes the report says:

- the verdict: the platform that would be selected (or the candidates, when only their
  ``activate()`` can decide), a general plugin that would load, or what skips it
  (``SGLANG_PLUGINS``, a platform distribution that is not the selected one, a name another
  distribution also uses, a name reserved for a built-in platform);
- what makes it incompatible here: a ``Requires-Dist`` this environment does not satisfy (an
  ``sglang`` pin that the aliased plugin surface's version does not meet, say); an import that
  running the entry point reaches (``launcher.plugin_imports``: its module and the packages
  above it, what they import, its callback's body and what that calls, and for a platform the
  class its ``activate()`` names) of a module that neither this project, its alias table of
  SGLang's names (``launchspec.compat``), nor any installed package provides (an import guarded
  by ``try``/``except ImportError`` is the plugin's own fallback and is not counted); a ``.pth``
  file it installs that runs code at every interpreter start. An entry point is blamed only for
  what its own code reaches, never for another entry point's package of its distribution.

``check(environ)`` returns the report as plain data; ``main`` of ``launcher.commands.plugins``
prints it.
"""

from __future__ import annotations

import importlib.metadata as metadata
import importlib.util
import os
import sys
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from launcher import plugin_imports
from platforms import entrypoints
from platforms.entrypoints import EntryPoint
from platforms.runtimes import RUNTIMES, RuntimeSpec


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


# -- one distribution --------------------------------------------------------------------------
def _distribution(name: str | None) -> metadata.Distribution | None:
    if not name:
        return None
    try:
        return metadata.distribution(name)
    except metadata.PackageNotFoundError:
        return None


def _top_packages(dist: metadata.Distribution, eps: Iterable[EntryPoint]) -> set[str]:
    """The distribution's top-level package and module names (its ``RECORD``, and its entry
    points' modules for a distribution installed without one)."""
    tops = {ep.module.split(".")[0] for ep in eps}
    for path in dist.files or ():
        first = path.parts[0] if path.parts else ""
        if path.suffix == ".py" and first and not first.endswith((".dist-info", ".egg-info")):
            tops.add(first[:-3] if first.endswith(".py") else first)
    return {t for t in tops if t.isidentifier()}


def _requirement_problems(
    dist: metadata.Distribution, aliases_active: bool
) -> tuple[list[str], list[str]]:
    """What the distribution's ``Requires-Dist`` asks that this environment lacks, and notes. A
    requirement on ``sglang`` where SGLang's names are aliased is held against the SGLang
    version whose plugin surface the aliases provide (``launchspec.compat.SGLANG_VERSION``)."""
    from packaging.requirements import InvalidRequirement, Requirement

    from launchspec.compat import SGLANG_VERSION

    problems, notes = [], []
    for text in dist.requires or ():
        try:
            req = Requirement(text)
        except InvalidRequirement:
            problems.append(f"its Requires-Dist {text!r} cannot be parsed")
            continue
        if req.marker is not None and not req.marker.evaluate({"extra": ""}):
            continue
        if aliases_active and req.name.lower() == "sglang":
            surface = f"sglang-launch provides SGLang {SGLANG_VERSION}'s plugin surface, not SGLang itself"
            if req.specifier.contains(SGLANG_VERSION, prereleases=True):
                notes.append(f"it requires {text}: {surface}")
            else:
                problems.append(f"it requires {text}, and {surface}")
            continue
        try:
            installed = metadata.version(req.name)
        except metadata.PackageNotFoundError:
            problems.append(f"it requires {text}, which is not installed")
            continue
        if req.specifier and not req.specifier.contains(installed, prereleases=True):
            problems.append(f"it requires {text}, and {req.name} {installed} is installed")
    return problems, notes


def _aliased(module: str) -> bool:
    """Whether the alias table of SGLang's names provides ``module`` (an aliased module that
    exists here, or a package on the way to one)."""
    from hooks.compat import translate_name
    from launchspec.compat import TABLE

    ours = translate_name(module, TABLE)
    if ours is not None:
        return module_exists(ours)
    return any(alias == module or alias.startswith(module + ".") for alias in TABLE.modules)


def _import_problems(
    ep: EntryPoint, package: plugin_imports.Package, platform: bool, aliases_active: bool
) -> list[str]:
    """What running ``ep`` imports that nothing here provides (``launcher.plugin_imports``)."""

    def provided(module: str) -> bool:
        if aliases_active and (module == "sglang" or module.startswith("sglang.")):
            return _aliased(module)
        return package.owns(module) or module_exists(module)

    found, unreadable = plugin_imports.reached(ep, package, platform)
    problems, seen = list(unreadable), set()
    for imp in found:
        if imp.module in seen or provided(imp.module):
            continue
        if imp.alternatives and all(provided(alt) for alt in imp.alternatives):
            continue  # the fallback of an import that works here: never runs
        seen.add(imp.module)
        if aliases_active and (imp.module == "sglang" or imp.module.startswith("sglang.")):
            problems.append(
                f"{imp.where} imports {imp.module}, which sglang-launch does not provide: it "
                f"provides SGLang's plugin surface only, not SGLang's internals"
            )
        else:
            problems.append(f"{imp.where} imports {imp.module}, which is not installed")
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
    """Findings: what each distribution brings along (read once per distribution) and what each
    entry point's own code imports (``_import_problems``)."""

    def __init__(self, aliases_active: bool) -> None:
        self.aliases_active = aliases_active
        self.cache: dict[str | None, _Shipped] = {}

    def finding(
        self,
        runtime: str,
        kind: str,
        ep: EntryPoint,
        verdict: str,
        why: str,
        all_eps: list[EntryPoint],
    ) -> Finding:
        """The ``Finding`` of ``ep`` with ``verdict``: its distribution's problems and notes, and
        the imports its own code reaches."""
        shipped = self.shipped(ep, all_eps)
        problems = list(shipped.problems)
        if shipped.package is not None:
            problems += _import_problems(
                ep, shipped.package, kind == "platform", self.aliases_active
            )
        return Finding(
            runtime,
            kind,
            ep.name,
            ep.value,
            ep.distribution,
            shipped.version,
            verdict,
            why,
            problems,
            list(shipped.notes),
        )

    def shipped(self, ep: EntryPoint, all_eps: list[EntryPoint]) -> _Shipped:
        if ep.distribution not in self.cache:
            dist = _distribution(ep.distribution)
            if dist is None:
                self.cache[ep.distribution] = _Shipped(
                    None, [], ["its distribution's metadata is gone"], None
                )
            else:
                mine = [e for e in all_eps if e.distribution == ep.distribution]
                tops = _top_packages(dist, mine)
                pth_problems, pth_notes = _pth_findings(dist)
                requirement_problems, requirement_notes = _requirement_problems(
                    dist, self.aliases_active
                )
                self.cache[ep.distribution] = _Shipped(
                    dist.version,
                    requirement_problems + pth_problems,
                    requirement_notes + pth_notes,
                    plugin_imports.Package(tops),
                )
        return self.cache[ep.distribution]


@dataclass
class _Shipped:
    """What one distribution brings along, whichever of its entry points runs."""

    version: str | None
    problems: list[str]
    notes: list[str]
    package: plugin_imports.Package | None


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
