"""What replicas are started with, and what a reload asks for, checked before any process starts.

A running launch starts its replicas from a ``Revision`` of its configuration (the word is a
rollout's, as in a deployment's revisions: nothing to do with text generation): the server
arguments, their payload, the entry points their children adopt, and what the model directory
serves (its ``kind``). A reload makes the next revision (``next_revision``): the same arguments
but for the model fields it changes, checked the way a start checks them, and the installed
entry points read again, so that a plugin distribution installed, upgraded or removed since the
launch started takes effect in the fresh replicas. Two things a reload keeps unless told:

- the platform: the replicas pin the platform the launch selected, so a change of the installed
  platform distributions of the launch's runtime is refused, with a message saying that a
  restart is needed;
- what the server serves (embedding, generation, image, ``launchspec.model_config.model_kind``):
  a reload to a model of another kind would change the API under the clients, so it is refused
  unless ``allow_kind_change`` (``sglang-launch reload --allow-kind-change``).

``ChangeRefused`` is every refusal a caller can act on: the message says what is wrong and what
to do (``sglang-launch reload`` and ``scale`` exit 2 with it).
"""

from __future__ import annotations

import copy
import importlib
import importlib.metadata
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from launchspec.model_config import model_kind
from launchspec.runtimes import serving_spec
from platforms import entrypoints
from platforms.runtimes import runtime_spec

if TYPE_CHECKING:
    from launchspec.server_args import ServerArgs
    from platforms import Selection

EntryPointRows = tuple[tuple[str, str, str, str | None], ...]


class ChangeRefused(ValueError):
    """A reload or a scale that cannot be made; the message says why and what to do."""


@dataclass
class Revision:
    """What replicas are started with: ``args`` and their ``payload``, the ``entry_points`` their
    children adopt, and the ``versions`` of the plugin distributions those name. ``model_path``
    is the model directory resolved and ``served_name`` the name clients use for it (as given,
    where the path is not a model directory of the runtime's kind: another engine's target);
    ``kind`` is what that directory serves (None where its files do not say)."""

    args: ServerArgs
    payload: bytes
    entry_points: EntryPointRows | None
    versions: dict[str, str | None] = field(default_factory=dict)
    model_path: str | None = None
    served_name: str | None = None
    kind: str | None = None

    def __post_init__(self) -> None:
        spec = serving_spec(self.args.runtime)
        try:
            source = spec.model_check(self.args.model_path, self.args.served_model_name)
        except ValueError:
            self.model_path, self.served_name = self.args.model_path, self.args.served_model_name
            self.kind = None
        else:
            self.model_path, self.served_name = str(source.path), source.served_name
            self.kind = model_kind(source.path)


def first_revision(
    args: ServerArgs, payload: bytes, entry_points: EntryPointRows | None
) -> Revision:
    """The revision the launch started with."""
    return Revision(args, payload, entry_points, plugin_versions(entry_points or ()))


def next_revision(
    current: Revision,
    selection: Selection,
    *,
    model_path: str | None = None,
    served_model_name: str | None = None,
    allow_kind_change: bool = False,
) -> tuple[Revision, list[str]]:
    """The revision a reload starts, and what differs besides the model (the plugin
    distributions installed, removed or upgraded since ``current``'s replicas started).

    ``model_path`` / ``served_model_name``: None keeps the current value; ``""`` goes back to
    the default (the embedded model; the directory's name). Refused (``ChangeRefused``) when the
    arguments do not pass the start's checks, the platform distributions changed, or the new
    model serves another kind than the current one and ``allow_kind_change`` is False."""
    from launchspec.gguf_cache import conversions_refused
    from launchspec.server_args import ServerArgsError, encode_server_args

    args = copy.copy(current.args)  # the platform's defaults were applied once already
    if model_path is not None:
        args.model_path = model_path or None
    if served_model_name is not None:
        args.served_model_name = served_model_name or None
    try:
        # On the supervisor's event loop: a GGUF file's minute-long conversion would stall it.
        with conversions_refused("a reload does not convert one while the server runs"):
            args.check_server_args()
    except ServerArgsError as exc:
        raise ChangeRefused(
            "the reload's server arguments are invalid:\n"
            + "\n".join(f"  - {p}" for p in exc.problems)
        ) from None
    except (TypeError, ValueError) as exc:
        raise ChangeRefused(f"the reload's server arguments are invalid: {exc}") from None
    rows = fresh_entry_points()
    problem = platform_change(selection, current.entry_points or (), rows)
    if problem:
        raise ChangeRefused(problem)
    versions = plugin_versions(rows)
    revision = Revision(args, encode_server_args(args), rows, versions)
    if not allow_kind_change:
        problem = kind_change(current, revision)
        if problem:
            raise ChangeRefused(problem)
    return revision, version_changes(current.versions, versions)


