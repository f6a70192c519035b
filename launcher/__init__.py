"""sglang-launch's launcher: the supervisor, its CLI and the embedded ``Launcher``.

A lazy facade: ``from launcher import Launcher`` (or ``LaunchError``) imports only the standard
library, because ``spawn`` children re-run an embedding application's module scope before their
platform is initialized. The supervisor and its dependencies load when ``Launcher.start()`` runs.
"""

from __future__ import annotations

__all__ = ["LaunchError", "Launcher"]


def __getattr__(name: str) -> type:
    if name == "Launcher":
        from launcher._embedded import Launcher

        return Launcher
    if name == "LaunchError":
        from launcher._failure import LaunchError

        return LaunchError
    raise AttributeError(f"module 'launcher' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted([*globals(), *__all__])
