"""Tool calling on ``/v1/chat/completions``: what a request's ``tools`` and ``tool_choice`` make
of the prompt, the sampling and the answer.

``ToolPlan.of(body, template, parser)`` is None without tools or with ``tool_choice`` ``none``
(the tools are then left out of the prompt, and the text is never read for calls). Otherwise:

- the prompt: the chat template renders the tools (``tools=`` of ``apply_chat_template``) when it
  reads them; a template that does not gets the fallback prompt instead, a system text listing
  each function's JSON Schema and how to write a call in the parser's format (added to the first
  system message, or a system message of its own);
- ``auto``: the model writes what it likes; its text is read in the format of ``parser``
  (``--tool-call-parser``, else the one ``infer_parser`` finds in the template);
- ``required`` or a named function: a grammar (``SamplingParams.json_schema``) makes the model
  write a JSON array of one or more calls (one with ``parallel_tool_calls`` false), each
  ``{"name": ..., "parameters": ...}`` whose parameters match that function's schema (SGLang's
  shape); a named function allows only that one.

``conversation(messages, native, fmt)`` is the messages as the template reads them: an assistant
message's ``tool_calls`` with their arguments as JSON objects and a ``tool`` message's
``tool_call_id`` when the template renders tools; otherwise the calls written into the
assistant's text in the parser's format and each tool message a user turn holding
``<tool_response>`` + its text + ``</tool_response>``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from serving.http.tool_parsers import FORCED, FORMATS, ToolFormat, ToolStream, parse
from serving.http.tool_schemas import Tool

FALLBACK_INTRO = (
    "You may call functions to answer. These are the functions, each given as its name, what "
    "it does, and the JSON Schema of its arguments:"
)


@dataclass(frozen=True)
class ToolPlan:
    """How one request calls tools (see the module docstring)."""

    tools: list[Tool]
    fmt: ToolFormat  # the format the answer is read in
    write_fmt: ToolFormat  # the format the fallback prompt teaches
    forced: bool
    schema: str | None  # the grammar of a forced call (a JSON Schema as text)

    @classmethod
    def of(cls, body: Any, parser: str) -> ToolPlan | None:
        """The plan of ``body`` (a ``ChatCompletionRequest``, checked) served with ``parser``."""
        choice = body.tool_choice
        if not body.tools or choice == "none":
            return None
        written = FORMATS[parser]
        if choice in (None, "auto"):
            return cls(body.tools, written, written, False, None)
        offered = body.tools
        if not isinstance(choice, str):
            offered = [t for t in body.tools if t.function.name == choice.function.name]
        schema = forced_schema(offered, body.parallel_tool_calls)
        return cls(body.tools, FORCED, written, True, json.dumps(schema))

    @property
    def names(self) -> frozenset[str]:
        return frozenset(t.function.name for t in self.tools)

    def template_tools(self) -> list[dict[str, Any]]:
        """The tools as a chat template reads them (OpenAI's shape)."""
        return [
            {"type": "function", "function": _function(t)}
            for t in self.tools  # the whole list: a named choice is still one of them
        ]

    def fallback_prompt(self) -> str:
        """The system text of the fallback (a template that does not render tools)."""
        lines = [FALLBACK_INTRO]
        lines += [json.dumps(_function(t)) for t in self.tools]
        lines.append(
            "To call a function, answer with the call and nothing else, written like this:\n"
            + self.write_fmt.example(self.tools[0].function.name)
        )
        return "\n".join(lines)

    def parse(self, text: str, reason: str | None) -> tuple[str | None, list[Any], str | None]:
        """A whole answer: its content, its calls and its finish reason (``tool_calls`` when
        the model stopped after calling)."""
        content, calls = parse(text, self.fmt, self.names)
        return content, calls, finish_reason(reason, bool(calls))

    def stream(self) -> ToolStream:
        return ToolStream(self.fmt, self.names)


def finish_reason(reason: str | None, called: bool) -> str | None:
    """``tool_calls`` for an answer that stopped after its calls, else ``reason``."""
    return "tool_calls" if called and reason == "stop" else reason


def _function(tool: Tool) -> dict[str, Any]:
    out: dict[str, Any] = {"name": tool.function.name}
    if tool.function.description is not None:
        out["description"] = tool.function.description
    out["parameters"] = _parameters(tool)
    return out


def _parameters(tool: Tool) -> dict[str, Any]:
    return tool.function.parameters or {"type": "object", "properties": {}}


def forced_schema(tools: list[Tool], parallel: bool) -> dict[str, Any]:
    """The JSON Schema of a forced answer: an array of calls of ``tools`` (at most one when not
    ``parallel``)."""
    calls = [
        {
            "type": "object",
            "properties": {
                "name": {"type": "string", "enum": [t.function.name]},
                "parameters": _parameters(t),
            },
            "required": ["name", "parameters"],
            "additionalProperties": False,
        }
        for t in tools
    ]
    schema: dict[str, Any] = {
        "type": "array",
        "minItems": 1,
        "items": calls[0] if len(calls) == 1 else {"anyOf": calls},
    }
    if not parallel:
        schema["maxItems"] = 1
    return schema


def conversation(messages: list[Any], native: bool, fmt: ToolFormat) -> list[dict[str, Any]]:
    """``messages`` (``ChatMessage``s) as the chat template reads them (see the module
    docstring)."""
    out: list[dict[str, Any]] = []
    for m in messages:
        role = "system" if m.role == "developer" else m.role
        entry: dict[str, Any] = {"role": role, "content": m.text}
        if native:
            if m.tool_calls:
                entry["tool_calls"] = [
                    {
                        "id": c.id,
                        "type": "function",
                        "function": {
                            "name": c.function.name,
                            "arguments": json.loads(c.function.arguments),
                        },
                    }
                    for c in m.tool_calls
                ]
            if m.tool_call_id is not None:
                entry["tool_call_id"] = m.tool_call_id
        elif m.tool_calls:
            written = fmt.write([(c.function.name, c.function.arguments) for c in m.tool_calls])
            entry["content"] = f"{m.text}\n{written}" if m.text else written
        elif role == "tool":
            entry = {"role": "user", "content": f"<tool_response>\n{m.text}\n</tool_response>"}
        out.append(entry)
    return out


def with_fallback_prompt(conv: list[dict[str, Any]], prompt: str) -> list[dict[str, Any]]:
    """``conv`` with ``prompt`` added to its first system message, or as a system message of
    its own before the others."""
    if conv and conv[0]["role"] == "system":
        first = dict(conv[0])
        first["content"] = f"{first['content']}\n\n{prompt}" if first["content"] else prompt
        return [first, *conv[1:]]
    return [{"role": "system", "content": prompt}, *conv]
