"""Every JSON body the HTTP child sends, as msgspec structs: the wire and ``/openapi.json`` both.

A route answers ``json_response(SomeStruct(...))`` and names that struct as its ``Route.response``,
from which ``/openapi.json`` documents its 200 answer; a client can decode the bytes back into the
struct (``msgspec.json.decode(data, type=..., strict=True)``). Field order is the order on the
wire. A field typed ``... | UnsetType`` is left out of the JSON while ``UNSET`` (the usage chunk of
a completion stream is the only chunk that has ``usage``); ``None`` is sent as ``null``.

- text: ``EmbeddingList``, ``Completion``, ``CompletionChunk``, ``ChatCompletion``,
  ``ChatCompletionChunk``, ``GenerateResult``, ``GenerateChunk`` (OpenAI's shapes, and SGLang's
  native one for ``/generate``), with their log-probabilities (``CompletionLogprobs``, OpenAI's
  legacy shape; ``ChatLogprobs``; ``meta_info.output_token_logprobs``, SGLang's);
- the server: ``ModelList``, ``Health``, ``Ready``, ``ServerInfo``, ``ModelInfo``;
- images: ``ImagesResponse`` and the streamed ``ImageProgressEvent`` / ``ImageCompletedEvent``;
- every refusal: ``ErrorBody`` (OpenAI's ``{"error": {"message", "type", "param", "code"}}``),
  made by ``error_body``.
"""

from __future__ import annotations

from typing import Annotated, Final, Literal

import msgspec
from msgspec import UNSET, UnsetType

PROGRESS: Final = "image_generation.progress"  # the streamed image events' names (and their "type")
COMPLETED: Final = "image_generation.completed"
# A JSON object whose values are whatever its source reports (a scheduler's model description
# and memory figures, the server arguments).
JsonObject = dict[str, Annotated[object, msgspec.Meta(description="any JSON value")]]

# ---- errors ----------------------------------------------------------------------------------

ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    404: "not_found_error",
    405: "invalid_request_error",
    413: "invalid_request_error",
    503: "service_unavailable",
    504: "timeout_error",
}


class ErrorDetail(msgspec.Struct):
    message: str
    type: str
    param: str | None
    code: int


class ErrorBody(msgspec.Struct):
    """Every error the server answers (OpenAI's shape)."""

    error: ErrorDetail


_json = msgspec.json.Encoder()


def error_body(status: int, message: str, param: str | None = None) -> bytes:
    """The JSON of an ``ErrorBody``: ``type`` follows ``status`` (``ERROR_TYPES``; otherwise
    ``invalid_request_error`` for a 4xx, ``server_error`` for a 5xx)."""
    kind = ERROR_TYPES.get(status, "invalid_request_error" if status < 500 else "server_error")
    return _json.encode(ErrorBody(ErrorDetail(message, kind, param, status)))


# ---- text ------------------------------------------------------------------------------------


class Embedding(msgspec.Struct, kw_only=True):
    object: Literal["embedding"] = "embedding"
    index: int
    embedding: list[float] | str  # str: the base64 of little-endian float32 values


class EmbeddingUsage(msgspec.Struct, kw_only=True):
    prompt_tokens: int
    total_tokens: int


class EmbeddingList(msgspec.Struct, kw_only=True):
    """OpenAI's answer to ``POST /v1/embeddings``."""

    object: Literal["list"] = "list"
    data: list[Embedding]
    model: str
    usage: EmbeddingUsage


class PromptTokensDetails(msgspec.Struct, kw_only=True):
    """OpenAI's ``usage.prompt_tokens_details``: ``cached_tokens``, how many of the prompt
    tokens had their KV taken from the prefix cache rather than prefilled."""

    cached_tokens: int = 0


