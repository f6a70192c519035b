"""The scheduler: one per data-parallel replica (every tensor-parallel rank of it runs this target).

``run_scheduler_process(server_args, ctx)``: join the replica's tensor-parallel group when
``ctx.tp_size > 1`` (the platform's distributed backend), load the model (``model_runner``), run one
warm-up batch, then report ready. Rank 0 binds a ROUTER socket at
``ctx.endpoint(scheduler_endpoint_name(dp_rank))`` (on several nodes, a replica whose rank 0 is not
on node 0 binds TCP and announces it in the launch's store; see ``distributed``) and serves the
HTTP child: requests are
validated on arrival (a bad one gets a 400 ``RequestFailed`` at once and never joins a batch), queued,
and run in batches of up to ``max_batch_size`` requests, collected for at most ``batch_wait_ms``
after the first one arrived, and no longer than until every request the HTTP child has
outstanding at this replica is queued (so a lone request never waits). Ranks > 0 follow rank 0's broadcasts in lockstep.

The loop runs until ``ctx.stopping`` is set (SIGTERM from the supervisor); it then tells its
followers to stop and returns.
"""

from __future__ import annotations

import logging
import os
import random
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import msgspec

from launcher.model_source import resolve_model
from serving import wire as messages
from serving.srt.model_runner import InputError, ModelRunner
from serving.srt.sampling import Sequence

if TYPE_CHECKING:
    from torch.distributed import TCPStore

    from bootstrap import WorkerContext
    from launcher.server_args import ServerArgs

log = logging.getLogger("sglang_launch.scheduler")

_TICK_SECONDS = 1.0
_REQUEST_KINDS = {
    messages.EmbedRequest: "embedding",
    messages.GenerateRequest: "generation",
    messages.ImageRequest: "image",
}
_KIND_ROUTES = {
    "embedding": "/v1/embeddings",
    "generation": "/v1/completions or /generate",
    "image": "/v1/images/generations",
}


