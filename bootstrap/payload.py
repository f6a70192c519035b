"""The opaque ServerArgs payload: a dataclass encoded with msgpack (never pickle), versioned.

``encode_payload(args)`` writes ``{"format", "version", "class", "fields"}``; ``decode_payload``
checks the format and version and builds an instance of the class the *child* looked up (after
its hooks), field by field and without running ``__post_init__`` again: the supervisor already
ran it (platform defaults, hook effects), and the child must see exactly the values the supervisor
checked. Fields the payload lacks take the class's defaults; fields the class lacks are an error,
because that means the two processes loaded different plugins.

msgspec is imported inside the functions, so importing this module stays standard-library only.
"""

from __future__ import annotations

import dataclasses
from typing import TypeVar

_T = TypeVar("_T")

FORMAT = "sglang-launch/server-args"
VERSION = 1


class PayloadError(ValueError):
    """A payload that cannot be decoded, with the reason and what to do."""


def _qualname(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


def encode_payload(args: object) -> bytes:
    """``args`` (a dataclass instance) as versioned msgpack bytes."""
    import msgspec

    if not dataclasses.is_dataclass(args) or isinstance(args, type):
        raise TypeError(
            f"expected a dataclass instance such as ServerArgs, got {type(args).__name__}"
        )
    fields = {f.name: getattr(args, f.name) for f in dataclasses.fields(args)}
    try:
        return msgspec.msgpack.encode(
            {"format": FORMAT, "version": VERSION, "class": _qualname(type(args)), "fields": fields}
        )
    except TypeError:
        bad = []
        for name, value in fields.items():
            try:
                msgspec.msgpack.encode(value)
            except TypeError:
                bad.append(f"{name} ({type(value).__name__})")
        raise TypeError(
            f"{type(args).__name__} fields {', '.join(bad)} cannot be sent to the children; "
            "fields must hold plain data (str, int, float, bool, None, lists and dicts of those)"
        ) from None


def decode_payload(data: bytes, cls: type[_T]) -> _T:
    """Build a ``cls`` instance from ``encode_payload`` bytes; ``PayloadError`` on bad data."""
    import msgspec

    try:
        doc = msgspec.msgpack.decode(data)
    except (msgspec.DecodeError, TypeError) as exc:
        raise PayloadError(
            f"the ServerArgs payload is corrupt ({exc}); it must be the unmodified bytes "
            "encode_payload() wrote"
        ) from None
    if (
        not isinstance(doc, dict)
        or doc.get("format") != FORMAT
        or not isinstance(doc.get("fields"), dict)
    ):
        raise PayloadError(
            "the payload is not a ServerArgs payload (no "
            f"{FORMAT!r} header); build it with bootstrap.payload.encode_payload()"
        )
    if doc.get("version") != VERSION:
        raise PayloadError(
            f"the ServerArgs payload has format version {doc.get('version')!r} but this process "
            f"reads version {VERSION}: the supervisor and this child run different sglang-launch "
            "installs; run both from the same environment"
        )
    if not dataclasses.is_dataclass(cls):
        raise PayloadError(
            f"{_qualname(cls)} is not a dataclass and cannot hold a ServerArgs payload"
        )
    fields = doc["fields"]
    known = {f.name: f for f in dataclasses.fields(cls)}
    unknown = sorted(set(fields) - set(known))
    if unknown:
        raise PayloadError(
            f"the payload carries fields {', '.join(unknown)} that {_qualname(cls)} in this "
            f"process lacks (the supervisor built {doc.get('class')}); the supervisor and the "
            "children must load the same plugins (same installed packages and SGLANG_PLUGINS)"
        )
    obj = cls.__new__(cls)
    for name, f in known.items():
        if name in fields:
            value = fields[name]
        elif f.default is not dataclasses.MISSING:
            value = f.default
        elif f.default_factory is not dataclasses.MISSING:
            value = f.default_factory()
        else:
            raise PayloadError(
                f"the payload has no value for required field {name!r} of {_qualname(cls)}; the "
                "supervisor and the children must load the same plugins"
            )
        object.__setattr__(obj, name, value)
    return obj