class Usage(msgspec.Struct, kw_only=True):
    """OpenAI's ``usage`` of a completion or a chat completion."""

    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    prompt_tokens_details: PromptTokensDetails = msgspec.field(default_factory=PromptTokensDetails)

    @classmethod
    def of(cls, prompt_tokens: int, completion_tokens: int, cached_tokens: int = 0) -> Usage:
        """The usage of ``prompt_tokens`` in (``cached_tokens`` of them from the prefix cache)
        and ``completion_tokens`` out."""
        return cls(
            prompt_tokens=prompt_tokens,
            completion_tokens=completion_tokens,
            total_tokens=prompt_tokens + completion_tokens,
            prompt_tokens_details=PromptTokensDetails(cached_tokens=cached_tokens),
        )


class CompletionLogprobs(msgspec.Struct, kw_only=True):
    """OpenAI's legacy log-probabilities of a completion's tokens (or a chunk's), one entry of
    each list per token: its text, its log-probability, the most likely tokens at its step
    (text to log-probability; null without ``logprobs`` > 0), and its offset in the completion's
    text (the lengths of the tokens before it, counted across a stream's chunks)."""

    tokens: list[str]
    token_logprobs: list[float]
    top_logprobs: list[dict[str, float]] | None
    text_offset: list[int]


class CompletionChoice(msgspec.Struct, kw_only=True):
    index: int
    text: str
    logprobs: CompletionLogprobs | None = None
    finish_reason: str | None  # "length", "stop" or "abort"; null in a chunk before the last


class Completion(msgspec.Struct, kw_only=True):
    """OpenAI's answer to ``POST /v1/completions``."""

    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: Usage


class CompletionChunk(msgspec.Struct, kw_only=True):
    """One streamed event of ``POST /v1/completions``: a text increment in ``choices``, or (with
    ``stream_options.include_usage``, after the last increment) no choices and ``usage``."""

    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: Usage | UnsetType = UNSET


class TopLogprob(msgspec.Struct, kw_only=True):
    token: str
    logprob: float
    bytes: list[int]  # the token's text as UTF-8


class ChatTokenLogprob(msgspec.Struct, kw_only=True):
    token: str
    logprob: float
    bytes: list[int]
    top_logprobs: list[TopLogprob]  # most likely first; empty without top_logprobs


class ChatLogprobs(msgspec.Struct, kw_only=True):
    """A chat choice's (or chunk's) generated tokens with their log-probabilities."""

    content: list[ChatTokenLogprob]


class FunctionCall(msgspec.Struct, kw_only=True):
    name: str
    arguments: str  # a JSON object, as text


class ToolCall(msgspec.Struct, kw_only=True):
    """A call of one of the request's ``tools``; ``id`` (``call_<hex>``) is what the ``tool``
    message that answers it names as its ``tool_call_id``."""

    id: str
    type: Literal["function"] = "function"
    function: FunctionCall


class FunctionCallDelta(msgspec.Struct, kw_only=True):
    name: str | UnsetType = UNSET
    arguments: str


class ToolCallDelta(msgspec.Struct, kw_only=True):
    """A streamed part of call ``index``: the first has its ``id``, ``type`` and name (and
    empty arguments); the others append to its arguments."""

    index: int
    id: str | UnsetType = UNSET
    type: Literal["function"] | UnsetType = UNSET
    function: FunctionCallDelta


class AssistantMessage(msgspec.Struct, kw_only=True):
    """``content`` is null when the answer is only tool calls; ``tool_calls`` is there only
    when the model called a tool; ``refusal`` is always null (OpenAI's field: this server never
    answers with a refusal in its place)."""

    role: Literal["assistant"] = "assistant"
    content: str | None
    refusal: None = None
    tool_calls: list[ToolCall] | UnsetType = UNSET


class ChatChoice(msgspec.Struct, kw_only=True):
    index: int
    message: AssistantMessage
    logprobs: ChatLogprobs | None = None
    finish_reason: str | None  # "length", "stop", "tool_calls" or "abort"


