"""The request shapes of tool calling on ``/v1/chat/completions`` (OpenAI's), and their checks.

``tools`` lists ``Tool``s (``type`` "function", a ``function`` with a ``name`` of letters, digits,
``_`` and ``-`` up to 64 characters, unique in the request, a ``description`` and ``parameters``,
the JSON Schema of its arguments: an object schema). ``tool_choice`` is ``"auto"`` (the default
with tools), ``"none"`` (the default without), ``"required"``, or ``ToolChoiceFunction`` naming
one of them. An assistant message of the conversation may carry the ``tool_calls`` it made
(``MessageToolCall``, arguments a JSON object as text), and a ``tool`` message answers one of them
(``tool_call_id``).

``tools_problem(tools, tool_choice)`` and ``message_problem(message, prefix)`` return the
``(message, param)`` of the first thing wrong, naming the field and what to send (the request
schemas raise it as a 400); None when all is well. Standard library and msgspec only: the request
schemas import this module.
"""

from __future__ import annotations

import json
import re
from typing import Annotated, Any

import msgspec

TOOL_CHOICES = ("auto", "none", "required")
_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
# The types a JSON Schema's "type" may name.
_SCHEMA_TYPES = frozenset({"object", "array", "string", "number", "integer", "boolean", "null"})
# Keywords whose value is a schema, a list of schemas, or an object of schemas.
_ONE = ("items", "additionalProperties", "not", "if", "then", "else", "contains")
_MANY = ("anyOf", "oneOf", "allOf", "prefixItems")
_NAMED = ("properties", "$defs", "definitions", "patternProperties")
Problem = tuple[str, str]


class FunctionDef(msgspec.Struct, kw_only=True):
    name: Annotated[str, msgspec.Meta(description="letters, digits, _ and -; at most 64")]
    description: str | None = None
    parameters: Annotated[
        dict[str, Any] | None,
        msgspec.Meta(description="the JSON Schema of the arguments (an object schema)"),
    ] = None
    strict: Annotated[bool | None, msgspec.Meta(description="accepted; calls always match")] = None


class Tool(msgspec.Struct, kw_only=True):
    type: Annotated[str, msgspec.Meta(description="only function")] = "function"
    function: FunctionDef


class NamedFunction(msgspec.Struct, kw_only=True):
    name: str


class ToolChoiceFunction(msgspec.Struct, kw_only=True):
    """``{"type": "function", "function": {"name": ...}}``: call that function."""

    type: Annotated[str, msgspec.Meta(description="only function")] = "function"
    function: NamedFunction


class CalledFunction(msgspec.Struct, kw_only=True):
    name: str
    arguments: Annotated[str, msgspec.Meta(description="a JSON object, as text")]


class MessageToolCall(msgspec.Struct, kw_only=True):
    """A call an assistant message of the conversation made."""

    id: str | None = None
    type: str = "function"
    function: CalledFunction


def tools_problem(
    tools: list[Tool] | None, choice: str | ToolChoiceFunction | None
) -> Problem | None:
    """What is wrong with ``tools`` and ``tool_choice`` (see the module docstring)."""
    seen: set[str] = set()
    for i, tool in enumerate(tools or []):
        at = f"tools[{i}]"
        if tool.type != "function":
            return f"{at}.type {tool.type!r} is not supported; send 'function'", f"{at}.type"
        name = tool.function.name
        if not _NAME.match(name):
            return (
                f"{at}.function.name {name!r} must be 1 to 64 letters, digits, '_' or '-'",
                f"{at}.function.name",
            )
        if name in seen:
            return (
                f"{at}.function.name {name!r} is given twice; name each function once",
                f"{at}.function.name",
            )
        seen.add(name)
        params = tool.function.parameters
        if params is not None:
            if params.get("type", "object") != "object":
                return (
                    f"{at}.function.parameters must be an object schema (type 'object'), not "
                    f"type {params.get('type')!r}: the arguments are a JSON object",
                    f"{at}.function.parameters",
                )
            wrong = schema_problem(params, f"{at}.function.parameters")
            if wrong:
                return wrong
    if isinstance(choice, str):
        if choice not in TOOL_CHOICES:
            return (
                f"tool_choice {choice!r} is not one of {', '.join(TOOL_CHOICES)}, or "
                f'{{"type": "function", "function": {{"name": ...}}}}',
                "tool_choice",
            )
        if choice == "required" and not tools:
            return "tool_choice 'required' needs tools; send the functions in tools", "tool_choice"
    elif choice is not None:
        if choice.type != "function":
            return (
                f"tool_choice.type {choice.type!r} is not supported; send 'function'",
                "tool_choice.type",
            )
        if choice.function.name not in seen:
            offered = ", ".join(sorted(seen)) or "none"
            return (
                f"tool_choice.function.name {choice.function.name!r} is not one of the tools "
                f"(offered: {offered}); name a function of tools",
                "tool_choice.function.name",
            )
    return None


