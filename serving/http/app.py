"""The ASGI application of the HTTP child: one route table, errors, the API key and the body limit.

Routes (``create_app``'s table is the one list of them): ``/health`` (liveness), ``/ready``
(every scheduler answers a ping), ``/v1/models``, ``/v1/embeddings``, ``/v1/completions`` (OpenAI
shapes), ``/generate`` (SGLang's native shape), ``/get_server_info``, ``/metrics`` (Prometheus),
``/openapi.json`` (built from the same table and the request structs) and ``/docs``; plus the
routes of the launch's runtime (``AppState.api_routes``: the diffusion runtime adds
``/v1/images/generations``), built from a ``RouteKit`` and served the same way. Every error
is JSON in OpenAI's shape ``{"error": {"message", "type", "param", "code"}}``; input a client gets
wrong is a 4xx whose ``param`` names the field and whose message says the fix. With an API key,
every route but ``/health`` and ``/ready`` needs ``Authorization: Bearer <key>``. A client that
disconnects cancels its request at the scheduler.

A request is dispatched once, here: the route is looked up by path and method, a JSON body is
decoded straight into the route's msgspec struct (``schemas.decode_body``), and the handler
answers ``handler(body, receive)``.
"""

from __future__ import annotations

import asyncio
import base64
import dataclasses
import hmac
import logging
import time
import uuid
from collections.abc import (
    AsyncGenerator,
    AsyncIterator,
    Awaitable,
    Callable,
    Iterable,
    Iterator,
    Mapping,
    MutableMapping,
)
from typing import Any

import msgspec
from starlette.responses import Response, StreamingResponse

import launcher
from serving import wire as messages
from serving.http.client import SchedulerClient, SchedulerError
from serving.http.metrics import Metrics
from serving.http.schemas import (
    Body,
    BodyError,
    CompletionRequest,
    EmbeddingRequest,
    ErrorBody,
    GenerateRequest,
    SamplingFields,
    decode_body,
)

_ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    404: "not_found_error",
    405: "invalid_request_error",
    413: "invalid_request_error",
    503: "service_unavailable",
}
_json = msgspec.json.Encoder()
log = logging.getLogger("sglang_launch.http")


VERSION: str = launcher.__version__

Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
Handler = Callable[[Any, Receive], Awaitable[Response]]


def error_body(status: int, message: str, param: str | None = None) -> bytes:
    """An error in OpenAI's JSON shape."""
    kind = _ERROR_TYPES.get(status, "invalid_request_error" if status < 500 else "server_error")
    return _json.encode(
        {"error": {"message": message, "type": kind, "param": param, "code": status}}
    )


def json_response(obj: object, status: int = 200) -> Response:
    """``obj`` as a JSON response."""
    return Response(_json.encode(obj), status_code=status, media_type="application/json")


def error_response(
    status: int, message: str, param: str | None = None, headers: Mapping[str, str] | None = None
) -> Response:
    """An error response (``error_body``)."""
    return Response(
        error_body(status, message, param),
        status_code=status,
        media_type="application/json",
        headers=headers,
    )


@dataclasses.dataclass(frozen=True)
class Route:
    """One HTTP route: ``handler(body, receive)`` answers ``method path``.

    ``body`` is the msgspec struct a JSON request body is decoded into (``None``: the route reads
    no body). ``public`` routes need no API key. ``params`` renames the request fields the
    scheduler names in its errors (``input``, ``max_new_tokens``) to this route's own. Routes
    with ``in_schema=False`` are served but left out of ``/openapi.json``. ``events`` describes
    what the route streams when its body asks for ``stream`` (``/openapi.json`` lists a
    ``text/event-stream`` answer with it); None: it does not stream."""

    method: str
    path: str
    handler: Handler
    summary: str
    body: type[Body] | None = None
    public: bool = False
    params: Mapping[str, str] = dataclasses.field(default_factory=dict)
    in_schema: bool = True
    events: str | None = None


@dataclasses.dataclass
class AppState:
    """What the routes need: the scheduler client, the metrics and static facts of the launch."""

    client: SchedulerClient
    metrics: Metrics
    served_name: str
    model_path: str
    server_args: object
    platform: dict
    api_key: str | None = None
    max_request_bytes: int = 1 << 20
    started: int = dataclasses.field(default_factory=lambda: int(time.time()))
    # The runtime's own API routes (``platforms.runtimes`` ``api_routes``): called by
    # ``create_app`` with a ``RouteKit``, it returns the ``Route``s to add. None: none.
    api_routes: Callable[[RouteKit], list[Route]] | None = None


