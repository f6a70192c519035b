"""Every JSON answer of the HTTP app is a struct of ``serving.http.responses`` that its route names,
and ``/openapi.json`` documents each answer from that struct (in-process, httpx's ASGI transport):
the document and the wire cannot disagree. A scheduler's refusal of a request of the wrong kind
names the routes that serve the model's kind, once.

The answers that need a scheduler (embeddings, completions, images, their streams) are checked
against real servers in ``tests/e2e/test_serving_responses.py``."""

from __future__ import annotations

import asyncio
import json

import httpx
import msgspec
import pytest

from launchspec.server_args import ServerArgs
from serving.http import responses
from serving.http.app import AppState, Route
from serving.http.dispatcher import Dispatcher
from serving.http.images import add_image_routes
from serving.http.metrics import Metrics
from serving.http.pool import ReplicaPool
from serving.http.replica import SchedulerError
from serving.http.responses import PlatformSummary
from serving.http.routes import create_app

REF = "#/components/schemas/{name}"


def make_app(**state):
    pool = ReplicaPool([])
    return create_app(
        AppState(
            pool=pool,
            dispatcher=Dispatcher(pool),
            metrics=Metrics(),
            server_args=ServerArgs(api_key="k"),
            served_name="tiny",
            model_path="/models/tiny",
            platform=PlatformSummary(key="builtin:cpu"),
            api_routes=add_image_routes,  # the diffusion runtime's routes too
            **state,
        )
    )


def call(app, method: str, path: str, body: bytes | None = None) -> httpx.Response:
    async def go():
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://app") as client:
            return await client.request(method, path, content=body)

    return asyncio.run(go())


def documented_struct(doc: dict, path: str, method: str, status: str = "200") -> type:
    """The struct of ``serving.http.responses`` that ``doc`` names for ``method path``'s answer."""
    schema = doc["paths"][path][method]["responses"][status]["content"]["application/json"]
    name = schema["schema"]["$ref"].removeprefix("#/components/schemas/")
    return getattr(responses, name)


def test_every_json_route_documents_its_answers_from_its_struct():
    app = make_app()
    doc = call(app, "GET", "/openapi.json").json()
    schemas = doc["components"]["schemas"]
    routes = [r for r in app.all_routes() if r.in_schema]
    assert {r.path for r in routes} >= {"/v1/embeddings", "/v1/images/generations", "/ready"}
    for route in routes:
        operation = doc["paths"][route.path][route.method.lower()]
        if route.media_type != "application/json":  # /metrics: Prometheus' text
            assert route.response is None
            assert operation["responses"]["200"]["content"][route.media_type]
            continue
        assert route.response is not None, f"{route.path} names no response struct"
        assert route.response.__module__ == "serving.http.responses"
        for status in route.answers:
            assert documented_struct(doc, route.path, route.method.lower(), str(status)) is (
                route.response
            )
        # The documented schema is msgspec's of the struct, the one that encodes the answer.
        _, own = msgspec.json.schema_components([route.response], ref_template=REF)
        for name, schema in own.items():
            assert schemas[name] == schema, name
        for status, answer in operation["responses"].items():
            if status not in {str(s) for s in route.answers}:
                assert answer["content"]["application/json"]["schema"]["$ref"] == REF.format(
                    name="ErrorBody"
                )
        if route.events:
            carried = operation["responses"]["200"]["content"]["text/event-stream"]
            names = [ref["$ref"].rsplit("/", 1)[1] for ref in carried["x-event-data"]["oneOf"]]
            assert names == [s.__name__ for s in route.stream] + ["ErrorBody"]
            assert all(name in schemas for name in names)


@pytest.mark.parametrize("path", ["/health", "/ready", "/v1/models", "/get_server_info"])
def test_answers_decode_strictly_into_their_documented_struct(path):
    app = make_app()
    doc = call(app, "GET", "/openapi.json").json()
    answer = call(app, "GET", path)
    assert answer.status_code == 200, answer.text
    struct = documented_struct(doc, path, "get")
    decoded = msgspec.json.decode(answer.content, type=struct, strict=True)
    assert msgspec.json.encode(decoded) == answer.content  # nothing lost, nothing reordered


def test_errors_decode_strictly_into_error_body():
    app = make_app()
    for method, path, body in [
        ("GET", "/nope", None),
        ("POST", "/v1/embeddings", b'{"input": ""}'),
        ("POST", "/v1/images/generations", b'{"prompt": "x", "n": 0}'),
        ("POST", "/v1/embeddings", b'{"input": "x"}'),  # no scheduler: 503
    ]:
        r = call(app, method, path, body)
        assert r.status_code >= 400
        error = msgspec.json.decode(r.content, type=responses.ErrorBody, strict=True).error
        assert error.code == r.status_code and error.message


def _refusing(message: str) -> Route:
    async def refuse(body, receive):
        raise SchedulerError(400, message, "model")

    return Route("POST", "/refuse", refuse, "a route whose scheduler refuses the request")


@pytest.mark.parametrize(
    "message",
    [
        "model 'tiny' serves embedding, not generation",  # the scheduler names no route
        "model 'tiny' serves embedding, not generation; use /v1/embeddings",  # it does
    ],
)
def test_a_wrong_kind_refusal_names_the_routes_of_the_served_kind_once(message):
    app = make_app()
    app.add_route(_refusing(message))
    error = call(app, "POST", "/refuse").json()["error"]
    assert error["message"] == "model 'tiny' serves embedding, not generation; use /v1/embeddings"
    assert (error["param"], error["code"]) == ("model", 400)
    app.add_route(_refusing("model 'pic' serves image, not embedding"))
    error = call(app, "POST", "/refuse").json()["error"]
    assert error["message"].endswith("not embedding; use /v1/images/generations")
    app.add_route(_refusing("model 'tiny' serves generation, not embedding"))
    error = call(app, "POST", "/refuse").json()["error"]
    assert error["message"].endswith(
        "not embedding; use /v1/completions or /v1/chat/completions or /generate"
    )


def test_other_refusals_are_left_as_the_scheduler_words_them():
    app = make_app()
    words = "input has 300 tokens, more than this model's limit of 256"
    app.add_route(_refusing(words))
    assert call(app, "POST", "/refuse").json()["error"]["message"] == words


def test_plugin_routes_answer_plain_json():
    from serving.http.app import json_response

    async def hello(body, receive):
        return json_response({"plugin": "p", "n": None})

    app = make_app()
    app.add_route(Route("GET", "/p/hello", hello, "a plugin's route"))
    assert json.loads(call(app, "GET", "/p/hello").content) == {"plugin": "p", "n": None}
    doc = call(app, "GET", "/openapi.json").json()
    assert doc["paths"]["/p/hello"]["get"]["responses"]["200"] == {"description": "success"}
