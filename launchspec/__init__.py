"""The shared floor: what the supervisor and the worker processes both read.

The server arguments (``server_args``), the ops event types (``events``) and the causes and exit
codes they carry (``causes``), the model directory's checks and facts (``model_source``,
``model_config``), the runtime table's serving fields (``runtimes``), the rendezvous address
(``rendezvous``), and the one way to start and end bootstrap children (``children``, with
``proctree`` for their process trees), used by the supervisor and by check-platform.

It imports only the packages below it (``bootstrap``, ``hooks``, ``platforms``) and nothing of
``launcher``, ``serving`` or ``conformance``; a worker process that reads its server arguments
never loads the supervisor (the layering contracts in pyproject.toml and
tests/project/test_layering.py check both). Import-light: no torch, no serving runtime.
"""

from __future__ import annotations

from typing import Any

__all__ = ["__version__"]

_DISTRIBUTION = "sglang-launch"


def __getattr__(name: str) -> Any:
    if name == "__version__":
        return version()
    raise AttributeError(f"module 'launchspec' has no attribute {name!r}")


def version() -> str:
    """The installed distribution's version (pyproject.toml is its one source); "unknown" when
    the package runs from a source tree that was never installed."""
    from importlib import metadata

    try:
        return metadata.version(_DISTRIBUTION)
    except metadata.PackageNotFoundError:
        return "unknown"
