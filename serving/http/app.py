"""The ASGI layer of the HTTP child: the route table, request handling, the API key, the body
limit, errors and ``/openapi.json``.

``serving.http.routes.create_app(state)`` serves the built-in routes (``serving.http.routes``: ``/health``, ``/ping``,
``/health_generate``, ``/ready``, ``/v1/models``, ``/v1/embeddings``, ``/v1/completions``,
``/v1/chat/completions``, ``/generate``, ``/get_model_info``, ``/get_server_info``, ``/metrics``,
``/flush_cache``, ``/openapi.json``, ``/docs``) and the routes of the launch's runtime
(``AppState.api_routes``: the diffusion runtime adds ``/v1/images/generations``), built from a
``RouteKit``; a plugin adds its own with ``app.add_route(Route(...))``. Every error is JSON in
OpenAI's shape (``responses.ErrorBody``); input a client gets wrong is a 4xx whose ``param`` names
the field and whose message says the fix; a scheduler's refusal of a request of the wrong kind
(an embedding request to a generation model) also names the routes that serve the model's kind,
from this table. With an API key, every route but the probes (``public`` routes: ``/health``,
``/ping``, ``/health_generate``, ``/ready``) needs ``Authorization: Bearer <key>``. A client that
disconnects cancels its request at the scheduler.

A request is handled once, here: the route is looked up by path and method, a JSON body is
decoded straight into the route's msgspec struct (``body_decode.decode_body``), and the handler
answers ``handler(body, receive)``. ``/openapi.json`` is built from the same table: request bodies
from ``Route.body``, answers from ``Route.response`` (the struct the handler sends), errors from
``ErrorBody``.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import functools
import hmac
import logging
import re
import time
from collections.abc import Awaitable, Callable, Iterator, Mapping
from typing import Any, Generic, Protocol, TypeVar

import msgspec
from starlette.responses import Response

import launchspec
from launchspec.server_args import ServerArgs
from serving.http.asgi import Message, Receive, Scope, Send
from serving.http.body_decode import decode_body
from serving.http.chat_template import ChatTemplate
from serving.http.dispatcher import Dispatcher
from serving.http.metrics import Metrics
from serving.http.pool import ReplicaPool
from serving.http.replica import SchedulerError
from serving.http.responses import ErrorBody, PlatformSummary, error_body
from serving.http.schemas import Body, BodyError
from serving.http.streaming import event_stream, sse
from serving.http.supervisor_link import QuerySocket

__all__ = [  # the names plugins and the runtimes' route functions import from here
    "App",
    "AppState",
    "Handler",
    "Message",
    "Receive",
    "Route",
    "RouteKit",
    "Send",
    "error_body",
    "error_response",
    "event_stream",
    "json_response",
    "sse",
]

JSON = "application/json"
VERSION: str = launchspec.__version__
log = logging.getLogger("sglang_launch.http")
_json = msgspec.json.Encoder()

B = TypeVar("B")
T = TypeVar("T")
Handler = Callable[[B, Receive], Awaitable[Response]]
# What runs for the app's ASGI lifespan (the sockets to the schedulers and the supervisor).
Lifespan = Callable[[], contextlib.AbstractAsyncContextManager[None]]


def json_response(obj: object, status: int = 200) -> Response:
    """``obj`` (a ``serving.http.responses`` struct, or any value msgspec encodes) as JSON."""
    return Response(_json.encode(obj), status_code=status, media_type=JSON)


def error_response(
    status: int, message: str, param: str | None = None, headers: Mapping[str, str] | None = None
) -> Response:
    """An error response (``error_body``)."""
    return Response(
        error_body(status, message, param), status_code=status, media_type=JSON, headers=headers
    )


@dataclasses.dataclass(frozen=True)
class Route(Generic[B]):
    """One HTTP route: ``handler(body, receive)`` answers ``method path``.

    ``body`` is the msgspec struct a JSON request body is decoded into (``None``: the route reads
    no body). ``public`` routes need no API key. ``params`` renames the request fields the
    scheduler names in its errors (``input``, ``max_new_tokens``) to this route's own. Routes
    with ``in_schema=False`` are served but left out of ``/openapi.json``. ``events`` describes
    what the route streams when its body asks for ``stream`` (``/openapi.json`` lists a
    ``text/event-stream`` answer with it); None: it does not stream.

    ``response`` is the struct of ``serving.http.responses`` the handler answers with, for the
    statuses in ``answers``; ``/openapi.json`` documents those answers from it (None: a plain
    "success", or a ``media_type`` other than JSON). ``stream`` lists the structs the ``data:``
    lines of its events carry. ``kind`` is the kind of model whose requests the route sends to
    the schedulers (``embedding``, ``generation``, ``image``: ``Pong.kind``)."""

    method: str
    path: str
    handler: Handler[B]
    summary: str
    body: type[B] | None = None
    public: bool = False
    params: Mapping[str, str] = dataclasses.field(default_factory=dict)
    in_schema: bool = True
    events: str | None = None
    response: type[msgspec.Struct] | None = None
    answers: tuple[int, ...] = (200,)
    media_type: str = JSON
    stream: tuple[type[msgspec.Struct], ...] = ()
    kind: str | None = None

    @property
    def operation_id(self) -> str:
        """``/openapi.json``'s name of the route: its handler's name and its method."""
        handler: Callable[..., object] = self.handler
        while isinstance(handler, functools.partial):
            handler = handler.func
        return f"{handler.__name__}_{self.method.lower()}"


@dataclasses.dataclass
class AppState:
    """What the routes need: the scheduler replicas (``pool``: their health; ``dispatcher``: a
    request to one of them), the supervisor's query socket, the metrics and the facts of the
    launch. ``served_name``, ``model_path`` and the model fields of ``server_args`` are the one
    place the routes read the served model from; ``serve_model`` changes them when a reload
    finished."""

    pool: ReplicaPool
    dispatcher: Dispatcher
    metrics: Metrics
    served_name: str
    model_path: str
    server_args: ServerArgs
    platform: PlatformSummary
    queries: QuerySocket = dataclasses.field(default_factory=lambda: QuerySocket(None))
    api_key: str | None = None
    max_request_bytes: int = 1 << 20
    started: int = dataclasses.field(default_factory=lambda: int(time.time()))
    # The runtime's own API routes (``platforms.runtimes`` ``api_routes``): called by
    # ``create_app`` with a ``RouteKit``, it returns the ``Route``s to add. None: none.
    api_routes: Callable[[RouteKit], list[Route[Any]]] | None = None
    # What the model directory says it serves: "generation", "embedding" or "image" (None:
    # it does not say), and, for a generation model, its chat template.
    kind: str | None = None
    chat: ChatTemplate | None = None
    # The GGUF file this launch (or the reload that finished) was given, when ``model_path`` is
    # its converted copy in the model cache; None otherwise.
    gguf_file: str | None = None
    # The longest prompt plus completion the schedulers accept, once one has said (chat).
    context_length: int | None = None
    # Seconds /health_generate waits for its probe before it answers 503.
    health_timeout: float = 20.0

    def serve_model(
        self,
        model_path: str,
        served_name: str,
        *,
        kind: str | None,
        chat: ChatTemplate | None,
        gguf_file: str | None = None,
    ) -> None:
        """A reload finished: the replicas serve the model at ``model_path`` as ``served_name``
        from now on (of ``kind``, with ``chat`` as its template); the context length is asked
        again."""
        args = copy.copy(self.server_args)
        args.model_path = model_path
        args.served_model_name = served_name
        self.server_args = args
        self.model_path, self.served_name = model_path, served_name
        self.kind, self.chat = kind, chat
        self.gguf_file = gguf_file
        self.context_length = None

    def wrong_model(self, name: str | None) -> Response | None:
        """The 404 for a request's ``model`` that is not the served one; None when it is (or the
        request names none)."""
        if name and name != self.served_name:
            return error_response(
                404,
                f"model {name!r} is not served here; this server serves "
                f"{self.served_name!r} (see /v1/models)",
                "model",
            )
        return None


class UnlessDisconnected(Protocol):
    """``streaming.unless_disconnected``'s signature."""

    def __call__(self, receive: Receive, awaitable: Awaitable[T], /) -> Awaitable[T | None]: ...


