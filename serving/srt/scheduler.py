"""The text runtime's scheduler: one per data-parallel replica (every tensor-parallel rank of it
runs this target).

``run_scheduler_process(server_args, ctx)``: join the replica's tensor-parallel group when
``ctx.tp_size > 1`` (the platform's distributed backend), load the model (``model_runner``), run
one warm-up batch, then serve: rank 0 runs ``Scheduler`` (the shared ``BatchingScheduler`` of
``serving.scheduler``: socket, queue, batch timing, failure policy), ranks > 0 ``follow`` rank
0's broadcasts in lockstep.

What is the text runtime's own: a request is tokenised on arrival (an embedding request counts
its texts, a generation request draws its seed unless it gave one; input over the limits is a
400 at once), a batch holds up to ``--max-batch-size`` requests and, for embeddings, that many
texts, shared between the queued requests (``serving.srt.embedding``: a request of many texts
runs over several batches, interleaved with the others); a generation batch is broadcast to the
tensor-parallel ranks and decoded together, streaming increments, and a cancelled sequence stops
at the next decode step.
"""

from __future__ import annotations

import logging
import random
from collections import deque
from dataclasses import dataclass
from typing import TYPE_CHECKING, cast

from launcher.model_source import resolve_model
from serving import wire
from serving.errors import InputError
from serving.scheduler import BatchingScheduler, Queued, follow
from serving.srt.embedding import EmbedItem, take_texts
from serving.srt.model_runner import ModelRunner
from serving.srt.sampling import Sequence
from serving.threads import share_cpu_threads

if TYPE_CHECKING:
    from torch.distributed import TCPStore

    from bootstrap import WorkerContext
    from launcher.server_args import ServerArgs
    from platforms import SRTPlatform

log = logging.getLogger("sglang_launch.scheduler")


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
            follow(ctx, lambda work: follow_text_batch(runner, work))
    finally:
        if tp_size > 1:
            close_tp_group()


def load_runner(
    server_args: ServerArgs, platform: SRTPlatform, local_rank: int = 0, tp_size: int = 1
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


@dataclass(kw_only=True)
class GenerateItem(Queued):
    """A queued generation request: its prompt's tokens and the seed it samples with."""

    request: wire.GenerateRequest
    prompt_ids: list[int]
    seed: int
    load = 1

    @property
    def prompt_tokens(self) -> int:
        return len(self.prompt_ids)


TextItem = EmbedItem | GenerateItem


def sequences(work: list[wire.SeqWork]) -> list[Sequence]:
    """The decode state of each broadcast sequence (the same on every rank)."""
    return [Sequence(w.rid, w.prompt_ids, w.params, w.seed, w.stream) for w in work]


class Scheduler(BatchingScheduler[wire.EmbedRequest | wire.GenerateRequest, TextItem]):
    """Rank 0 of a text replica: embeddings or generation on a ``ModelRunner``."""

    def __init__(
        self,
        runner: ModelRunner,
        server_args: ServerArgs,
        ctx: WorkerContext,
        store: TCPStore | None = None,
    ) -> None:
        """``store`` (the launch's rendezvous store) is given to a replica whose rank 0 runs on a
        node other than 0: it binds on TCP and announces the address there."""
        super().__init__(
            server_args,
            ctx,
            serves=(wire.EmbedRequest, wire.GenerateRequest),
            model=runner.source.served_name,
            kind=runner.kind,
            ranks=runner.tp_size,
            platform=runner.platform,
            store=store,
        )
        self.runner = runner

    def admit(self, identity: bytes, request: wire.EmbedRequest | wire.GenerateRequest) -> TextItem:
        """Tokenise ``request``; ``InputError`` names the text (``input[i]`` of several) or the
        limit it is over."""
        if isinstance(request, wire.EmbedRequest):
            return EmbedItem(
                identity=identity, request=request, input_ids=self.encode_texts(request.texts)
            )
        params = request.params
        return GenerateItem(
            identity=identity,
            request=request,
            prompt_ids=self.runner.encode_prompt(request.text, params.max_new_tokens),
            seed=params.seed if params.seed is not None else random.getrandbits(31),
        )

    def encode_texts(self, texts: list[str]) -> list[list[int]]:
        input_ids = []
        for i, text in enumerate(texts):
            try:
                input_ids.append(self.runner.encode_embedding_input(text))
            except InputError as exc:
                if len(texts) == 1:
                    raise
                raise InputError(f"input[{i}]: {exc}", f"input[{i}]") from None
        return input_ids

    def take_batch(self) -> list[TextItem]:
        """Up to ``max_batch_size`` requests, oldest first, at least one; for embeddings that
        many texts, shared between the queued requests (``take_texts``)."""
        if isinstance(self.queue[0], EmbedItem):
            return [*take_texts(cast("deque[EmbedItem]", self.queue), self.max_batch_size)]
        batch = [self.queue.popleft()]
        load = batch[0].load
        while self.queue:
            size = self.queue[0].load
            if len(batch) >= self.max_batch_size or load + size > self.max_batch_size:
                break
            batch.append(self.queue.popleft())
            load += size
        return batch

    def execute(self, batch: list[TextItem]) -> None:
        embeds = [item for item in batch if isinstance(item, EmbedItem)]
        if embeds:
            self.run_embeddings(embeds)
        generations = [item for item in batch if isinstance(item, GenerateItem)]
        if generations:
            self.run_generation(generations)

    def run_embeddings(self, batch: list[EmbedItem]) -> None:
        """Embed each request's ``part``; answer the requests whose last texts these were."""
        inputs = [ids for item in batch for ids in item.input_ids[item.part.start : item.part.stop]]
        matrix = self.runner.embed_matrix(inputs)
        dim = int(matrix.shape[1])
        packed, row = wire.pack_vectors(matrix), dim * 4
        at = 0
        for item in batch:
            n = len(item.part)
            item.add_rows(packed[at * row : (at + n) * row], len(inputs))
            at += n
            if item.complete and item.rid not in self.cancelled:
                self.send(item.identity, item.answer(dim))

    def run_generation(self, batch: list[GenerateItem]) -> None:
        work = [
            wire.SeqWork(q.rid, q.prompt_ids, q.request.params, q.seed, q.request.stream)
            for q in batch
        ]
        if self.ranks > 1:
            self.broadcast(wire.Batch(work))
        owners = {q.rid: q for q in batch}
        seqs = sequences(work)

        def emit(seq: Sequence) -> None:
            owner = owners[seq.rid]
            text = seq.take_increment() if seq.stream else seq.text
            if seq.stream and not text and not seq.finished:
                return
            self.send(
                owner.identity,
                wire.Generated(
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

        self.runner.generate(seqs, emit=emit, cancelled=self.poll)
        self.aborted += sum(1 for s in seqs if s.finish_reason == "abort")
        self.generated_tokens += sum(len(s.output_ids) for s in seqs)

    def stats(self) -> wire.TextStats:
        runner = self.runner
        return self.counted(wire.TextStats(model=runner.describe(), memory=runner.memory_info()))


def follow_text_batch(runner: ModelRunner, work: wire.FollowerWork) -> None:
    """A tensor-parallel rank > 0: decode rank 0's batch in lockstep with it (no answers)."""
    if isinstance(work, wire.Batch):
        runner.generate(sequences(work.seqs))