class ChatCompletion(msgspec.Struct, kw_only=True):
    """OpenAI's answer to ``POST /v1/chat/completions``; ``usage.prompt_tokens`` counts the
    prompt the chat template made of the messages."""

    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int
    model: str
    choices: list[ChatChoice]
    usage: Usage


class ChatDelta(msgspec.Struct, kw_only=True):
    """What a chunk adds to its choice: the role in the choice's first chunk, then text or
    parts of tool calls."""

    role: Literal["assistant"] | UnsetType = UNSET
    content: str | UnsetType = UNSET
    tool_calls: list[ToolCallDelta] | UnsetType = UNSET


class ChatChunkChoice(msgspec.Struct, kw_only=True):
    index: int
    delta: ChatDelta
    logprobs: ChatLogprobs | None = None
    finish_reason: str | None  # set in the choice's last chunk only


class ChatCompletionChunk(msgspec.Struct, kw_only=True):
    """One streamed event of ``POST /v1/chat/completions``: a delta of one choice, or (with
    ``stream_options.include_usage``, after every choice's last delta) no choices and
    ``usage``."""

    id: str
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    created: int
    model: str
    choices: list[ChatChunkChoice]
    usage: Usage | UnsetType = UNSET


class FinishReason(msgspec.Struct):
    type: str  # "length", "stop" or "abort"


# SGLang's native log-probability entries: [logprob, token_id, text]. A top entry has no token
# id (null); a chosen token's text is null unless return_text_in_logprobs.
TokenEntry = tuple[float, int, str | None]
TopEntry = tuple[float, None, str]


class GenerateMeta(msgspec.Struct, kw_only=True):
    """``cached_tokens``: how many of the ``prompt_tokens`` had their KV taken from the prefix
    cache (SGLang's name). ``output_token_logprobs`` with ``return_logprob``; ``output_top_logprobs`` also with
    ``top_logprobs_num`` > 0 (one list per token, most likely first). In a stream, both hold
    every token so far."""

    id: str
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int = 0
    finish_reason: FinishReason | None
    seed: int | None
    output_token_logprobs: list[TokenEntry] | UnsetType = UNSET
    output_top_logprobs: list[list[TopEntry]] | UnsetType = UNSET


class GenerateResult(msgspec.Struct, kw_only=True):
    """SGLang's native answer to ``POST /generate``: the completion and its ``meta_info``."""

    text: str
    meta_info: GenerateMeta


class GenerateChunk(GenerateResult, kw_only=True):
    """One streamed event of ``POST /generate``: ``text`` is the whole text so far."""


# ---- the server ------------------------------------------------------------------------------


class ModelCard(msgspec.Struct, kw_only=True):
    id: str
    object: Literal["model"] = "model"
    created: int
    owned_by: str = "sglang-launch"
    root: str


class ModelList(msgspec.Struct, kw_only=True):
    """OpenAI's answer to ``GET /v1/models``: the one served model."""

    object: Literal["list"] = "list"
    data: list[ModelCard]


class Health(msgspec.Struct, kw_only=True):
    """``GET /health``: ``reason`` only when not healthy (a 503)."""

    healthy: bool
    reason: str | UnsetType = UNSET


class SchedulerLoad(msgspec.Struct, kw_only=True):
    dp_rank: int
    pid: int
    queue_depth: int


class Ready(msgspec.Struct, kw_only=True):
    """``GET /ready``: when ready, the schedulers that answered and those restarting; when not
    (a 503), only ``reason``."""

    ready: bool
    reason: str | UnsetType = UNSET
    schedulers: list[SchedulerLoad] | UnsetType = UNSET
    restarting: list[str] | UnsetType = UNSET  # "scheduler dp=N"
    # "<worker>: <how its plugins differ from a peer's>", when a worker's do (ready all the same)
    plugins_differ: list[str] | UnsetType = UNSET