@dataclasses.dataclass(frozen=True)
class RouteKit:
    """What a runtime's route function gets from ``create_app`` to build its ``Route``s:
    ``state`` (the client, the metrics, the served name), ``wrong_model(name)`` (the 404 response
    for a ``model`` that is not the served one, else None) and ``unless_disconnected(receive,
    awaitable)`` (None when the client went away, which cancels the request at the worker)."""

    state: AppState
    wrong_model: Callable[[str | None], Response | None]
    unless_disconnected: Callable[[Receive, Awaitable[Any]], Awaitable[Any]]


class App:
    """The ASGI app: dispatches each request to its ``Route``, after the API key and the body
    limit; counts every answer in the metrics; starts and closes ``state.client`` in the ASGI
    lifespan. A request body is always parsed as JSON, whatever ``Content-Type`` it carries."""

    def __init__(self, state: AppState, routes: list[Route]) -> None:
        self.state = state
        self.routes: dict[str, dict[str, Route]] = {}
        for route in routes:
            self.add_route(route)

    def add_route(self, route: Route) -> None:
        """Serve ``route`` too (a plugin's ``build_app`` hook adds its routes this way); one for
        the same method and path replaces the earlier one."""
        self.routes.setdefault(route.path, {})[route.method] = route

    async def __call__(self, scope: dict, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            return await self._lifespan(receive, send)
        if scope["type"] != "http":
            return None  # no websocket routes: the server refuses the handshake
        started = time.monotonic()
        path = scope["path"]
        status_box = [500]

        async def send_counted(message: Message) -> None:
            if message["type"] == "http.response.start":
                status_box[0] = message["status"]
            await send(message)

        try:
            await self._dispatch(scope, receive, send_counted, path)
        finally:
            route = path if path in self.routes else "other"
            self.state.metrics.observe_request(route, status_box[0], time.monotonic() - started)
        return None

    async def _dispatch(self, scope: dict, receive: Receive, send: Send, path: str) -> None:
        state = self.state
        by_method = self.routes.get(path)
        public = by_method is not None and any(r.public for r in by_method.values())
        if state.api_key and not public and not self._authorised(scope):
            return await _send_error(
                send,
                401,
                "missing or wrong API key; send the header "
                "'Authorization: Bearer <key>' with the server's --api-key",
            )
        if by_method is None:
            return await _send_error(send, 404, f"no route {path}; see /docs for the routes")
        route = by_method.get(scope["method"])
        if route is None:
            allowed = ", ".join(sorted(by_method))
            return await _send_error(
                send,
                405,
                f"{scope['method']} is not allowed on {path}; use {allowed}",
                [(b"allow", allowed.encode())],
            )
        body = None
        if route.body is not None:
            data = await self._read_body(scope, receive, send)
            if data is None:
                return None
            try:
                body = decode_body(data, route.body)
            except BodyError as exc:
                return await _send_error(send, 400, exc.message, param=exc.param)
        try:
            response = await route.handler(body, receive)
        except SchedulerError as exc:
            param = route.params.get(exc.param, exc.param) if exc.param else None
            response = error_response(exc.status, exc.message, param)
        except Exception as exc:  # noqa: BLE001 - a bug answers 500 in JSON, the server goes on
            log.exception("%s %s failed", scope["method"], path)
            response = error_response(500, f"internal error: {type(exc).__name__}: {exc}")
        await response(scope, receive, send)
        return None

    async def _read_body(self, scope: dict, receive: Receive, send: Send) -> bytes | None:
        """The request body, at most ``max_request_bytes``; None once answered (413) or when the
        client went away."""
        limit = self.state.max_request_bytes
        for name, value in scope.get("headers") or ():
            if name == b"content-length":
                try:
                    declared = int(value)
                except ValueError:
                    await _send_error(send, 400, "the Content-Length header is not a number")
                    return None
                if declared > limit:
                    await _send_error(send, 413, _too_large(declared, limit))
                    return None
        chunks, size = [], 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return None
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > limit:
                await _send_error(send, 413, _too_large(size, limit))
                return None
            chunks.append(chunk)
            if not message.get("more_body"):
                return chunks[0] if len(chunks) == 1 else b"".join(chunks)

    def _authorised(self, scope: dict) -> bool:
        expected = (self.state.api_key or "").encode()
        for name, value in scope.get("headers") or ():
            if name == b"authorization" and value[:7].lower() == b"bearer ":
                return hmac.compare_digest(value[7:].strip(), expected)
            if name == b"x-api-key":
                return hmac.compare_digest(value.strip(), expected)
        return False

    async def _lifespan(self, receive: Receive, send: Send) -> None:
        client = self.state.client
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                try:
                    await client.start()
                except Exception as exc:  # noqa: BLE001 - reported to the server, which stops
                    await send(
                        {
                            "type": "lifespan.startup.failed",
                            "message": f"{type(exc).__name__}: {exc}",
                        }
                    )
                    return
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                try:
                    await client.close()
                finally:
                    await send({"type": "lifespan.shutdown.complete"})
                return

    def openapi(self) -> dict:
        """The OpenAPI 3.1 document of the route table (request bodies from their structs)."""
        ref = "#/components/schemas/{name}"
        routes = [
            r for by_method in self.routes.values() for r in by_method.values() if r.in_schema
        ]
        bodies = list(dict.fromkeys(r.body for r in routes if r.body is not None))
        _, schemas = msgspec.json.schema_components([*bodies, ErrorBody], ref_template=ref)
        error = {
            "description": "refused: the message says why, param names the field",
            "content": {"application/json": {"schema": {"$ref": ref.format(name="ErrorBody")}}},
        }
        paths: dict[str, dict] = {}
        for r in routes:
            responses: dict[str, dict] = {"200": {"description": "success"}}
            if r.events:
                responses["200"] = {
                    "description": "success: JSON, or with stream: true server-sent events",
                    "content": {
                        "application/json": {},
                        "text/event-stream": {
                            "schema": {"type": "string", "description": r.events}
                        },
                    },
                }
            operation: dict[str, Any] = {
                "summary": r.summary,
                "responses": responses,
                "operationId": f"{r.handler.__name__}_{r.method.lower()}",
            }
            if r.body is not None:
                operation["requestBody"] = {
                    "required": True,
                    "content": {
                        "application/json": {"schema": {"$ref": ref.format(name=r.body.__name__)}}
                    },
                }
                responses.update({"400": error, "404": error, "413": error})
            if self.state.api_key and not r.public:
                operation["security"] = [{"bearer": []}]
                responses["401"] = error
            paths.setdefault(r.path, {})[r.method.lower()] = operation
        document: dict[str, Any] = {
            "openapi": "3.1.0",
            "info": {
                "title": "sglang-launch",
                "version": VERSION,
                "description": "OpenAI-compatible and SGLang-native serving of one model.",
            },
            "paths": paths,
            "components": {"schemas": schemas},
        }
        if self.state.api_key:
            document["components"]["securitySchemes"] = {
                "bearer": {"type": "http", "scheme": "bearer"}
            }
        return document


def _too_large(size: int, limit: int) -> str:
    return (
        f"the request body has {size} bytes, more than the limit of {limit} "
        f"(--max-request-bytes); send fewer or shorter inputs per request"
    )


async def _send_error(
    send: Send, status: int, message: str, headers: list | None = None, param: str | None = None
) -> None:
    body = error_body(status, message, param)
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode()),
                *(headers or ()),
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})


