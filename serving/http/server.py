"""The HTTP child: ``run_http_server(server_args, ctx)``, the app of ``serving.http.app`` on uvicorn with uvloop.

The listening socket is bound here first (``ServerArgs.host``, loopback by default, and
``ServerArgs.port``), so a taken port is a clear start-up error rather than a log line from a
thread. uvicorn runs in a thread of its own and leaves signal handling to the bootstrap. Once uvicorn has
started, the main thread waits (at most ``startup_timeout``) until every scheduler replica answers
a ping through its socket and only then reports ready, so the launch never claims ready with a
replica the HTTP child cannot reach; it then waits for ``ctx.stopping`` (SIGTERM) and drains.
On several nodes a replica whose rank 0 runs on another node is found through the launch's
rendezvous store (``distributed.EndpointDirectory``).

``build_app`` makes the child's parts and joins them, each owned once: the ``pool.ReplicaPool`` of
scheduler replicas, the ``dispatcher.Dispatcher`` that sends requests over it, the supervisor's
``supervisor_link.QuerySocket``, and the ``supervisor_link.SupervisorLink`` that applies the
supervisor's events to the pool; ``connected`` opens their sockets for the app's lifespan.

For a generation model (``model_kind``) the app gets the model's chat template, loaded once here
(``chat_template.ChatTemplate``; ``--chat-template FILE`` replaces it, and a file that is not a
usable Jinja template fails the start naming it).

The drain: on SIGTERM uvicorn stops accepting connections and the requests in flight have the
whole ``--stop-grace-period`` but the last ``drain_margin`` of it (the supervisor kills the
process at its end) to finish. Those still running then are ended (``Dispatcher.end_all``):
each gets a 503, a stream its error event and ``[DONE]``, and each is cancelled at its scheduler;
how many is the ``requests_cut`` of this worker's ``stopped`` report, which the launcher's last
line and its ``server.stopped`` event repeat.

The child takes part in reloads and scales (its ready report says ``probes_replicas``): it
probes each replica they start before routing to it, drains each they retire, and the app's
model (``AppState.serve_model``: name, path, kind, chat template) changes once a reload
finished: ``ModelReads`` reads the new model's files and loads its tokenizer in a thread from the
reload's start, and swaps it in at its end, so nothing that loads or imports runs on the event
loop and the swap waits for little.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import importlib
import logging
import resource
import socket
import threading
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import TYPE_CHECKING

from bootstrap import resolve
from launchspec.model_config import model_kind
from launchspec.runtimes import serving_spec
from serving.distributed import EndpointDirectory, replica_node
from serving.wire import scheduler_endpoint_name

if TYPE_CHECKING:
    import uvicorn

    from bootstrap import WorkerContext
    from launchspec.server_args import ServerArgs
    from serving.http.app import App, AppState
    from serving.http.chat_template import ChatTemplate
    from serving.http.dispatcher import Dispatcher
    from serving.http.metrics import Metrics
    from serving.http.pool import ReplicaPool
    from serving.http.responses import PlatformSummary
    from serving.http.supervisor_link import QuerySocket, SupervisorLink

log = logging.getLogger("sglang_launch.http")

# The files the HTTP child keeps open besides its connections (sockets to the schedulers and the
# supervisor, the model's files, libraries), when it raises its file limit for --max-connections.
_OTHER_FILES = 256


def drain_margin(grace: float) -> float:
    """The end of the grace period kept for ending the requests still running and exiting: a
    second, or a quarter of a shorter grace period."""
    return min(1.0, grace / 4)


def make_room_for_connections(max_connections: int) -> None:
    """Raise this process's soft limit of open files (up to its hard limit) so that
    ``max_connections`` connections and the probes above them can all be accepted."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    need = max_connections + _OTHER_FILES
    if soft == resource.RLIM_INFINITY or soft >= need:
        return
    room = need if hard == resource.RLIM_INFINITY else min(need, hard)
    if room > soft:
        resource.setrlimit(resource.RLIMIT_NOFILE, (room, hard))
    if room < need:
        log.warning(
            "this process may open %d files, fewer than --max-connections %d needs (%d); "
            "raise the hard limit (ulimit -Hn, LimitNOFILE=) or lower --max-connections",
            room,
            max_connections,
            need,
        )


