"""Lifecycle checks: plugins loaded, ServerArgs defaults, init_backend() once per process."""

from __future__ import annotations

import dataclasses
import importlib
from typing import TYPE_CHECKING

from .catalog import check
from .rows import CheckFailed

if TYPE_CHECKING:
    from launchspec.server_args import ServerArgs

    from .probe import Probe


@check(
    "lifecycle.plugins",
    "general plugins registered and hooks applied",
    "general plugins of the selected platform's distribution load, run their callbacks and apply "
    "their hooks; a failure there aborts start-up",
)
def plugins(probe: Probe) -> str:
    # The bootstrap ran both phases before this process reached the checks; a failure there is
    # reported against this row by the parent, from the child's failure report.
    return "the bootstrap registered this runtime's general plugins and applied their hooks"


def _problems(args: ServerArgs) -> list[str]:
    """What ``check_server_args()`` refuses in ``args`` (empty when it passes)."""
    try:
        args.check_server_args()
    except ValueError as exc:
        return list(getattr(exc, "problems", None) or [str(exc)])
    return []


def _fields(args: ServerArgs) -> dict[str, object]:
    return {f.name: getattr(args, f.name) for f in dataclasses.fields(args)}


@check(
    "lifecycle.server_args_defaults",
    "apply_server_args_defaults() keeps a default ServerArgs valid",
    "apply_server_args_defaults(server_args) fills platform defaults in ServerArgs.__post_init__ "
    "and leaves arguments that pass check_server_args()",
)
def server_args_defaults(probe: Probe) -> str:
    # Looked up now, after the bootstrap applied hooks: a REPLACE of the class applies.
    cls = importlib.import_module("launchspec.server_args").ServerArgs
    platform = probe.platform
    # The same construction without the platform's hand (its method shadowed on this instance):
    # what ServerArgs fills itself (the worker target, the embedded model's path), what plugins'
    # hooks change, and what this installation refuses either way are not the platform's doing.
    fields: dict[str, object] = {"runtime": probe.runtime}
    platform.apply_server_args_defaults = lambda server_args: None
    try:
        bare = cls(**fields)
        stand_in = None
        if bare.model_path is None:
            # No embedded default here (its package missing, or a runtime without one): a launch
            # must name a model, and platform code always gets it as a path, as in SGLang.
            from launchspec.embedded_models import EMBEDDING_MODEL

            fields["model_path"] = EMBEDDING_MODEL.name  # the small embedded encoder's path
            bare = cls(**fields)
            stand_in = bare.model_path
    finally:
        del platform.apply_server_args_defaults
    try:
        args = cls(**fields)  # __post_init__ calls apply_server_args_defaults()
    except Exception as exc:  # noqa: BLE001 - the platform's failure is this row's
        from platforms.vendor import plugin_code

        vendor = plugin_code(exc)
        where = f" ({vendor.describe()})" if vendor is not None else ""
        raise CheckFailed(
            f"ServerArgs() with model_path={bare.model_path!r} raised {type(exc).__name__}: {exc}"
            f"{where}; a launch stops there (exit 5)"
        ) from exc
    before = _problems(bare)
    own = [p for p in _problems(args) if p not in before]
    if own:
        raise CheckFailed(
            "the defaulted arguments no longer pass check_server_args(): " + "; ".join(own)
        )
    was, now = _fields(bare), _fields(args)
    changed = [f"{name}: {was[name]!r} -> {now[name]!r}" for name in was if now[name] != was[name]]
    result = (
        "set " + ", ".join(changed) if changed else "changed nothing"
    ) + "; check_server_args() passes"
    if stand_in:
        result += (
            f" (with model_path={stand_in!r}: a launch here must name a model, there being no "
            f"embedded default, and platform code reads it as a path, as in SGLang)"
        )
    if before:
        result += (
            f" (apart from what it refuses without the platform's defaults too: "
            f"{'; '.join(before)})"
        )
    return result


@check(
    "lifecycle.init_backend",
    "init_backend() ran once under initialize_current_platform()",
    "init_backend() runs at most once per process, through initialize_current_platform(), and "
    "returns (raising aborts start-up; it must never end the process)",
)
def init_backend(probe: Probe) -> str:
    p = probe.platform
    calls = []
    p.init_backend = lambda: calls.append(1)  # shadows the method on this instance only
    try:
        again = probe.platforms.initialize_current_platform()
    finally:
        del p.init_backend
    if calls:
        raise CheckFailed("a second initialize_current_platform() ran init_backend() again")
    if again is not p:
        raise CheckFailed(
            "a second initialize_current_platform() returned another platform instance"
        )
    return "ran in the bootstrap before the checks; calling initialize_current_platform() again did not re-run it"