@dataclasses.dataclass(frozen=True)
class RouteKit:
    """What a runtime's route function gets from ``create_app`` to build its ``Route``s:
    ``state`` (the dispatcher, the metrics, the served name), ``wrong_model(name)`` (the 404 response
    for a ``model`` that is not the served one, else None) and ``unless_disconnected(receive,
    awaitable)`` (None when the client went away, which cancels the request at the worker)."""

    state: AppState
    wrong_model: Callable[[str | None], Response | None]
    unless_disconnected: UnlessDisconnected


# A scheduler's refusal of a request of the wrong kind: "model 'm' serves embedding, not generation".
_KIND_REFUSAL = re.compile(r"\bserves (?P<served>[\w-]+), not [\w-]+")


class App:
    """The ASGI app: hands each request to its ``Route``, after the API key and the body
    limit; counts every answer in the metrics; runs ``lifespan`` (when given) for the ASGI
    lifespan. A request body is always parsed as JSON, whatever ``Content-Type`` it carries."""

    def __init__(
        self, state: AppState, routes: list[Route[Any]], lifespan: Lifespan | None = None
    ) -> None:
        self.state = state
        self.lifespan = lifespan
        self.routes: dict[str, dict[str, Route[Any]]] = {}
        for route in routes:
            self.add_route(route)

    def add_route(self, route: Route[Any]) -> None:
        """Serve ``route`` too (a plugin's ``build_app`` hook adds its routes this way); one for
        the same method and path replaces the earlier one."""
        self.routes.setdefault(route.path, {})[route.method] = route

    def all_routes(self) -> Iterator[Route[Any]]:
        """Every route served, in the order they were added."""
        for by_method in self.routes.values():
            yield from by_method.values()

    def refusal_message(self, message: str, param: str | None) -> str:
        """A scheduler's refusal ``message``, with the routes that serve the model's kind when it
        refuses a request of another kind (``; use /v1/embeddings``) and names no route itself."""
        match = _KIND_REFUSAL.search(message) if param == "model" else None
        if match is None or "use /" in message:
            return message
        paths = dict.fromkeys(r.path for r in self.all_routes() if r.kind == match["served"])
        return f"{message}; use {' or '.join(paths) or '/v1/models to see what is served'}"

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
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
            await self._handle(scope, receive, send_counted, path)
        finally:
            route = path if path in self.routes else "other"
            self.state.metrics.observe_request(route, status_box[0], time.monotonic() - started)
        return None

    async def _handle(self, scope: Scope, receive: Receive, send: Send, path: str) -> None:
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
        body: Body | None = None
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
        except BodyError as exc:  # a handler's own check of the body (a chat template's)
            response = error_response(400, exc.message, exc.param)
        except SchedulerError as exc:
            param = route.params.get(exc.param, exc.param) if exc.param else None
            wait = {"retry-after": str(exc.retry_after)} if exc.retry_after else None
            message = self.refusal_message(exc.message, param)
            response = error_response(exc.status, message, param, headers=wait)
        except Exception as exc:  # noqa: BLE001 - a bug answers 500 in JSON, the server goes on
            log.exception("%s %s failed", scope["method"], path)
            response = error_response(500, f"internal error: {type(exc).__name__}: {exc}")
        await response(scope, receive, send)
        return None

    async def _read_body(self, scope: Scope, receive: Receive, send: Send) -> bytes | None:
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
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return None
            chunk: bytes = message.get("body", b"")
            size += len(chunk)
            if size > limit:
                await _send_error(send, 413, _too_large(size, limit))
                return None
            chunks.append(chunk)
            if not message.get("more_body"):
                return chunks[0] if len(chunks) == 1 else b"".join(chunks)

    def _authorised(self, scope: Scope) -> bool:
        expected = (self.state.api_key or "").encode()
        for name, value in scope.get("headers") or ():
            if name == b"authorization" and value[:7].lower() == b"bearer ":
                return hmac.compare_digest(value[7:].strip(), expected)
            if name == b"x-api-key":
                return hmac.compare_digest(value.strip(), expected)
        return False

    async def _lifespan(self, receive: Receive, send: Send) -> None:
        async with contextlib.AsyncExitStack() as running:
            while True:
                message = await receive()
                if message["type"] == "lifespan.startup":
                    try:
                        if self.lifespan is not None:
                            await running.enter_async_context(self.lifespan())
                    except Exception as exc:  # noqa: BLE001 - reported to the server, which stops
                        failed = f"{type(exc).__name__}: {exc}"
                        await send({"type": "lifespan.startup.failed", "message": failed})
                        return
                    await send({"type": "lifespan.startup.complete"})
                elif message["type"] == "lifespan.shutdown":
                    try:
                        await running.aclose()
                    finally:
                        await send({"type": "lifespan.shutdown.complete"})
                    return

    def openapi(self) -> dict[str, object]:
        """The OpenAPI 3.1 document of the route table: request bodies, answers and errors from
        their structs."""
        routes = [r for r in self.all_routes() if r.in_schema]
        structs = dict.fromkeys(
            s for r in routes for s in (r.body, r.response, *r.stream) if s is not None
        )
        _, schemas = msgspec.json.schema_components([*structs, ErrorBody], ref_template=_REF)
        paths: dict[str, dict[str, object]] = {}
        for r in routes:
            paths.setdefault(r.path, {})[r.method.lower()] = self._operation(r)
        components: dict[str, object] = {"schemas": schemas}
        if self.state.api_key:
            components["securitySchemes"] = {"bearer": {"type": "http", "scheme": "bearer"}}
        return {
            "openapi": "3.1.0",
            "info": {
                "title": "sglang-launch",
                "version": VERSION,
                "description": "OpenAI-compatible and SGLang-native serving of one model.",
            },
            "paths": paths,
            "components": components,
        }

    def _operation(self, r: Route[Any]) -> dict[str, object]:
        """The OpenAPI operation of route ``r``."""
        error: dict[str, object] = {
            "description": "refused: the message says why, param names the field",
            "content": {JSON: {"schema": _ref(ErrorBody)}},
        }
        responses = {str(status): _answer(r, status) for status in r.answers}
        operation: dict[str, object] = {
            "summary": r.summary,
            "responses": responses,
            "operationId": r.operation_id,
        }
        if r.body is not None:
            operation["requestBody"] = {
                "required": True,
                "content": {JSON: {"schema": _ref(r.body)}},
            }
            responses.update({"400": error, "404": error, "413": error})
        if self.state.api_key and not r.public:
            operation["security"] = [{"bearer": []}]
            responses["401"] = error
        return operation


