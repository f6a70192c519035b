"""Plugin loading for one runtime, described as data; SRT and diffusion are two instances.

A ``PluginRuntime`` owns a hook registry and two once-per-process phases:

* **register**: read the runtime's hook entry points (``platforms.entrypoints``; sorted by
  entry-point name, then distribution, so hook order is the same on every machine), keep those
  that ``SGLANG_PLUGINS`` allows, skip those shipped by an installed platform distribution other
  than the selected one, then import each plugin and run its callback with the plugin recorded
  as the source of every hook it registers. No hook target is resolved.
* **apply**: run *register* if it has not run, then ``registry.apply_hooks()``.

Failures: a plugin shipped in the selected platform's distribution is part of that platform's
contract, so failing to import it, to run its callback or to apply a hook it registered raises
``PluginError`` naming it, chained to the cause. Any other plugin's failure is logged at WARNING
with its name and traceback, its hooks are discarded, and the rest proceed.

Phases: each runs at most once per process (``platforms.once.ProcessOnce``): another thread waits
for the running call, a failure is terminal and re-raised to later callers, a forked child starts
over. Before a plugin's callback runs again (in a forked child, whose registry holds what the
parent's run registered and applied), the hooks that callback registered last time are discarded
and their targets restored, so each ends up applied once. A call made from inside any phase of
the same runtime in the same thread (a plugin callback calling ``load_plugins()``) returns at
once and lets the outer call finish, so hooks are never applied half registered. A later call of
the apply phase applies the hooks registered since it ran (each hook is applied once), logged at
INFO.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib
import logging
import os
import re
import threading
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ._core import HookError, PluginError, PluginSource, Registry, plugin_source

if TYPE_CHECKING:
    from platforms import Selection
    from platforms.entrypoints import EntryPoint
    from platforms.once import ProcessOnce
    from platforms.runtimes import RuntimeSpec

logger = logging.getLogger("hooks")

# One hook registry and one plugin runtime per runtime of ``platforms.runtimes``, keyed by its
# name. Registries exist from import (plugins register into them); a runtime's loading rules are
# read from its record on first use, so importing ``hooks`` imports nothing of ``platforms``.
REGISTRIES: dict[str, Registry] = {}
RUNTIMES: dict[str, PluginRuntime] = {}
_building = threading.Lock()


def registry_of(name: str) -> Registry:
    """The hook registry of runtime ``name`` (made on first use)."""
    with _building:
        if name not in REGISTRIES:
            REGISTRIES[name] = Registry(name)
        return REGISTRIES[name]


def runtime_of(name: str) -> PluginRuntime:
    """The ``PluginRuntime`` of runtime ``name``, built from its ``platforms.runtimes`` record;
    ``ValueError`` names the known runtimes."""
    from platforms.runtimes import runtime_spec

    spec = runtime_spec(name)  # ValueError for an unknown name
    registry = registry_of(name)
    with _building:
        if name not in RUNTIMES:
            RUNTIMES[name] = PluginRuntime(spec, registry)
        return RUNTIMES[name]


def all_runtimes() -> list[PluginRuntime]:
    """Every runtime's ``PluginRuntime``, in the order of ``platforms.runtimes.RUNTIMES``."""
    from platforms.runtimes import RUNTIMES as SPECS

    return [runtime_of(name) for name in SPECS]


def _version(distribution: str | None) -> str | None:
    """The installed version of ``distribution`` (None when unknown)."""
    if not distribution:
        return None
    from importlib import metadata

    try:
        return metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return None


def _norm(distribution: str | None) -> str | None:
    return re.sub(r"[-_.]+", "_", distribution).lower() if distribution else None


class DuplicatePluginError(HookError):
    """Two admitted plugins of one runtime share an entry-point name (diffusion forbids it);
    ``names`` lists the clashing names. Raised before any plugin is imported."""

    def __init__(self, message: str, *, names: list[str]) -> None:
        super().__init__(message)
        self.names = names


