"""The spec's early-import check: runtime modules a child finds already imported at entry.

``spawn`` re-runs the launching script's module scope in every child before the target starts, so
a script that imports worker code (or torch) at module scope has those modules imported ahead of
``init_backend()`` and the plugin hooks. Hooks can still patch such modules, but classes and
registrations created while importing them are past reach. The child names them in one warning.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping

from bootstrap.targets import module_of

# The heavy libraries a platform's init_backend() may need to configure before they load; the
# worker target's own top-level package (its worker code) is watched too.
RUNTIME_MODULES = ("torch", "transformers", "diffusers", "starlette", "uvicorn")


def early_imports(
    target: str | None = None, modules: Mapping[str, object] | None = None
) -> list[str]:
    """Which of ``RUNTIME_MODULES`` (plus the worker target's top-level package) are already
    imported."""
    loaded = sys.modules if modules is None else modules
    watched = list(RUNTIME_MODULES)
    if target:
        watched.append(module_of(target).partition(".")[0])
    found = []
    for name in watched:
        if name and any(m == name or m.startswith(name + ".") for m in loaded):
            found.append(name)
    return sorted(set(found))


def warning_text(worker: str, names: list[str]) -> str:
    return (
        f"{worker}: runtime modules were already imported when this child started, before its "
        f"platform initialization and plugin hooks: {', '.join(names)}. spawn re-ran the launching "
        "script's module scope; hooks can still patch these modules, but classes and registrations "
        "created while importing them are past reach. Move those imports under "
        '`if __name__ == "__main__":` or into the function that uses them.'
    )
