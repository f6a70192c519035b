"""Request bodies of the HTTP API (pydantic), which also make the app's OpenAPI schema.

OpenAI shapes for ``/v1/embeddings`` and ``/v1/completions``; SGLang's native shape for
``/generate``. Every bound a client can break is declared here, so a bad value is a 400 naming the
field before anything reaches a scheduler; limits that need the tokenizer (tokens per input,
prompt + completion length) are checked by the scheduler, also as 400s.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

MAX_INPUTS = 2048
MAX_NEW_TOKENS = 1 << 20
MAX_SEED = (1 << 63) - 1
MAX_STOP = 4

Text = str


def _check_text(value: str, what: str) -> str:
    if not value:
        raise ValueError(f"{what} must not be empty")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError(f"{what} must be valid Unicode text (it holds an unpaired surrogate)") from None
    return value


def _check_texts(value: str | list[str], field: str) -> str | list[str]:
    """``value`` (one text or a list of them) for ``field``: 1 to ``MAX_INPUTS`` non-empty texts."""
    texts = [value] if isinstance(value, str) else value
    if not texts:
        raise ValueError(f"{field} must hold at least one text")
    if len(texts) > MAX_INPUTS:
        raise ValueError(f"{field} holds {len(texts)} texts; at most {MAX_INPUTS} per request")
    for i, text in enumerate(texts):
        _check_text(text, field if isinstance(value, str) else f"{field}[{i}]")
    return value


def _check_stop(value: str | list[str] | None) -> tuple[str, ...]:
    if value is None:
        return ()
    stops = [value] if isinstance(value, str) else list(value)
    if len(stops) > MAX_STOP:
        raise ValueError(f"at most {MAX_STOP} stop strings are allowed, got {len(stops)}")
    return tuple(_check_text(s, "a stop string") for s in stops)


class _Body(BaseModel):
    model_config = ConfigDict(extra="ignore")


class EmbeddingRequest(_Body):
    """OpenAI ``POST /v1/embeddings``."""

    input: str | list[str] = Field(description="a text, or a list of texts (at most 2048)")
    model: str | None = Field(None, description="must name the served model when given")
    encoding_format: Literal["float"] = "float"
    dimensions: int | None = Field(None, description="not supported: the model returns its native "
                                                     "size, and a request that sets this is refused (400)")
    user: str | None = None

    @field_validator("input")
    @classmethod
    def _input(cls, value: str | list[str]) -> str | list[str]:
        return _check_texts(value, "input")


class _Sampling(_Body):
    temperature: float = Field(1.0, ge=0.0, le=2.0)
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    top_k: int = Field(-1, ge=-1, le=1 << 30, description="-1 or 0: no top-k cut")
    stop: str | list[str] | None = None
    seed: int | None = Field(None, ge=0, le=MAX_SEED)
    ignore_eos: bool = False

    @field_validator("stop")
    @classmethod
    def _stop(cls, value: str | list[str] | None) -> list[str]:
        return list(_check_stop(value))


class CompletionRequest(_Sampling):
    """OpenAI ``POST /v1/completions`` (plus SGLang's ``top_k`` and ``ignore_eos``)."""

    prompt: str | list[str]
    model: str | None = None
    max_tokens: int = Field(16, ge=1, le=MAX_NEW_TOKENS)
    n: int = Field(1, ge=1, le=1, description="only 1 is supported")
    stream: bool = False
    user: str | None = None

    @field_validator("prompt")
    @classmethod
    def _prompt(cls, value: str | list[str]) -> str | list[str]:
        return _check_texts(value, "prompt")


class NativeSamplingParams(_Sampling):
    """SGLang's ``sampling_params``."""

    max_new_tokens: int = Field(128, ge=1, le=MAX_NEW_TOKENS)


class GenerateRequest(_Body):
    """SGLang's native ``POST /generate``: ``text`` + ``sampling_params`` in, ``text`` +
    ``meta_info`` out (a stream of server-sent events with ``stream: true``)."""

    text: str
    sampling_params: NativeSamplingParams = Field(default_factory=NativeSamplingParams)
    stream: bool = False

    @field_validator("text")
    @classmethod
    def _text(cls, value: str) -> str:
        return _check_text(value, "text")
