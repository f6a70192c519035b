"""Every request body, whatever its bytes, is a JSON 4xx naming what is wrong (``param``: the
field, or the key): the bodies a fault-injection run once saw answered with a plain-text 500 (an
unpaired surrogate in a field of the wrong type, or as a key), and a generator of such faults
over every route that reads a body (hypothesis, derandomized and bounded): unpaired surrogates in
any field or key, values of a type the route's own ``/openapi.json`` does not allow, bodies that
are not objects, bytes that are not JSON. The app runs in-process (httpx's ASGI transport): no
scheduler is needed for a 4xx, and none is asked (a body that got past the checks would be a
503 here, which fails the test)."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support.http_bodies import SEEN_AS_500

from launchspec.server_args import ServerArgs
from serving.http.app import App, AppState
from serving.http.dispatcher import Dispatcher
from serving.http.images import add_image_routes
from serving.http.metrics import Metrics
from serving.http.pool import ReplicaPool
from serving.http.responses import PlatformSummary
from serving.http.routes import create_app

# A body each route accepts; the faults are made from it.
VALID: dict[str, dict[str, Any]] = {
    "/v1/embeddings": {"input": "x"},
    "/v1/completions": {"prompt": "x", "max_tokens": 2},
    "/v1/chat/completions": {"messages": [{"role": "user", "content": "hi"}]},
    "/generate": {"text": "x", "sampling_params": {"max_new_tokens": 2}},
    "/v1/images/generations": {"prompt": "a cat"},
}


def make_app() -> App:
    pool = ReplicaPool([])
    return create_app(
        AppState(
            pool=pool,
            dispatcher=Dispatcher(pool),
            metrics=Metrics("tiny"),
            server_args=ServerArgs(),
            served_name="tiny",
            model_path="/models/tiny",
            platform=PlatformSummary(key="builtin:cpu"),
            api_routes=add_image_routes,  # every route a runtime serves
            kind="generation",
        )
    )


APP = make_app()


def post(path: str, body: bytes) -> httpx.Response:
    async def go() -> httpx.Response:
        transport = httpx.ASGITransport(app=APP)
        async with httpx.AsyncClient(transport=transport, base_url="http://app") as client:
            return await client.post(path, content=body)

    return asyncio.run(go())


def assert_refused(reply: httpx.Response, param: str | None) -> None:
    assert 400 <= reply.status_code < 500, (reply.status_code, reply.text)
    assert reply.headers["content-type"] == "application/json", reply.text
    error = reply.json()["error"]
    assert error["code"] == reply.status_code and error["message"], error
    assert error["param"] == param, error


@pytest.mark.parametrize(
    "route, body, param", SEEN_AS_500, ids=[b.decode() for _, b, _ in SEEN_AS_500]
)
def test_a_body_once_answered_500_is_a_400_naming_the_field(route, body, param):
    assert_refused(post(route, body), param)


def test_every_route_that_reads_a_body_has_a_valid_one_to_fault():
    assert set(VALID) == {r.path for r in APP.all_routes() if r.body is not None}


# ---- the generator ----------------------------------------------------------------------------

SCHEMAS: dict[str, Any] = APP.openapi()["components"]["schemas"]  # type: ignore[assignment]
BODIES = {r.path: r.body.__name__ for r in APP.all_routes() if r.body is not None}


def _struct(schema: dict[str, Any]) -> dict[str, Any] | None:
    """The component a property's schema refers to (directly or as one of ``anyOf``)."""
    for option in [schema, *schema.get("anyOf", ())]:
        ref = option.get("$ref")
        if ref:
            return SCHEMAS[ref.rsplit("/", 1)[1]]  # type: ignore[no-any-return]
        items = option.get("items", {})
        if "$ref" in items:
            return SCHEMAS[items["$ref"].rsplit("/", 1)[1]]  # type: ignore[no-any-return]
    return None


def _allowed(schema: dict[str, Any]) -> set[str] | None:
    """The JSON types a property's schema allows (None: any)."""
    if "$ref" in schema:
        return {"object"}
    if "anyOf" in schema:
        kinds: set[str] = set()
        for option in schema["anyOf"]:
            some = _allowed(option)
            if some is None:
                return None
            kinds |= some
        return kinds
    kind = schema.get("type")
    if kind is None:
        return None
    return {kind} if isinstance(kind, str) else set(kind)