def run_scheduler_process(server_args: ServerArgs, ctx: WorkerContext) -> None:
    """The bootstrap's scheduler target: load, warm up, report ready, serve until stopping."""
    from platforms import current_platform
    from serving.distributed import (
        close_tp_group,
        init_tp_group,
        launch_store,
        replica_node,
    )

    tp_size, dp_size = ctx.tp_size, ctx.dp_size
    nnodes = server_args.nnodes
    timeout_s = server_args.startup_timeout
    if current_platform.is_cpu():
        share_cpu_threads(ranks_on_node=tp_size * dp_size // nnodes)
    # Several nodes: global rank 0 serves the launch's rendezvous store at --dist-init-addr, the
    # other ranks connect to it (tp groups meet there, remote replicas announce their address).
    store = (
        launch_store(server_args, host=ctx.rank == 0, timeout_s=timeout_s) if nnodes > 1 else None
    )
    remote = nnodes > 1 and replica_node(ctx.dp_rank, tp_size, dp_size, nnodes) != 0
    if tp_size > 1:
        init_tp_group(
            current_platform.get_torch_distributed_backend_str(),
            ctx.runtime_dir,
            ctx.dp_rank,
            ctx.tp_rank,
            tp_size,
            timeout_s=timeout_s,
            store=store,
        )
        ctx.phase("tp_group_joined")
    try:
        runner = load_runner(
            server_args, current_platform, local_rank=ctx.local_rank, tp_size=tp_size
        )
        ctx.phase("model_loaded")
        runner.warm_up()
        ctx.phase("warmed_up")
        if ctx.tp_rank == 0:
            Scheduler(runner, server_args, ctx, store=store if remote else None).serve()
        else:
            ctx.ready(dp_rank=ctx.dp_rank, tp_rank=ctx.tp_rank, pid=os.getpid())
            follow(runner, ctx)
    finally:
        if tp_size > 1:
            close_tp_group()


def share_cpu_threads(ranks_on_node: int) -> None:
    """Size torch's intra-op thread pool for a scheduler rank computing on the CPU: the cores are
    shared among this node's ``ranks_on_node`` ranks. Without this every rank starts one thread
    per core, and the ranks slow each other down. No core is kept back for the HTTP child, whose
    work per request is small beside the model's: the launch starts scheduler children with
    ``OMP_WAIT_POLICY=PASSIVE`` (unless set), so a waiting pool thread sleeps instead of spinning
    and the HTTP child gets a core as soon as it needs one. An explicit ``OMP_NUM_THREADS`` wins
    (set it lower when other work shares the cores)."""
    if os.environ.get("OMP_NUM_THREADS"):
        return
    import torch

    cores = (
        len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    )
    torch.set_num_threads(max(1, cores // max(ranks_on_node, 1)))


def cpu_threads() -> dict[str, Any]:
    """This process's torch CPU thread settings, as ``/get_server_info`` reports them under
    ``model``: the intra-op thread count and the OpenMP wait policy its thread pool started with
    (``OMP_WAIT_POLICY``, which the launch sets to ``PASSIVE`` unless the environment sets it;
    None when unset)."""
    import torch

    return {
        "intra_op": torch.get_num_threads(),
        "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY"),
    }


def load_runner(
    server_args: ServerArgs, platform: Any, local_rank: int = 0, tp_size: int = 1
) -> ModelRunner:
    """A ``ModelRunner`` configured from ``server_args``."""
    source = resolve_model(server_args.model_path, server_args.served_model_name)
    return ModelRunner(
        source,
        platform=platform,
        local_rank=local_rank,
        tp_size=tp_size,
        device=server_args.device,
        dtype=server_args.dtype,
        attention_backend=server_args.attention_backend,
        seed=server_args.seed,
        max_input_tokens=server_args.max_input_tokens,
        max_total_tokens=server_args.max_total_tokens,
        max_batch_size=server_args.max_batch_size,
        trust_remote_code=server_args.trust_remote_code,
    )


@dataclass
class _Queued:
    identity: bytes
    request: messages.EmbedRequest | messages.GenerateRequest
    arrived: float
    prompt_tokens: int = 0
    prompt_ids: list[int] | None = None  # generation: the prompt
    input_ids: list[list[int]] | None = None  # embeddings: one token list per text
    seed: int = 0


class Scheduler:
    """Rank 0 of a replica: the request socket, the queue, and the batches."""

    def __init__(
        self,
        runner: ModelRunner,
        server_args: ServerArgs,
        ctx: WorkerContext,
        store: TCPStore | None = None,
    ) -> None:
        """``store`` (the launch's rendezvous store) is given to a replica whose rank 0 runs on a
        node other than 0: it binds on TCP and announces the address there."""
        import zmq

        self.runner = runner
        self.ctx = ctx
        self.dp_rank = ctx.dp_rank
        self.max_batch_size = server_args.max_batch_size
        self.batch_wait = server_args.batch_wait_ms / 1000.0
        self.queue: deque[_Queued] = deque()
        self.cancelled: set[str] = set()
        self.batches = 0
        self.aborted = 0
        self.generated_tokens = 0
        self.last_broadcast = time.monotonic()
        self._zmq = zmq
        self._zctx = zmq.Context()
        self.sock = self._zctx.socket(zmq.ROUTER)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.server_args = server_args
        self.store = store
        self.endpoint = (
            None
            if store is not None
            else ctx.endpoint(messages.scheduler_endpoint_name(self.dp_rank))
        )

    # ---- lifecycle -------------------------------------------------------------------------

    def serve(self) -> None:
        try:
            self.bind()
            self.ctx.ready(
                dp_rank=self.dp_rank,
                endpoint=self.endpoint,
                pid=os.getpid(),
                model=self.runner.describe(),
                memory=self.runner.memory_info(),
            )
            log.info(
                "scheduler dp=%d serving %s (%s) at %s",
                self.dp_rank,
                self.runner.source.served_name,
                self.runner.kind,
                self.endpoint,
            )
            while not self.ctx.stopping.is_set():
                self.step()
        finally:
            if self.runner.tp_size > 1:
                self._broadcast(messages.Stop())
            self.sock.close(0)
            self._zctx.term()

    def bind(self) -> None:
        """One node: the private ``ipc://`` path. A remote replica: TCP on this node's address on
        the route to node 0 (a free port), announced in the launch's store for the HTTP child."""
        if self.store is None:
            self.endpoint = self.ctx.endpoint(messages.scheduler_endpoint_name(self.dp_rank))
            self.sock.bind(self.endpoint)
            return
        from serving.distributed import advertised_host, rendezvous_address, scheduler_key

        host = advertised_host(*rendezvous_address(self.server_args))
        if ":" in host:
            self.sock.setsockopt(self._zmq.IPV6, 1)
            host = f"[{host}]"
        self.sock.bind(f"tcp://{host}:*")
        self.endpoint = self.sock.getsockopt_string(self._zmq.LAST_ENDPOINT)
        self.store.set(scheduler_key(self.dp_rank), self.endpoint)

    def step(self) -> None:
        """Receive what arrived (waiting at most until the oldest request's batch is due), then
        run one batch if it is full or due."""
        now = time.monotonic()
        if self.queue:
            due = self.queue[0].arrived + self.batch_wait
            timeout_ms = 0 if self.batch_due() else max(0, int((due - now) * 1000))
        else:
            timeout_ms = 100
        if self.sock.poll(timeout_ms):
            self.drain()
        if self.queue and self.batch_due():
            self.run_batch()
        elif self.runner.tp_size > 1 and time.monotonic() - self.last_broadcast > _TICK_SECONDS:
            self._broadcast(messages.Tick())

    def batch_due(self) -> bool:
        """Run now when the batch is full, when every request the HTTP child has outstanding
        here is already queued (nothing more is on the way), or when the oldest has waited
        ``batch_wait_ms``."""
        return (
            len(self.queue) >= self.max_batch_size
            or len(self.queue) >= self.queue[-1].request.inflight
            or time.monotonic() >= self.queue[0].arrived + self.batch_wait
        )

    # ---- receiving -------------------------------------------------------------------------

    def drain(self) -> None:
        """Handle every message waiting on the socket, without blocking."""
        zmq = self._zmq
        while True:
            try:
                frames = self.sock.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                return
            if len(frames) != 2:
                log.warning(
                    "dropped a message of %d frames (expected identity + body)", len(frames)
                )
                continue
            self.handle(frames[0], frames[1])

    def handle(self, identity: bytes, frame: bytes) -> None:
        try:
            msg = messages.decode_to_scheduler(frame)
        except msgspec.DecodeError as exc:
            log.warning("dropped an undecodable message: %s", exc)
            return
        if isinstance(msg, messages.Ping):
            self.send(identity, self.pong(msg.rid))
        elif isinstance(msg, messages.Cancel):
            before = len(self.queue)
            self.queue = deque(q for q in self.queue if q.request.rid != msg.rid)
            if len(self.queue) == before:
                self.cancelled.add(msg.rid)
        else:
            self.enqueue(identity, msg)

    def enqueue(
        self,
        identity: bytes,
        req: messages.EmbedRequest | messages.GenerateRequest | messages.ImageRequest,
    ) -> None:
        kind = _REQUEST_KINDS.get(type(req), "generation")
        runner = self.runner
        if kind != runner.kind:
            route = _KIND_ROUTES.get(runner.kind, "/v1/models to see what is served")
            self.send(
                identity,
                messages.RequestFailed(
                    req.rid,
                    400,
                    (
                        f"model {runner.source.served_name!r} serves {runner.kind}, not {kind}; use {route}"
                    ),
                    "model",
                ),
            )
            return
        assert not isinstance(req, messages.ImageRequest)  # no text runner serves images
        item = _Queued(identity, req, time.monotonic())
        try:
            if isinstance(req, messages.EmbedRequest):
                input_ids: list[list[int]] = []
                item.input_ids = input_ids
                for i, text in enumerate(req.texts):
                    try:
                        input_ids.append(runner.encode_embedding_input(text))
                    except InputError as exc:
                        where = f"input[{i}]: " if len(req.texts) > 1 else ""
                        raise InputError(
                            where + str(exc), f"input[{i}]" if where else "input"
                        ) from None
                item.prompt_tokens = sum(map(len, input_ids))
            else:
                item.prompt_ids = runner.encode_prompt(req.text, req.params.max_new_tokens)
                item.prompt_tokens = len(item.prompt_ids)
                item.seed = (
                    req.params.seed if req.params.seed is not None else random.getrandbits(31)
                )
        except InputError as exc:
            self.send(identity, messages.RequestFailed(req.rid, 400, str(exc), exc.field))
            return
        self.queue.append(item)

    # ---- running ---------------------------------------------------------------------------

    def take_batch(self) -> list[_Queued]:
        """Up to ``max_batch_size`` requests (for embeddings: texts), oldest first, at least one."""
        batch = [self.queue.popleft()]
        load = len(batch[0].input_ids or ()) or 1  # embeddings: one token list per text
        while self.queue:
            nxt = self.queue[0]
            size = len(nxt.input_ids or ()) or 1
            if len(batch) >= self.max_batch_size or load + size > self.max_batch_size:
                break
            batch.append(self.queue.popleft())
            load += size
        return batch

    def run_batch(self) -> None:
        batch = self.take_batch()
        self.batches += 1
        try:
            if self.runner.kind == "embedding":
                self._run_embeddings(batch)
            else:
                self._run_generation(batch)
        except Exception as exc:  # noqa: BLE001 - one failed batch must not end the scheduler
            if self.runner.tp_size > 1:
                # Unless the scheduler is one rank of a tp group: the failure (often a peer rank
                # gone, seen as a broken collective) leaves the ranks out of step, so the process
                # ends; the supervisor restarts the replica, and its in-flight requests that are
                # safe to repeat go to another one instead of failing with a 500 here.
                raise
            log.exception("batch of %d failed", len(batch))
            for item in batch:
                self.send(
                    item.identity,
                    messages.RequestFailed(
                        item.request.rid,
                        500,
                        f"the model failed on this batch: {type(exc).__name__}: {exc}",
                    ),
                )
            self.runner.platform.empty_cache()
        finally:
            self.cancelled.clear()

    def _run_embeddings(self, batch: list[_Queued]) -> None:
        inputs = [ids for item in batch for ids in item.input_ids or ()]
        matrix = self.runner.embed_matrix(inputs)
        dim = int(matrix.shape[1])
        packed, row = messages.pack_vectors(matrix), dim * 4
        at = 0
        for item in batch:
            n = len(item.input_ids or ())
            if item.request.rid not in self.cancelled:
                self.send(
                    item.identity,
                    messages.Embeddings(
                        item.request.rid,
                        packed[at * row : (at + n) * row],
                        dim,
                        item.prompt_tokens,
                        batch_size=len(inputs),
                    ),
                )
            at += n

    def _run_generation(self, batch: list[_Queued]) -> None:
        work = []
        for q in batch:
            req = q.request
            if not isinstance(req, messages.GenerateRequest) or q.prompt_ids is None:
                raise TypeError(
                    f"request {req.rid} in a generation batch is not a generation request"
                )
            work.append(messages.SeqWork(req.rid, q.prompt_ids, req.params, q.seed, req.stream))
        if self.runner.tp_size > 1:
            self._broadcast(messages.Batch(work))
        owners = {q.request.rid: q for q in batch}
        seqs = [Sequence(w.rid, w.prompt_ids, w.params, w.seed, w.stream) for w in work]

        def emit(seq: Sequence) -> None:
            owner = owners[seq.rid]
            text = seq.take_increment() if seq.stream else seq.text
            if seq.stream and not text and not seq.finished:
                return
            self.send(
                owner.identity,
                messages.Generated(
                    seq.rid,
                    text,
                    owner.prompt_tokens,
                    len(seq.output_ids),
                    finished=seq.finished,
                    finish_reason=seq.finish_reason,
                    seed=seq.seed,
                    batch_size=len(seqs),
                ),
            )

        def cancelled() -> set[str]:
            self.drain()
            return self.cancelled

        self.runner.generate(seqs, emit=emit, cancelled=cancelled)
        self.aborted += sum(1 for s in seqs if s.finish_reason == "abort")
        self.generated_tokens += sum(len(s.output_ids) for s in seqs)

    # ---- sending ---------------------------------------------------------------------------

    def send(self, identity: bytes, msg: msgspec.Struct) -> None:
        try:
            self.sock.send_multipart([identity, messages.encode(msg)], self._zmq.NOBLOCK)
        except self._zmq.ZMQError as exc:  # the client is gone or its queue is full
            log.debug("could not send %s: %s", type(msg).__name__, exc)

    def pong(self, rid: str) -> messages.Pong:
        info = {
            "model": self.runner.describe(),
            "memory": self.runner.memory_info(),
            "batches": self.batches,
            "aborted": self.aborted,
            "generated_tokens": self.generated_tokens,
        }
        return messages.Pong(
            rid,
            self.dp_rank,
            os.getpid(),
            self.runner.source.served_name,
            self.runner.kind,
            len(self.queue),
            info,
        )

    def _broadcast(self, msg: msgspec.Struct) -> None:
        from serving.distributed import broadcast_bytes

        broadcast_bytes(messages.encode(msg))
        self.last_broadcast = time.monotonic()


def follow(
    runner: Any, ctx: WorkerContext, run: Callable[[messages.ToFollower], None] | None = None
) -> None:
    """A rank > 0 of a replica: run what rank 0 broadcasts until it says stop. ``run(work)``
    runs each work message (default: a text ``Batch`` on ``runner``, a ``ModelRunner``)."""
    from serving.distributed import broadcast_bytes

    while True:
        work = messages.decode_to_follower(broadcast_bytes(None))
        if isinstance(work, messages.Stop):
            # Rank 0 stops because the supervisor is stopping the group: wait for our own SIGTERM,
            # so that returning is not mistaken for a crash.
            ctx.stopping.wait(timeout=30)
            return
        if isinstance(work, messages.Tick):
            continue
        if run is not None:
            run(work)
        elif isinstance(work, messages.Batch):
            seqs = [Sequence(w.rid, w.prompt_ids, w.params, w.seed, w.stream) for w in work.seqs]
            runner.generate(seqs)
