"""Tool calls in a model's text: the formats ``--tool-call-parser`` names (SGLang's names), and
how one text, whole or streamed, becomes content and calls.

A format (``ToolFormat``) says where the calls start (``marker``: ``<tool_call>`` for ``qwen25``,
``qwen`` and ``hermes``; ``<|python_tag|>`` for ``llama3``, whose calls may also open the text without it, as Llama 3.2's
JSON calls do; ``[TOOL_CALLS]`` for ``mistral``), what
may stand between the call objects (tags, separators, whitespace), and which key holds a call's
arguments. Every call is a JSON object with a ``name`` (one of the request's functions) and its
arguments (a JSON object) under ``arguments`` or ``parameters``. ``FORCED`` is the format a
``tool_choice`` of ``required`` or a named function makes the model write under a grammar: a JSON
array of such objects from the first character, SGLang's shape.

``scan(text, fmt, names)`` reads a text: what comes before the marker is content; after it, each
complete call is kept. A text whose calls are not readable (not JSON, an unknown function) has
no calls, and all of it is content. ``ToolStream`` gives the same result in increments, as
OpenAI streams it: content as it arrives (text that may be the start of the marker held back),
then for each call a first delta with its index, id, type, name and empty arguments and later
deltas that append the arguments' text. Joined, a stream's deltas are the text's calls: the
arguments are the model's own text of the JSON object, in both.
"""

from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass, field

from serving.http.responses import FunctionCall, FunctionCallDelta, ToolCall, ToolCallDelta

_WS = " \t\r\n"


@dataclass(frozen=True)
class ToolFormat:
    """How one model family writes its calls (see the module docstring)."""

    name: str
    marker: str  # "": the calls start at the text's first character
    between: tuple[str, ...]  # texts that may stand between (and around) the call objects
    args_keys: tuple[str, ...] = ("arguments", "parameters")
    bare: bool = False  # calls may also start the text without the marker (a first "{")

    def example(self, name: str) -> str:
        """How a call of function ``name`` is written in this format (the fallback prompt's
        instruction, and an earlier call of the conversation written back)."""
        return self.write([(name, '{"<argument>": <value>}')])

    def write(self, calls: list[tuple[str, str]]) -> str:
        """The text of ``calls`` (name, arguments as JSON text) in this format."""
        objects = [f'{{"name": {json.dumps(n)}, "{self.args_keys[0]}": {a}}}' for n, a in calls]
        if self.marker == "<tool_call>":
            return "\n".join(f"<tool_call>\n{o}\n</tool_call>" for o in objects)
        if self.marker == "<|python_tag|>":
            return self.marker + "; ".join(objects)
        return (self.marker + " " if self.marker else "") + "[" + ", ".join(objects) + "]"


_TAGGED = ToolFormat("qwen25", "<tool_call>", ("<tool_call>", "</tool_call>"))
FORMATS: dict[str, ToolFormat] = {
    "qwen25": _TAGGED,
    "qwen": ToolFormat("qwen", _TAGGED.marker, _TAGGED.between),
    "hermes": ToolFormat("hermes", _TAGGED.marker, _TAGGED.between),
    "llama3": ToolFormat(
        "llama3", "<|python_tag|>", ("<|python_tag|>", ";"), ("parameters", "arguments"), True
    ),
    "mistral": ToolFormat("mistral", "[TOOL_CALLS]", ("[", "]", ",")),
}
FORCED = ToolFormat("forced", "", ("[", "]", ","), ("parameters", "arguments"))
# What a chat template writes when it renders calls in a format, most specific first.
_TEMPLATE_MARKERS = (
    ("<|python_tag|>", "llama3"),
    ("[TOOL_CALLS]", "mistral"),
    ("<tool_call>", "qwen25"),
)
DEFAULT_PARSER = "qwen25"


def infer_parser(template: str | None) -> str:
    """The parser of the format ``template`` (a chat template's text) writes calls in, by the
    marker it holds; ``qwen25`` (also the fallback prompt's format) when it holds none."""
    for marker, name in _TEMPLATE_MARKERS:
        if template and marker in template:
            return name
    return DEFAULT_PARSER


@dataclass
class CallScan:
    """One call object of a text: positions are offsets in that text."""

    name: str | None = None
    args_start: int | None = None
    args_end: int | None = None
    end: int | None = None  # after its closing brace; None: not complete yet
    bad: bool = False  # not a call (its name or arguments are not what a call holds)


