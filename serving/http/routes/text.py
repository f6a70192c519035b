"""The text routes: ``POST /v1/embeddings`` and ``POST /v1/completions`` (OpenAI's shapes) and
``POST /generate`` (SGLang's native shape), each ``handler(state, body, receive)``.

Each sends its request to a scheduler through ``state.client`` and answers the struct of
``serving.http.responses`` its route names; a streamed completion or generation is
``streaming.event_stream`` of ``CompletionChunk`` / ``GenerateChunk`` events. A client that
goes away before the answer cancels the request (a bare 499).
"""

from __future__ import annotations

import asyncio
import base64
import time
import uuid
from collections.abc import AsyncGenerator, Callable, Iterator

import msgspec
from starlette.responses import Response

from serving import wire as messages
from serving.http.app import AppState, error_response, json_response
from serving.http.asgi import Receive
from serving.http.metrics import Metrics
from serving.http.responses import (
    Completion,
    CompletionChoice,
    CompletionChunk,
    Embedding,
    EmbeddingList,
    EmbeddingUsage,
    FinishReason,
    GenerateChunk,
    GenerateMeta,
    GenerateResult,
    Usage,
)
from serving.http.schemas import (
    CompletionRequest,
    EmbeddingRequest,
    GenerateRequest,
    SamplingFields,
)
from serving.http.streaming import event_stream, sse, unless_disconnected


async def embeddings(state: AppState, body: EmbeddingRequest, receive: Receive) -> Response:
    """``POST /v1/embeddings``: an ``EmbeddingList``."""
    refused = state.wrong_model(body.model)
    if refused:
        return refused
    if body.dimensions is not None:
        return error_response(
            400,
            f"dimensions is not supported by model {state.served_name!r}: it "
            f"returns its native embedding size; leave dimensions out",
            "dimensions",
        )
    texts = [body.input] if isinstance(body.input, str) else list(body.input)
    reply: messages.Embeddings | None = await unless_disconnected(
        receive, state.client.one(lambda rid: messages.EmbedRequest(rid, texts))
    )
    if reply is None:
        return Response(status_code=499)
    state.metrics.observe_result(reply.batch_size, reply.prompt_tokens)
    rows = _embedding_rows(reply, body.encoding_format)
    return json_response(
        EmbeddingList(
            data=[Embedding(index=i, embedding=row) for i, row in enumerate(rows)],
            model=state.served_name,
            usage=EmbeddingUsage(
                prompt_tokens=reply.prompt_tokens, total_tokens=reply.prompt_tokens
            ),
        )
    )


def _embedding_rows(reply: messages.Embeddings, encoding: str) -> list[list[float] | str]:
    """Each vector of ``reply``: a list of floats, or (``base64``) the base64 of its
    little-endian float32 bytes, as OpenAI defines ``encoding_format``."""
    if encoding == "base64":
        row = reply.dim * 4
        data = reply.vectors
        return [
            base64.b64encode(data[at : at + row]).decode("ascii") for at in range(0, len(data), row)
        ]
    return [*messages.unpack_vectors(reply.vectors, reply.dim)]


async def completions(state: AppState, body: CompletionRequest, receive: Receive) -> Response:
    """``POST /v1/completions``: a ``Completion``, or with ``stream`` ``CompletionChunk`` events."""
    refused = state.wrong_model(body.model)
    if refused:
        return refused
    prompts = [body.prompt] if isinstance(body.prompt, str) else list(body.prompt)
    params = _sampling(body, body.max_tokens)
    cid, created = f"cmpl-{uuid.uuid4().hex}", int(time.time())
    if body.stream:
        return await _stream_completion(state, body, prompts[0], params, cid, created, receive)
    calls = [state.client.one(_generate_for(p, params)) for p in prompts]
    replies: list[messages.Generated] | None = await unless_disconnected(
        receive, asyncio.gather(*calls)
    )
    if replies is None:
        return Response(status_code=499)
    for r in replies:
        state.metrics.observe_result(r.batch_size, r.prompt_tokens, r.completion_tokens)
    return json_response(
        Completion(
            id=cid,
            created=created,
            model=state.served_name,
            choices=[
                CompletionChoice(index=i, text=r.text, finish_reason=r.finish_reason)
                for i, r in enumerate(replies)
            ],
            usage=Usage.of(
                sum(r.prompt_tokens for r in replies), sum(r.completion_tokens for r in replies)
            ),
        )
    )