async def _client_gone(receive: Receive) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass


async def _unless_disconnected(receive: Receive, awaitable: Awaitable[Any]) -> Any:
    """Await ``awaitable`` in this task; if the client disconnects first, a watcher cancels this
    task (which cancels the request at the scheduler) and the result is None. The watcher is
    parked before the request goes out, so the HTTP child has nothing left to run while the
    scheduler computes, and the answer wakes this task directly."""
    task = asyncio.current_task()
    assert task is not None, "called from a task"
    gone = False

    async def watch() -> None:
        nonlocal gone
        await _client_gone(receive)
        gone = True
        task.cancel()

    watcher = asyncio.ensure_future(watch())
    try:
        return await awaitable
    except asyncio.CancelledError:
        if not gone:
            raise
        task.uncancel()
        return None
    finally:
        watcher.cancel()


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


def _args_dict(server_args: object) -> dict:
    if dataclasses.is_dataclass(server_args) and not isinstance(server_args, type):
        data = dataclasses.asdict(server_args)
    else:
        data = dict(vars(server_args)) if server_args is not None else {}
    if data.get("api_key"):
        data["api_key"] = "***"
    return {
        k: v if isinstance(v, (str, int, float, bool, type(None), list, dict)) else str(v)
        for k, v in data.items()
    }


