"""The checks every option of ``ServerArgs`` gets from its type annotation alone: a value of the
declared type (``T`` or ``T | None``), a finite float; and the flag an option is spelt as."""

from __future__ import annotations

import dataclasses
import math
import typing
from typing import Any


def flag(name: str) -> str:
    """The command-line flag of the field ``name`` (``--tp-size`` for ``tp_size``)."""
    return "--" + name.replace("_", "-")


def field_default(f: dataclasses.Field[Any]) -> Any:
    if f.default is not dataclasses.MISSING:
        return f.default
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return None


def base_type(hint: Any) -> tuple[type, bool]:
    """``(T, optional)`` for ``T`` or ``T | None``."""
    args = typing.get_args(hint)
    if args and type(None) in args:
        rest = [a for a in args if a is not type(None)]
        return (rest[0] if len(rest) == 1 else str), True
    return hint, False


def type_problems(args: Any) -> list[str]:
    """What is wrong with the values of the dataclass ``args`` for their declared types, one
    sentence each naming the flag."""
    problems = []
    hints = typing.get_type_hints(type(args))
    for f in dataclasses.fields(args):
        kind, optional = base_type(hints.get(f.name, object))
        value = getattr(args, f.name)
        if value is None and optional:
            continue
        if kind is float:
            ok = isinstance(value, (int, float)) and not isinstance(value, bool)
            if ok and not math.isfinite(value):
                problems.append(
                    f"{flag(f.name)} {value} is not a finite number; give a plain number "
                    "(inf and nan are not accepted)"
                )
                continue
        elif kind is int:
            ok = isinstance(value, int) and not isinstance(value, bool)
        elif kind in (str, bool):
            ok = isinstance(value, kind)
        else:
            continue
        if not ok:
            shown = "None" if value is None else repr(value)
            problems.append(
                f"{flag(f.name)} must be {'a' if kind is not int else 'an'} {kind.__name__}"
                f"{' or None' if optional else ''}, got {shown} ({type(value).__name__})"
            )
    return problems
