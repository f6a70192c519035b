"""The routes about the server: ``/health`` (and ``/ping``), ``/health_generate``, ``/ready``,
``/v1/models``, ``/get_model_info``, ``/get_server_info``, ``/metrics``, ``/flush_cache``,
``/openapi.json`` and ``/docs``, each ``handler(state, body, receive)`` (the document's routes take the ``App``
instead).

``/health`` answers from what the replica pool knows (a dead replica, the supervisor's
failure); ``/health_generate`` also runs the model (``health_generate``); ``/ready``,
``/get_server_info`` and ``/metrics`` ping every scheduler replica that serves (``read_pong`` is
the one reader of what a replica reports; replicas a reload or a scale is starting or retiring
are left out). The served model (``/v1/models``, ``/get_model_info``, the model fields of
``/get_server_info``'s arguments) is ``AppState``'s, which a finished reload updates.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import time
from pathlib import Path
from typing import Any

import msgspec
from msgspec import UNSET
from starlette.responses import Response

from launchspec.gguf_cache import read_origin
from launchspec.server_args import ServerArgs
from serving import wire
from serving.http.app import VERSION, App, AppState, json_response
from serving.http.asgi import Receive
from serving.http.probes import probe_request
from serving.http.replica import Replica, SchedulerError
from serving.http.responses import (
    Health,
    ModelCard,
    ModelInfo,
    ModelList,
    Ready,
    SchedulerLoad,
    SchedulerState,
    ServerInfo,
    WeightsSource,
    WorkerManifest,
)


async def health(state: AppState, body: None, receive: Receive) -> Response:
    """``GET /health``: ``Health``, a 503 with the reason once a scheduler is gone."""
    reason = state.pool.unhealthy_reason
    if reason:
        return json_response(Health(healthy=False, reason=reason), 503)
    return json_response(Health(healthy=True))


async def health_generate(state: AppState, body: None, receive: Receive) -> Response:
    """``GET /health_generate``: ``Health`` once the model produced something on every live
    replica since the check began; a 503 naming the replica that failed or produced nothing
    within ``state.health_timeout``.

    Only the model's work counts (``pool.is_progress``: generated tokens, an embedding, an image
    or a denoising step), as SGLang counts only generation outputs: a replica answers pings
    (``/ready``, ``/metrics``) between steps even while its steps fail or hang, so those answers
    prove nothing. A replica that is busy (requests in flight, and progress within the timeout)
    is not probed: it passes at its next progress. Any other replica gets the smallest request
    of the kind it says it serves (one greedy token, one embedded text, one denoising step; a
    ping when the kind is unknown) and passes when that, or any other request, progresses."""
    pool = state.pool
    reason = pool.unhealthy_reason
    if reason:
        return json_response(Health(healthy=False, reason=reason), 503)
    live = [r for r in pool.replicas if r.live]
    if not live:
        why = "no scheduler is reachable yet: " + pool.unanswered_reason(
            [r.dp_rank for r in pool.replicas]
        )
        return json_response(Health(healthy=False, reason=why), 503)
    failures = [f for f in await asyncio.gather(*(_probe(state, r) for r in live)) if f]
    if failures:
        return json_response(Health(healthy=False, reason="; ".join(failures)), 503)
    return json_response(Health(healthy=True))


async def _probe(state: AppState, rep: Replica) -> str | None:
    """Why replica ``rep`` is not healthy, or None: it made progress (its probe's answer, or
    another request's) within the timeout."""
    timeout = state.health_timeout
    busy = bool(rep.inflight) and time.monotonic() - rep.last_progress < timeout
    progressed: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    rep.progress_waiters.append(progressed)
    probe: asyncio.Future[Any] | None = None
    if not busy:
        request = probe_request(rep.kind or state.kind, "health")
        probe = asyncio.ensure_future(state.dispatcher.one(request, rep))
    try:
        waiting: list[asyncio.Future[Any]] = [progressed] if probe is None else [progressed, probe]
        await asyncio.wait(waiting, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
    finally:
        if progressed in rep.progress_waiters:
            rep.progress_waiters.remove(progressed)
        progressed.cancel()
        if probe is not None and not probe.done():
            probe.cancel()  # sends Cancel to the scheduler
            await asyncio.gather(probe, return_exceptions=True)
    if probe is not None and probe.done() and not probe.cancelled():
        exc = probe.exception()
        if isinstance(exc, SchedulerError):
            return f"scheduler dp={rep.dp_rank} failed a probe: {exc.message}"
        if exc is not None:
            raise exc
        return None  # it answered the probe
    if progressed.done() and not progressed.cancelled():
        return None
    if probe is None:
        return (
            f"scheduler dp={rep.dp_rank} produced nothing within {timeout:g} s while it held "
            f"{len(rep.inflight)} request(s)"
        )
    return f"scheduler dp={rep.dp_rank} did not answer a probe within {timeout:g} s"


async def model_info(state: AppState, body: None, receive: Receive) -> Response:
    """``GET /get_model_info``: ``ModelInfo``, from the model directory's files."""
    config = await asyncio.to_thread(_read_config, Path(state.model_path))
    architectures = config.get("architectures")
    model_type = config.get("model_type")
    chat = state.chat
    weights = weights_source(Path(state.model_path), state.gguf_file)
    answers = await state.dispatcher.ping_serving(timeout=2.0)
    loaded = next((m for _, p in answers if p and (m := read_pong(p)[1])), None)
    if loaded and loaded.get("weights"):
        quantization = loaded.get("quantization")
        weights.dtype, weights.dtype_reason = str(loaded["dtype"]), str(loaded["dtype_reason"])
        weights.quantization = None if quantization is None else str(quantization)
        weights.precision = str(loaded["weights"])
    return json_response(
        ModelInfo(
            model_path=state.model_path,
            tokenizer_path=state.server_args.tokenizer_path or state.model_path,
            is_generation=state.kind == "generation",
            model_type=model_type if isinstance(model_type, str) else None,
            architectures=[a for a in architectures if isinstance(a, str)]
            if isinstance(architectures, list)
            else None,
            served_model_name=state.served_name,
            kind=state.kind,
            chat_template=chat.source if chat is not None else None,
            weights=weights,
        )
    )


def weights_source(directory: Path, gguf_file: str | None = None) -> WeightsSource:
    """Where the weights in ``directory`` came from: a GGUF file it is the converted copy of, or
    the directory itself. The file is ``gguf_file``, the one this launch was given: the cache is
    keyed by the file's content and shared, so the conversion's record names whichever file (of
    whichever checkout) was converted first, which only a launch given the cache directory itself
    reports."""
    origin = read_origin(directory)
    if origin is None:
        return WeightsSource(format="directory")
    return WeightsSource(
        format="gguf",
        gguf_file=gguf_file or str(origin.get("gguf_file", "")),
        sha256=str(origin.get("sha256", "")),
        cache_dir=str(directory),
        converted_at=str(origin.get("converted_at", "")),
    )


def _read_config(folder: Path) -> dict[str, object]:
    """``folder``/config.json as a JSON object (empty when there is none)."""
    try:
        config = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return config if isinstance(config, dict) else {}


async def ready(state: AppState, body: None, receive: Receive) -> Response:
    """``GET /ready``: ``Ready``, a 503 naming the replicas that are gone or not answering."""
    pool = state.pool
    reason = pool.unhealthy_reason
    if reason:
        return json_response(Ready(ready=False, reason=reason), 503)
    restarting = pool.restarting
    answers = await state.dispatcher.ping_serving(timeout=1.0)
    if not answers and pool.changing:
        why = "no scheduler replica serves: a reload is replacing it"
        return json_response(Ready(ready=False, reason=why), 503)
    missing = [rep.dp_rank for rep, p in answers if p is None and rep.dp_rank not in restarting]
    if missing:
        why = f"scheduler(s) dp={missing} not answering yet: {pool.unanswered_reason(missing)}"
        return json_response(Ready(ready=False, reason=why), 503)
    loads = [read_pong(p)[0] for _, p in answers if p]
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
    answers = await state.dispatcher.ping_serving(timeout=2.0)
    read = [None if p is None else read_pong(p) for _, p in answers]
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
            healthy=state.pool.healthy,
            workers=await worker_manifests(state, timeout=2.0) or UNSET,
        )
    )


