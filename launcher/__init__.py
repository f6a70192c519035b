"""sglang-launch's launcher: the supervisor, its CLI, the embedded ``Launcher`` and the offline
``DiffGenerator``.

A lazy facade: ``from launcher import Launcher`` (or ``DiffGenerator``, ``LaunchError``) imports
only the standard library, because ``spawn`` children re-run an embedding application's module
scope before their platform is initialized. The supervisor and its dependencies load when
``Launcher.start()`` (or ``DiffGenerator.from_pretrained()``) runs.
"""

from __future__ import annotations

from typing import Any

__all__ = ["DiffGenerator", "LaunchError", "Launcher", "__version__"]

_DISTRIBUTION = "sglang-launch"


def __getattr__(name: str) -> Any:
    if name == "__version__":
        return _version()
    if name == "Launcher":
        from launcher.embedded import Launcher

        return Launcher
    if name == "DiffGenerator":
        from launcher.diffgen import DiffGenerator

        return DiffGenerator
    if name == "LaunchError":
        from launcher.supervisor.causes import LaunchError

        return LaunchError
    raise AttributeError(f"module 'launcher' has no attribute {name!r}")


def _version() -> str:
    """The installed distribution's version (pyproject.toml is its one source); "unknown" when
    the package runs from a source tree that was never installed."""
    from importlib import metadata

    try:
        return metadata.version(_DISTRIBUTION)
    except metadata.PackageNotFoundError:
        return "unknown"


def __dir__() -> list[str]:
    return sorted([*globals(), *__all__])