class PlatformSummary(msgspec.Struct, kw_only=True):
    """The selected platform as the HTTP child sees it; ``error`` when it could not say more."""

    key: str
    platform_class: str | UnsetType = UNSET
    distribution: str | None | UnsetType = UNSET
    reason: str | UnsetType = UNSET
    device_type: str | UnsetType = UNSET
    device_name: str | UnsetType = UNSET
    error: str | UnsetType = UNSET


class SchedulerState(msgspec.Struct, kw_only=True):
    dp_rank: int
    pid: int
    queue_depth: int
    batches: int | None
    aborted: int | None
    generated_tokens: int | None
    memory: JsonObject | None


class WorkerManifest(msgspec.Struct, kw_only=True):
    """What one worker process reported having of platform and plugins (``bootstrap.manifest``),
    and how that differs from a peer's of its role."""

    name: str
    pid: int | None
    manifest: JsonObject | None
    differs: list[str]


class WeightsSource(msgspec.Struct, kw_only=True):
    """Where the served weights came from: ``format`` ``directory`` (a model directory, loaded
    as it is) or ``gguf`` (``gguf_file``, converted once into the model cache directory
    ``cache_dir``, keyed by the file's ``sha256``, at ``converted_at``)."""

    format: Literal["directory", "gguf"]
    gguf_file: str | UnsetType = UNSET
    sha256: str | UnsetType = UNSET
    cache_dir: str | UnsetType = UNSET
    converted_at: str | UnsetType = UNSET
    # As the first answering scheduler loaded them: the dtype (and why), the weight scheme
    # (``int8wo``, ``int4wo-32``, ``gguf``; null: none) and what the weights are, as a sentence.
    dtype: str | UnsetType = UNSET
    dtype_reason: str | UnsetType = UNSET
    quantization: str | None | UnsetType = UNSET
    precision: str | UnsetType = UNSET


class ModelInfo(msgspec.Struct, kw_only=True):
    """``GET /get_model_info`` (SGLang's fields, then this server's): the model directory and
    whether it generates text; ``kind`` is ``generation``, ``embedding`` or ``image`` (null when
    the directory does not say); ``chat_template`` names where the chat template comes from
    (``model``, ``--chat-template PATH``; null: the model has none); ``weights``: where the
    weights came from (a GGUF file's, with its converted copy)."""

    model_path: str
    tokenizer_path: str
    is_generation: bool
    preferred_sampling_params: JsonObject | None = None
    model_type: str | None
    architectures: list[str] | None
    served_model_name: str
    kind: str | None
    chat_template: str | None
    weights: WeightsSource


class ServerInfo(msgspec.Struct, kw_only=True):
    """``GET /get_server_info``; ``schedulers`` holds null for a replica that did not answer."""

    version: str
    platform: PlatformSummary
    device: str | None
    model: JsonObject | None  # the model as the first answering scheduler describes it
    schedulers: list[SchedulerState | None]
    server_args: JsonObject  # the api key masked
    healthy: bool
    workers: list[WorkerManifest] | UnsetType = UNSET  # from the supervisor, when it answers


# ---- images ----------------------------------------------------------------------------------


class ImageData(msgspec.Struct, kw_only=True):
    b64_json: str
    seed: int


class ImagesResponse(msgspec.Struct, kw_only=True):
    """OpenAI's answer to ``POST /v1/images/generations`` (images inline, with their seeds)."""

    created: int
    model: str
    data: list[ImageData]
    output_format: str
    size: str  # WIDTHxHEIGHT
    num_inference_steps: int


class ImageProgressEvent(msgspec.Struct, kw_only=True):
    """``event: image_generation.progress``: denoising step ``step`` of ``total_steps`` is done."""

    type: Literal["image_generation.progress"] = PROGRESS
    step: int
    total_steps: int
    created_at: int


class ImageCompletedEvent(msgspec.Struct, kw_only=True):
    """``event: image_generation.completed``: image ``index`` of the request."""

    type: Literal["image_generation.completed"] = COMPLETED
    index: int
    b64_json: str
    seed: int
    size: str
    output_format: str
    num_inference_steps: int
    created_at: int