def _embedding_rows(reply: messages.Embeddings, encoding: str) -> list:
    """Each vector of ``reply``: a list of floats, or (``base64``) the base64 of its
    little-endian float32 bytes, as OpenAI defines ``encoding_format``."""
    if encoding == "base64":
        row = reply.dim * 4
        data = reply.vectors
        return [
            base64.b64encode(data[at : at + row]).decode("ascii") for at in range(0, len(data), row)
        ]
    return messages.unpack_vectors(reply.vectors, reply.dim)


DOCS_PAGE = b"""<!doctype html>
<html><head><meta charset="utf-8"><title>sglang-launch API</title>
<link rel="stylesheet" href="https://cdn.jsdelivr.net/npm/swagger-ui-dist@5/swagger-ui.css"></head>
<body><div id="ui"></div>
<script src="https://cdn.jsdelivr.net/npm/swagger-ui-dist@5/swagger-ui-bundle.js"></script>
<script>SwaggerUIBundle({url: "openapi.json", dom_id: "#ui"});</script>
</body></html>
"""


def _generate_for(
    text: str, params: messages.SamplingParams
) -> Callable[[str], messages.GenerateRequest]:
    """What makes the scheduler request for one prompt: a request id in, its request out."""
    return lambda rid: messages.GenerateRequest(rid, text, params)