@dataclass
class Scan:
    """A text read in a format: ``start`` is where the calls begin (the text's length: none
    yet); ``held`` how many characters before ``start`` may be the marker's beginning;
    ``calls`` every call object begun; ``broken``: the text after ``start`` is not calls."""

    start: int
    held: int = 0
    calls: list[CallScan] = field(default_factory=list)
    broken: bool = False


def _skip_ws(text: str, i: int) -> int:
    while i < len(text) and text[i] in _WS:
        i += 1
    return i


_STRING = re.compile(r'"(?:[^"\\\x00-\x1f]|\\(?:["\\/bfnrt]|u[0-9a-fA-F]{4}))*"')
_PARTIAL_STRING = re.compile(r'"(?:[^"\\\x00-\x1f]|\\(?:["\\/bfnrt]|u[0-9a-fA-F]{0,4})?)*\Z')
_NUMBER = re.compile(r"-?(?:0|[1-9]\d*)(?:\.\d+)?(?:[eE][+-]?\d+)?")
_LITERALS = ("true", "false", "null")


class _Bad(Exception):
    """The text is not JSON where a call's JSON is expected."""


def _value_end(text: str, i: int) -> int | None:
    """Where the JSON value at ``text[i]`` ends; None when the text ends first; ``_Bad`` when
    it is not JSON."""
    if i >= len(text):
        return None
    c = text[i]
    if c == '"':
        m = _STRING.match(text, i)
        if m:
            return m.end()
        if _PARTIAL_STRING.match(text, i):
            return None
        raise _Bad
    if c in "{[":
        close = "}" if c == "{" else "]"
        i = _skip_ws(text, i + 1)
        first = True
        while True:
            if i >= len(text):
                return None
            if text[i] == close:
                return i + 1
            if not first:
                if text[i] != ",":
                    raise _Bad
                i = _skip_ws(text, i + 1)
            first = False
            if i >= len(text):
                return None
            if c == "{":
                if text[i] != '"':
                    raise _Bad
                key_end = _value_end(text, i)
                if key_end is None:
                    return None
                i = _skip_ws(text, key_end)
                if i >= len(text):
                    return None
                if text[i] != ":":
                    raise _Bad
                i = _skip_ws(text, i + 1)
            end = _value_end(text, i)
            if end is None:
                return None
            i = _skip_ws(text, end)
    for word in _LITERALS:
        if text.startswith(word, i):
            return i + len(word)
        if word.startswith(text[i:]):
            return None
    m = _NUMBER.match(text, i)
    if m:
        return None if m.end() == len(text) else m.end()
    if text[i:] == "-":
        return None
    raise _Bad


def _scan_call(text: str, i: int, fmt: ToolFormat, names: frozenset[str]) -> CallScan:
    """The call object at ``text[i]`` (a ``{``), as far as the text goes; ``_Bad`` when it is
    not a JSON object."""
    call = CallScan()
    i = _skip_ws(text, i + 1)
    first = True
    while i < len(text):
        if text[i] == "}":
            call.end = i + 1
            call.bad = call.bad or call.name is None
            return call
        if not first:
            if text[i] != ",":
                raise _Bad
            i = _skip_ws(text, i + 1)
        first = False
        if i >= len(text):
            break
        if text[i] != '"':
            raise _Bad
        key_end = _value_end(text, i)
        if key_end is None:
            break
        key = json.loads(text[i:key_end])
        i = _skip_ws(text, key_end)
        if i >= len(text):
            break
        if text[i] != ":":
            raise _Bad
        i = _skip_ws(text, i + 1)
        if i >= len(text):
            break
        is_args = key in fmt.args_keys and call.args_start is None
        if is_args:
            call.args_start = i
            call.bad = call.bad or text[i] != "{"
        end = _value_end(text, i)
        if end is None:
            break
        if key == "name":
            name = json.loads(text[i:end])
            call.name = name if isinstance(name, str) else None
            call.bad = call.bad or call.name not in names
        if is_args:
            call.args_end = end
        i = _skip_ws(text, end)
    return call


def _between(text: str, i: int, fmt: ToolFormat) -> tuple[int, bool]:
    """Past what may stand between call objects from ``i``: (where, complete); complete is
    False when the text ends inside a tag."""
    while i < len(text):
        if text[i] in _WS:
            i += 1
            continue
        for tag in fmt.between:
            if text.startswith(tag, i):
                i += len(tag)
                break
            if tag.startswith(text[i:]):
                return i, False
        else:
            return i, True
    return i, True


