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


def _field_defaults(cls: type) -> dict:
    values = {}
    for f in dataclasses.fields(cls):
        if f.default is not dataclasses.MISSING:
            values[f.name] = f.default
        elif f.default_factory is not dataclasses.MISSING:
            values[f.name] = f.default_factory()
    return values


def _problems(args: ServerArgs) -> list[str]:
    """What ``check_server_args()`` refuses in ``args`` (empty when it passes)."""
    try:
        args.check_server_args()
    except ValueError as exc:
        return list(getattr(exc, "problems", None) or [str(exc)])
    return []


@check(
    "lifecycle.server_args_defaults",
    "apply_server_args_defaults() keeps a default ServerArgs valid",
    "apply_server_args_defaults(server_args) fills platform defaults in ServerArgs.__post_init__ "
    "and leaves arguments that pass check_server_args()",
)
def server_args_defaults(probe: Probe) -> str:
    # Looked up now, after the bootstrap applied hooks: a REPLACE of the class applies.
    cls = importlib.import_module("launchspec.server_args").ServerArgs
    defaults = _field_defaults(cls)
    args = cls(runtime=probe.runtime)  # __post_init__ calls apply_server_args_defaults()
    # The same defaults without the platform's hand (no __post_init__): what this installation
    # refuses either way (the embedded model's package missing, say) is not the platform's doing.
    bare = cls.__new__(cls)
    for name, value in {**defaults, "runtime": probe.runtime}.items():
        object.__setattr__(bare, name, value)
    before = _problems(bare)
    own = [p for p in _problems(args) if p not in before]
    if own:
        raise CheckFailed(
            "the defaulted arguments no longer pass check_server_args(): " + "; ".join(own)
        )
    changed = [
        f"{name}: {defaults[name]!r} -> {getattr(args, name)!r}"
        for name in defaults
        if name != "runtime" and getattr(args, name) != defaults[name]
    ]
    result = (
        "set " + ", ".join(changed) if changed else "changed nothing"
    ) + "; check_server_args() passes"
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
