"""Request bodies of the HTTP API (msgspec structs), which also make the app's OpenAPI schema.

OpenAI shapes for ``/v1/embeddings``, ``/v1/completions`` and ``/v1/chat/completions``;
SGLang's native shape for ``/generate``. ``serving.http.body_decode.decode_body(data, type)``
turns a request body into one of these structs or raises ``BodyError`` naming the offending
field (``param``, a dotted path such as ``sampling_params.temperature``, ``input[2]`` or ``messages[1].content``) in the project's
words, whatever the bytes: a body that is not JSON, a value of the wrong type, a text or a key
that holds an unpaired surrogate (``"\ud800"``: valid JSON, not Unicode text) are each a
``BodyError``. Every bound a client can break is checked here, so a bad value is a 400 before anything
reaches a scheduler; limits that need the tokenizer (tokens per input, prompt + completion length)
are checked by the scheduler, also as 400s naming the field.

Fields that OpenAI's clients may send and this server does not act on are declared on purpose:
``user`` is accepted and ignored; ``dimensions`` and the options that would change the result
and are not implemented (``echo``, ``suffix``, ``best_of`` > 1, ``logit_bias``, prompt
log-probabilities) are refused with a 400 naming them. A grammar (``response_format``, SGLang's
``json_schema``, ``regex``, ``ebnf``) is checked by ``serving.http.structured``. Fields nobody
declared are ignored, except on ``/generate``: every field of SGLang's ``GenerateReqInput`` and
``SamplingParams`` (``serving.http.native_fields``, as of SGLang 0.5.23) is either served or
refused by name, and a field SGLang does not have either is refused too (a typo would otherwise
change nothing, silently).
"""

from __future__ import annotations

from typing import Annotated, Any

import msgspec

from serving.http import structured
from serving.http import tool_schemas as ts

MAX_INPUTS = 2048
MAX_NEW_TOKENS = 1 << 20
MAX_SEED = (1 << 63) - 1
MAX_STOP = 4
MAX_TOP_LOGPROBS = 20
MAX_CHOICES = 128
MAX_PENALTY = 2.0
ENCODING_FORMATS = ("float", "base64")


class BodyError(Exception):
    """A request body the server refuses: ``message`` for the client, ``param`` the field."""

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.param = param


def doc(description: str, **constraints: Any) -> msgspec.Meta:
    """Documentation (and JSON Schema bounds checked by ``check()``, not by msgspec) for a field."""
    return msgspec.Meta(description=description, extra_json_schema=constraints or None)


def bound(value: float, param: str, low: float, high: float) -> None:
    """``BodyError`` unless ``low <= value <= high`` (a NaN is never within)."""
    if not low <= value <= high:
        raise BodyError(f"{param} must be between {low} and {high}, not {value}", param)


def _check_text(value: str, param: str) -> None:
    if not value:
        raise BodyError(f"{param} must not be empty; send some text", param)


def _check_texts(value: str | list[str], param: str) -> None:
    """``value`` (one text or a list of them) for ``param``: 1 to ``MAX_INPUTS`` non-empty texts."""
    if isinstance(value, str):
        _check_text(value, param)
        return
    if not value:
        raise BodyError(f"{param} must hold at least one text", param)
    if len(value) > MAX_INPUTS:
        raise BodyError(
            f"{param} holds {len(value)} texts; at most {MAX_INPUTS} per request", param
        )
    for i, text in enumerate(value):
        _check_text(text, f"{param}[{i}]")


def _refuse(param: str, why: str) -> None:
    raise BodyError(f"{param} is not supported: {why}", param)


# A text, or a list of 1 to MAX_INPUTS texts (the bounds are checked by ``check()``).
_Text = Annotated[str, msgspec.Meta(extra_json_schema={"minLength": 1})]
Texts = Annotated[
    _Text
    | Annotated[
        list[_Text], msgspec.Meta(extra_json_schema={"minItems": 1, "maxItems": MAX_INPUTS})
    ],
    msgspec.Meta(description=f"a text, or a list of texts (at most {MAX_INPUTS})"),
]
Stop = Annotated[
    str | list[str] | None,
    doc(f"up to {MAX_STOP} strings that end the completion (not included in it)"),
]


class Body(msgspec.Struct, kw_only=True):
    """A JSON request body; ``check()`` applies the bounds msgspec's types do not express."""

    def check(self, prefix: str = "") -> None:
        """Raise ``BodyError`` (fields named with ``prefix``) for a value out of bounds."""