def _fields(route: str) -> list[tuple[str, dict[str, Any]]]:
    """(path, schema) of every field of ``route``'s body, and of the objects its valid body
    nests (``sampling_params.temperature``, ``messages[0].content``)."""
    fields = []
    for name, schema in SCHEMAS[BODIES[route]]["properties"].items():
        fields.append((name, schema))
        nested = _struct(schema)
        if nested is None or name not in VALID[route]:
            continue
        inner = f"{name}[0]" if isinstance(VALID[route][name], list) else name
        fields += [(f"{inner}.{n}", s) for n, s in nested["properties"].items()]
    return fields


def _type_of(value: object) -> set[str]:
    if value is None:
        return {"null"}
    if isinstance(value, bool):
        return {"boolean"}
    if isinstance(value, int):
        return {"integer", "number"}
    if isinstance(value, float):
        return {"number"}
    if isinstance(value, str):
        return {"string"}
    return {"array"} if isinstance(value, list) else {"object"}


def _container(body: dict[str, Any], path: str) -> tuple[dict[str, Any], str]:
    """The object holding the field at ``path`` in ``body``, and the field's name."""
    *outer, name = path.split(".")
    here: Any = body
    for part in outer:
        key, _, index = part.partition("[")
        here = here[key]
        if index:
            here = here[int(index.rstrip("]"))]
    return here, name


surrogates = st.integers(0xD800, 0xDFFF).map(chr)
texts_with_a_surrogate = st.tuples(st.text(max_size=3), surrogates, st.text(max_size=3)).map(
    "".join
)
json_values = st.one_of(
    texts_with_a_surrogate,
    st.integers(-(2**70), 2**70),
    st.floats(allow_nan=False),
    st.booleans(),
    st.none(),
    st.lists(st.integers(), max_size=2),
    st.dictionaries(st.text(max_size=2), st.integers(), max_size=2),
)


@st.composite
def faulty_bodies(draw: st.DrawFn) -> tuple[str, bytes, str | None]:
    """(route, body, the param its refusal names)."""
    route = draw(st.sampled_from(sorted(VALID)))
    body = json.loads(json.dumps(VALID[route]))
    fault = draw(st.sampled_from(["surrogate", "wrong type", "key", "not an object", "bytes"]))
    if fault == "not an object":
        value = draw(json_values.filter(lambda v: not isinstance(v, dict)))
        return route, json.dumps(value).encode(), None
    if fault == "bytes":
        data = draw(st.binary(max_size=40))
        return route, data, None
    if fault == "key":
        where = draw(st.sampled_from(["", *(p for p, _ in _fields(route) if "." not in p)]))
        holder = body if not where else None
        if where:
            inner = body.get(where)
            holder = inner[0] if isinstance(inner, list) and inner else inner
        if not isinstance(holder, dict):
            holder, where = body, ""
        key = draw(texts_with_a_surrogate)
        holder[key] = draw(json_values)
        prefix = (
            (where + "[0]." if isinstance(body.get(where), list) else where + ".") if where else ""
        )
        return (
            route,
            json.dumps(body).encode(),
            prefix + key.encode("ascii", "backslashreplace").decode("ascii"),
        )
    path, schema = draw(st.sampled_from(_fields(route)))
    if fault == "surrogate":
        value: object = draw(texts_with_a_surrogate)
    else:
        allowed = _allowed(schema)
        if allowed is None:  # any JSON value is a valid type here: a surrogate still is not
            value = draw(texts_with_a_surrogate)
        else:
            value = draw(json_values.filter(lambda v: not _type_of(v) & allowed))
    holder, name = _container(body, path)
    holder[name] = value
    return route, json.dumps(body).encode(), path


@settings(
    max_examples=300,
    derandomize=True,
    database=None,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
@given(faulty_bodies())
def test_a_faulty_body_on_any_route_is_a_json_4xx_naming_the_field(case):
    route, body, param = case
    assert_refused(post(route, body), param)