def schema_problem(schema: Any, where: str) -> Problem | None:
    """What makes ``schema`` (at ``where``) not a JSON Schema: not an object (or a boolean),
    a ``type`` that names no JSON type, ``properties`` that are not schemas, ``required`` that
    is not a list of names."""
    if isinstance(schema, bool):
        return None
    if not isinstance(schema, dict):
        return f"{where} must be a JSON Schema (an object), not {json.dumps(schema)}", where
    kind = schema.get("type")
    kinds = kind if isinstance(kind, list) else [kind] if kind is not None else []
    for k in kinds:
        if k not in _SCHEMA_TYPES:
            return (
                f"{where}.type {json.dumps(k)} is not a JSON Schema type; use one of "
                f"{', '.join(sorted(_SCHEMA_TYPES))}",
                f"{where}.type",
            )
    required = schema.get("required")
    if required is not None and not (
        isinstance(required, list) and all(isinstance(r, str) for r in required)
    ):
        return f"{where}.required must be a list of property names", f"{where}.required"
    for key in _NAMED:
        group = schema.get(key)
        if group is None:
            continue
        if not isinstance(group, dict):
            return f"{where}.{key} must be an object of schemas", f"{where}.{key}"
        for name, sub in group.items():
            wrong = schema_problem(sub, f"{where}.{key}.{name}")
            if wrong:
                return wrong
    for key in _MANY:
        group = schema.get(key)
        if group is None:
            continue
        if not isinstance(group, list):
            return f"{where}.{key} must be a list of schemas", f"{where}.{key}"
        for i, sub in enumerate(group):
            wrong = schema_problem(sub, f"{where}.{key}[{i}]")
            if wrong:
                return wrong
    for key in _ONE:
        if key in schema:
            wrong = schema_problem(schema[key], f"{where}.{key}")
            if wrong:
                return wrong
    return None


def message_problem(message: Any, prefix: str) -> Problem | None:
    """What is wrong with a ``ChatMessage``'s tool fields (``prefix``: ``messages[i].``)."""
    role, content, tool_calls = message.role, message.content, message.tool_calls
    tool_call_id: str | None = message.tool_call_id
    if tool_calls and role != "assistant":
        return (
            f"{prefix}tool_calls is only for an assistant message, not a {role!r} one",
            prefix + "tool_calls",
        )
    for j, call in enumerate(tool_calls or []):
        at = f"{prefix}tool_calls[{j}].function.arguments"
        try:
            args = json.loads(call.function.arguments)
        except ValueError:
            args = None
        if not isinstance(args, dict):
            return f"{at} must be a JSON object as text, such as '{{}}'", at
    if role == "tool" and not tool_call_id:
        return (
            f"{prefix}tool_call_id is required in a tool message; send the id of the call it "
            f"answers",
            prefix + "tool_call_id",
        )
    if content is None and not tool_calls:
        return f"{prefix}content is required; send the message's text", prefix + "content"
    return None