_REF = "#/components/schemas/{name}"


def _ref(struct: type) -> dict[str, str]:
    return {"$ref": _REF.format(name=struct.__name__)}


def _answer(r: Route[Any], status: int) -> dict[str, object]:
    """The OpenAPI response of route ``r`` for ``status`` (one of ``r.answers``)."""
    if status >= 400 and r.response is None:  # a route with no answer struct refuses in JSON
        return {
            "description": "refused: the message says why",
            "content": {JSON: {"schema": _ref(ErrorBody)}},
        }
    content: dict[str, object] = {}
    if r.response is not None:
        content[r.media_type] = {"schema": _ref(r.response)}
    elif r.media_type != JSON:
        content[r.media_type] = {"schema": {"type": "string"}}
    description = "success" if status < 400 else "unavailable: reason says why"
    if r.events and status == 200:
        description = "success: JSON, or with stream: true server-sent events"
        events: dict[str, object] = {"schema": {"type": "string", "description": r.events}}
        if r.stream:  # what the data: lines carry (OpenAPI 3.1 has no keyword for it)
            carried: list[type[msgspec.Struct]] = [*r.stream, ErrorBody]
            events["x-event-data"] = {"oneOf": [_ref(s) for s in carried]}
        content["text/event-stream"] = events
    answer: dict[str, object] = {"description": description}
    if content:
        answer["content"] = content
    return answer


def _too_large(size: int, limit: int) -> str:
    return (
        f"the request body has {size} bytes, more than the limit of {limit} "
        f"(--max-request-bytes); send fewer or shorter inputs per request"
    )


async def _send_error(
    send: Send,
    status: int,
    message: str,
    headers: list[tuple[bytes, bytes]] | None = None,
    param: str | None = None,
) -> None:
    body = error_body(status, message, param)
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", JSON.encode()),
                (b"content-length", str(len(body)).encode()),
                *(headers or ()),
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})
