"""The routes about the server: ``/health``, ``/ready``, ``/v1/models``, ``/get_server_info``,
``/metrics``, ``/openapi.json`` and ``/docs``, each ``handler(state, body, receive)`` (the
document's routes take the ``App`` instead).

``/health`` answers from what the scheduler client knows (a dead replica, the supervisor's
failure); ``/ready`` and ``/get_server_info`` ping every scheduler replica (``read_pong`` is the
one reader of what a replica reports).
"""

from __future__ import annotations

import dataclasses

import msgspec
from msgspec import UNSET
from starlette.responses import Response

from launcher.server_args import ServerArgs
from serving import wire as messages
from serving.http.app import VERSION, App, AppState, json_response
from serving.http.asgi import Receive
from serving.http.responses import (
    Health,
    ModelCard,
    ModelList,
    Ready,
    SchedulerLoad,
    SchedulerState,
    ServerInfo,
    WorkerManifest,
)


async def health(state: AppState, body: None, receive: Receive) -> Response:
    """``GET /health``: ``Health``, a 503 with the reason once a scheduler is gone."""
    reason = state.client.unhealthy_reason
    if reason:
        return json_response(Health(healthy=False, reason=reason), 503)
    return json_response(Health(healthy=True))


async def ready(state: AppState, body: None, receive: Receive) -> Response:
    """``GET /ready``: ``Ready``, a 503 naming the replicas that are gone or not answering."""
    client = state.client
    reason = client.unhealthy_reason
    if reason:
        return json_response(Ready(ready=False, reason=reason), 503)
    restarting = client.restarting
    pongs = await client.ping_all(timeout=1.0)
    missing = [i for i, p in enumerate(pongs) if p is None and i not in restarting]
    if missing:
        why = f"scheduler(s) dp={missing} not answering yet: {client.unanswered_reason(missing)}"
        return json_response(Ready(ready=False, reason=why), 503)
    loads = [read_pong(p)[0] for p in pongs if p]
    differ = [
        f"{w.name}: {'; '.join(w.differs)}"
        for w in await worker_manifests(state, timeout=0.5) or ()
        if w.differs
    ]
    return json_response(
        Ready(
            ready=True,
            schedulers=[
                SchedulerLoad(dp_rank=s.dp_rank, pid=s.pid, queue_depth=s.queue_depth)
                for s in loads
            ],
            restarting=[f"scheduler dp={dp}" for dp in restarting],
            plugins_differ=differ or UNSET,
        )
    )


async def models(state: AppState, body: None, receive: Receive) -> Response:
    """``GET /v1/models``: a ``ModelList`` of the one served model."""
    card = ModelCard(id=state.served_name, created=state.started, root=state.model_path)
    return json_response(ModelList(data=[card]))


async def server_info(state: AppState, body: None, receive: Receive) -> Response:
    """``GET /get_server_info``: ``ServerInfo``."""
    pongs = await state.client.ping_all(timeout=2.0)
    read = [None if p is None else read_pong(p) for p in pongs]
    live = [r for r in read if r is not None]
    model = live[0][1] if live else None
    device = (model or {}).get("device")
    return json_response(
        ServerInfo(
            version=VERSION,
            platform=state.platform,
            device=device if isinstance(device, str) else None,
            model=model,
            schedulers=[None if r is None else r[0] for r in read],
            server_args=_args_dict(state.server_args),
            healthy=state.client.healthy,
            workers=await worker_manifests(state, timeout=2.0) or UNSET,
        )
    )


async def worker_manifests(state: AppState, timeout: float) -> list[WorkerManifest] | None:
    """Every worker's manifest, from the supervisor's snapshot (None when it does not answer)."""
    try:
        reply = await state.client.query({"query": "snapshot"}, timeout=timeout)
        workers = reply["snapshot"]["workers"]
    except (LookupError, KeyError, TypeError):
        return None
    return [
        WorkerManifest(
            name=w.get("name", "?"),
            pid=w.get("pid"),
            manifest=w.get("manifest"),
            differs=list(w.get("manifest_differs") or ()),
        )
        for w in workers
    ]


def read_pong(pong: messages.Pong) -> tuple[SchedulerState, dict[str, object] | None]:
    """What the routes report of one replica's answer to a ping: its state, and its model as it
    describes it (None: it did not)."""
    info = pong.info
    state = SchedulerState(
        dp_rank=pong.dp_rank,
        pid=pong.pid,
        queue_depth=pong.queue_depth,
        batches=info.batches if info else None,
        aborted=info.aborted if info else None,
        generated_tokens=info.generated_tokens if info else None,
        memory=msgspec.to_builtins(info.memory) if info else None,
    )
    return state, msgspec.to_builtins(info.model) if info else None


def _args_dict(server_args: ServerArgs) -> dict[str, object]:
    """``server_args`` as JSON values (others as their ``str``), the API key masked."""
    data = dataclasses.asdict(server_args)
    if data.get("api_key"):
        data["api_key"] = "***"
    return {
        k: v if isinstance(v, (str, int, float, bool, type(None), list, dict)) else str(v)
        for k, v in data.items()
    }


async def prometheus(state: AppState, body: None, receive: Receive) -> Response:
    """``GET /metrics``: the Prometheus page."""
    page, media_type = state.metrics.render()
    return Response(page, media_type=media_type)


async def openapi(app: App, body: None, receive: Receive) -> Response:
    """``GET /openapi.json``: the document of ``app``'s routes."""
    return json_response(app.openapi())


async def docs(app: App, body: None, receive: Receive) -> Response:
    """``GET /docs``: Swagger UI on ``/openapi.json``."""
    return Response(DOCS_PAGE, media_type="text/html")


DOCS_PAGE = b"""<!doctype html>
<html><head><meta charset="utf-8"><title>sglang-launch API</title>
<link rel="stylesheet" href="https://cdn.jsdelivr.net/npm/swagger-ui-dist@5/swagger-ui.css"></head>
<body><div id="ui"></div>
<script src="https://cdn.jsdelivr.net/npm/swagger-ui-dist@5/swagger-ui-bundle.js"></script>
<script>SwaggerUIBundle({url: "openapi.json", dom_id: "#ui"});</script>
</body></html>
"""
