"""The built-in route table of the HTTP child (``builtin_routes``), with its handlers in
``info`` (the server), ``text`` (embeddings and generation) and ``chat`` (chat completions).

A handler is a module-level ``async def name(state, body, receive)``; the table binds it to the
app's ``AppState`` (``functools.partial``), so a ``Route`` calls it as ``handler(body, receive)``
like any plugin's route.
"""

from __future__ import annotations

from functools import partial
from typing import Any

from serving.http.app import App, AppState, Lifespan, Route, RouteKit
from serving.http.responses import (
    ChatCompletion,
    ChatCompletionChunk,
    Completion,
    CompletionChunk,
    EmbeddingList,
    GenerateChunk,
    GenerateResult,
    Health,
    ModelInfo,
    ModelList,
    Ready,
    ServerInfo,
)
from serving.http.routes import chat, info, text
from serving.http.schemas import (
    ChatCompletionRequest,
    CompletionRequest,
    EmbeddingRequest,
    GenerateRequest,
)
from serving.http.streaming import unless_disconnected

# The request fields the schedulers name in their refusals, as each route calls them.
COMPLETION_FIELDS = {"input": "prompt", "max_new_tokens": "max_tokens"}
CHAT_FIELDS = {
    "input": "messages",
    "max_new_tokens": "max_tokens",
    "json_schema": "response_format",
}
GENERATE_FIELDS = {
    "input": "text",
    "max_new_tokens": "sampling_params.max_new_tokens",
    **{name: f"sampling_params.{name}" for name in ("json_schema", "regex", "ebnf")},
}


def builtin_routes(app: App) -> list[Route[Any]]:
    """Every route an app serves whatever the runtime, in ``/openapi.json``'s order."""
    state = app.state
    return [
        Route(
            "GET",
            "/health",
            partial(info.health, state),
            "liveness: false as soon as any scheduler is dead (with --restart-policy "
            "on-failure: once every scheduler is dead)",
            public=True,
            response=Health,
            answers=(200, 503),
        ),
        Route(
            "GET",
            "/health_generate",
            partial(info.health_generate, state),
            "health through the model: a one-token generation (one embedded text, one "
            "denoising step) on every live replica, skipped on a replica that is busy "
            "answering others; 503 when one fails or does not answer in time",
            public=True,
            response=Health,
            answers=(200, 503),
        ),
        Route(
            "GET",
            "/ping",
            partial(info.health, state),
            "liveness for SageMaker-style probes: /health's answer",
            public=True,
            response=Health,
            answers=(200, 503),
        ),
        Route(
            "GET",
            "/ready",
            partial(info.ready, state),
            "true once every scheduler answers (model loaded, warmed up) but those "
            "restarting, which it lists",
            public=True,
            response=Ready,
            answers=(200, 503),
        ),
        Route(
            "GET",
            "/v1/models",
            partial(info.models, state),
            "the served model (OpenAI shape)",
            response=ModelList,
        ),
        Route(
            "POST",
            "/v1/embeddings",
            partial(text.embeddings, state),
            "embeddings (OpenAI shape)",
            EmbeddingRequest,
            response=EmbeddingList,
            kind="embedding",
        ),
        Route(
            "POST",
            "/v1/completions",
            partial(text.completions, state),
            "text completion (OpenAI shape; stream with server-sent events)",
            CompletionRequest,
            params=COMPLETION_FIELDS,
            events="one `data:` completion chunk per text increment (the last carries "
            "finish_reason; with stream_options.include_usage a chunk with usage follows), "
            "then `data: [DONE]`",
            response=Completion,
            stream=(CompletionChunk,),
            kind="generation",
        ),
        Route(
            "POST",
            "/v1/chat/completions",
            partial(chat.chat_completions, state),
            "chat completion (OpenAI shape; the model's chat template or --chat-template; "
            "stream with server-sent events)",
            ChatCompletionRequest,
            params=CHAT_FIELDS,
            events="per choice: a `data:` chunk with the role, one per text increment, one "
            "with finish_reason; with stream_options.include_usage a chunk with usage "
            "follows; then `data: [DONE]`",
            response=ChatCompletion,
            stream=(ChatCompletionChunk,),
            kind="generation",
        ),
        Route(
            "POST",
            "/generate",
            partial(text.generate, state),
            "generation (SGLang's native shape; stream with server-sent events)",
            GenerateRequest,
            params=GENERATE_FIELDS,
            events="one `data:` object per text increment, `text` holding the text so far, "
            "then `data: [DONE]`",
            response=GenerateResult,
            stream=(GenerateChunk,),
            kind="generation",
        ),
        Route(
            "GET",
            "/get_model_info",
            partial(info.model_info, state),
            "the model directory, whether it generates text, its chat template",
            response=ModelInfo,
        ),
        Route(
            "GET",
            "/get_server_info",
            partial(info.server_info, state),
            "platform, device, memory, model and arguments",
            response=ServerInfo,
        ),
        Route(
            "GET",
            "/metrics",
            partial(info.prometheus, state),
            "Prometheus metrics",
            media_type="text/plain",
        ),
        Route(
            "POST",
            "/flush_cache",
            partial(info.flush_cache, state),
            "empty the prefix cache of every replica (SGLang's route): 200 with a short text "
            "when every one flushed, 400 naming the replicas that refused (one refuses while "
            "requests run or wait there; retry)",
            media_type="text/plain",
            answers=(200, 400, 503),
        ),
        Route("GET", "/openapi.json", partial(info.openapi, app), "this document", in_schema=False),
        Route("GET", "/docs", partial(info.docs, app), "the API, browsable", in_schema=False),
    ]


def create_app(state: AppState, lifespan: Lifespan | None = None) -> App:
    """The app of the built-in routes and the runtime's; ``lifespan`` (``server.connected``) runs
    for its ASGI lifespan."""
    app = App(state, [], lifespan)
    for route in builtin_routes(app):
        app.add_route(route)
    if state.api_routes is not None:
        for route in state.api_routes(RouteKit(state, state.wrong_model, unless_disconnected)):
            app.add_route(route)
    return app
