"""The text routes: ``POST /v1/embeddings`` and ``POST /v1/completions`` (OpenAI's shapes) and
``POST /generate`` (SGLang's native shape), each ``handler(state, body, receive)``; the chat
route (``routes.chat``) builds on the helpers here.

Each sends its request to a scheduler through ``state.dispatcher`` and answers the struct of
``serving.http.responses`` its route names; a streamed completion or generation is
``streaming.event_stream`` of ``CompletionChunk`` / ``GenerateChunk`` events. Every sequence of
one HTTP request carries that request's id as its ``group`` (the scheduler shares its room fairly
between requests). A client that goes away before the answer cancels the request (a bare 499).
A streamed sequence goes through ``streamed``: where this process decodes with the scheduler's
tokenizer, the scheduler may send its token ids, and they become text here.
"""

from __future__ import annotations

import asyncio
import base64
import time
import uuid
from collections.abc import AsyncGenerator, Callable

import msgspec
from starlette.responses import Response

from serving import wire
from serving.detokenize import IdStream, TextDecoder
from serving.http import structured
from serving.http.app import AppState, error_response, json_response
from serving.http.asgi import Receive
from serving.http.logprobs import completion_logprobs, native_logprobs, next_offset
from serving.http.metrics import GenerationTiming, Metrics
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
    MAX_SEED,
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
    reply: wire.Embeddings | None = await unless_disconnected(
        receive, state.dispatcher.one(lambda rid: wire.EmbedRequest(rid, texts))
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


def _embedding_rows(reply: wire.Embeddings, encoding: str) -> list[list[float] | str]:
    """Each vector of ``reply``: a list of floats, or (``base64``) the base64 of its
    little-endian float32 bytes, as OpenAI defines ``encoding_format``."""
    if encoding == "base64":
        row = reply.dim * 4
        data = reply.vectors
        return [
            base64.b64encode(data[at : at + row]).decode("ascii") for at in range(0, len(data), row)
        ]
    return [*wire.unpack_vectors(reply.vectors, reply.dim)]


async def completions(state: AppState, body: CompletionRequest, receive: Receive) -> Response:
    """``POST /v1/completions``: a ``Completion``, or with ``stream`` ``CompletionChunk`` events."""
    refused = state.wrong_model(body.model)
    if refused:
        return refused
    prompts = [body.prompt] if isinstance(body.prompt, str) else list(body.prompt)
    top = body.logprobs or 0
    params = sampling(body, body.max_tokens, logprobs=body.logprobs is not None, top=top)
    cid, created = f"cmpl-{uuid.uuid4().hex}", int(time.time())
    if body.stream:
        return await _stream_completion(state, body, prompts[0], params, cid, created, receive)
    timings = [state.metrics.generation(streamed=False) for _ in prompts]
    calls = [state.dispatcher.one(generate_for(p, params, cid)) for p in prompts]
    replies: list[wire.Generated] | None = await unless_disconnected(
        receive, asyncio.gather(*calls)
    )
    if replies is None:
        return Response(status_code=499)
    for r, timing in zip(replies, timings, strict=True):
        timing.answered(r)
        state.metrics.observe_result(r.batch_size, r.prompt_tokens, r.completion_tokens)
    return json_response(
        Completion(
            id=cid,
            created=created,
            model=state.served_name,
            choices=[
                CompletionChoice(
                    index=i,
                    text=r.text,
                    logprobs=None
                    if body.logprobs is None
                    else completion_logprobs(r.logprobs or [], top),
                    finish_reason=r.finish_reason,
                )
                for i, r in enumerate(replies)
            ],
            usage=Usage.of(
                sum(r.prompt_tokens for r in replies),
                sum(r.completion_tokens for r in replies),
                sum(r.cached_tokens for r in replies),
            ),
        )
    )


async def _stream_completion(
    state: AppState,
    body: CompletionRequest,
    prompt: str,
    params: wire.SamplingParams,
    cid: str,
    created: int,
    receive: Receive,
) -> Response:
    """A streamed completion: one chunk per increment, then (``include_usage``) the usage."""
    usage = body.stream_options is not None and body.stream_options.include_usage
    offset = [0]  # where the next chunk's tokens start in the completion's text

    def chunk(reply: wire.Generated) -> CompletionChunk:
        finish = reply.finish_reason if reply.finished else None
        shaped = None
        if body.logprobs is not None:
            shaped = completion_logprobs(reply.logprobs or [], body.logprobs, offset[0])
            offset[0] = next_offset(shaped, offset[0])
        return CompletionChunk(
            id=cid,
            created=created,
            model=state.served_name,
            choices=[
                CompletionChoice(index=0, text=reply.text, logprobs=shaped, finish_reason=finish)
            ],
        )

    def last(reply: wire.Generated) -> CompletionChunk | None:
        if not usage:
            return None
        return CompletionChunk(
            id=cid,
            created=created,
            model=state.served_name,
            choices=[],
            usage=Usage.of(reply.prompt_tokens, reply.completion_tokens, reply.cached_tokens),
        )

    replies = streamed(state, generate_for(prompt, params, cid, stream=True))
    timing = state.metrics.generation(streamed=True)
    return await text_stream(replies, chunk, state.metrics, receive, timing, last)


async def generate(state: AppState, body: GenerateRequest, receive: Receive) -> Response:
    """``POST /generate``: a ``GenerateResult``, or with ``stream`` ``GenerateChunk`` events."""
    sp = body.sampling_params
    top = body.top_logprobs_num if body.return_logprob else 0
    params = sampling(sp, sp.max_new_tokens, logprobs=body.return_logprob, top=top)
    group = f"generate-{uuid.uuid4().hex}"
    if body.stream:
        text = [""]
        tokens: list[wire.TokenLogprob] = []

        def chunk(reply: wire.Generated) -> GenerateChunk:
            text[0] += reply.text  # the native stream carries the text so far
            tokens.extend(reply.logprobs or [])
            return GenerateChunk(text=text[0], meta_info=_meta(reply, body, tokens))

        replies = streamed(state, generate_for(body.text, params, group, stream=True))
        timing = state.metrics.generation(streamed=True)
        return await text_stream(replies, chunk, state.metrics, receive, timing)
    if sp.n > 1:
        return await _generate_samples(state, body, params, group, receive)
    timing = state.metrics.generation(streamed=False)
    reply: wire.Generated | None = await unless_disconnected(
        receive, state.dispatcher.one(generate_for(body.text, params, group))
    )
    if reply is None:
        return Response(status_code=499)
    timing.answered(reply)
    state.metrics.observe_result(reply.batch_size, reply.prompt_tokens, reply.completion_tokens)
    meta = _meta(reply, body, reply.logprobs or [])
    return json_response(GenerateResult(text=reply.text, meta_info=meta))


async def _generate_samples(
    state: AppState,
    body: GenerateRequest,
    params: wire.SamplingParams,
    group: str,
    receive: Receive,
) -> Response:
    """``sampling_params.n`` > 1: a list of ``n`` ``GenerateResult``s, one per sample, as
    SGLang answers it (its ``parallel_sample_num`` turns one text into a batch of ``n``). With a
    ``seed``, sample ``i`` samples with ``seed + i`` (as the chat route's choices do)."""
    n = body.sampling_params.n
    seeds = [None if params.seed is None else (params.seed + i) % (MAX_SEED + 1) for i in range(n)]
    samples = [msgspec.structs.replace(params, seed=seed) for seed in seeds]
    timings = [state.metrics.generation(streamed=False) for _ in samples]
    calls = [state.dispatcher.one(generate_for(body.text, p, group)) for p in samples]
    replies: list[wire.Generated] | None = await unless_disconnected(
        receive, asyncio.gather(*calls)
    )
    if replies is None:
        return Response(status_code=499)
    results = []
    for reply, timing in zip(replies, timings, strict=True):
        timing.answered(reply)
        state.metrics.observe_result(reply.batch_size, reply.prompt_tokens, reply.completion_tokens)
        meta = _meta(reply, body, reply.logprobs or [])
        results.append(GenerateResult(text=reply.text, meta_info=meta))
    return json_response(results)


def _meta(
    reply: wire.Generated, body: GenerateRequest, tokens: list[wire.TokenLogprob]
) -> GenerateMeta:
    """The ``meta_info`` of ``reply``; with ``return_logprob``, the logprobs of ``tokens``."""
    meta = GenerateMeta(
        id=reply.rid,
        prompt_tokens=reply.prompt_tokens,
        completion_tokens=reply.completion_tokens,
        cached_tokens=reply.cached_tokens,
        finish_reason=FinishReason(reply.finish_reason) if reply.finish_reason else None,
        seed=reply.seed,
    )
    if body.return_logprob:
        chosen, top = native_logprobs(tokens, body.return_text_in_logprobs, body.top_logprobs_num)
        meta.output_token_logprobs = chosen
        if top is not None:
            meta.output_top_logprobs = top
    return meta


async def text_stream(
    replies: AsyncGenerator[wire.Generated, None],
    chunk: Callable[[wire.Generated], msgspec.Struct],
    metrics: Metrics,
    receive: Receive,
    timing: GenerationTiming,
    last: Callable[[wire.Generated], msgspec.Struct | None] | None = None,
) -> Response:
    """A streamed generation (``event_stream``): ``chunk(reply)`` for each increment, and
    ``last(final reply)`` after the final one when it gives one; ``timing`` sees each reply."""

    def render(reply: wire.Generated) -> list[bytes]:
        timing.answered(reply)
        event = sse(chunk(reply))
        if not reply.finished:  # an increment: one event, no generator made for it
            return [event]
        metrics.observe_result(reply.batch_size, reply.prompt_tokens, reply.completion_tokens)
        extra = last(reply) if last else None
        return [event] if extra is None else [event, sse(extra)]

    return await event_stream(replies, render, receive)


def sampling(
    params: SamplingFields,
    max_new_tokens: int,
    *,
    logprobs: bool = False,
    top: int = 0,
    seed: int | None = None,
) -> wire.SamplingParams:
    """The scheduler's sampling parameters of a request's fields (``seed`` replaces the
    request's own when given), its grammar included (``structured.grammar_fields``)."""
    return wire.SamplingParams(
        max_new_tokens=max_new_tokens,
        temperature=params.temperature,
        top_p=params.top_p,
        top_k=max(params.top_k, 0),
        stop=params.stops,
        ignore_eos=params.ignore_eos,
        seed=params.seed if seed is None else seed,
        presence_penalty=params.presence_penalty,
        frequency_penalty=params.frequency_penalty,
        logprobs=logprobs,
        top_logprobs=top if logprobs else 0,
        **structured.grammar_fields(params),
    )


def generate_for(
    text: str,
    params: wire.SamplingParams,
    group: str,
    stream: bool = False,
    raw: bool = False,
) -> Callable[[str], wire.GenerateRequest]:
    """What makes the scheduler request for one sequence of HTTP request ``group``: a request id
    in, its request out."""
    return lambda rid: wire.GenerateRequest(rid, text, params, stream=stream, group=group, raw=raw)


def streamed(
    state: AppState, make: Callable[[str], wire.GenerateRequest]
) -> AsyncGenerator[wire.Generated, None]:
    """``state.dispatcher.call(make)`` for a streamed sequence. When this process decodes with a
    plain tokenizer (``ChatTemplate.decoder``), the request names it, and a scheduler with the
    same tokenizer may answer with token ids (``Scheduler.sends_ids``), which become each
    answer's ``text`` here (``IdStream``; an answer whose ids complete no character yet is held
    back until one does)."""
    decoder = state.chat.decoder if state.chat is not None else None
    if decoder is None:
        return state.dispatcher.call(make)
    identity = decoder.identity
    named = state.dispatcher.call(lambda rid: msgspec.structs.replace(make(rid), decoder=identity))
    return _decoded(named, decoder)


async def _decoded(
    replies: AsyncGenerator[wire.Generated, None], decoder: TextDecoder
) -> AsyncGenerator[wire.Generated, None]:
    stream: IdStream | None = None
    try:
        async for reply in replies:
            if reply.token_ids is not None:
                stream = stream or IdStream(decoder)
                settle = reply.finished and reply.finish_reason in ("stop", "length")
                reply.text = stream.push(reply.token_ids, settle)
                if not reply.text and not reply.finished:
                    continue
            yield reply
    finally:
        await replies.aclose()
