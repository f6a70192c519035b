"""``describe(runtime)``: what is installed for one runtime and what would happen at start-up.

The report is plain JSON-able data for ``sglang-launch plugins``. Producing it selects the
runtime's platform as start-up would (activation callbacks run) and runs the plugin registration
phase (plugin callbacks run; no hook target is resolved, so nothing of the serving runtime is
imported). Built-in platforms are found by probing hardware, which imports torch; unless asked to
``probe``, the report stops where probing would start and says which built-ins would be probed,
in order. Errors are reported, never raised.
"""

from __future__ import annotations

import contextlib
import os
from typing import TYPE_CHECKING, Any

from ._core import _defined_in
from ._loader import PluginRuntime, _norm

if TYPE_CHECKING:
    from platforms import Selection


def _error_text(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"


def _selection(
    runtime: PluginRuntime, probe: bool
) -> tuple[dict[str, Any], Selection | None, bool]:
    """The report's ``selection`` entry and the ``Selection`` (None where there is none: a
    selection error, or a built-in only a hardware probe could pick), plus whether the selected
    platform's distribution is known without probing (False after an error)."""
    from platforms import ProbeRequired

    try:
        sel = runtime.selection(probe=probe)
    except ProbeRequired as need:
        probed = list(need.builtins)
        if need.serving_fallback:  # what a launch does at the chain's end
            probed[-1] = f"{need.serving_fallback} (a server's stand-in for {probed[-1]})"
        return (
            {
                "key": None,
                "qualname": None,
                "distribution": None,
                "probed": probed,
                "reason": f"{need.reason}; start-up probes the built-ins in this order and takes the first "
                f"available: {', '.join(probed)} (probing imports torch: pass --probe to run it now)",
            },
            None,
            True,
        )
    except Exception as exc:  # noqa: BLE001 - reported, not raised
        return {"error": _error_text(exc)}, None, False
    return (
        {
            "key": sel.key,
            "qualname": sel.qualname,
            "distribution": sel.distribution,
            "reason": sel.reason,
        },
        sel,
        True,
    )


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


def describe(runtime: PluginRuntime, probe: bool = False) -> dict:
    """The report on ``runtime`` (see the module docstring); ``probe`` allows hardware probes."""
    selection, sel, known = _selection(runtime, probe)
    allowed = runtime.allowlist()
    # Without probing, the selection found above stands for the process's own (a preview is not
    # remembered, and resolving again could probe).
    assumed = (
        runtime.assume_selected_distribution(sel.distribution if sel else None)
        if known and not probe
        else contextlib.nullcontext()
    )
    with assumed:
        try:
            excluded = runtime.excluded_distributions()
            exclusion_error = None
        except Exception as exc:  # noqa: BLE001
            excluded, exclusion_error = set(), _error_text(exc)
        try:
            runtime.register_plugins()
            registration_error = None
        except Exception as exc:  # noqa: BLE001
            registration_error = _error_text(exc)

    from platforms import entrypoints

    platform_filter = _platform_filter(runtime)
    auto_allowed = entrypoints.allowlist(platform_filter["variable"]) if platform_filter else None
    selected_ep = getattr(sel, "entry_point", None)
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
    plugins = []
    for ep in runtime.entry_points():
        outcome = runtime.outcomes.get((ep.name, ep.distribution))
        plugins.append(
            {
                "name": ep.name,
                "value": ep.value,
                "distribution": ep.distribution,
                "allowed": allowed is None or ep.name in allowed,
                "skipped_unselected_platform": _norm(ep.distribution) in excluded,
                "status": outcome.status if outcome else "not loaded",
                "detail": outcome.detail if outcome else "",
                "hooks": hooks_by_plugin.get((ep.name, ep.distribution), []),
            }
        )
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
