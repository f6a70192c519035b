"""``POST /v1/chat/completions`` (OpenAI's shape): ``handler(state, body, receive)``.

The messages become one prompt through the model's chat template (``AppState.chat``, loaded at
start-up); each of the ``n`` choices is one ``GenerateRequest`` of that prompt, ``raw`` (the
template wrote the special tokens) and in the HTTP request's ``group``. With a ``seed``, choice
``i`` samples with ``seed + i``. Without ``max_tokens`` (or ``max_completion_tokens``) a choice
may take every token the model's context leaves after the prompt.

The answer is a ``ChatCompletion``, or with ``stream`` ``ChatCompletionChunk`` events: each
choice's first chunk carries the role, then one chunk per text increment, then one with its
``finish_reason``; with ``stream_options.include_usage`` a last chunk without choices carries
the usage. With ``tools`` (``serving.http.tools``) a choice's text is read for calls: the answer's
``message.tool_calls`` (``content`` then null, or the text before the calls) and ``finish_reason``
``tool_calls``; streamed, its calls go out as ``tool_calls`` deltas. ``usage.prompt_tokens`` is the templated prompt's, as the scheduler counted it (once,
whatever ``n``), and ``usage.prompt_tokens_details.cached_tokens`` how many of them the first
choice found in the prefix cache (counted once too, as SGLang counts it: never more than the
prompt).
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Callable, Iterator

import msgspec
from starlette.responses import Response

from serving import wire
from serving.http.app import AppState, json_response
from serving.http.asgi import Receive
from serving.http.chat_template import ChatTemplate
from serving.http.logprobs import chat_logprobs
from serving.http.replica import SchedulerError
from serving.http.responses import (
    AssistantMessage,
    ChatChoice,
    ChatChunkChoice,
    ChatCompletion,
    ChatCompletionChunk,
    ChatDelta,
    ChatLogprobs,
    Usage,
)
from serving.http.routes.text import generate_for, sampling, streamed
from serving.http.schemas import MAX_SEED, ChatCompletionRequest
from serving.http.streaming import event_stream, merged, sse, unless_disconnected
from serving.http.tools import ToolPlan, finish_reason

NO_TEMPLATE = ChatTemplate(None, None, None, "no tokenizer was loaded for it")


async def chat_completions(
    state: AppState, body: ChatCompletionRequest, receive: Receive
) -> Response:
    """``POST /v1/chat/completions``: a ``ChatCompletion``, or ``ChatCompletionChunk`` events."""
    refused = state.wrong_model(body.model)
    if refused:
        return refused
    if state.kind not in (None, "generation"):
        raise SchedulerError(
            400, f"model {state.served_name!r} serves {state.kind}, not generation", "model"
        )
    template = state.chat or NO_TEMPLATE
    parser = template.tool_parser(state.server_args.tool_call_parser)
    plan = ToolPlan.of(body, parser)
    if plan is not None and plan.forced and state.server_args.grammar_backend == "none":
        raise SchedulerError(
            400,
            "tool_choice 'required' or a named function needs a grammar, and this server runs "
            "with --grammar-backend none; use tool_choice auto, or restart the server with "
            "--grammar-backend xgrammar",
            "tool_choice",
        )
    prompt = template.render(body.messages, state.served_name, plan, parser)
    max_new_tokens = body.max_new_tokens or await _room(state, template, prompt)
    top = (body.top_logprobs or 0) if body.logprobs else 0
    cid, created = f"chatcmpl-{uuid.uuid4().hex}", int(time.time())
    makers = [
        generate_for(
            prompt,
            _forced(
                sampling(
                    body,
                    max_new_tokens,
                    logprobs=body.logprobs,
                    top=top,
                    seed=None if body.seed is None else (body.seed + i) % (MAX_SEED + 1),
                ),
                plan,
            ),
            cid,
            stream=body.stream,
            raw=True,
        )
        for i in range(body.n)
    ]
    if body.stream:
        return await _stream_chat(state, body, makers, cid, created, top, receive, plan)
    timings = [state.metrics.generation(streamed=False) for _ in makers]
    replies: list[wire.Generated] | None = await unless_disconnected(
        receive, asyncio.gather(*(state.dispatcher.one(make) for make in makers))
    )
    if replies is None:
        return Response(status_code=499)
    for i, (reply, timing) in enumerate(zip(replies, timings, strict=True)):
        timing.answered(reply)
        prompt_tokens = reply.prompt_tokens if i == 0 else 0
        state.metrics.observe_result(reply.batch_size, prompt_tokens, reply.completion_tokens)
    return json_response(
        ChatCompletion(
            id=cid,
            created=created,
            model=state.served_name,
            choices=[
                _choice(i, r, chat_logprobs(r.logprobs or [], top) if body.logprobs else None, plan)
                for i, r in enumerate(replies)
            ],
            usage=Usage.of(
                replies[0].prompt_tokens,
                sum(r.completion_tokens for r in replies),
                replies[0].cached_tokens,
            ),
        )
    )


def _forced(params: wire.SamplingParams, plan: ToolPlan | None) -> wire.SamplingParams:
    """``params`` with the grammar of a forced call (``tool_choice`` required or a function)."""
    if plan is None or plan.schema is None:
        return params
    if params.json_schema or params.regex or params.ebnf:
        raise SchedulerError(
            400,
            "tool_choice 'required' or a named function holds the answer to a call by a grammar "
            "of its own; leave out the other grammar (response_format, json_schema, regex or "
            "ebnf) or use tool_choice auto",
            "tool_choice",
        )
    return msgspec.structs.replace(params, json_schema=plan.schema)


def _choice(
    index: int, reply: wire.Generated, logprobs: ChatLogprobs | None, plan: ToolPlan | None
) -> ChatChoice:
    """One choice of a whole answer; with ``plan``, its text read for tool calls."""
    if plan is None:
        message = AssistantMessage(content=reply.text)
        return ChatChoice(
            index=index, message=message, logprobs=logprobs, finish_reason=reply.finish_reason
        )
    content, calls, reason = plan.parse(reply.text, reply.finish_reason)
    message = AssistantMessage(content=content)
    if calls:
        message.tool_calls = calls
    return ChatChoice(index=index, message=message, logprobs=logprobs, finish_reason=reason)


async def _room(state: AppState, template: ChatTemplate, prompt: str) -> int:
    """Tokens a choice may generate when the request sets no limit: what one request's room
    (the smaller of ``TextModel.context_length`` and the KV pool ``max_total_tokens``, as the
    schedulers report them) leaves after the prompt."""
    if state.context_length is None:
        pongs = await state.dispatcher.ping_all(timeout=5.0)
        limits = [
            min(p.info.model.context_length, p.info.model.max_total_tokens)
            for p in pongs
            if p is not None and isinstance(p.info, wire.TextStats)
        ]
        if not limits:
            raise SchedulerError(
                503, "no scheduler answered to tell the model's context length; retry shortly"
            )
        state.context_length = min(limits)
    return max(1, state.context_length - template.count_tokens(prompt))


async def _stream_chat(
    state: AppState,
    body: ChatCompletionRequest,
    makers: list[Callable[[str], wire.GenerateRequest]],
    cid: str,
    created: int,
    top: int,
    receive: Receive,
    plan: ToolPlan | None = None,
) -> Response:
    """The choices' increments as chunks, in the order they arrive (with ``plan``, each
    choice's text read for calls as it comes: ``ToolStream``)."""
    include_usage = body.stream_options is not None and body.stream_options.include_usage
    timings = [state.metrics.generation(streamed=True) for _ in makers]
    started: set[int] = set()
    finals: dict[int, wire.Generated] = {}
    readers = [plan.stream() for _ in makers] if plan is not None else []

    def chunk(
        index: int,
        delta: ChatDelta,
        logprobs: ChatLogprobs | None = None,
        finish_reason: str | None = None,
    ) -> bytes:
        choice = ChatChunkChoice(
            index=index, delta=delta, logprobs=logprobs, finish_reason=finish_reason
        )
        return sse(
            ChatCompletionChunk(id=cid, created=created, model=state.served_name, choices=[choice])
        )

    def render(item: tuple[int, wire.Generated]) -> Iterator[bytes]:
        index, reply = item
        timings[index].answered(reply)
        if index not in started:
            started.add(index)
            yield chunk(index, ChatDelta(role="assistant", content=""))
        shaped = chat_logprobs(reply.logprobs or [], top) if body.logprobs else None
        if readers:
            content, calls = readers[index].feed(reply.text, final=reply.finished)
            if content or calls or shaped:
                delta = ChatDelta(content=content) if content or not calls else ChatDelta()
                if calls:
                    delta.tool_calls = calls
                yield chunk(index, delta, shaped)
        elif reply.text or reply.logprobs:
            yield chunk(index, ChatDelta(content=reply.text), shaped)
        if not reply.finished:
            return
        reason = reply.finish_reason
        if readers:
            reason = finish_reason(reason, readers[index].called)
        yield chunk(index, ChatDelta(), finish_reason=reason)
        finals[index] = reply
        prompt_tokens = reply.prompt_tokens if len(finals) == 1 else 0
        state.metrics.observe_result(reply.batch_size, prompt_tokens, reply.completion_tokens)
        if include_usage and len(finals) == len(makers):
            usage = Usage.of(
                finals[0].prompt_tokens,
                sum(r.completion_tokens for r in finals.values()),
                finals[0].cached_tokens,
            )
            yield sse(
                ChatCompletionChunk(
                    id=cid, created=created, model=state.served_name, choices=[], usage=usage
                )
            )

    streams = [streamed(state, make) for make in makers]
    return await event_stream(merged(streams), render, receive)
