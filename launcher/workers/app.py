"""The FastAPI application of the HTTP child: routes, errors, the API key and the body limit.

Routes: ``/health`` (liveness), ``/ready`` (every scheduler answers a ping), ``/v1/models``,
``/v1/embeddings``, ``/v1/completions`` (OpenAI shapes), ``/generate`` (SGLang's native shape),
``/get_server_info``, ``/metrics`` (Prometheus). Every error is JSON in OpenAI's shape
``{"error": {"message", "type", "param", "code"}}``; input a client gets wrong is a 4xx naming the
field and the fix. With an API key, every route but ``/health`` and ``/ready`` needs
``Authorization: Bearer <key>``. A client that disconnects cancels its request at the scheduler.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import hmac
import inspect
import json
import logging
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable

import msgspec
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import Response, StreamingResponse
from pydantic import BaseModel, ValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException

from launcher.workers import messages as m
from launcher.workers.client import SchedulerClient, SchedulerError
from launcher.workers.metrics import Metrics
from launcher.workers.schemas import CompletionRequest, EmbeddingRequest, GenerateRequest

PUBLIC_PATHS = frozenset({"/health", "/ready"})
ROUTES = frozenset({"/health", "/ready", "/v1/models", "/v1/embeddings", "/v1/completions",
                    "/generate", "/get_server_info", "/metrics", "/openapi.json", "/docs"})
_ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error", 404: "not_found_error",
                405: "invalid_request_error", 413: "invalid_request_error", 422: "invalid_request_error",
                503: "service_unavailable"}
_json = msgspec.json.Encoder()
log = logging.getLogger("sglang_launch.http")


def error_body(status: int, message: str, param: str | None = None) -> bytes:
    kind = _ERROR_TYPES.get(status, "invalid_request_error" if status < 500 else "server_error")
    return _json.encode({"error": {"message": message, "type": kind, "param": param, "code": status}})


def json_response(obj, status: int = 200) -> Response:
    return Response(_json.encode(obj), status_code=status, media_type="application/json")


def error_response(status: int, message: str, param: str | None = None) -> Response:
    return Response(error_body(status, message, param), status_code=status, media_type="application/json")


def not_json_message(problem: str, at: object = None) -> str:
    where = f" at character {at}" if isinstance(at, int) else ""
    return (f"the request body is not valid JSON ({problem}{where}); "
            f"send a JSON object with Content-Type: application/json")


def validation_message(errors) -> str:
    """One 400 message for pydantic's errors: each field (dotted path) with what is wrong."""
    problems = []
    for err in errors:
        if err.get("type") == "json_invalid":  # FastAPI's: json.loads' message in ctx, position in loc
            problem = (err.get("ctx") or {}).get("error") or err.get("msg")
            return not_json_message(problem, (err.get("loc") or [None])[-1])
        where = ".".join(str(p) for p in err.get("loc", ()) if p != "body") or "body"
        problems.append(f"{where}: {err.get('msg')}")
    return "invalid request: " + "; ".join(problems)


Receive = Callable[[], Awaitable[dict]]


@dataclasses.dataclass(frozen=True)
class JsonRoute:
    """A POST route whose body is one JSON object of ``model``: ``handler(body, receive)`` answers
    it (``receive`` reports the client's disconnect).

    The ``Guard`` dispatches these routes itself (parse, validate, call), without FastAPI's
    per-request machinery (routing, dependencies, its request object). FastAPI declares the same routes, so ``/openapi.json`` and ``/docs`` describe them, and its
    endpoints call the same handlers. Bodies are parsed with ``json.loads`` and validated in
    Python mode, as FastAPI does, so both paths accept and refuse the same input with the same
    message (a test holds them to it)."""

    model: type[BaseModel]
    handler: Callable[[BaseModel, Receive], Awaitable[Response]]

    async def respond(self, body: bytes, receive: Receive) -> Response:
        try:
            data = json.loads(body)
        except json.JSONDecodeError as exc:
            return error_response(400, not_json_message(exc.msg, exc.pos))
        except (ValueError, RecursionError) as exc:  # bytes that are not UTF-8, nesting too deep
            return error_response(400, not_json_message(str(exc) or type(exc).__name__))
        try:
            parsed = self.model.model_validate(data, from_attributes=True)  # as FastAPI validates
        except ValidationError as exc:
            return error_response(400, validation_message(exc.errors(include_url=False)))
        try:
            return await self.handler(parsed, receive)
        except SchedulerError as exc:
            return error_response(exc.status, exc.message)
        except Exception as exc:  # noqa: BLE001 - a bug answers 500 in JSON, the server goes on
            log.exception("%s failed", self.handler.__name__)
            return error_response(500, f"internal error: {type(exc).__name__}: {exc}")


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