def create_app(state: AppState) -> App:
    """The app; ``state.client`` is started and closed by the ASGI lifespan."""
    client, metrics = state.client, state.metrics

    def wrong_model(name: str | None) -> Response | None:
        if name and name != state.served_name:
            return error_response(
                404,
                f"model {name!r} is not served here; this server serves "
                f"{state.served_name!r} (see /v1/models)",
                "model",
            )
        return None

    async def health(body: None, receive: Receive) -> Response:
        reason = client.unhealthy_reason
        if reason:
            return json_response({"healthy": False, "reason": reason}, 503)
        return json_response({"healthy": True})

    async def ready(body: None, receive: Receive) -> Response:
        if not client.healthy:
            return json_response({"ready": False, "reason": client.unhealthy_reason}, 503)
        restarting = client.restarting
        pongs = await client.ping_all(timeout=1.0)
        missing = [i for i, p in enumerate(pongs) if p is None and i not in restarting]
        if missing:
            return json_response(
                {
                    "ready": False,
                    "reason": f"scheduler(s) dp={missing} not answering yet: "
                    f"{client.unanswered_reason(missing)}",
                },
                503,
            )
        return json_response(
            {
                "ready": True,
                "schedulers": [
                    {"dp_rank": p.dp_rank, "pid": p.pid, "queue_depth": p.queue_depth}
                    for p in pongs
                    if p
                ],
                "restarting": [f"scheduler dp={dp}" for dp in restarting],
            }
        )

    async def models(body: None, receive: Receive) -> Response:
        return json_response(
            {
                "object": "list",
                "data": [
                    {
                        "id": state.served_name,
                        "object": "model",
                        "created": state.started,
                        "owned_by": "sglang-launch",
                        "root": state.model_path,
                    }
                ],
            }
        )

    async def embeddings(body: EmbeddingRequest, receive: Receive) -> Response:
        refused = wrong_model(body.model)
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
        reply = await _unless_disconnected(
            receive, client.one(lambda rid: messages.EmbedRequest(rid, texts))
        )
        if reply is None:
            return Response(status_code=499)
        metrics.observe_result(reply.batch_size, reply.prompt_tokens)
        return json_response(
            {
                "object": "list",
                "data": [
                    {"object": "embedding", "index": i, "embedding": v}
                    for i, v in enumerate(_embedding_rows(reply, body.encoding_format))
                ],
                "model": state.served_name,
                "usage": {
                    "prompt_tokens": reply.prompt_tokens,
                    "total_tokens": reply.prompt_tokens,
                },
            }
        )

    async def completions(body: CompletionRequest, receive: Receive) -> Response:
        refused = wrong_model(body.model)
        if refused:
            return refused
        prompts = [body.prompt] if isinstance(body.prompt, str) else list(body.prompt)
        params = _sampling(body, body.max_tokens)
        cid, created = f"cmpl-{uuid.uuid4().hex}", int(time.time())
        if body.stream:
            usage = body.stream_options is not None and body.stream_options.include_usage

            def chunk(reply: messages.Generated) -> dict:
                return {
                    "id": cid,
                    "object": "text_completion",
                    "created": created,
                    "model": state.served_name,
                    "choices": [
                        {
                            "index": 0,
                            "text": reply.text,
                            "logprobs": None,
                            "finish_reason": reply.finish_reason if reply.finished else None,
                        }
                    ],
                }

            def last(reply: messages.Generated) -> dict | None:
                if not usage:
                    return None
                return {
                    "id": cid,
                    "object": "text_completion",
                    "created": created,
                    "model": state.served_name,
                    "choices": [],
                    "usage": _usage(reply.prompt_tokens, reply.completion_tokens),
                }

            return await _text_stream(
                client.call(lambda rid: messages.GenerateRequest(rid, prompts[0], params, True)),
                chunk,
                metrics,
                receive,
                last,
            )
        calls = [client.one(_generate_for(p, params)) for p in prompts]
        replies = await _unless_disconnected(receive, asyncio.gather(*calls))
        if replies is None:
            return Response(status_code=499)
        for r in replies:
            metrics.observe_result(r.batch_size, r.prompt_tokens, r.completion_tokens)
        return json_response(
            {
                "id": cid,
                "object": "text_completion",
                "created": created,
                "model": state.served_name,
                "choices": [
                    {"index": i, "text": r.text, "logprobs": None, "finish_reason": r.finish_reason}
                    for i, r in enumerate(replies)
                ],
                "usage": _usage(
                    sum(r.prompt_tokens for r in replies), sum(r.completion_tokens for r in replies)
                ),
            }
        )

    async def generate(body: GenerateRequest, receive: Receive) -> Response:
        sp = body.sampling_params
        params = _sampling(sp, sp.max_new_tokens)

        def meta(reply: messages.Generated, rid: str) -> dict:
            return {
                "id": rid,
                "prompt_tokens": reply.prompt_tokens,
                "completion_tokens": reply.completion_tokens,
                "finish_reason": {"type": reply.finish_reason} if reply.finish_reason else None,
                "seed": reply.seed,
            }

        if body.stream:
            text = [""]

            def chunk(reply: messages.Generated) -> dict:
                text[0] += reply.text  # the native stream carries the text so far
                return {"text": text[0], "meta_info": meta(reply, reply.rid)}

            return await _text_stream(
                client.call(lambda rid: messages.GenerateRequest(rid, body.text, params, True)),
                chunk,
                metrics,
                receive,
            )
        reply = await _unless_disconnected(
            receive, client.one(lambda rid: messages.GenerateRequest(rid, body.text, params))
        )
        if reply is None:
            return Response(status_code=499)
        metrics.observe_result(reply.batch_size, reply.prompt_tokens, reply.completion_tokens)
        return json_response({"text": reply.text, "meta_info": meta(reply, reply.rid)})

    async def server_info(body: None, receive: Receive) -> Response:
        pongs = await client.ping_all(timeout=2.0)
        live = [p for p in pongs if p is not None]
        model = live[0].info.model if live and live[0].info else None
        return json_response(
            {
                "version": VERSION,
                "platform": state.platform,
                "device": model.device if model else None,
                "model": model,
                "schedulers": [
                    None
                    if p is None
                    else {
                        "dp_rank": p.dp_rank,
                        "pid": p.pid,
                        "queue_depth": p.queue_depth,
                        "batches": p.info.batches if p.info else None,
                        "aborted": p.info.aborted if p.info else None,
                        "generated_tokens": p.info.generated_tokens if p.info else None,
                        "memory": p.info.memory if p.info else None,
                    }
                    for p in pongs
                ],
                "server_args": _args_dict(state.server_args),
                "healthy": client.healthy,
            }
        )

    async def prometheus(body: None, receive: Receive) -> Response:
        page, media_type = metrics.render()
        return Response(page, media_type=media_type)

    async def openapi(body: None, receive: Receive) -> Response:
        return json_response(app.openapi())

    async def docs(body: None, receive: Receive) -> Response:
        return Response(DOCS_PAGE, media_type="text/html")

    completion_fields = {"input": "prompt", "max_new_tokens": "max_tokens"}
    generate_fields = {"input": "text", "max_new_tokens": "sampling_params.max_new_tokens"}
    app = App(
        state,
        [
            Route(
                "GET",
                "/health",
                health,
                "liveness: false as soon as any scheduler is dead (with --restart-policy "
                "on-failure: once every scheduler is dead)",
                public=True,
            ),
            Route(
                "GET",
                "/ready",
                ready,
                "true once every scheduler answers (model loaded, warmed up) but those "
                "restarting, which it lists",
                public=True,
            ),
            Route("GET", "/v1/models", models, "the served model (OpenAI shape)"),
            Route(
                "POST", "/v1/embeddings", embeddings, "embeddings (OpenAI shape)", EmbeddingRequest
            ),
            Route(
                "POST",
                "/v1/completions",
                completions,
                "text completion (OpenAI shape; stream with server-sent events)",
                CompletionRequest,
                params=completion_fields,
                events="one `data:` completion chunk per text increment (the last carries "
                "finish_reason; with stream_options.include_usage a chunk with usage follows), "
                "then `data: [DONE]`",
            ),
            Route(
                "POST",
                "/generate",
                generate,
                "generation (SGLang's native shape; stream with server-sent events)",
                GenerateRequest,
                params=generate_fields,
                events="one `data:` object per text increment, `text` holding the text so far, "
                "then `data: [DONE]`",
            ),
            Route(
                "GET",
                "/get_server_info",
                server_info,
                "platform, device, memory, model and arguments",
            ),
            Route("GET", "/metrics", prometheus, "Prometheus metrics"),
            Route("GET", "/openapi.json", openapi, "this document", in_schema=False),
            Route("GET", "/docs", docs, "the API, browsable", in_schema=False),
        ],
    )
    if state.api_routes is not None:
        for route in state.api_routes(RouteKit(state, wrong_model, _unless_disconnected)):
            app.add_route(route)
    return app