def bind_socket(host: str, port: int) -> socket.socket:
    """A listening TCP socket on ``host:port``; ``OSError`` names the fix."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise OSError(
            exc.errno,
            f"cannot listen on {host}:{port} ({exc.strerror}); pick a free "
            f"port with --port or another address with --host",
        ) from None
    sock.listen(2048)
    sock.set_inheritable(True)
    return sock


def platform_summary(ctx: WorkerContext, platform_module: str = "platforms") -> PlatformSummary:
    """The platform as the HTTP child sees it (the one ``platform_module``, the launch's runtime's,
    selected): what was selected, why, and its device."""
    from serving.http.responses import PlatformSummary

    summary = PlatformSummary(key=ctx.platform)
    try:
        module = importlib.import_module(platform_module)
        current_platform, selection = module.current_platform, module.current_selection()
        summary = PlatformSummary(
            key=selection.key,
            platform_class=selection.qualname,
            distribution=selection.distribution,
            reason=selection.reason,
            device_type=current_platform.device_type,
        )
        summary.device_name = current_platform.get_device_name(0)
    except Exception as exc:  # noqa: BLE001 - the summary is informative only
        summary.error = f"{type(exc).__name__}: {exc}"
    return summary


def build_app(server_args: ServerArgs, ctx: WorkerContext, metrics: Metrics | None = None) -> App:
    """The ASGI app for ``server_args`` talking to the schedulers of ``ctx``'s launch: the one
    place the HTTP child's parts are made and joined (the pool of replicas, the dispatcher
    over it, the supervisor's query socket, the link that applies the supervisor's events)."""
    from serving.http.app import AppState
    from serving.http.dispatcher import Dispatcher
    from serving.http.metrics import Metrics
    from serving.http.pool import ReplicaPool
    from serving.http.routes import create_app
    from serving.http.supervisor_link import QuerySocket, SupervisorLink

    spec = serving_spec(server_args.runtime)
    model = served_model(server_args, server_args.model_path, server_args.served_model_name)
    dp_size, tp_size = ctx.dp_size, ctx.tp_size
    metrics = metrics or Metrics(model.served_name)
    nnodes = server_args.nnodes
    # A replica whose rank 0 runs on node 0 (this node) has its private ipc:// socket; one on
    # another node announces a TCP address in the launch's store.
    endpoints = [
        ctx.endpoint(scheduler_endpoint_name(i))
        if nnodes == 1 or replica_node(i, tp_size, dp_size, nnodes) == 0
        else None
        for i in range(dp_size)
    ]
    directory = None
    if None in endpoints:
        directory = EndpointDirectory(server_args, timeout_s=server_args.startup_timeout)
    pool = ReplicaPool(
        endpoints,
        metrics=metrics,
        resolve=directory.lookup if directory else None,
        heals=_heals(server_args),
        endpoint_of=(lambda dp: ctx.endpoint(scheduler_endpoint_name(dp))) if nnodes == 1 else None,
    )
    dispatcher = Dispatcher(pool, wait_s=_wait_for_replica_s(server_args))
    queries = QuerySocket(ctx.query_endpoint)
    state = AppState(
        pool=pool,
        dispatcher=dispatcher,
        queries=queries,
        metrics=metrics,
        served_name=model.served_name,
        model_path=str(model.path),
        server_args=server_args,
        platform=platform_summary(ctx, spec.platform.platform_module),
        api_key=server_args.api_key or None,
        max_request_bytes=server_args.max_request_bytes,
        api_routes=resolve(spec.api_routes) if spec.api_routes else None,
        kind=model.kind,
        chat=model.chat,
        gguf_file=None if model.gguf_file is None else str(model.gguf_file),
    )
    reads = ModelReads(state)
    link = SupervisorLink(
        pool,
        dispatcher,
        queries,
        ctx.ops_endpoint,
        tp_size=tp_size,
        metrics=metrics,
        probe_timeout_s=server_args.startup_timeout,
        on_model_coming=reads.begin,
        on_model_change=reads.finish,
    )
    return create_app(state, functools.partial(connected, pool, queries, link))


@contextlib.asynccontextmanager
async def connected(
    pool: ReplicaPool, queries: QuerySocket, link: SupervisorLink
) -> AsyncIterator[None]:
    """The schedulers' sockets and the supervisor's, on one ZeroMQ context, for as long as the
    app runs (its ASGI lifespan)."""
    import zmq.asyncio  # loaded with the pool's module already: nothing to import on the loop

    zctx = zmq.asyncio.Context()
    try:
        pool.start(zctx)
        queries.start(zctx)
        link.start(zctx)
        yield
    finally:
        await link.close()
        await pool.close()
        zctx.destroy(0)


@dataclasses.dataclass(frozen=True)
class ServedModel:
    """What the HTTP child knows of the model it serves: its directory, its name, its kind
    (``model_kind``), for a generation model its chat template, and the GGUF file this launch
    was given when the directory is its converted copy (None otherwise)."""

    path: Path
    served_name: str
    kind: str | None
    chat: ChatTemplate | None
    gguf_file: Path | None = None


def served_model(
    server_args: ServerArgs,
    model_path: str | None,
    served_name: str | None,
    *,
    reloaded: bool = False,
) -> ServedModel:
    """The model at ``model_path`` served as ``served_name``: the runtime's check of it, its kind
    and its chat template (one that cannot be used fails the start, and leaves a ``reloaded``
    model without chat). It reads files and may import transformers: never on the event loop
    once the server runs (``change_model``)."""
    from serving.http.chat_template import ChatTemplateError

    spec = serving_spec(server_args.runtime)
    source = spec.model_check(model_path, served_name)
    kind = model_kind(source.path)
    try:
        chat = chat_template(source.path, kind, server_args)
    except ChatTemplateError as exc:
        if not reloaded:
            raise
        log.error("the reloaded model's chat template cannot be used: %s", exc)
        chat = None
    gguf = getattr(source, "gguf", None)
    gguf_file = gguf.file if gguf is not None else None
    return ServedModel(source.path, source.served_name, kind, chat, gguf_file)


class ModelReads:
    """The routes' side of a reload: the new model's files are read (its kind, tokenizer and chat
    template) in a thread from the moment the reload starts (``begin``), so that when it finishes
    (``finish``) the swap waits for nothing already done; the event loop goes on serving
    meanwhile. When reading fails the routes go on with the model they had (logged)."""

    def __init__(self, state: AppState) -> None:
        self.state = state
        self._reads: dict[tuple[str | None, str | None], asyncio.Future[ServedModel]] = {}

    def _read(self, model_path: str | None, served_name: str | None) -> asyncio.Future[ServedModel]:
        key = (model_path, served_name)
        read = self._reads.get(key)
        if read is None:
            read = asyncio.ensure_future(
                asyncio.to_thread(
                    served_model, self.state.server_args, model_path, served_name, reloaded=True
                )
            )
            read.add_done_callback(lambda f: f.cancelled() or f.exception())  # no "never retrieved"
            self._reads = {key: read}  # only the newest reload's read is kept
        return read

    def begin(self, model_path: str | None, served_name: str | None) -> None:
        """A reload to ``model_path`` served as ``served_name`` started: read it ahead."""
        self._read(model_path, served_name)

    async def finish(self, model_path: str | None, served_name: str | None) -> None:
        """The reload finished: swap the model in once read."""
        try:
            new = await asyncio.shield(self._read(model_path, served_name))
        except asyncio.CancelledError:
            raise
        except Exception:  # noqa: BLE001 - the schedulers serve it; the routes keep what they know
            log.exception("cannot read the reloaded model %s (%s)", served_name, model_path)
            return
        finally:
            self._reads.pop((model_path, served_name), None)
        self.state.serve_model(
            str(new.path),
            new.served_name,
            kind=new.kind,
            chat=new.chat,
            gguf_file=None if new.gguf_file is None else str(new.gguf_file),
        )
        log.info("the routes serve %s (%s, %s) from now on", new.served_name, new.path, new.kind)


async def change_model(state: AppState, model_path: str | None, served_name: str | None) -> None:
    """A reload finished with no read begun ahead: read the new model, then swap it in."""
    await ModelReads(state).finish(model_path, served_name)


def chat_template(path: Path, kind: str | None, server_args: ServerArgs) -> ChatTemplate | None:
    """The chat template of a generation model at ``path`` (``--chat-template`` replaces the
    model's own); None for another kind."""
    if kind != "generation":
        return None
    from serving.http.chat_template import ChatTemplate

    tokenizer = server_args.tokenizer_path or str(path)  # the template is the tokenizer's
    return ChatTemplate.load(tokenizer, server_args.chat_template, server_args.trust_remote_code)


def _wait_for_replica_s(server_args: ServerArgs) -> float:
    """How long a request waits for a replica while none serves during a reload: until just
    before ``--request-timeout`` would answer 504, so that it gets the 503 with ``Retry-After``
    (no limit: as long as a replica may take to start)."""
    timeout = server_args.request_timeout
    if timeout <= 0:
        return server_args.startup_timeout
    return max(timeout - min(0.5, timeout / 10), 0.0)


def _heals(server_args: ServerArgs) -> bool:
    """The supervisor restarts a replica that dies (``--restart-policy`` in effect)."""
    return server_args.restart_policy_in_effect() == "on-failure"


def run_http_server(server_args: ServerArgs, ctx: WorkerContext) -> None:
    """The bootstrap's HTTP target: serve until ``ctx.stopping`` is set."""
    import uvicorn

    host, port = server_args.host, server_args.port
    started = time.monotonic()
    make_room_for_connections(server_args.max_connections)
    sock = bind_socket(host, port)
    app = build_app(server_args, ctx)
    from serving.http.limits import RequestTimeout, guarded_protocol

    grace = server_args.stop_grace_period
    config = uvicorn.Config(
        RequestTimeout(app, server_args.request_timeout),
        http=guarded_protocol(
            server_args.http_header_timeout,
            server_args.http_body_timeout,
            server_args.max_connections,
        ),
        loop="uvloop",
        lifespan="on",
        log_level=server_args.log_level.lower(),
        # No logging configuration of uvicorn's own: its records reach the root logger and are
        # written in the launch's one format (bootstrap.logformat), like every other line.
        log_config=None,
        access_log=False,
        # uvicorn cancels what still runs then; the drain has ended it before (see drain()).
        timeout_graceful_shutdown=grace - drain_margin(grace) / 2,  # type: ignore[arg-type]
    )
    server = uvicorn.Server(config)
    failure: list[BaseException] = []

    def serve() -> None:
        try:
            server.run(sockets=[sock])
        except BaseException as exc:  # noqa: BLE001 - reported by the main thread
            failure.append(exc)

    thread = threading.Thread(target=serve, name="uvicorn", daemon=True)
    thread.start()
    while not server.started and thread.is_alive() and not ctx.stopping.is_set():
        thread.join(timeout=0.05)
    if not server.started:
        if ctx.stopping.is_set():
            server.should_exit = True
            thread.join(timeout=10)
            return
        raise RuntimeError(
            f"the HTTP server did not start on {host}:{port}: "
            f"{failure[0] if failure else 'uvicorn exited during start-up'}"
        )
    url_host = f"[{host}]" if ":" in host else host
    url = f"http://{url_host}:{port}"
    log.info("HTTP server listening on %s", url)
    deadline = started + server_args.startup_timeout
    if not wait_for_schedulers(app.state, ctx, thread, deadline):
        server.should_exit = True
        thread.join(timeout=10)
        sock.close()
        return
    ctx.ready(url=url, host=host, port=port, probes_replicas=True)
    while not ctx.stopping.is_set() and thread.is_alive():
        ctx.stopping.wait(timeout=0.2)
    if ctx.stopping.is_set():
        ctx.stopped(requests_cut=drain(server, thread, app.state, grace))
    else:
        server.should_exit = True
        thread.join(timeout=grace)
    sock.close()
    if not ctx.stopping.is_set():
        raise RuntimeError(
            f"the HTTP server on {url} stopped unexpectedly: "
            f"{failure[0] if failure else 'uvicorn exited'}"
        )


def drain(server: uvicorn.Server, thread: threading.Thread, state: AppState, grace: float) -> int:
    """Stop uvicorn and give the requests in flight the grace period but its ``drain_margin``;
    end the ones still running then (a 503, a stream's error event), and return how many."""
    began = time.monotonic()
    margin = drain_margin(grace)
    server.should_exit = True  # no new connections; idle ones close
    thread.join(timeout=max(0.0, grace - margin))
    loop = state.pool.loop
    if not thread.is_alive() or loop is None:
        return 0
    message = (
        f"the server stopped before this request was answered: the --stop-grace-period of "
        f"{grace:g}s ran out; send it again"
    )
    try:
        cut = asyncio.run_coroutine_threadsafe(_end_all(state.dispatcher, message), loop).result(
            timeout=margin / 2
        )
    except Exception as exc:  # noqa: BLE001 - the loop is gone or stuck: uvicorn cancels the rest
        log.warning("could not end the requests still running: %s", exc)
        cut = 0
    if cut:
        log.warning("%d request(s) were still running when the grace period ran out: ended", cut)
    thread.join(timeout=max(0.0, began + grace - time.monotonic()))
    return cut


async def _end_all(dispatcher: Dispatcher, message: str) -> int:
    return dispatcher.end_all(message)


def wait_for_schedulers(
    state: AppState, ctx: WorkerContext, thread: threading.Thread, deadline: float
) -> bool:
    """Wait until every replica answers a ping (True), or the stop request (False); raise when
    ``deadline`` passes or uvicorn stops first, naming the replicas that never answered."""
    last_log = time.monotonic()
    while not ctx.stopping.is_set():
        if not thread.is_alive():
            raise RuntimeError("the HTTP server stopped while waiting for the schedulers")
        pool = state.pool
        missing = [r.dp_rank for r in pool.replicas]
        if pool.loop is not None:
            try:
                pongs = asyncio.run_coroutine_threadsafe(
                    state.dispatcher.ping_serving(timeout=1.0), pool.loop
                ).result(timeout=10)
                missing = [rep.dp_rank for rep, pong in pongs if pong is None]
            except Exception as exc:  # noqa: BLE001 - the loop is stopping; seen above next time
                log.debug("ping of the schedulers failed: %s", exc)
        if not missing:
            return True
        now = time.monotonic()
        if now >= deadline:
            raise RuntimeError(
                f"scheduler replica(s) did not answer the HTTP child before the start-up "
                f"timeout: {pool.unanswered_reason(missing)}; check that node 0 can "
                f"reach every node (--dist-init-addr, firewalls) and the nodes' logs"
            )
        if now - last_log > 15:
            last_log = now
            log.info("waiting for scheduler(s) to answer: %s", pool.unanswered_reason(missing))
        ctx.stopping.wait(timeout=0.2)
    return False
