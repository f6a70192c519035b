"""The ordered registry of conformance checks.

A check is a function ``fn(probe) -> str`` registered with ``@check(...)``; it returns the detail
shown on a pass, or raises ``rows.CheckFailed`` / ``rows.Missing`` / ``rows.Skip``. Everything
else it raises is a failure, except ``NotImplementedError`` from a check marked ``optional``
(the contract's default for that method raises): that is ``missing``. ``needs`` names checks
that must have passed first (their values, such as the device, are on the probe); otherwise the
check is skipped and says which one it waited for.

``checks_for(runtime)`` imports the check modules (torch-free at import) and returns the checks
that apply to ``"srt"`` or ``"diffusion"``, in the order rows are shown.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import NamedTuple

# The areas of the contract, in display order; one module each.
GROUPS = ("selection", "device", "distributed", "execution", "lifecycle", "subsystems", "diffusion")
RUNTIMES = ("srt", "diffusion")


class Check(NamedTuple):
    id: str
    title: str
    contract: str  # what the contract expects, shown with a failure
    fn: Callable
    runtimes: tuple[str, ...]
    optional: bool
    needs: tuple[str, ...]

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
):
    """Register the decorated function as check ``id`` (``"<group>.<name>"``)."""
    group = id.partition(".")[0]
    if group not in GROUPS:
        raise ValueError(f"check {id!r}: its group must be one of {', '.join(GROUPS)}")

    def register(fn: Callable) -> Callable:
        if any(c.id == id for c in _CHECKS):
            raise ValueError(f"check {id!r} is registered twice")
        _CHECKS.append(Check(id, title, contract, fn, tuple(runtimes), optional, tuple(needs)))
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