# What can happen to an installed plugin entry point in a process: the one set of statuses
# that ``manifest()``, ``describe()`` and the workers' manifests report.
LOADED, FAILED, NOT_ALLOWED, SKIPPED, NOT_RUN = (
    "loaded",
    "failed",
    "not allowed",
    "skipped",
    "not run",
)
STATUSES = (LOADED, FAILED, NOT_ALLOWED, SKIPPED, NOT_RUN)


@dataclass(frozen=True)
class PluginRecord:
    """One installed general plugin entry point of a runtime and what happened to it in this
    process, the one record ``outcomes``, ``manifest()`` and ``describe()`` hold: ``status`` is one
    of ``STATUSES`` (``not run``: registration never reached it), ``detail`` the reason."""

    name: str
    group: str
    value: str
    distribution: str | None
    version: str | None
    status: str
    detail: str = ""

    @classmethod
    def of(cls, ep: EntryPoint | PluginSource, status: str, detail: str = "") -> PluginRecord:
        """``ep``'s record with ``status`` (its version is read when it is reported)."""
        return cls(ep.name, ep.group, ep.value, ep.distribution, None, status, detail)

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "group": self.group,
            "value": self.value,
            "distribution": self.distribution,
            "version": self.version,
            "status": self.status,
            "detail": self.detail,
        }