def kind_change(before: Revision, after: Revision) -> str | None:
    """Why replacing ``before``'s replicas by ``after``'s changes what the server serves (both
    kinds known and different), with how to do it anyway; None when it does not."""
    if before.kind is None or after.kind is None or before.kind == after.kind:
        return None
    return (
        f"the reload changes what the server serves, from {before.kind} ({before.model_path}) "
        f"to {after.kind} ({after.model_path}): clients of the {before.kind} API would get "
        f"errors from then on, and some already while both kinds serve; to reload anyway, pass "
        f"--allow-kind-change (Launcher.reload(..., allow_kind_change=True), or "
        f'"allow_kind_change": true in the query)'
    )


def fresh_entry_points() -> EntryPointRows:
    """The installed entry points read again (this process's table included)."""
    importlib.invalidate_caches()
    entrypoints.reset()
    return entrypoints.snapshot()


def platform_change(
    selection: Selection, before: EntryPointRows, after: EntryPointRows
) -> str | None:
    """Why the replicas cannot keep ``selection`` with the entry points ``after`` (those of
    ``selection``'s runtime's platform group differ from ``before``: a platform distribution
    was installed, removed or replaced), else None. Upgrades of the same distributions pass."""
    group = runtime_spec(selection.runtime).platform_group

    def platforms(rows: EntryPointRows) -> dict[str, tuple[str, str | None]]:
        return {name: (value, dist) for g, name, value, dist in rows if g == group}

    was, now = platforms(before), platforms(after)
    if was == now:
        return None
    changed = []
    for name in sorted(set(was) | set(now)):
        if name not in now:
            changed.append(f"{name} from {was[name][1] or 'an unknown distribution'} was removed")
        elif name not in was:
            changed.append(f"{name} from {now[name][1] or 'an unknown distribution'} was installed")
        elif was[name] != now[name]:
            changed.append(
                f"{name} is now {now[name][0]} from {now[name][1]} (was {was[name][0]} from "
                f"{was[name][1]})"
            )
    kept = selection.key + (f" from {selection.distribution}" if selection.distribution else "")
    return (
        f"the installed {selection.runtime} platform plugins changed since this launch started "
        f"({'; '.join(changed)}); a reload keeps the platform the launch selected ({kept}), so "
        "restart the server to change platforms (systemctl restart, or stop and start "
        "sglang-launch)"
    )


def plugin_versions(rows: EntryPointRows) -> dict[str, str | None]:
    """The version of every distribution ``rows`` name (None where it cannot be read)."""
    versions: dict[str, str | None] = {}
    for _, _, _, dist in rows:
        if dist and dist not in versions:
            try:
                versions[dist] = importlib.metadata.version(dist)
            except importlib.metadata.PackageNotFoundError:
                versions[dist] = None
    return versions


def version_changes(before: dict[str, str | None], after: dict[str, str | None]) -> list[str]:
    """``"demo-plugin 0.1.0 -> 0.2.0"``, ``"new-hooks 1.0 installed"``, ``"old-hooks removed"``."""
    changes = []
    for dist in sorted(set(before) | set(after)):
        if dist not in after:
            changes.append(f"{dist} {before[dist] or ''} removed".replace("  ", " "))
        elif dist not in before:
            changes.append(f"{dist} {after[dist] or ''} installed".replace("  ", " "))
        elif before[dist] != after[dist]:
            changes.append(f"{dist} {before[dist]} -> {after[dist]}")
    return changes