def _usage(prompt_tokens: int, completion_tokens: int) -> dict:
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }


def sse(data: object, event: str | None = None) -> bytes:
    """One server-sent event: an ``event: NAME`` line when ``event`` is given, then ``data:`` with
    ``data`` as JSON (``bytes`` go as they are, such as ``b"[DONE]"``)."""
    payload = data if isinstance(data, bytes) else _json.encode(data)
    named = b"event: " + event.encode("ascii") + b"\n" if event else b""
    return named + b"data: " + payload + b"\n\n"


_END = object()


async def event_stream(
    replies: AsyncGenerator[Any, None],
    render: Callable[[Any], Iterable[bytes]],
    receive: Receive,
    error_event: str | None = None,
) -> Response:
    """The one way a route streams (``text/event-stream``): the events ``render(reply)`` gives
    (``sse(...)``) for each reply of ``replies`` (``SchedulerClient.call``) in turn, then
    ``data: [DONE]``.

    The first reply is awaited before the response starts, so a request the scheduler refuses is
    still a plain JSON 4xx, and a client that leaves while waiting for it cancels the request (the
    answer is then a bare 499). A ``SchedulerError`` once streaming is one event of
    ``error_body`` (named ``error_event`` when given) before ``[DONE]``. Closing the stream early
    (the client went away) closes ``replies``, which cancels the request at the scheduler."""
    try:
        first = await _unless_disconnected(receive, anext(replies, _END))
    except BaseException:
        await replies.aclose()
        raise
    if first is None:  # the client went away: the wait was cancelled, and with it the request
        await replies.aclose()
        return Response(status_code=499)

    async def events() -> AsyncIterator[bytes]:
        try:
            reply = first
            while reply is not _END:
                for event in render(reply):
                    yield event
                try:
                    reply = await anext(replies, _END)
                except SchedulerError as exc:
                    yield sse(error_body(exc.status, exc.message, exc.param), error_event)
                    reply = _END
            yield sse(b"[DONE]")
        finally:
            await replies.aclose()

    return StreamingResponse(events(), media_type="text/event-stream")


async def _text_stream(
    replies: AsyncGenerator[Any, None],
    chunk: Callable[[messages.Generated], dict],
    metrics: Metrics,
    receive: Receive,
    last: Callable[[messages.Generated], dict | None] | None = None,
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
