"""A worker's plugin manifest: the platform and plugins a process really has, as it reports them.

Every child reports one with its readiness (``messages.Ready.manifest``), made in the child after
its platform was initialized and its hooks applied, so it says what that process selected,
loaded and applied, not what another process expects it to. The supervisor keeps each worker's
(``sglang-launch status --json``, ``plugins --running``, the ready event, ``/get_server_info``)
and names a worker whose manifest differs from its peers' (``differences``).

- ``platform``: the selection (key, class, the distribution that shipped it and its version,
  why it was selected);
- ``plugins``: each installed general plugin of the runtime's hook group: loaded, failed, not
  allowed or skipped, and why;
- ``hooks``: each hook the process registered: target (as applied, after SGLang's names are
  translated), type, plugin, applied / pending / failed, and the error.
"""

from __future__ import annotations

import msgspec


class PlatformRecord(msgspec.Struct, frozen=True, kw_only=True):
    runtime: str
    key: str
    qualname: str
    distribution: str | None = None
    version: str | None = None
    reason: str = ""


class PluginRecord(msgspec.Struct, frozen=True, kw_only=True):
    name: str
    group: str
    value: str = ""
    distribution: str | None = None
    version: str | None = None
    status: str  # loaded, failed, not allowed, skipped, not run
    detail: str = ""


class HookRecord(msgspec.Struct, frozen=True, kw_only=True):
    target: str
    registered_as: str
    type: str
    hook: str
    plugin: str | None = None
    distribution: str | None = None
    state: str  # applied, pending, failed
    error: str | None = None


class Manifest(msgspec.Struct, frozen=True, kw_only=True):
    platform: PlatformRecord
    plugins: list[PluginRecord] = []
    hooks: list[HookRecord] = []


def collect(runtime: str) -> Manifest:
    """This process's manifest for ``runtime`` (its platform is resolved: call it after the
    bootstrap initialized the platform)."""
    import importlib
    from importlib import metadata

    import hooks
    from platforms.runtimes import runtime_spec

    platforms = importlib.import_module(runtime_spec(runtime).platform_module)
    selection = platforms.current_selection()
    version = None
    if selection.distribution:
        try:
            version = metadata.version(selection.distribution)
        except metadata.PackageNotFoundError:
            version = None
    record = PlatformRecord(
        runtime=runtime,
        key=selection.key,
        qualname=selection.qualname,
        distribution=selection.distribution,
        version=version,
        reason=selection.reason,
    )
    plugins = hooks.manifest(runtime)
    return Manifest(
        platform=record,
        plugins=msgspec.convert(plugins["plugins"], list[PluginRecord]),
        hooks=msgspec.convert(plugins["hooks"], list[HookRecord]),
    )


def _hooks_of(manifest: Manifest) -> dict[tuple[str, str, str | None], str]:
    return {(h.target, h.type, h.plugin): h.state for h in manifest.hooks}


def differences(mine: Manifest, theirs: Manifest, peer: str) -> list[str]:
    """What in ``mine`` differs from ``peer``'s ``theirs``, one sentence each (empty: the same).

    Compared: the platform's key, class and version; each plugin's status; each hook's state
    (a hook applied in one process and failed or missing in the other)."""
    out = []
    a, b = mine.platform, theirs.platform
    if (a.key, a.qualname, a.version) != (b.key, b.qualname, b.version):
        out.append(
            f"platform {a.key} ({a.qualname} {a.version or ''}".rstrip()
            + f") where {peer} has {b.key} ({b.qualname} {b.version or ''}".rstrip()
            + ")"
        )
    their_plugins = {(p.name, p.distribution): p for p in theirs.plugins}
    for p in mine.plugins:
        other = their_plugins.get((p.name, p.distribution))
        if other is not None and other.status != p.status:
            out.append(f"plugin {p.name} is {p.status} where {peer} has it {other.status}")
    my_hooks, their_hooks = _hooks_of(mine), _hooks_of(theirs)
    for key in sorted(set(my_hooks) | set(their_hooks), key=str):
        here, there = my_hooks.get(key), their_hooks.get(key)
        if here != there:
            target, kind, plugin = key
            out.append(
                f"{kind} hook on {target} of {plugin or 'no plugin'} is {here or 'absent'} where "
                f"{peer} has it {there or 'absent'}"
            )
    return out