async def worker_manifests(state: AppState, timeout: float) -> list[WorkerManifest] | None:
    """Every worker's manifest, from the supervisor's snapshot (None when it does not answer)."""
    try:
        reply = await state.queries.query({"query": "snapshot"}, timeout=timeout)
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


def read_pong(pong: wire.Pong) -> tuple[SchedulerState, dict[str, object] | None]:
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
    """``GET /metrics``: the Prometheus page, its scheduler gauges from the replicas' answers
    to a ping now (a replica that does not answer within a second is left out)."""
    pongs = await state.dispatcher.ping_all(timeout=1.0)
    state.metrics.observe_schedulers(p for p in pongs if p is not None)
    page, media_type = state.metrics.render()
    return Response(page, media_type=media_type)


FLUSH_TIMEOUT_S = 30.0  # a replica answers between two steps; a long prefill step may delay it
FLUSH_WAIT_S = 10.0  # a busy replica is asked again until its requests are done, this long
FLUSH_RETRY_S = 0.1
FLUSHED = b"Cache flushed.\n"


async def flush_cache(state: AppState, body: None, receive: Receive) -> Response:
    """``POST /flush_cache`` (SGLang's route): empty the prefix cache of every live replica.

    200 with a short text when every one flushed; 400 naming each replica that did not and why
    (a replica refuses while requests run or wait there, and is asked again until they are done,
    up to ``FLUSH_WAIT_S``; a runtime without a prefix cache refuses always); 503 when no replica is reachable. A replica that is
    dead, or that a reload or a scale is starting or retiring, is not asked: none has a cache
    that serves requests."""
    pool = state.pool
    live = [r for r in pool.replicas if r.live]
    if not live:
        raise SchedulerError(
            503,
            "no scheduler is reachable to flush its cache: "
            + pool.unanswered_reason([r.dp_rank for r in pool.replicas]),
        )
    reasons = await asyncio.gather(*(_flush(state, r) for r in live))
    refused = [f"dp={r.dp_rank}: {why}" for r, why in zip(live, reasons, strict=True) if why]
    if refused:
        flushed = [f"dp={r.dp_rank}" for r, why in zip(live, reasons, strict=True) if not why]
        also = f" (flushed on {', '.join(flushed)})" if flushed else ""
        raise SchedulerError(400, f"the cache was not flushed on {'; '.join(refused)}{also}")
    return Response(FLUSHED, media_type="text/plain")


async def _flush(state: AppState, rep: Replica) -> str | None:
    """Why replica ``rep`` did not flush its prefix cache, or None when it did. A replica that
    refuses because requests run there (``busy``) is asked again until they are done, for at
    most ``FLUSH_WAIT_S`` (SGLang's route waits the same way when given a timeout)."""
    deadline = time.monotonic() + FLUSH_WAIT_S
    while True:
        try:
            result = await asyncio.wait_for(
                state.dispatcher.one(wire.FlushCache, rep), FLUSH_TIMEOUT_S
            )
        except TimeoutError:
            return f"no answer within {FLUSH_TIMEOUT_S:g}s"
        except SchedulerError as exc:
            return exc.message
        if not isinstance(result, wire.FlushCacheResult):
            return f"answered {type(result).__name__}, not a flush result"
        if result.ok:
            return None
        if not result.busy or time.monotonic() >= deadline:
            return result.message or "refused"
        await asyncio.sleep(FLUSH_RETRY_S)


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
