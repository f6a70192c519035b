"""What one check produces: a ``Row`` with a status, and the outcomes a check function raises.

Statuses:

- ``pass``: the platform did what the contract says;
- ``fail``: it did something else; ``expected`` says what the contract expects;
- ``missing``: an optional method whose contract default raises ``NotImplementedError`` is not
  implemented (shown, never a failure; a *required* method that is not implemented fails);
- ``skipped``: the check could not run here; ``detail`` says why.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, NamedTuple

PASS = "pass"
FAIL = "fail"
MISSING = "missing"
SKIPPED = "skipped"
STATUSES = (PASS, FAIL, MISSING, SKIPPED)


class Row(NamedTuple):
    """One check's result. ``expected`` is the contract's wording, set on failures; ``missing``
    names the required method a failed row found not implemented."""

    id: str
    group: str
    title: str
    status: str
    detail: str
    expected: str | None = None
    missing: str | None = None  # a required contract method this row found not implemented

    def to_dict(self) -> dict:
        return self._asdict()

    @classmethod
    def from_dict(cls, data: dict) -> Row:
        fields: dict[str, Any] = {name: data.get(name) for name in cls._fields}
        return cls(**fields)


class CheckFailed(Exception):
    """Raised by a check: the platform broke the contract; the message says what it did."""


class Missing(Exception):
    """Raised by a check: an optional method is not implemented."""


class Skip(Exception):
    """Raised by a check: it cannot run on this machine; the message says why."""


def counts(rows: Iterable[Row]) -> dict[str, int]:
    """``{status: number of rows}`` for every status, zeros included."""
    result = {status: 0 for status in STATUSES}
    for row in rows:
        result[row.status] = result.get(row.status, 0) + 1
    return result
