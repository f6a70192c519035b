"""Structured outputs in requests: OpenAI's ``response_format`` and SGLang's ``json_schema``,
``regex`` and ``ebnf``, checked here and turned into the one grammar a sequence follows
(``wire.SamplingParams``; the scheduler compiles and enforces it, ``serving.srt.constrained``).

- ``response_format`` (chat): ``{"type": "text"}`` (no grammar), ``{"type": "json_object"}``
  (any JSON object, as SGLang serves it: the schema ``{"type": "object"}``) or
  ``{"type": "json_schema", "json_schema": {"name": ..., "schema": {...}, "strict": ...}}`` (the
  schema enforced whatever ``strict`` says; no schema: any JSON object).
- ``json_schema`` (a JSON Schema as a JSON string), ``regex``, ``ebnf``: SGLang's names, on
  ``/generate``'s ``sampling_params`` and at the top level of ``/v1/completions`` and
  ``/v1/chat/completions``.

At most one grammar per request. The ``*_problem`` functions return ``(message, param)`` for a
400 naming the field, or None.
"""

from __future__ import annotations

import json
import re
from typing import Any

RESPONSE_FORMAT_TYPES = ("text", "json_object", "json_schema")
GRAMMAR_FIELDS = ("json_schema", "regex", "ebnf")
# The schema of ``{"type": "json_object"}``: any JSON object.
ANY_OBJECT = '{"type": "object"}'
_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")

RESPONSE_FORMAT_DOC = (
    'text (the default), json_object, or json_schema with {"name", "schema", "strict"}: the '
    "output is constrained to it"
)
GRAMMAR_DOCS = {
    "json_schema": "SGLang's: a JSON Schema, as a JSON string, the output is constrained to",
    "regex": "SGLang's: a regular expression the output is constrained to",
    "ebnf": "SGLang's: an EBNF grammar (GBNF dialect, rule root) the output is constrained to",
}


def grammar_problem(fields: Any, prefix: str = "") -> tuple[str, str] | None:
    """A 400 for the native grammar fields of ``fields`` (``json_schema``, ``regex``,
    ``ebnf``): more than one set, an empty one, or a ``json_schema`` that is not a JSON
    object."""
    given = [name for name in GRAMMAR_FIELDS if getattr(fields, name, None) is not None]
    if len(given) > 1:
        names = " and ".join(prefix + name for name in given)
        return f"{names} are set; send at most one grammar", prefix + given[1]
    if not given:
        return None
    name = given[0]
    text = getattr(fields, name)
    if not text.strip():
        return f"{prefix}{name} is empty; send a grammar or leave it out", prefix + name
    if name == "json_schema":
        return _schema_text_problem(text, prefix + name)
    return None


def _schema_text_problem(text: str, param: str) -> tuple[str, str] | None:
    try:
        schema = json.loads(text)
    except ValueError as exc:
        return f"{param} is not valid JSON ({exc}); send a JSON Schema as a JSON string", param
    if not isinstance(schema, dict):
        return f"{param} must be a JSON object (a JSON Schema), not {type(schema).__name__}", param
    return None


def response_format_problem(response_format: dict[str, Any] | None) -> tuple[str, str] | None:
    """A 400 for an OpenAI ``response_format`` this server cannot serve as asked."""
    if response_format is None:
        return None
    kind = response_format.get("type")
    if kind is None:
        return (
            "response_format.type is required: text, json_object or json_schema",
            "response_format.type",
        )
    if kind not in RESPONSE_FORMAT_TYPES:
        return (
            f"response_format.type {kind!r} is not supported; use one of "
            f"{', '.join(RESPONSE_FORMAT_TYPES)}",
            "response_format.type",
        )
    if kind != "json_schema":
        return None
    where = "response_format.json_schema"
    spec = response_format.get("json_schema")
    if not isinstance(spec, dict):
        return f"{where} is required with type json_schema: an object with name and schema", where
    name = spec.get("name")
    if not isinstance(name, str) or not _NAME.match(name):
        return (
            f"{where}.name must be 1 to 64 letters, digits, underscores or dashes, not {name!r}",
            f"{where}.name",
        )
    if spec.get("strict") not in (None, True, False):
        return f"{where}.strict must be true or false", f"{where}.strict"
    schema = spec.get("schema")
    if schema is not None and not isinstance(schema, dict):
        return f"{where}.schema must be a JSON object (a JSON Schema)", f"{where}.schema"
    return None


def conflict_problem(response_format: dict[str, Any] | None, fields: Any) -> tuple[str, str] | None:
    """A 400 for a ``response_format`` that asks for JSON beside a native grammar field."""
    if (response_format or {}).get("type", "text") == "text":
        return None
    for name in GRAMMAR_FIELDS:
        if getattr(fields, name, None) is not None:
            return f"response_format and {name} are both set; send at most one", name
    return None


def grammar_fields(body: Any) -> dict[str, str]:
    """The grammar of a checked request as ``wire.SamplingParams`` fields (empty: none): its
    ``response_format`` (chat) or its native ``json_schema``, ``regex`` or ``ebnf``."""
    response_format = getattr(body, "response_format", None) or {}
    kind = response_format.get("type", "text")
    if kind == "json_object":
        return {"json_schema": ANY_OBJECT}
    if kind == "json_schema":
        schema = response_format["json_schema"].get("schema")
        return {"json_schema": ANY_OBJECT if schema is None else json.dumps(schema)}
    for name in GRAMMAR_FIELDS:
        text = getattr(body, name, None)
        if text is not None:
            return {name: text}
    return {}
