"""``describe(runtime)``: what is installed for one runtime and what would happen at start-up.

The report is plain JSON-able data for ``sglang-launch plugins``. Producing it resolves the
runtime's platform selection (which calls activation callbacks, as start-up would) and runs the
plugin registration phase (plugin callbacks; no hook target is resolved, so nothing of the serving
runtime is imported). Errors are reported, never raised.
"""

from __future__ import annotations

import os

from ._loader import PluginRuntime, _norm


def _error_text(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"


def _selection(runtime: PluginRuntime) -> tuple[dict, object]:
    try:
        sel = runtime.selection()
    except Exception as exc:  # noqa: BLE001 - reported, not raised
        return {"error": _error_text(exc)}, None
    return {
        "key": sel.key,
        "qualname": sel.qualname,
        "distribution": sel.distribution,
        "reason": sel.reason,
    }, sel


def describe(runtime: PluginRuntime) -> dict:
    selection, sel = _selection(runtime)
    allowed = runtime.allowlist()
    try:
        excluded = runtime._excluded()
        exclusion_error = None
    except Exception as exc:  # noqa: BLE001
        excluded, exclusion_error = set(), _error_text(exc)
    try:
        runtime.register_plugins()
        registration_error = None
    except Exception as exc:  # noqa: BLE001
        registration_error = _error_text(exc)

    selected_ep = getattr(sel, "entry_point", None)
    platforms = [
        {
            "name": ep.name,
            "value": ep.value,
            "distribution": ep.distribution,
            "selected": selected_ep is not None and ep.name == selected_ep.name
            and _norm(ep.distribution) == _norm(selected_ep.distribution),
        }
        for ep in runtime.entry_points(runtime.platform_group)
    ]

    hooks_by_plugin: dict[tuple, list] = {}
    for hook in runtime.registry.hooks():
        key = (hook.source.name, hook.source.distribution) if hook.source else (None, None)
        hooks_by_plugin.setdefault(key, []).append(
            {"target": hook.path.dotted, "type": hook.type.name, "hook": hook.name,
             "applied": hook.location is not None}
        )
    plugins = []
    for ep in runtime.entry_points():
        outcome = runtime.outcomes.get((ep.name, ep.distribution))
        plugins.append({
            "name": ep.name,
            "value": ep.value,
            "distribution": ep.distribution,
            "allowed": allowed is None or ep.name in allowed,
            "skipped_unselected_platform": _norm(ep.distribution) in excluded,
            "status": outcome.status if outcome else "not loaded",
            "detail": outcome.detail if outcome else "",
            "hooks": hooks_by_plugin.get((ep.name, ep.distribution), []),
        })
    startup_error = selection.get("error") or registration_error or exclusion_error
    return {
        "runtime": runtime.name,
        "selector": {"variable": runtime.selector_env(), "value": os.environ.get(runtime.selector_env())},
        "allowlist": sorted(allowed) if allowed is not None else None,
        "selection": selection,
        "groups": {runtime.platform_group: platforms, runtime.plugin_group: plugins},
        "conflicts": runtime.registry.conflicts(),
        "registration_error": registration_error,
        "startup_error": startup_error,
    }
