"""``describe(runtime)``: what is installed for one runtime and what would happen at start-up.

The report is plain JSON-able data for ``sglang-launch plugins``. Producing it selects the
runtime's platform and constructs its class as start-up would, through the same call
(``PluginRuntime.construct_platform``: activation callbacks run, and a class a launch refuses is
reported as that error), and runs the plugin registration phase (plugin callbacks run; no hook
target is resolved, so nothing of the serving runtime is imported). Each of those may be bounded
by a timeout: plugin code that does not return in time is reported as stuck, naming the plugin. Built-in platforms are found by probing hardware, which imports torch; unless asked to
``probe``, the report stops where probing would start and says which built-ins would be probed,
in order. Errors are reported, never raised.
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

from ._core import PluginSource, _defined_in
from ._loader import PluginRuntime, _norm

if TYPE_CHECKING:
    from platforms import Selection


def _error_text(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"


@dataclass
class _Resolved:
    """What the report learnt of the platform a launch would select.

    ``entry`` is the report's ``selection``; ``selected`` the selection, when it was made and its
    class constructed (None after an error, or where only a hardware probe could decide);
    ``distribution`` the selected platform's distribution as known without probing, in a 1-tuple
    (``(None,)`` for a built-in), None when unknown; ``stuck`` says which plugin code did not
    return within the report's timeout (the report then runs no more plugin code of this runtime).
    """

    entry: dict[str, Any]
    selected: Selection | None = None
    distribution: tuple[str | None] | None = None
    stuck: str | None = None


def _resolve(runtime: PluginRuntime, probe: bool, timeout: float | None) -> _Resolved:
    """Select the platform and construct its class exactly as a launch does (through
    ``current_platform``), so a class a launch would refuse is reported as the error it is."""
    from platforms import ProbeRequired

    try:
        sel = _bounded(lambda: runtime.selection(probe=probe), timeout)
    except ProbeRequired as need:
        probed = list(need.builtins)
        if need.serving_fallback:  # what a launch does at the chain's end
            probed[-1] = f"{need.serving_fallback} (a server's stand-in for {probed[-1]})"
        entry = {
            "key": None,
            "qualname": None,
            "distribution": None,
            "probed": probed,
            "reason": f"{need.reason}; start-up probes the built-ins in this order and takes the first "
            f"available: {', '.join(probed)} (probing imports torch: pass --probe to run it now)",
        }
        return _Resolved(entry, distribution=(None,))
    except _Stuck as stuck:
        return _Resolved({"error": stuck.text}, stuck=stuck.text)
    except Exception as exc:  # noqa: BLE001 - reported, not raised
        return _Resolved({"error": _error_text(exc)})
    try:
        _bounded(runtime.construct_platform, timeout)
    except _Stuck as stuck:
        return _Resolved({"error": stuck.text}, stuck=stuck.text)
    except Exception as exc:  # noqa: BLE001 - a launch stops here (exit 5): so does the report
        return _Resolved({"error": _error_text(exc)}, distribution=(sel.distribution,))
    import importlib

    entry = {
        "key": sel.key,
        "qualname": sel.qualname,
        "distribution": sel.distribution,
        "reason": sel.reason,
        # What print(current_platform) shows in a process that selects as a launch does.
        "current_platform": str(importlib.import_module(runtime.selection_module).current_platform),
    }
    return _Resolved(entry, sel, (sel.distribution,))


class _Stuck(Exception):
    """Plugin code the report ran did not return in time; ``text`` says which and for how long."""

    def __init__(self, text: str) -> None:
        super().__init__(text)
        self.text = text


_T = TypeVar("_T")


def _bounded(fn: Callable[[], _T], timeout: float | None) -> _T:
    """``fn()``, or ``_Stuck`` when it does not return within ``timeout`` seconds (None: no
    bound). It runs in a daemon thread, which is left behind when stuck: plugin code cannot be
    interrupted, and the report does not wait for it."""
    if timeout is None:
        return fn()
    done: list[_T] = []
    failed: list[BaseException] = []

    def run() -> None:
        try:
            done.append(fn())
        except BaseException as exc:  # noqa: BLE001 - handed to the caller's thread
            failed.append(exc)

    thread = threading.Thread(target=run, name="sglang-plugins-report", daemon=True)
    thread.start()
    thread.join(timeout)
    if thread.is_alive():
        what = _running_plugin_code(thread) or "plugin code"
        raise _Stuck(
            f"{what} did not return within {timeout:g}s (the report's limit: sglang-launch plugins "
            "--timeout SECONDS); a launch would wait for it as long"
        )
    if failed:
        raise failed[0]
    return done[0]


def _running_plugin_code(thread: threading.Thread) -> str | None:
    """Which plugin callback ``thread`` is in, read from its innermost frames: a platform's
    ``activate()``, a platform class's construction, or a general plugin's callback."""
    from platforms import Selection
    from platforms.entrypoints import EntryPoint

    frame = sys._current_frames().get(thread.ident or -1)
    while frame is not None:
        name, local = frame.f_code.co_name, frame.f_locals
        ep, selection, source = local.get("ep"), local.get("selection"), local.get("source")
        if name == "_call_activate" and isinstance(ep, EntryPoint):
            return f"activate() of platform plugin {ep.describe()}"
        if name == "instantiate" and isinstance(selection, Selection):
            return f"constructing platform class {selection.qualname}"
        if name in ("_register", "_load") and isinstance(source, PluginSource):
            return f"plugin {source.name!r} ({source.distribution})"
        frame = frame.f_back
    return None


def _platform_filter(runtime: PluginRuntime) -> dict | None:
    """The variable that narrows automatic platform selection (SRT: ``SGLANG_PLUGINS``) and whether
    it applies now (not while the selector variable names a platform); None for a runtime without."""
    spec = runtime.spec
    if not spec.auto_allowlist_env:
        return None
    return {
        "variable": spec.auto_allowlist_env,
        "applies": not os.environ.get(spec.selector_env, "").strip(),
    }


def _registered_by(module: str | None) -> str:
    """Who registered a hook of no plugin defined in ``module``: the installed entry point (of
    any group) whose module is it or its package, else the module itself."""
    from platforms import entrypoints

    if module is None:
        return "a hook that names no module, registered outside any plugin"
    best = None
    for group in entrypoints.GROUPS:
        for ep in entrypoints.entry_points(group):
            if module == ep.module or module.startswith(ep.module + "."):
                if best is None or len(ep.module) > len(best.module):
                    best = ep
    if best is not None:
        kind = "platform" if group_is_platform(best.group) else "plugin"
        return f"module {module}, imported by {kind} entry point {best.describe()} ({best.group})"
    return f"module {module}, outside any plugin (imported by the application or another module)"


def group_is_platform(group: str) -> bool:
    """Whether ``group`` is a platform entry-point group (of either runtime)."""
    return group.endswith(".platforms")


def describe(runtime: PluginRuntime, probe: bool = False, timeout: float | None = None) -> dict:
    """The report on ``runtime`` (see the module docstring); ``probe`` allows hardware probes;
    ``timeout`` bounds each piece of plugin code the report runs (activation, the platform class's
    construction, plugin registration): one that does not return in time is reported as stuck."""
    resolved = _resolve(runtime, probe, timeout)
    selection, sel = resolved.entry, resolved.selected
    allowed = runtime.allowlist()
    # Without probing, the selection found above stands for the process's own (a preview is not
    # remembered, and resolving again could probe).
    assumed = (
        runtime.assume_selected_distribution(resolved.distribution[0])
        if resolved.distribution is not None and not probe
        else contextlib.nullcontext()
    )
    excluded: set[str | None] = set()
    exclusion_error = registration_error = None
    if resolved.stuck:  # what is stuck may hold the selection: run nothing more of this runtime
        registration_error = "not run: the platform selection did not finish"
    else:
        with assumed:
            try:
                excluded = runtime.excluded_distributions()
            except Exception as exc:  # noqa: BLE001
                exclusion_error = _error_text(exc)
            try:
                _bounded(runtime.register_plugins, timeout)
            except _Stuck as stuck:
                registration_error = stuck.text
            except Exception as exc:  # noqa: BLE001
                registration_error = _error_text(exc)

    from platforms import entrypoints

    platform_filter = _platform_filter(runtime)
    auto_allowed = entrypoints.allowlist(platform_filter["variable"]) if platform_filter else None
    selected_ep = sel.entry_point if sel is not None else None
    platforms = [
        {
            "name": ep.name,
            "value": ep.value,
            "distribution": ep.distribution,
            "selected": selected_ep is not None
            and ep.name == selected_ep.name
            and _norm(ep.distribution) == _norm(selected_ep.distribution),
            # Whether the allowlist admits it to automatic selection; None where no allowlist
            # filters this runtime's platforms or the selector variable selects explicitly.
            "allowed": None
            if not platform_filter or not platform_filter["applies"]
            else auto_allowed is None or ep.name in auto_allowed,
        }
        for ep in runtime.entry_points(runtime.platform_group)
    ]

    hooks_by_plugin: dict[tuple, list] = {}
    for hook in runtime.registry.hooks():
        key = (hook.source.name, hook.source.distribution) if hook.source else (None, None)
        hooks_by_plugin.setdefault(key, []).append(
            {
                "target": hook.path.dotted,
                "type": hook.type.name,
                "hook": hook.name,
                "module": _defined_in(hook.func),
                "applied": hook.location is not None,
            }
        )
    plugins = [
        record.to_dict()
        | {
            "allowed": allowed is None or record.name in allowed,
            "skipped_unselected_platform": _norm(record.distribution) in excluded,
            "hooks": hooks_by_plugin.get((record.name, record.distribution), []),
        }
        for record in runtime.records()
    ]
    startup_error = selection.get("error") or registration_error or exclusion_error
    # Hooks of no plugin are applied too: say where they come from.
    unattributed = [
        dict(h, registered_by=_registered_by(h["module"]))
        for h in hooks_by_plugin.get((None, None), [])
    ]
    return {
        "runtime": runtime.name,
        "selector": {
            "variable": runtime.selector_env(),
            "value": os.environ.get(runtime.selector_env()),
        },
        "allowlist": sorted(allowed) if allowed is not None else None,
        "platform_allowlist": platform_filter,
        "selection": selection,
        "groups": {runtime.platform_group: platforms, runtime.plugin_group: plugins},
        "other_hooks": unattributed,
        "conflicts": runtime.registry.conflicts(),
        "registration_error": registration_error,
        "startup_error": startup_error,
    }