class EmbeddingRequest(Body, kw_only=True):
    """OpenAI ``POST /v1/embeddings``."""

    input: Texts
    model: Annotated[str | None, doc("must name the served model when given")] = None
    encoding_format: Annotated[
        str,
        doc(
            "float: a list of numbers; base64: the little-endian float32 bytes, base64-encoded",
            enum=list(ENCODING_FORMATS),
        ),
    ] = "float"
    dimensions: Annotated[
        int | None,
        doc(
            "not supported: the model returns its native size, and a request that sets this is "
            "refused (400)"
        ),
    ] = None
    user: Annotated[str | None, doc("accepted and ignored")] = None

    def check(self, prefix: str = "") -> None:
        _check_texts(self.input, "input")
        if self.encoding_format not in ENCODING_FORMATS:
            raise BodyError(
                f"encoding_format must be 'float' or 'base64', not {self.encoding_format!r}",
                "encoding_format",
            )


class SamplingFields(Body, kw_only=True):
    """Sampling options shared by ``/v1/completions`` and ``/generate``'s ``sampling_params``."""

    temperature: Annotated[float, doc("0 is greedy", minimum=0, maximum=2)] = 1.0
    top_p: Annotated[float, doc("nucleus sampling", exclusiveMinimum=0, maximum=1)] = 1.0
    top_k: Annotated[int, doc("-1 or 0: no top-k cut", minimum=-1, maximum=1 << 30)] = -1
    stop: Stop = None
    seed: Annotated[int | None, doc("repeatable sampling", minimum=0, maximum=MAX_SEED)] = None
    ignore_eos: bool = False
    presence_penalty: Annotated[
        float,
        doc(
            "subtracted from the logit of every token already generated",
            minimum=-MAX_PENALTY,
            maximum=MAX_PENALTY,
        ),
    ] = 0.0
    frequency_penalty: Annotated[
        float,
        doc(
            "subtracted from a token's logit once per time it was generated",
            minimum=-MAX_PENALTY,
            maximum=MAX_PENALTY,
        ),
    ] = 0.0
    json_schema: Annotated[str | None, doc(structured.GRAMMAR_DOCS["json_schema"])] = None
    regex: Annotated[str | None, doc(structured.GRAMMAR_DOCS["regex"])] = None
    ebnf: Annotated[str | None, doc(structured.GRAMMAR_DOCS["ebnf"])] = None

    def check(self, prefix: str = "") -> None:
        wrong = structured.grammar_problem(self, prefix)
        if wrong:
            raise BodyError(*wrong)
        bound(self.temperature, prefix + "temperature", 0.0, 2.0)
        bound(self.presence_penalty, prefix + "presence_penalty", -MAX_PENALTY, MAX_PENALTY)
        bound(self.frequency_penalty, prefix + "frequency_penalty", -MAX_PENALTY, MAX_PENALTY)
        if not 0.0 < self.top_p <= 1.0:
            raise BodyError(
                f"{prefix}top_p must be more than 0 and at most 1, not {self.top_p}",
                prefix + "top_p",
            )
        bound(self.top_k, prefix + "top_k", -1, 1 << 30)
        if self.seed is not None:
            bound(self.seed, prefix + "seed", 0, MAX_SEED)
        stops = (
            [] if self.stop is None else [self.stop] if isinstance(self.stop, str) else self.stop
        )
        if len(stops) > MAX_STOP:
            raise BodyError(
                f"{prefix}stop holds {len(stops)} strings; at most {MAX_STOP} are allowed",
                prefix + "stop",
            )
        for i, text in enumerate(stops):
            _check_text(
                text, f"{prefix}stop" if isinstance(self.stop, str) else f"{prefix}stop[{i}]"
            )

    @property
    def stops(self) -> tuple[str, ...]:
        """``stop`` as a tuple (empty without one)."""
        if self.stop is None:
            return ()
        return (self.stop,) if isinstance(self.stop, str) else tuple(self.stop)


class StreamOptions(Body, kw_only=True):
    include_usage: Annotated[bool, doc("a last chunk with the token counts")] = False


