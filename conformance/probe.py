"""``Probe``: what every check is handed, and ``evaluate``: one check run into one ``Row``.

The probe carries the platform under test (the real instance, not the lazy proxy), its
runtime's modules, the selection, a private scratch directory, and the values earlier checks
left for later ones (``probe.values["device"]`` from ``device.get_device`` and so on).
"""

from __future__ import annotations

import importlib
from typing import Any

from platforms.entrypoints import import_object
from platforms.runtimes import runtime_spec

from . import rows
from .catalog import Check


class Probe:
    """The platform under test and the shared state of one check run."""

    def __init__(self, runtime: str, workdir: str) -> None:
        self.runtime = runtime
        self.workdir = workdir
        self.spec = runtime_spec(runtime)
        self.platforms = importlib.import_module(self.spec.platform_module)
        # Already initialized by the bootstrap: this returns the instance without re-running
        # init_backend() (lifecycle.init_backend verifies exactly that).
        self.platform = self.platforms.initialize_current_platform()
        self.selection = self.platforms.current_selection()
        self.statuses: dict[str, str] = {}
        self.values: dict[str, Any] = {}

    @property
    def base_class(self) -> type:
        """The runtime's platform base class, which every selected platform derives from."""
        base: type = import_object(self.spec.base_class)
        return base

    @property
    def torch(self) -> Any:
        import torch

        return torch

    @property
    def device(self) -> Any:
        """The device ``get_device(0)`` returned (checks that use it declare that need)."""
        return self.values["device"]


def _describe(exc: BaseException) -> str:
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def _not_implemented(exc: NotImplementedError, platform: object) -> str:
    text = str(exc).strip()
    if not text or text.startswith(f"{type(platform).__qualname__} does not implement"):
        return "not implemented (the contract's default raises NotImplementedError)"
    return f"not implemented: {text}"  # the platform's own reason says more than the default


# Checks that, when they find their method missing, leave what a launch uses instead for the
# checks that need them (device.get_device: torch.device(device_type, local_rank)).
_STAND_INS = frozenset({"device.get_device"})


def evaluate(check: Check, probe: Probe) -> rows.Row:
    """Run ``check`` against ``probe`` and return its row (never raises for a platform's fault)."""

    def row(
        status: str, detail: str, expected: str | None = None, missing: str | None = None
    ) -> rows.Row:
        probe.statuses[check.id] = status
        return rows.Row(check.id, check.group, check.title, status, detail, expected, missing)

    for need in check.needs:
        status = probe.statuses.get(need)
        # A missing method whose stand-in a launch uses (device.get_device's) serves as well.
        if status != rows.PASS and not (status == rows.MISSING and need in _STAND_INS):
            return row(rows.SKIPPED, f"needs {need} to pass (it is {status or 'not run'})")
    try:
        detail = check.fn(probe)
    except rows.Skip as exc:
        return row(rows.SKIPPED, str(exc))
    except rows.Missing as exc:
        return row(rows.MISSING, str(exc))
    except rows.CheckFailed as exc:
        return row(rows.FAIL, str(exc), check.contract)
    except NotImplementedError as exc:
        if check.required is not None:
            method, where = check.required
            return row(
                rows.FAIL,
                f"{_not_implemented(exc, probe.platform)}, but a launch needs {method}(): {where}",
                check.contract,
                missing=method,
            )
        if check.optional:
            return row(rows.MISSING, _not_implemented(exc, probe.platform))
        return row(
            rows.FAIL,
            f"raised {_describe(exc)}, but the contract gives this method a working default",
            check.contract,
        )
    except Exception as exc:  # noqa: BLE001 - whatever the platform raises is this row's failure
        return row(rows.FAIL, f"raised {_describe(exc)}", check.contract)
    return row(rows.PASS, detail)