def scan(text: str, fmt: ToolFormat, names: frozenset[str]) -> Scan:
    """Read ``text`` in ``fmt`` (``names``: the functions the request offers)."""
    skip = len(fmt.marker)
    if fmt.marker:
        at = text.find(fmt.marker)
        if at == -1 and fmt.bare:
            first = _skip_ws(text, 0)
            if first == len(text):  # only whitespace yet: a call may still start the text
                return Scan(len(text), len(text))
            if text[first] == "{":
                at, skip = first, 0
        if at == -1:
            held = 0
            for n in range(min(len(fmt.marker) - 1, len(text)), 0, -1):
                if fmt.marker.startswith(text[-n:]):
                    held = n
                    break
            return Scan(len(text), held)
    else:
        at = 0
    result = Scan(at)
    i = at + skip
    try:
        while True:
            i, complete = _between(text, i, fmt)
            if i >= len(text) or not complete:
                return result
            if text[i] != "{":
                raise _Bad
            call = _scan_call(text, i, fmt, names)
            result.calls.append(call)
            if call.end is None:
                return result
            i = call.end
    except (_Bad, ValueError):
        result.broken = True
        return result


def new_call_id() -> str:
    """An id for a call, as OpenAI's look: ``call_`` and hex digits."""
    return f"call_{uuid.uuid4().hex[:24]}"


def parse(text: str, fmt: ToolFormat, names: frozenset[str]) -> tuple[str | None, list[ToolCall]]:
    """``text`` (a whole completion) as its content (None when it is only whitespace or
    nothing) and its calls (each with a new id)."""
    read = scan(text, fmt, names)
    calls = [
        ToolCall(
            id=new_call_id(),
            function=FunctionCall(name=c.name or "", arguments=_arguments(text, c)),
        )
        for c in read.calls
        if c.end is not None and not c.bad
    ]
    content = text[: read.start] if calls else text
    return (content if content.strip() else None), calls


def _arguments(text: str, call: CallScan) -> str:
    if call.args_start is None:
        return "{}"
    return text[call.args_start : call.args_end]


class ToolStream:
    """One streamed choice's text, read in increments (see the module docstring)."""

    def __init__(self, fmt: ToolFormat, names: frozenset[str]) -> None:
        self.fmt = fmt
        self.names = names
        self.text = ""
        self.content_sent = 0
        self.sent: list[int] = []  # per announced call: how much of its arguments went out
        self.ids: list[str] = []
        self.released = False  # the calls were unreadable: everything is content

    @property
    def called(self) -> bool:
        """Whether a call was announced."""
        return bool(self.sent)

    def feed(self, piece: str, final: bool = False) -> tuple[str, list[ToolCallDelta]]:
        """The content and call deltas ``piece`` adds (``final``: the text ends with it)."""
        self.text += piece
        if self.released:
            return self._content(len(self.text)), []
        read = scan(self.text, self.fmt, self.names)
        calls = [c for c in read.calls if not c.bad]
        if not self.sent and (read.broken or (final and not any(c.end for c in calls))):
            if read.start < len(self.text):
                self.released = True
                return self._content(len(self.text)), []
        content_end = read.start - (0 if final else read.held)
        content = self._content(content_end)
        deltas: list[ToolCallDelta] = []
        for index, call in enumerate(calls):
            if index >= len(self.sent):
                if call.name is None or (call.args_start is None and call.end is None):
                    break
                self.sent.append(0)
                self.ids.append(new_call_id())
                deltas.append(
                    ToolCallDelta(
                        index=index,
                        id=self.ids[index],
                        type="function",
                        function=FunctionCallDelta(name=call.name, arguments=""),
                    )
                )
            if call.args_start is None:
                more = "{}" if call.end is not None and self.sent[index] == 0 else ""
            else:
                end = call.args_end if call.args_end is not None else len(self.text)
                more = self.text[call.args_start + self.sent[index] : end]
            if more:
                self.sent[index] += len(more)
                deltas.append(
                    ToolCallDelta(index=index, function=FunctionCallDelta(arguments=more))
                )
        return content, deltas

    def _content(self, end: int) -> str:
        if end <= self.content_sent:
            return ""
        piece = self.text[self.content_sent : end]
        self.content_sent = end
        return piece