class CompletionRequest(SamplingFields, kw_only=True):
    """OpenAI ``POST /v1/completions`` (plus SGLang's ``top_k`` and ``ignore_eos``)."""

    prompt: Texts
    model: Annotated[str | None, doc("must name the served model when given")] = None
    max_tokens: Annotated[int, doc("tokens to generate", minimum=1, maximum=MAX_NEW_TOKENS)] = 16
    n: Annotated[int, doc("only 1 is supported", minimum=1, maximum=1)] = 1
    stream: bool = False
    stream_options: StreamOptions | None = None
    user: Annotated[str | None, doc("accepted and ignored")] = None
    echo: Annotated[bool, doc("only false is supported")] = False
    suffix: Annotated[str | None, doc("not supported")] = None
    logprobs: Annotated[
        int | None,
        doc(
            "each token's log-probability, and the N most likely tokens at each step",
            minimum=0,
            maximum=MAX_TOP_LOGPROBS,
        ),
    ] = None
    best_of: Annotated[int | None, doc("only 1 is supported")] = None
    logit_bias: Annotated[dict[str, float] | None, doc("not supported")] = None

    def check(self, prefix: str = "") -> None:
        _check_texts(self.prompt, "prompt")
        bound(self.max_tokens, "max_tokens", 1, MAX_NEW_TOKENS)
        if self.n != 1:
            _refuse("n", "one completion per prompt; send n: 1 or leave n out")
        if self.echo:
            _refuse("echo", "the completion never repeats the prompt; leave echo out")
        if self.suffix:
            _refuse("suffix", "leave suffix out")
        if self.logprobs is not None:
            bound(self.logprobs, "logprobs", 0, MAX_TOP_LOGPROBS)
        if self.best_of not in (None, 1):
            _refuse("best_of", "one sample per prompt; leave best_of out")
        if self.logit_bias:
            _refuse("logit_bias", "leave logit_bias out")
        if self.stream and not isinstance(self.prompt, str) and len(self.prompt) != 1:
            raise BodyError(
                "stream: true takes one prompt; send the prompts one per request", "prompt"
            )
        super().check(prefix)


class NativeSamplingParams(SamplingFields, kw_only=True, forbid_unknown_fields=True):
    """SGLang's ``sampling_params``."""

    max_new_tokens: Annotated[int, doc("tokens to generate", minimum=1, maximum=MAX_NEW_TOKENS)] = (
        128
    )
    n: Annotated[
        int,
        doc(
            "samples of the text: above 1 the answer is a list of that many results, as SGLang's",
            minimum=1,
            maximum=MAX_CHOICES,
        ),
    ] = 1
    # SGLang's, served at the value that is this server's behaviour (SGLang's default too).
    skip_special_tokens: Annotated[
        bool, doc("only true: special tokens are left out of the text")
    ] = True
    spaces_between_special_tokens: Annotated[
        bool, doc("only true (SGLang's default; no effect while special tokens are skipped)")
    ] = True
    no_stop_trim: Annotated[bool, doc("only false: the text ends before a stop string")] = False

    def check(self, prefix: str = "") -> None:
        bound(self.max_new_tokens, prefix + "max_new_tokens", 1, MAX_NEW_TOKENS)
        bound(self.n, prefix + "n", 1, MAX_CHOICES)
        if not self.skip_special_tokens:
            _refuse(
                prefix + "skip_special_tokens",
                "special tokens are always left out of the text; leave it out or send true",
            )
        if not self.spaces_between_special_tokens:
            _refuse(prefix + "spaces_between_special_tokens", "only true is served; leave it out")
        if self.no_stop_trim:
            _refuse(
                prefix + "no_stop_trim",
                "the text always ends before its stop string; leave it out or send false",
            )
        super().check(prefix)


class GenerateRequest(Body, kw_only=True, forbid_unknown_fields=True):
    """SGLang's native ``POST /generate``: ``text`` + ``sampling_params`` in, ``text`` +
    ``meta_info`` out (a stream of server-sent events with ``stream: true``)."""

    text: _Text
    sampling_params: NativeSamplingParams = msgspec.field(default_factory=NativeSamplingParams)
    stream: bool = False
    return_logprob: Annotated[
        bool, doc("meta_info gets output_token_logprobs: [logprob, token_id, text]")
    ] = False
    top_logprobs_num: Annotated[
        int,
        doc(
            "with return_logprob: output_top_logprobs, the N most likely tokens at each step",
            minimum=0,
            maximum=MAX_TOP_LOGPROBS,
        ),
    ] = 0
    return_text_in_logprobs: Annotated[
        bool, doc("the token's text in output_token_logprobs (else null)")
    ] = False
    logprob_start_len: Annotated[
        int, doc("only -1: log-probabilities of the prompt are not computed")
    ] = -1

    def check(self, prefix: str = "") -> None:
        _check_text(self.text, "text")
        self.sampling_params.check("sampling_params.")
        if self.stream and self.sampling_params.n != 1:
            _refuse(
                "sampling_params.n",
                "a stream carries one sample; send n: 1 with stream, or n without stream "
                "(a list of results)",
            )
        bound(self.top_logprobs_num, "top_logprobs_num", 0, MAX_TOP_LOGPROBS)
        if self.logprob_start_len != -1:
            _refuse(
                "logprob_start_len",
                "log-probabilities of the prompt are not computed; leave logprob_start_len out",
            )


# ---- chat ---------------------------------------------------------------------------------

CHAT_ROLES = ("system", "developer", "user", "assistant", "tool")


class ContentPart(Body, kw_only=True):
    """One part of a message's ``content``: only ``{"type": "text", "text": ...}``."""

    type: Annotated[str, doc("only text", enum=["text"])]
    text: str | None = None