class PluginRuntime:
    """One runtime's plugin loading (see the module docstring), ruled by its ``RuntimeSpec``:
    its groups, where its selection lives, how unselected platform packages are known
    (``plugin_exclusion_env``: the variable that, when set, names the selected platform by
    entry-point name, so they are known from metadata alone; None: always, by the resolved
    selection's distribution) and whether two plugins may share a name."""

    def __init__(self, spec: RuntimeSpec, registry: Registry) -> None:
        self.spec = spec
        self.name = spec.name
        # Two admitted plugins of one name stop loading before either is imported (diffusion).
        self.unique_names = spec.reject_duplicate_names
        self.plugin_group = spec.plugin_group
        self.platform_group = spec.platform_group
        self.selection_module = spec.platform_module
        self.exclusion_selector = spec.plugin_exclusion_env
        self.registry = registry
        registry.required_policy = self.is_required
        registry.without_hint = self.without
        self.outcomes: dict[tuple[str, str | None], PluginRecord] = {}
        self._phases: dict[str, ProcessOnce] | None = None
        self._phases_lock = threading.Lock()
        self._inside = threading.local()
        self._assumed_selection: tuple[str | None] | None = None  # (distribution,) while assumed
        self._callback_marks: dict[PluginSource, int] = {}  # registry.last_seq before each callback
        self._stopped: BaseException | None = None  # what ended this process's registration

    # -- phases -------------------------------------------------------------------------------
    def register_plugins(self) -> None:
        """Discover, filter and run this runtime's plugin callbacks, once per process."""
        self._enter("register", self._register)

    def apply_plugin_hooks(self) -> None:
        """Register plugins if that has not happened, then apply every hook, once per process."""
        self._enter("apply", self._apply)

    def _phase(self, which: str) -> ProcessOnce:
        if self._phases is None:
            from platforms.once import ProcessOnce  # lazily: hooks imports no platforms at import

            with self._phases_lock:
                if self._phases is None:
                    self._phases = {
                        "register": ProcessOnce(f"{self.name} plugin registration"),
                        "apply": ProcessOnce(f"{self.name} hook application"),
                    }
        phases: dict[str, ProcessOnce] = self._phases
        return phases[which]

    def _enter(self, which: str, body: Callable[[], None]) -> None:
        if getattr(self._inside, "depth", 0):
            return  # re-entrant: called from a callback; the outer phase finishes the work
        self._inside.depth = 1
        try:
            if not self._phase(which).run(body) and which == "apply":
                self._apply_late()
        finally:
            self._inside.depth = 0

    def _apply(self) -> None:
        self._phase("register").run(self._register)
        self.registry.apply_hooks()

    def _apply_late(self) -> None:
        """The apply phase ran already: apply the hooks registered since (never one twice)."""
        pending = self.registry.pending()
        if pending:
            logger.info(
                "applying %d %s hook(s) registered after hooks were applied: %s",
                len(pending),
                self.name,
                "; ".join(map(str, pending)),
            )
            self.registry.apply_hooks()

    def _register(self) -> None:
        self._stopped = None  # a forked child registers afresh
        try:
            self._run_callbacks()
        except BaseException as exc:
            self._stopped = exc
            raise

    def _run_callbacks(self) -> None:
        for source, callback in self._load(self.excluded_distributions()):
            if (
                source in self._callback_marks
            ):  # a forked child: drop the parent's run of this callback
                self.registry.discard(source, after=self._callback_marks[source])
            self._callback_marks[source] = self.registry.last_seq
            with plugin_source(source):
                try:
                    callback()
                except Exception as exc:  # noqa: BLE001 - a plugin's failure is judged below
                    self._failed(source, "run its callback", exc)
                    continue
            self.outcomes[(source.name, source.distribution)] = PluginRecord.of(source, LOADED)

    # -- discovery and filtering --------------------------------------------------------------
    def entry_points(self, group: str | None = None) -> list[EntryPoint]:
        from platforms import entrypoints

        eps = entrypoints.entry_points(group or self.plugin_group)
        return sorted(eps, key=lambda ep: (ep.name, ep.distribution or ""))

    def allowlist(self) -> frozenset[str] | None:
        from platforms import entrypoints

        return entrypoints.allowlist("SGLANG_PLUGINS")

    def selector_env(self) -> str:
        """The variable that selects this runtime's platform."""
        return self.spec.selector_env

    def selection(self, probe: bool = True) -> Selection:
        """The runtime's platform selection (resolving it if nothing has yet); ``probe=False`` as
        in ``platforms.current_selection`` (raises ``platforms.ProbeRequired`` where only a
        hardware probe could decide)."""
        return importlib.import_module(self.selection_module).current_selection(probe)

    def construct_platform(self) -> None:
        """Construct the selected platform through ``current_platform``, as every launch does
        before a worker starts, so that a class that cannot be this runtime's platform (not
        importable, not a subclass of the base, a bad ``_enum`` or device name, a constructor
        that raises) raises its ``PlatformSelectionError`` here. Resolves the selection first,
        probing where it must."""
        importlib.import_module(self.selection_module).current_platform.device_type  # noqa: B018

    def selected_distribution(self) -> str | None:
        """The distribution that ships the selected platform (None for a built-in)."""
        if self._assumed_selection is not None:
            return self._assumed_selection[0]
        return self.selection().distribution

    @contextlib.contextmanager
    def assume_selected_distribution(self, distribution: str | None) -> Iterator[None]:
        """Take ``distribution`` as the selected platform's (None: a built-in) instead of
        resolving the selection (``describe`` without hardware probes)."""
        self._assumed_selection = (distribution,)
        try:
            yield
        finally:
            self._assumed_selection = None

    def excluded_distributions(self) -> set[str | None]:
        """Normalised names of the platform distributions whose plugins are skipped."""
        providers = {
            _norm(ep.distribution)
            for ep in self.entry_points(self.platform_group)
            if ep.distribution
        }
        if not providers:
            return set()
        if self.exclusion_selector is not None:
            chosen = os.environ.get(self.exclusion_selector, "").strip()
            if not chosen:
                return set()
            selected = {
                _norm(ep.distribution)
                for ep in self.entry_points(self.platform_group)
                if ep.name == chosen
            }
        else:
            selected = {_norm(self.selected_distribution())}
        return providers - selected

    def _load(self, excluded: set[str | None]) -> list[tuple[PluginSource, Callable[[], object]]]:
        """Import every admitted plugin; returns ``(source, callback)`` pairs, in order."""
        allowed = self.allowlist()
        self._warn_unknown_allowlist(allowed)
        admitted = []
        for ep in self.entry_points():
            key = (ep.name, ep.distribution)
            if allowed is not None and ep.name not in allowed:
                self.outcomes[key] = PluginRecord.of(ep, NOT_ALLOWED, "not named in SGLANG_PLUGINS")
                logger.debug(
                    "plugin %r (%s) is not in SGLANG_PLUGINS; skipped", ep.name, ep.distribution
                )
                continue
            if _norm(ep.distribution) in excluded:
                self.outcomes[key] = PluginRecord.of(
                    ep, SKIPPED, "its distribution ships a platform that is not selected"
                )
                logger.info(
                    "plugin %r skipped: %s ships a %s platform that is not the selected one",
                    ep.name,
                    ep.distribution,
                    self.name,
                )
                continue
            admitted.append(ep)
        if self.unique_names:
            self._reject_duplicates(admitted)
        loaded = []
        for ep in admitted:
            source = PluginSource(ep.name, ep.distribution, ep.group, ep.value)
            with plugin_source(source):
                try:
                    callback = ep.load()
                    if not callable(callback):
                        raise TypeError(
                            f"entry point {ep.value!r} names {callback!r}, which is not callable; "
                            "point it at a zero-argument function"
                        )
                except Exception as exc:  # noqa: BLE001 - a plugin's failure is judged below
                    self._failed(source, "load", exc)
                    continue
            # Hooks its module registered when something else imported it first are its own.
            self.registry.adopt(ep.module, source)
            loaded.append((source, callback))
        return loaded

    def _reject_duplicates(self, admitted: list[Any]) -> None:
        """Two admitted plugins of one name: ``DuplicatePluginError`` naming both distributions,
        before either is imported (as SGLang does for diffusion)."""
        by_name: dict[str, list] = {}
        for ep in admitted:
            by_name.setdefault(ep.name, []).append(ep)
        clashes = {name: eps for name, eps in by_name.items() if len(eps) > 1}
        if not clashes:
            return
        for eps in clashes.values():
            for ep in eps:
                self.outcomes[(ep.name, ep.distribution)] = PluginRecord.of(
                    ep,
                    FAILED,
                    "another installed distribution uses the same plugin name; none of them loaded",
                )
        parts = [
            f"{name!r} is shipped by "
            + " and ".join(repr(ep.distribution or "an unknown distribution") for ep in eps)
            for name, eps in clashes.items()
        ]
        raise DuplicatePluginError(
            f"{self.name} plugin names must be unique in {self.plugin_group!r}: {'; '.join(parts)}. No "
            f"plugin was imported; uninstall all but one of those distributions, or leave the name out "
            f"of SGLANG_PLUGINS",
            names=sorted(clashes),
        )

    def _warn_unknown_allowlist(self, allowed: frozenset[str] | None) -> None:
        if not allowed:
            return
        from platforms import entrypoints

        known = {ep.name for group in entrypoints.GROUPS for ep in entrypoints.entry_points(group)}
        unknown = sorted(allowed - known)
        if unknown:
            logger.warning(
                "SGLANG_PLUGINS names %s, which no installed plugin provides; installed: %s",
                ", ".join(unknown),
                ", ".join(sorted(known)) or "none",
            )

    # -- failure policy -----------------------------------------------------------------------
    def is_required(self, source: PluginSource) -> bool:
        """True when ``source`` ships in the selected platform's distribution (its failure
        aborts). Resolves the selection only for distributions that provide a platform."""
        dist = _norm(source.distribution)
        if dist is None:
            return False
        if dist not in {_norm(ep.distribution) for ep in self.entry_points(self.platform_group)}:
            return False
        try:
            selected = self.selected_distribution()
        except Exception as exc:  # noqa: BLE001 - selection reports its own error where it is used
            logger.debug(
                "cannot tell whether %s is required: platform selection failed: %s", source, exc
            )
            return False
        return _norm(selected) == dist

    def _failed(self, source: PluginSource, stage: str, error: Exception) -> None:
        self.registry.discard(
            source, because=f"its plugin failed to {stage}: {type(error).__name__}: {error}"
        )
        self.outcomes[(source.name, source.distribution)] = PluginRecord.of(
            source, FAILED, f"failed to {stage}: {type(error).__name__}: {error}"
        )
        if self.is_required(source):
            raise PluginError(
                f"{source} failed to {stage}: {type(error).__name__}: {error}. It ships in the selected "
                f"{self.name} platform's distribution, so start-up stops; fix or reinstall "
                f"{source.distribution}, or start without this plugin: {self.without(source.name)}",
                plugin=source.name,
                distribution=source.distribution,
            ) from error
        logger.warning(
            "%s failed to %s; its hooks are discarded and start-up continues",
            source,
            stage,
            exc_info=error,
        )

    def without(self, name: str) -> str:
        """The variables that start without general plugin ``name`` and keep the selected
        platform, as ``VAR=value`` words with a reason: ``SGLANG_PLUGINS`` naming every other
        plugin it admits now (of both hook groups; ``,`` admits none), and, where that variable
        also narrows automatic platform selection and nothing selects explicitly, the selector
        naming the selected platform, which the list would otherwise leave out of discovery."""
        from platforms import entrypoints

        allowed = self.allowlist()
        others = sorted(
            {
                ep.name
                for group in entrypoints.GROUPS
                if group.endswith(".plugins")
                for ep in entrypoints.entry_points(group)
                if ep.name != name and (allowed is None or ep.name in allowed)
            }
        )
        words = [f"SGLANG_PLUGINS={','.join(others) or ','}"]
        why = "" if others else " (',' admits no plugin)"
        spec = self.spec
        if spec.auto_allowlist_env and not os.environ.get(spec.selector_env, "").strip():
            platform = self._selected_entry_point_name()
            if platform is not None:
                words.insert(0, f"{spec.selector_env}={platform}")
                why += (
                    f"; {spec.selector_env} keeps the platform, which {spec.auto_allowlist_env} "
                    f"alone would leave out of automatic selection"
                )
        return " ".join(words) + why

    def _selected_entry_point_name(self) -> str | None:
        """The entry-point name of the selected platform plugin (None: a built-in, or unknown)."""
        try:
            distribution = self.selected_distribution()
        except Exception:  # noqa: BLE001 - a hint only; selection reports its own error
            return None
        if self._assumed_selection is None:
            try:
                ep = self.selection().entry_point
            except Exception:  # noqa: BLE001
                ep = None
            if ep is not None:
                return ep.name
        names = sorted(
            ep.name
            for ep in self.entry_points(self.platform_group)
            if distribution and _norm(ep.distribution) == _norm(distribution)
        )
        return names[0] if names else None

    # -- what this process has -------------------------------------------------------------------
    def records(self) -> list[PluginRecord]:
        """Each installed entry point of this runtime's hook group and what happened to it
        here, in loading order; one without an outcome is ``not run``, saying why."""
        if self._stopped is not None:
            plugin = getattr(self._stopped, "plugin", None)
            at = f" at plugin {plugin!r}" if plugin else ""
            not_run = f"plugin registration stopped before it{at} ({type(self._stopped).__name__})"
        else:
            not_run = "plugin registration has not run in this process"
        records = []
        for ep in self.entry_points():
            record = self.outcomes.get((ep.name, ep.distribution)) or PluginRecord.of(
                ep, NOT_RUN, not_run
            )
            records.append(dataclasses.replace(record, version=_version(ep.distribution)))
        return records

    def manifest(self) -> dict[str, Any]:
        """What this process really has of this runtime's general plugins, as plain data:
        ``plugins`` (``records()``: each installed entry point of the hook group, its
        ``status`` and its ``detail``) and ``hooks`` (``registry.records()``: each hook's target,
        type, plugin, state and error)."""
        return {
            "runtime": self.name,
            "plugins": [record.to_dict() for record in self.records()],
            "hooks": self.registry.records(),
        }

    # -- the public load_plugins_by_group -----------------------------------------------------
    def load_group(self, excluded_dists: Iterable[str] | None = None) -> dict[str, object]:
        """Import this runtime's admitted plugins without running them: ``{name: callback}``.

        ``excluded_dists`` overrides the computed set of skipped distributions. A plugin whose
        name another distribution also uses is keyed ``"name (distribution)"``.
        """
        excluded = (
            self.excluded_distributions()
            if excluded_dists is None
            else {_norm(d) for d in excluded_dists}
        )
        out: dict[str, object] = {}
        for source, callback in self._load(excluded):
            key = (
                source.name if source.name not in out else f"{source.name} ({source.distribution})"
            )
            out[key] = callback
        return out