class Guard:
    """Pure ASGI middleware: API key, request-body limit, and per-route metrics.

    A POST body is always parsed as JSON, whatever ``Content-Type`` the client sent.
    The body is read here (at most ``max_request_bytes``) and replayed to the app; after the body
    the app's ``receive`` still reports a client disconnect."""

    def __init__(self, app, state: AppState, json_routes: dict[str, JsonRoute] | None = None) -> None:
        self.app = app
        self.state = state
        self.json_routes = json_routes or {}

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        started = time.monotonic()
        path = scope.get("path", "")
        route = path if path in ROUTES else "other"
        status_box = [500]

        async def send_counted(message):
            if message["type"] == "http.response.start":
                status_box[0] = message["status"]
            await send(message)

        try:
            await self._guarded(scope, receive, send_counted, path)
        finally:
            self.state.metrics.observe_request(route, status_box[0], time.monotonic() - started)

    async def _guarded(self, scope, receive, send, path):
        state = self.state
        if state.api_key and path not in PUBLIC_PATHS and not self._authorised(scope):
            return await _send_error(send, 401, "missing or wrong API key; send the header "
                                                "'Authorization: Bearer <key>' with the server's --api-key")
        headers = dict(scope.get("headers") or [])
        length = headers.get(b"content-length")
        limit = state.max_request_bytes
        if length is not None:
            try:
                declared = int(length)
            except ValueError:
                return await _send_error(send, 400, "the Content-Length header is not a number")
            if declared > limit:
                return await _send_error(send, 413, _too_large(declared, limit))
        chunks, size = [], 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            body = message.get("body", b"")
            size += len(body)
            if size > limit:
                return await _send_error(send, 413, _too_large(size, limit))
            chunks.append(body)
            if not message.get("more_body"):
                break
        json_route = self.json_routes.get(path) if scope.get("method") == "POST" else None
        if json_route is not None:
            response = await json_route.respond(b"".join(chunks), receive)
            return await response(scope, receive, send)
        replayed = False

        async def replay():
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": b"".join(chunks), "more_body": False}
            return await receive()

        if scope.get("method") == "POST":
            # Bodies are JSON whatever the client labelled them (curl -d sends a form type).
            scope = dict(scope)
            scope["headers"] = [(k, v) for k, v in scope.get("headers") or [] if k != b"content-type"]
            scope["headers"].append((b"content-type", b"application/json"))
        await self.app(scope, replay, send)

    def _authorised(self, scope) -> bool:
        expected = self.state.api_key.encode()
        for name, value in scope.get("headers") or []:
            if name == b"authorization" and value[:7].lower() == b"bearer ":
                return hmac.compare_digest(value[7:].strip(), expected)
            if name == b"x-api-key":
                return hmac.compare_digest(value.strip(), expected)
        return False


def _too_large(size: int, limit: int) -> str:
    return (f"the request body has {size} bytes, more than the limit of {limit} "
            f"(--max-request-bytes); send fewer or shorter inputs per request")


async def _send_error(send, status: int, message: str) -> None:
    body = error_body(status, message)
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"),
                            (b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body})


async def _client_gone(receive: Receive) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass


async def _unless_disconnected(receive: Receive, awaitable):
    """Await ``awaitable`` in this task; if the client disconnects first, a watcher cancels this
    task (which cancels the request at the scheduler) and the result is None. The watcher is
    parked before the request goes out, so the HTTP child has nothing left to run while the
    scheduler computes, and the answer wakes this task directly."""
    task = asyncio.current_task()
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


def _sampling(params, max_new_tokens: int) -> m.SamplingParams:
    return m.SamplingParams(
        max_new_tokens=max_new_tokens,
        temperature=params.temperature,
        top_p=params.top_p,
        top_k=max(params.top_k, 0),
        stop=tuple(params.stop or ()),
        ignore_eos=params.ignore_eos,
        seed=params.seed,
    )


def _args_dict(server_args) -> dict:
    if dataclasses.is_dataclass(server_args):
        data = dataclasses.asdict(server_args)
    else:
        data = dict(vars(server_args))
    if data.get("api_key"):
        data["api_key"] = "***"
    return {k: v if isinstance(v, (str, int, float, bool, type(None), list, dict)) else str(v)
            for k, v in data.items()}


