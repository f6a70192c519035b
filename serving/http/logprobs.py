"""The scheduler's per-token log-probabilities (``wire.TokenLogprob``) in each route's shape.

- ``/v1/completions``: OpenAI's legacy ``CompletionLogprobs`` (``tokens``, ``token_logprobs``,
  ``top_logprobs`` as text-to-logprob objects, ``text_offset``);
- ``/v1/chat/completions``: ``ChatLogprobs`` (``content``: token, logprob, UTF-8 bytes,
  ``top_logprobs``);
- ``/generate``: SGLang's ``output_token_logprobs`` (``[logprob, token_id, text]``) and
  ``output_top_logprobs``.

The values are the model's distribution after the penalties and before temperature, top-k and
top-p (the engine's convention, OpenAI's too).
"""

from __future__ import annotations

from serving.http.responses import (
    ChatLogprobs,
    ChatTokenLogprob,
    CompletionLogprobs,
    TokenEntry,
    TopEntry,
    TopLogprob,
)
from serving.wire import TokenLogprob


def completion_logprobs(
    tokens: list[TokenLogprob], top: int, offset: int = 0
) -> CompletionLogprobs:
    """The legacy shape of ``tokens``, the first at ``offset`` characters into the completion
    (a stream passes the lengths of the tokens it sent before); ``top``: the request's
    ``logprobs`` (0: ``top_logprobs`` is null)."""
    offsets = []
    for token in tokens:
        offsets.append(offset)
        offset += len(token.token)
    return CompletionLogprobs(
        tokens=[t.token for t in tokens],
        token_logprobs=[t.logprob for t in tokens],
        top_logprobs=[dict(t.top[:top]) for t in tokens] if top else None,
        text_offset=offsets,
    )


def next_offset(shaped: CompletionLogprobs, offset: int) -> int:
    """The ``text_offset`` of the token after the ones ``shaped`` holds (``offset``, where they
    started, when it holds none)."""
    if not shaped.tokens:
        return offset
    return shaped.text_offset[-1] + len(shaped.tokens[-1])


def chat_logprobs(tokens: list[TokenLogprob], top: int) -> ChatLogprobs:
    """The chat shape of ``tokens`` with at most ``top`` alternatives each."""
    return ChatLogprobs(
        content=[
            ChatTokenLogprob(
                token=t.token,
                logprob=t.logprob,
                bytes=list(t.token.encode("utf-8")),
                top_logprobs=[
                    TopLogprob(token=text, logprob=value, bytes=list(text.encode("utf-8")))
                    for text, value in t.top[:top]
                ],
            )
            for t in tokens
        ]
    )


def native_logprobs(
    tokens: list[TokenLogprob], with_text: bool, top: int
) -> tuple[list[TokenEntry], list[list[TopEntry]] | None]:
    """SGLang's ``output_token_logprobs`` of ``tokens`` (the text only ``with_text``) and, when
    ``top`` > 0, its ``output_top_logprobs``."""
    chosen: list[TokenEntry] = [
        (t.logprob, t.token_id, t.token if with_text else None) for t in tokens
    ]
    if not top:
        return chosen, None
    alternatives: list[list[TopEntry]] = [
        [(value, None, text) for text, value in t.top[:top]] for t in tokens
    ]
    return chosen, alternatives