async def _stream_completion(
    state: AppState,
    body: CompletionRequest,
    prompt: str,
    params: messages.SamplingParams,
    cid: str,
    created: int,
    receive: Receive,
) -> Response:
    """A streamed completion: one chunk per increment, then (``include_usage``) the usage."""
    usage = body.stream_options is not None and body.stream_options.include_usage

    def chunk(reply: messages.Generated) -> CompletionChunk:
        finish = reply.finish_reason if reply.finished else None
        return CompletionChunk(
            id=cid,
            created=created,
            model=state.served_name,
            choices=[CompletionChoice(index=0, text=reply.text, finish_reason=finish)],
        )

    def last(reply: messages.Generated) -> CompletionChunk | None:
        if not usage:
            return None
        return CompletionChunk(
            id=cid,
            created=created,
            model=state.served_name,
            choices=[],
            usage=Usage.of(reply.prompt_tokens, reply.completion_tokens),
        )

    replies = state.client.call(lambda rid: messages.GenerateRequest(rid, prompt, params, True))
    return await _text_stream(replies, chunk, state.metrics, receive, last)


async def generate(state: AppState, body: GenerateRequest, receive: Receive) -> Response:
    """``POST /generate``: a ``GenerateResult``, or with ``stream`` ``GenerateChunk`` events."""
    sp = body.sampling_params
    params = _sampling(sp, sp.max_new_tokens)
    if body.stream:
        text = [""]

        def chunk(reply: messages.Generated) -> GenerateChunk:
            text[0] += reply.text  # the native stream carries the text so far
            return GenerateChunk(text=text[0], meta_info=_meta(reply))

        replies = state.client.call(
            lambda rid: messages.GenerateRequest(rid, body.text, params, True)
        )
        return await _text_stream(replies, chunk, state.metrics, receive)
    reply: messages.Generated | None = await unless_disconnected(
        receive, state.client.one(lambda rid: messages.GenerateRequest(rid, body.text, params))
    )
    if reply is None:
        return Response(status_code=499)
    state.metrics.observe_result(reply.batch_size, reply.prompt_tokens, reply.completion_tokens)
    return json_response(GenerateResult(text=reply.text, meta_info=_meta(reply)))


def _meta(reply: messages.Generated) -> GenerateMeta:
    return GenerateMeta(
        id=reply.rid,
        prompt_tokens=reply.prompt_tokens,
        completion_tokens=reply.completion_tokens,
        finish_reason=FinishReason(reply.finish_reason) if reply.finish_reason else None,
        seed=reply.seed,
    )


async def _text_stream(
    replies: AsyncGenerator[messages.Generated, None],
    chunk: Callable[[messages.Generated], msgspec.Struct],
    metrics: Metrics,
    receive: Receive,
    last: Callable[[messages.Generated], msgspec.Struct | None] | None = None,
) -> Response:
    """A streamed generation (``event_stream``): ``chunk(reply)`` for each increment, and
    ``last(final reply)`` after the final one when it gives one."""

    def render(reply: messages.Generated) -> Iterator[bytes]:
        yield sse(chunk(reply))
        if reply.finished:
            metrics.observe_result(reply.batch_size, reply.prompt_tokens, reply.completion_tokens)
            extra = last(reply) if last else None
            if extra is not None:
                yield sse(extra)

    return await event_stream(replies, render, receive)


def _sampling(params: SamplingFields, max_new_tokens: int) -> messages.SamplingParams:
    return messages.SamplingParams(
        max_new_tokens=max_new_tokens,
        temperature=params.temperature,
        top_p=params.top_p,
        top_k=max(params.top_k, 0),
        stop=params.stops,
        ignore_eos=params.ignore_eos,
        seed=params.seed,
    )


def _generate_for(
    text: str, params: messages.SamplingParams
) -> Callable[[str], messages.GenerateRequest]:
    """What makes the scheduler request for one prompt: a request id in, its request out."""
    return lambda rid: messages.GenerateRequest(rid, text, params)
