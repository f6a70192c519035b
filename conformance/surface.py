"""What a platform class's definition hides: public names the runtime never calls, and overrides
that cannot take what the runtime passes.

A platform's contract is the public surface of its runtime's base class (``SRTPlatform`` with
``DeviceMixin``, or the diffusion ``Platform``). Two mistakes pass every call-based check in
silence:

- a public method (or attribute) that is not a contract name: a typo (``get_devcie_name``), a
  name from the other runtime's contract, or a method SGLang renamed. The runtime never calls
  it, so the contract method it was meant to be keeps its default;
- an override whose parameters cannot bind a call the base signature accepts (a dropped
  ``device_id``, a renamed keyword, a new required parameter): the first call of the runtime
  raises ``TypeError`` in a worker.

Only the classes the platform adds are read (those of its MRO that are not the base class or
its bases). Private names (``_x``) are the platform's own business.
"""

from __future__ import annotations

import difflib
import inspect
from collections.abc import Callable, Iterator
from typing import Any

_SENTINEL = object()


def own_classes(cls: type, base: type) -> list[type]:
    """The classes of ``cls``'s MRO that the platform adds on top of ``base``'s."""
    inherited = set(base.__mro__)
    return [klass for klass in cls.__mro__ if klass not in inherited]


def contract_names(base: type) -> set[str]:
    """The public names of a runtime's contract: everything public on its base class."""
    return {name for name in dir(base) if not name.startswith("_")}


def own_public_names(cls: type, base: type) -> dict[str, type]:
    """Each public name the platform's own classes define, with the (first) class defining it."""
    names: dict[str, type] = {}
    for klass in own_classes(cls, base):
        for name in vars(klass):
            if not name.startswith("_"):
                names.setdefault(name, klass)
    return names


def nearest(name: str, candidates: set[str]) -> str | None:
    """The candidate ``name`` most resembles, if close enough to be a misspelling of it (None
    otherwise: ``vendor_name`` is a helper of the vendor's, not a misspelt ``device_name``)."""
    found = difflib.get_close_matches(name, sorted(candidates), n=1, cutoff=0.75)
    return found[0] if found else None


def stray_names(cls: type, base: type, other_bases: list[type]) -> list[str]:
    """One sentence per public name of ``cls``'s own classes that is not a contract name
    (``other_bases``: the other runtimes' base classes, whose names are called out as such)."""
    contract = contract_names(base)
    other = set().union(*(contract_names(b) for b in other_bases)) - contract
    out = []
    for name, klass in sorted(own_public_names(cls, base).items()):
        if name in contract:
            continue
        where = f"{klass.__qualname__}.{name}"
        if name in other:
            out.append(
                f"{where} belongs to the other runtime's contract, not this one: this runtime "
                f"never calls it (a package serving both runtimes needs a class for each)"
            )
            continue
        close = nearest(name, contract)
        if close is None:
            out.append(
                f"{where} is not part of the contract and resembles no contract name: the "
                f"runtime never uses it; make it private (_{name}) if it is a helper"
            )
            continue
        out.append(
            f"{where} is not part of the contract (nearest contract name: {close}): the runtime "
            f"never calls it; rename it to the contract name it was meant to be, or make it "
            f"private (_{name}) if it is a helper"
        )
    return out


def _callable_of(klass: type, name: str) -> Callable[..., Any] | None:
    """The function ``klass`` stores for ``name`` with how it is called: a plain function (its
    first parameter is the instance), or a static/class method's function as called."""
    raw = inspect.getattr_static(klass, name)
    if isinstance(raw, staticmethod):
        return raw.__func__
    if isinstance(raw, classmethod):
        return raw.__get__(None, klass)  # bound to the class: cls is not a parameter
    if inspect.isfunction(raw):
        return raw
    return None


def _as_called(klass: type, name: str) -> inspect.Signature | None:
    """``name``'s signature on ``klass`` as an instance's caller sees it (without self/cls)."""
    fn = _callable_of(klass, name)
    if fn is None:
        return None
    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError):
        return None
    if inspect.isfunction(inspect.getattr_static(klass, name)):
        params = list(signature.parameters.values())[1:]  # the instance
        signature = signature.replace(parameters=params)
    return signature


def _calls(signature: inspect.Signature) -> Iterator[tuple[str, tuple[object, ...], dict]]:
    """Representative calls the base ``signature`` accepts: positional prefixes from the required
    ones up, each optional parameter by keyword, and every keyword at once."""
    positional = [
        p
        for p in signature.parameters.values()
        if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
    ]
    required = [p for p in positional if p.default is p.empty]
    for count in range(len(required), len(positional) + 1):
        names = ", ".join(p.name for p in positional[:count])
        yield f"({names})" if names else "()", (_SENTINEL,) * count, {}
    keywords = [
        p
        for p in signature.parameters.values()
        if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)
    ]
    must = {p.name: _SENTINEL for p in keywords if p.default is p.empty}
    for p in keywords:
        if p.default is not p.empty:
            yield f"({p.name}=...)", (), {**must, p.name: _SENTINEL}
    if keywords:
        yield (
            "(" + ", ".join(f"{p.name}=..." for p in keywords) + ")",
            (),
            {p.name: _SENTINEL for p in keywords},
        )


def incompatible_overrides(cls: type, base: type) -> tuple[list[str], int]:
    """One sentence per contract method the platform overrides with a signature that cannot bind
    a call the base signature accepts, and how many overrides were compared."""
    contract = contract_names(base)
    problems, compared = [], 0
    for name, klass in sorted(own_public_names(cls, base).items()):
        if name not in contract:
            continue
        theirs = _as_called(base, name)
        ours = _as_called(klass, name)
        if theirs is None or ours is None:
            continue  # an attribute or property: nothing is called with arguments
        compared += 1
        for shown, args, kwargs in _calls(theirs):
            try:
                ours.bind(*args, **kwargs)
            except TypeError as exc:
                problems.append(
                    f"{klass.__qualname__}.{name}{ours} cannot accept what the runtime passes to "
                    f"{name}{theirs}: a call {name}{shown} fails ({exc}); take the base method's "
                    f"parameters, with the same names and defaults"
                )
                break
    return problems, compared
