"""The ordered registry of conformance checks.

A check is a function ``fn(probe) -> str`` registered with ``@check(...)``; it returns the detail
shown on a pass, or raises ``rows.CheckFailed`` / ``rows.Missing`` / ``rows.Skip``. Everything
else it raises is a failure, except ``NotImplementedError`` from a check marked ``optional``
(the contract's default for that method raises): that is ``missing``. A check marked
``required=(method, where)`` covers a contract method that a launch or the serving runtime calls
(``where`` says when): its ``NotImplementedError`` fails the row, which names the method, because
a launch on that platform would fail there. ``needs`` names checks that must have passed first
(their values, such as the device, are on the probe); otherwise the check is skipped and says
which one it waited for.

The ``workload`` group comes last: each of its rows runs the serving runtime's own path on the
platform (a runtime may have several). "conforms" requires every workload row of the runtime
to pass; a skipped one does not.

``checks_for(runtime)`` imports the check modules (torch-free at import) and returns the checks
that apply to ``"srt"`` or ``"diffusion"``, in the order rows are shown.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import NamedTuple

from platforms.runtimes import RUNTIMES as SPECS

# The areas of the contract, in display order; one module each.
GROUPS = (
    "selection",
    "device",
    "distributed",
    "execution",
    "lifecycle",
    "subsystems",
    "diffusion",
    "workload",
)
WORKLOAD = "workload"  # the group whose rows must all pass for "conforms"
RUNTIMES = tuple(SPECS)  # every runtime of the one runtime table


class Check(NamedTuple):
    id: str
    title: str
    contract: str  # what the contract expects, shown with a failure
    fn: Callable
    runtimes: tuple[str, ...]
    optional: bool
    needs: tuple[str, ...]
    required: tuple[str, str] | None = None  # (contract method, where a launch calls it)

    @property
    def group(self) -> str:
        return self.id.partition(".")[0]


_CHECKS: list[Check] = []


def check(
    id: str,
    title: str,
    contract: str,
    *,
    runtimes: tuple[str, ...] = RUNTIMES,
    optional: bool = False,
    needs: tuple[str, ...] = (),
    required: tuple[str, str] | None = None,
) -> Callable[[Callable], Callable]:
    """Register the decorated function as check ``id`` (``"<group>.<name>"``); ``required`` is
    ``(method, where a launch calls it)`` for a method a launch cannot do without."""
    group = id.partition(".")[0]
    if group not in GROUPS:
        raise ValueError(f"check {id!r}: its group must be one of {', '.join(GROUPS)}")

    def register(fn: Callable) -> Callable:
        if any(c.id == id for c in _CHECKS):
            raise ValueError(f"check {id!r} is registered twice")
        _CHECKS.append(
            Check(id, title, contract, fn, tuple(runtimes), optional, tuple(needs), required)
        )
        return fn

    return register


def checks_for(runtime: str) -> list[Check]:
    """The checks that apply to ``runtime``, grouped in ``GROUPS`` order."""
    if runtime not in RUNTIMES:
        raise ValueError(f"unknown runtime {runtime!r}; use one of {', '.join(RUNTIMES)}")
    for group in GROUPS:
        importlib.import_module(f"{__package__}.{group}")
    order = {group: i for i, group in enumerate(GROUPS)}
    chosen = [c for c in _CHECKS if runtime in c.runtimes]
    return sorted(chosen, key=lambda c: order[c.group])  # stable: registration order within a group


def required_methods(runtime: str) -> list[tuple[str, str]]:
    """``(method, where a launch calls it)`` for every contract method the catalog marks required
    for ``runtime``, in row order."""
    return [c.required for c in checks_for(runtime) if c.required is not None]