def create_app(state: AppState) -> FastAPI:
    """The app; ``state.client`` is started and closed by the app's lifespan."""

    @contextlib.asynccontextmanager
    async def lifespan(app):
        await state.client.start()
        try:
            yield
        finally:
            await state.client.close()

    app = FastAPI(title="sglang-launch", version="0.1.0", lifespan=lifespan,
                  description="OpenAI-compatible and SGLang-native serving of one model.")
    client, metrics = state.client, state.metrics

    @app.exception_handler(RequestValidationError)
    async def _invalid(request, exc: RequestValidationError):
        return error_response(400, validation_message(exc.errors()))

    @app.exception_handler(StarletteHTTPException)
    async def _http(request, exc: StarletteHTTPException):
        message = exc.detail if isinstance(exc.detail, str) else str(exc.detail)
        if exc.status_code == 404:
            message = f"no route {request.url.path}; see /docs for the routes"
        return error_response(exc.status_code, message)

    @app.exception_handler(SchedulerError)
    async def _scheduler(request, exc: SchedulerError):
        return error_response(exc.status, exc.message)

    json_routes: dict[str, JsonRoute] = {}

    def json_post(path: str, model: type[BaseModel], summary: str):
        """Register ``handler(body, receive)`` for ``POST path``: with the Guard, which serves it,
        and with FastAPI, which documents it (and whose endpoint calls the same handler)."""

        def register(handler):
            json_routes[path] = JsonRoute(model, handler)

            async def endpoint(body, request: Request):
                return await handler(body, request.receive)

            endpoint.__name__ = handler.__name__
            endpoint.__signature__ = inspect.Signature([
                inspect.Parameter("body", inspect.Parameter.POSITIONAL_OR_KEYWORD, annotation=model),
                inspect.Parameter("request", inspect.Parameter.POSITIONAL_OR_KEYWORD, annotation=Request)])
            app.post(path, summary=summary)(endpoint)
            return handler

        return register

    def check_model(name: str | None) -> None:
        if name and name != state.served_name:
            raise SchedulerError(404, f"model {name!r} is not served here; this server serves "
                                      f"{state.served_name!r} (see /v1/models)")

    @app.get("/health", summary="liveness: false as soon as any scheduler is dead")
    async def health():
        reason = client.unhealthy_reason
        if reason:
            return json_response({"healthy": False, "reason": reason}, 503)
        return json_response({"healthy": True})

    @app.get("/ready", summary="true once every scheduler answers (model loaded, warmed up)")
    async def ready():
        if not client.healthy:
            return json_response({"ready": False, "reason": client.unhealthy_reason}, 503)
        pongs = await client.ping_all(timeout=1.0)
        missing = [i for i, p in enumerate(pongs) if p is None]
        if missing:
            return json_response({"ready": False, "reason": f"scheduler(s) dp={missing} not answering yet: "
                                                            f"{client.unanswered_reason(missing)}"}, 503)
        return json_response({"ready": True, "schedulers": [
            {"dp_rank": p.dp_rank, "pid": p.pid, "queue_depth": p.queue_depth} for p in pongs]})

    @app.get("/v1/models", summary="the served model (OpenAI shape)")
    async def models():
        return json_response({"object": "list", "data": [{
            "id": state.served_name, "object": "model", "created": state.started,
            "owned_by": "sglang-launch", "root": state.model_path}]})

    @json_post("/v1/embeddings", EmbeddingRequest, "embeddings (OpenAI shape)")
    async def embeddings(body: EmbeddingRequest, receive: Receive) -> Response:
        check_model(body.model)
        if body.dimensions is not None:
            raise SchedulerError(400, f"dimensions is not supported by model {state.served_name!r}: it "
                                      f"returns its native embedding size; leave dimensions out")
        texts = [body.input] if isinstance(body.input, str) else list(body.input)
        reply = await _unless_disconnected(receive, client.one(lambda rid: m.EmbedRequest(rid, texts)))
        if reply is None:
            return Response(status_code=499)
        metrics.observe_result(reply.batch_size, reply.prompt_tokens)
        return json_response({
            "object": "list",
            "data": [{"object": "embedding", "index": i, "embedding": v}
                     for i, v in enumerate(m.unpack_vectors(reply.vectors, reply.dim))],
            "model": state.served_name,
            "usage": {"prompt_tokens": reply.prompt_tokens, "total_tokens": reply.prompt_tokens},
        })

    @json_post("/v1/completions", CompletionRequest,
               "text completion (OpenAI shape; stream with server-sent events)")
    async def completions(body: CompletionRequest, receive: Receive) -> Response:
        check_model(body.model)
        prompts = [body.prompt] if isinstance(body.prompt, str) else list(body.prompt)
        params = _sampling(body, body.max_tokens)
        cid, created = f"cmpl-{uuid.uuid4().hex}", int(time.time())
        if body.stream:
            if len(prompts) != 1:
                raise SchedulerError(400, "stream: true takes one prompt; send the prompts one per request")

            def chunk(reply: m.Generated) -> dict:
                return {"id": cid, "object": "text_completion", "created": created,
                        "model": state.served_name,
                        "choices": [{"index": 0, "text": reply.text, "logprobs": None,
                                     "finish_reason": reply.finish_reason if reply.finished else None}]}

            return await _stream(client.call(lambda rid: m.GenerateRequest(rid, prompts[0], params, True)),
                                 chunk, metrics)
        calls = [client.one(lambda rid, p=p: m.GenerateRequest(rid, p, params)) for p in prompts]
        replies = await _unless_disconnected(receive, asyncio.gather(*calls))
        if replies is None:
            return Response(status_code=499)
        for r in replies:
            metrics.observe_result(r.batch_size, r.prompt_tokens, r.completion_tokens)
        prompt_tokens = sum(r.prompt_tokens for r in replies)
        completion_tokens = sum(r.completion_tokens for r in replies)
        return json_response({
            "id": cid, "object": "text_completion", "created": created, "model": state.served_name,
            "choices": [{"index": i, "text": r.text, "logprobs": None, "finish_reason": r.finish_reason}
                        for i, r in enumerate(replies)],
            "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
                      "total_tokens": prompt_tokens + completion_tokens},
        })

    @json_post("/generate", GenerateRequest, "generation (SGLang's native shape; stream with server-sent events)")
    async def generate(body: GenerateRequest, receive: Receive) -> Response:
        sp = body.sampling_params
        params = _sampling(sp, sp.max_new_tokens)

        def meta(reply: m.Generated, rid: str) -> dict:
            return {"id": rid, "prompt_tokens": reply.prompt_tokens,
                    "completion_tokens": reply.completion_tokens,
                    "finish_reason": {"type": reply.finish_reason} if reply.finish_reason else None,
                    "seed": reply.seed}

        if body.stream:
            text = [""]

            def chunk(reply: m.Generated) -> dict:
                text[0] += reply.text  # the native stream carries the text so far
                return {"text": text[0], "meta_info": meta(reply, reply.rid)}

            return await _stream(client.call(lambda rid: m.GenerateRequest(rid, body.text, params, True)),
                                 chunk, metrics)
        reply = await _unless_disconnected(
            receive, client.one(lambda rid: m.GenerateRequest(rid, body.text, params)))
        if reply is None:
            return Response(status_code=499)
        metrics.observe_result(reply.batch_size, reply.prompt_tokens, reply.completion_tokens)
        return json_response({"text": reply.text, "meta_info": meta(reply, reply.rid)})

    @app.get("/get_server_info", summary="platform, device, memory, model and arguments")
    async def server_info():
        pongs = await client.ping_all(timeout=2.0)
        live = [p for p in pongs if p is not None]
        model = live[0].info.get("model") if live else None
        return json_response({
            "version": "0.1.0",
            "platform": state.platform,
            "device": (model or {}).get("device"),
            "model": model,
            "schedulers": [None if p is None else {
                "dp_rank": p.dp_rank, "pid": p.pid, "queue_depth": p.queue_depth,
                "batches": p.info.get("batches"), "aborted": p.info.get("aborted"),
                "generated_tokens": p.info.get("generated_tokens"),
                "memory": p.info.get("memory")} for p in pongs],
            "server_args": _args_dict(state.server_args),
            "healthy": client.healthy,
        })

    @app.get("/metrics", summary="Prometheus metrics")
    async def prometheus():
        return Response(metrics.render(), media_type="text/plain; version=0.0.4")

    return Guard(app, state, json_routes)


async def _stream(replies: AsyncIterator, chunk, metrics: Metrics) -> Response:
    """Server-sent events of ``chunk(reply)``; the first reply is awaited before the response
    starts, so a rejected request is still a plain 4xx. Closing the stream early (the client
    went away) closes ``replies``, which cancels the request at the scheduler."""
    try:
        first = await replies.__anext__()
    except StopAsyncIteration:
        first = None
    except BaseException:
        await replies.aclose()
        raise

    async def events():
        try:
            reply = first
            while reply is not None:
                if reply.finished:
                    metrics.observe_result(reply.batch_size, reply.prompt_tokens, reply.completion_tokens)
                yield b"data: " + _json.encode(chunk(reply)) + b"\n\n"
                try:
                    reply = await replies.__anext__()
                except StopAsyncIteration:
                    reply = None
                except SchedulerError as exc:
                    yield b"data: " + error_body(exc.status, exc.message) + b"\n\n"
                    reply = None
            yield b"data: [DONE]\n\n"
        finally:
            await replies.aclose()

    return StreamingResponse(events(), media_type="text/event-stream")
