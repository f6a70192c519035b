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


def __getattr__(name: str) -> Any:
    if name == "__version__":
        from launchspec import version

        return version()
    if name == "Launcher":
        from launcher.embedded import Launcher

        return Launcher
    if name == "DiffGenerator":
        from launcher.diffgen import DiffGenerator

        return DiffGenerator
    if name == "LaunchError":
        from launchspec.causes import LaunchError

        return LaunchError
    raise AttributeError(f"module 'launcher' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted([*globals(), *__all__])
