"""Installed entry points, read once per process for every group sglang-launch uses.

Reading entry-point metadata walks every distribution on ``sys.path``; selection and plugin
loading for both runtimes all need it, so one scan fills a table of every group and later lookups
are dictionary reads. Nothing here imports a plugin: ``EntryPoint.load()`` does that, and only for
the entry point it is called on.
"""

from __future__ import annotations

import importlib
import os
import threading
from collections.abc import Iterable, Mapping
from types import ModuleType
from typing import TYPE_CHECKING, Any, NamedTuple

if TYPE_CHECKING:
    from importlib.metadata import Distribution

SRT_PLATFORMS = "sglang.srt.platforms"
SRT_PLUGINS = "sglang.srt.plugins"
DIFFUSION_PLATFORMS = "sglang.multimodal_gen.platforms"
DIFFUSION_PLUGINS = "sglang.multimodal_gen.plugins"

GROUPS = (SRT_PLATFORMS, SRT_PLUGINS, DIFFUSION_PLATFORMS, DIFFUSION_PLUGINS)


class EntryPoint(NamedTuple):
    """One installed entry point: ``name = value`` in ``group``, shipped by ``distribution``.

    (A NamedTuple rather than a dataclass: ``dataclasses`` costs a fresh process more to import
    than the whole metadata scan.)
    """

    group: str
    name: str
    value: str
    distribution: str | None

    @property
    def module(self) -> str:
        return self.value.partition(":")[0].strip()

    def load(self) -> Any:
        """Import the entry point's module and return the object it names."""
        module_name, _, attr = self.value.partition(":")
        obj = importlib.import_module(module_name.strip())
        for part in attr.strip().split(".") if attr.strip() else ():
            obj = getattr(obj, part)
        return obj

    def describe(self) -> str:
        dist = self.distribution or "unknown distribution"
        return f"{self.name} = {self.value} (from {dist})"


_lock = threading.Lock()
_table: dict[str, tuple[EntryPoint, ...]] | None = None


def _dist_name(dist: Distribution) -> str | None:
    """The distribution's ``Name`` header, read without the email parser when possible."""
    for filename in ("METADATA", "PKG-INFO"):
        text = dist.read_text(filename)
        if text:
            for line in text.splitlines():
                if not line.strip():
                    break  # end of the headers
                key, sep, value = line.partition(":")
                if sep and key.strip().lower() == "name":
                    return value.strip()
    return dist.metadata["Name"] if dist.metadata else None


def _scan() -> dict[str, tuple[EntryPoint, ...]]:
    from importlib import metadata

    table: dict[str, list[EntryPoint]] = {group: [] for group in GROUPS}
    seen_dists: set[str] = set()
    for dist in metadata.distributions():
        # The same distribution can be visible twice (two sys.path entries); the first one wins,
        # as it does for imports. The normalised name comes from the folder name when it can,
        # so the scan reads no METADATA file except those of distributions in our groups.
        key = getattr(dist, "_normalized_name", None) or (_dist_name(dist) or "")
        key = key.lower().replace("-", "_").replace(".", "_")
        if key in seen_dists:
            continue
        seen_dists.add(key)
        mine = [ep for ep in dist.entry_points if ep.group in table]
        if not mine:
            continue
        dist_name = _dist_name(dist)
        for ep in mine:
            table[ep.group].append(EntryPoint(ep.group, ep.name, ep.value, dist_name))
    return {group: tuple(eps) for group, eps in table.items()}


def entry_points(group: str) -> tuple[EntryPoint, ...]:
    """Every installed entry point of ``group``, in ``sys.path`` order (one scan per process)."""
    global _table
    table = _table
    if table is None:
        with _lock:
            if _table is None:
                _table = _scan()
            table = _table
    if group not in table:
        raise ValueError(f"unknown entry-point group {group!r}; known groups: {', '.join(GROUPS)}")
    return table[group]


def snapshot() -> tuple[tuple[str, str, str, str | None], ...]:
    """This process's table as plain tuples ``(group, name, value, distribution)``.

    A launcher hands it to the children it spawns (same ``sys.path``), so that entry-point
    metadata is read once per launch rather than once per process; see ``seed``.
    """
    return tuple(
        (ep.group, ep.name, ep.value, ep.distribution)
        for group in GROUPS
        for ep in entry_points(group)
    )


def seed(rows: Iterable[tuple[str, str, str, str | None]]) -> None:
    """Adopt a ``snapshot()`` taken by the parent process instead of scanning; a no-op if this
    process has already scanned (its own reading wins)."""
    global _table
    with _lock:
        if _table is not None:
            return
        table: dict[str, list[EntryPoint]] = {group: [] for group in GROUPS}
        for group, name, value, distribution in rows:
            if group in table:
                table[group].append(EntryPoint(group, name, value, distribution))
        _table = {group: tuple(eps) for group, eps in table.items()}


def reset() -> None:
    """Forget the scan, so the next lookup reads metadata again (tests; after installs)."""
    global _table
    with _lock:
        _table = None


if hasattr(os, "register_at_fork"):
    # A forked child inherits the table, which is still right (same sys.path); only the lock must
    # be fresh, in case the parent forked while another thread held it.
    def _after_fork() -> None:
        global _lock
        _lock = threading.Lock()

    os.register_at_fork(after_in_child=_after_fork)


def allowlist(
    variable: str = "SGLANG_PLUGINS", environ: Mapping[str, str] | None = None
) -> frozenset[str] | None:
    """The entry-point names a comma-separated allowlist variable admits; None when it is unset
    or blank (no filtering). Names are stripped; empty items are ignored."""
    raw = (os.environ if environ is None else environ).get(variable, "")
    if not raw.strip():
        return None
    return frozenset(item.strip() for item in raw.split(",") if item.strip())


def import_if_exists(name: str) -> ModuleType | None:
    """Import module ``name``, or None when no such module exists. An import error raised
    *inside* an existing module (a dependency it lacks) propagates unchanged, so a broken module
    is never mistaken for a wrong path. The project's one rule for importing a named module."""
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as exc:
        if exc.name and (name == exc.name or name.startswith(exc.name + ".")):
            return None
        raise


def import_object(path: str) -> Any:
    """Import what ``path`` names: ``"pkg.mod:Attr.sub"`` or a dotted ``"pkg.mod.Attr"``.

    For a dotted path the longest importable module prefix is the module (``import_if_exists``).
    """
    if ":" in path:
        return EntryPoint("", "", path, None).load()
    parts = path.split(".")
    for split in range(len(parts) - 1, 0, -1):
        obj: Any = import_if_exists(".".join(parts[:split]))
        if obj is None:
            continue
        for attr in parts[split:]:
            obj = getattr(obj, attr)
        return obj
    raise ModuleNotFoundError(
        f"{path!r} names no importable module; expected 'package.module.Name'", name=parts[0]
    )