class ChatMessage(Body, kw_only=True):
    """One message of a conversation: ``content`` a text or a list of text parts (joined with
    a newline); ``developer`` is OpenAI's newer name for ``system``. An assistant message may
    carry its ``tool_calls`` (then ``content`` may be null); a ``tool`` message answers the call
    ``tool_call_id`` names (``serving.http.tool_schemas``)."""

    role: Annotated[str, doc("who speaks", enum=list(CHAT_ROLES))]
    content: str | list[ContentPart] | None = None
    name: Annotated[str | None, doc("accepted and ignored")] = None
    tool_calls: list[ts.MessageToolCall] | None = None
    tool_call_id: Annotated[str | None, doc("a tool message: the call it answers")] = None

    def check(self, prefix: str = "") -> None:
        if self.role not in CHAT_ROLES:
            why = f"{prefix}role {self.role!r} is not supported: use one of {', '.join(CHAT_ROLES)}"
            raise BodyError(why, prefix + "role")
        wrong = ts.message_problem(self, prefix)
        if wrong:
            raise BodyError(*wrong)
        if self.content is None or isinstance(self.content, str):
            return
        for i, part in enumerate(self.content):
            where = f"{prefix}content[{i}]"
            if part.type != "text":
                raise BodyError(
                    f"{where}.type {part.type!r} is not supported: this model reads text "
                    f"only; send parts of type 'text'",
                    where + ".type",
                )
            if part.text is None:
                raise BodyError(f"{where}.text is required", where + ".text")

    @property
    def text(self) -> str:
        """``content`` as one text."""
        if isinstance(self.content, list):
            return "\n".join(part.text or "" for part in self.content)
        return self.content or ""


class ChatCompletionRequest(SamplingFields, kw_only=True):
    """OpenAI ``POST /v1/chat/completions`` (plus SGLang's ``top_k`` and ``ignore_eos``)."""

    messages: Annotated[list[ChatMessage], msgspec.Meta(extra_json_schema={"minItems": 1})]
    model: Annotated[str | None, doc("must name the served model when given")] = None
    max_tokens: Annotated[
        int | None,
        doc(
            "tokens to generate (default: as many as the context leaves)",
            minimum=1,
            maximum=MAX_NEW_TOKENS,
        ),
    ] = None
    max_completion_tokens: Annotated[
        int | None,
        doc("OpenAI's newer name for max_tokens", minimum=1, maximum=MAX_NEW_TOKENS),
    ] = None
    n: Annotated[int, doc("choices to generate", minimum=1, maximum=MAX_CHOICES)] = 1
    stream: bool = False
    stream_options: StreamOptions | None = None
    logprobs: Annotated[bool, doc("each generated token's log-probability")] = False
    top_logprobs: Annotated[
        int | None,
        doc(
            "with logprobs: the N most likely tokens at each step",
            minimum=0,
            maximum=MAX_TOP_LOGPROBS,
        ),
    ] = None
    user: Annotated[str | None, doc("accepted and ignored")] = None
    response_format: Annotated[dict[str, Any] | None, doc(structured.RESPONSE_FORMAT_DOC)] = None
    tools: Annotated[list[ts.Tool] | None, doc("functions the model may call")] = None
    tool_choice: Annotated[
        str | ts.ToolChoiceFunction | None,
        doc("auto (the default with tools), none, required, or a function to call"),
    ] = None
    parallel_tool_calls: Annotated[bool, doc("false: at most one call")] = True
    logit_bias: Annotated[dict[str, float] | None, doc("not supported")] = None

    def check(self, prefix: str = "") -> None:
        if not self.messages:
            raise BodyError("messages must hold at least one message", "messages")
        for i, message in enumerate(self.messages):
            message.check(f"messages[{i}].")
        for name in ("max_tokens", "max_completion_tokens"):
            value = getattr(self, name)
            if value is not None:
                bound(value, name, 1, MAX_NEW_TOKENS)
        bound(self.n, "n", 1, MAX_CHOICES)
        if self.top_logprobs is not None:
            bound(self.top_logprobs, "top_logprobs", 0, MAX_TOP_LOGPROBS)
            if self.top_logprobs and not self.logprobs:
                raise BodyError(
                    "top_logprobs needs logprobs: true; send both or leave top_logprobs out",
                    "top_logprobs",
                )
        wrong = structured.response_format_problem(self.response_format)
        wrong = wrong or structured.conflict_problem(self.response_format, self)
        if wrong:
            raise BodyError(*wrong)
        wrong = ts.tools_problem(self.tools, self.tool_choice)
        if wrong:
            raise BodyError(*wrong)
        if self.logit_bias:
            _refuse("logit_bias", "leave logit_bias out")
        super().check(prefix)

    @property
    def max_new_tokens(self) -> int | None:
        """``max_completion_tokens``, else ``max_tokens``; None when neither is given."""
        return self.max_completion_tokens or self.max_tokens
