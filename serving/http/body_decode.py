"""Request bodies to structs: ``decode_body(data, type)`` turns a request body into one of
``serving.http.schemas``' structs, checked (``Body.check``), or raises ``BodyError`` naming the
offending field in the project's words, whatever the bytes: a body that is not JSON, a value of
the wrong type, a text or a key holding an unpaired surrogate (valid JSON, not Unicode text), an
undeclared field of ``/generate`` (refused by name, ``serving.http.native_fields``)."""

from __future__ import annotations

import json
import re
from typing import Any, TypeVar

import msgspec

from serving.http.native_fields import refusal
from serving.http.schemas import Body, BodyError

B = TypeVar("B", bound=Body)
_decoders: dict[type, msgspec.json.Decoder[Any]] = {}
_AT = re.compile(r"^(?P<what>.*?)(?: - at `\$(?P<path>[^`]*)`)?$", re.S)
_TYPE_WORDS = {
    "str": "a string",
    "array": "a list",
    "int": "an integer",
    "float": "a number",
    "bool": "true or false",
    "object": "a JSON object",
    "null": "null",
}


def decode_body(data: bytes, kind: type[B]) -> B:
    """``data`` (a JSON object) as ``kind``, checked; ``BodyError`` names what is wrong."""
    decoder = _decoders.get(kind)
    if decoder is None:
        decoder = _decoders[kind] = msgspec.json.Decoder(kind)
    try:
        body: B = decoder.decode(data)
    except msgspec.ValidationError as exc:
        raise _validation_error(str(exc)) from None
    except (msgspec.DecodeError, RecursionError):
        # msgspec's decode messages lack the position, and it refuses JSON that is valid but
        # holds an unpaired surrogate; the standard parser tells the two apart.
        body = _decode_slowly(data, kind)
    body.check()
    return body


def _decode_slowly(data: bytes, kind: type[B]) -> B:
    """What msgspec's decoder refused: not JSON (the standard parser says where), or JSON that
    holds an unpaired surrogate (``"\ud800"``, which msgspec refuses and the standard parser
    accepts). A value of the wrong type is named first, then the first surrogate."""
    try:
        value = json.loads(data)
    except json.JSONDecodeError as exc:
        where = f" character {exc.pos}" if exc.msg.endswith(" at") else f" at character {exc.pos}"
        raise BodyError(not_json_message(exc.msg + where)) from None
    except UnicodeDecodeError:
        raise BodyError(not_json_message("it is not UTF-8 text")) from None
    except RecursionError:
        raise BodyError(not_json_message("it is nested too deeply")) from None
    except ValueError as exc:
        raise BodyError(not_json_message(str(exc))) from None
    surrogate: list[BodyError] = []
    try:
        value = _without_surrogates(value, "", surrogate)
        body = msgspec.convert(value, kind)
    except msgspec.ValidationError as exc:
        if surrogate and "unknown field" in str(exc):  # that field is the key with a surrogate
            raise surrogate[0] from None
        raise _validation_error(str(exc)) from None
    except RecursionError:
        raise BodyError(not_json_message("it is nested too deeply")) from None
    if surrogate:
        raise surrogate[0]
    return body


def _without_surrogates(value: Any, path: str, found: list[BodyError]) -> Any:
    """``value`` (parsed JSON at ``path``) with every text and key that holds an unpaired
    surrogate made valid; ``found`` gets the error naming the first of them."""
    if isinstance(value, str):
        if not _is_unicode(value):
            if not found:
                found.append(
                    BodyError(
                        f"{path or 'the request body'} must be valid Unicode text (it holds an "
                        f"unpaired surrogate); send UTF-8 text",
                        path or None,
                    )
                )
            return value.encode("utf-8", "replace").decode("utf-8")
        return value
    if isinstance(value, list):
        return [_without_surrogates(item, f"{path}[{i}]", found) for i, item in enumerate(value)]
    if isinstance(value, dict):
        clean = {}
        for key, item in value.items():
            if not _is_unicode(key):
                shown = key.encode("ascii", "backslashreplace").decode("ascii")
                if not found:
                    found.append(
                        BodyError(
                            f"{path or 'the request body'} holds the key '{shown}', which is not "
                            f"valid Unicode text (an unpaired surrogate); send keys as UTF-8 text",
                            f"{path}.{shown}" if path else shown,
                        )
                    )
                key = key.encode("utf-8", "replace").decode("utf-8")
            name = f"{path}.{key}" if path else key
            clean[key] = _without_surrogates(item, name, found)
        return clean
    return value


def _is_unicode(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def not_json_message(problem: str) -> str:
    """The message for a body that is not JSON, with ``problem`` saying why."""
    return (
        f"the request body is not valid JSON ({problem}); send a JSON object, "
        f"for example with Content-Type: application/json"
    )


def _validation_error(text: str) -> BodyError:
    """msgspec's validation message (``Expected `int`, got `str` - at `$.n```) in our words."""
    match = _AT.match(text)
    what, path = (match["what"], match["path"]) if match else (text, None)
    param = path.lstrip(".") or None if path is not None else None
    unknown = re.match(r"Object contains unknown field `(.+)`", what)
    if unknown:
        refused = refusal(unknown[1], param)  # /generate's: refused by name
        if refused is not None:
            return BodyError(*refused)
    missing = re.match(r"Object missing required field `(.+)`", what)
    if missing:
        param = f"{param}.{missing[1]}" if param else missing[1]
        return BodyError(f"{param} is required", param)
    wrong = re.match(r"Expected `(.+?)`, got `(.+?)`", what)
    if wrong:
        expected = " or ".join(_TYPE_WORDS.get(t, t) for t in wrong[1].split(" | "))
        got = _TYPE_WORDS.get(wrong[2], wrong[2])
        if param is None:
            return BodyError(f"the request body must be {expected}, not {got}")
        return BodyError(f"{param} must be {expected}, not {got}", param)
    bound = re.match(r"Expected `(.+?)` (>=|<=|>|<) (.+)", what)
    if bound:
        words = {">=": "at least", "<=": "at most", ">": "more than", "<": "less than"}[bound[2]]
        return BodyError(f"{param or 'the body'} must be {words} {bound[3]}", param)
    return BodyError(f"{param}: {what[:1].lower()}{what[1:]}" if param else what, param)
