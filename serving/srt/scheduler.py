"""The text runtime's scheduler: one per data-parallel replica (every tensor-parallel rank of it
runs this target).

``run_scheduler_process(server_args, ctx)``: join the replica's tensor-parallel group when
``ctx.tp_size > 1`` (the platform's distributed backend), load the model (``model_runner``), run
one warm-up batch, then serve: rank 0 runs ``Scheduler`` (the shared ``BatchingScheduler`` of
``serving.scheduler``: socket, queue, batch timing, failure policy), ranks > 0 ``follow`` rank
0's broadcasts in lockstep.

What is the text runtime's own: a request is tokenised on arrival (an embedding request counts
its texts, a generation request draws its seed unless it gave one; input over the limits, or a
sequence that could never fit the KV pool, is a 400 at once). Embeddings: a batch holds up to
``--max-batch-size`` texts, shared between the queued requests (``serving.srt.embedding``: a
request of many texts runs over several batches, interleaved with the others).

Generation is batched continuously: each step of the loop first admits waiting sequences into
the running batch (``serving.srt.engine``) while they fit the KV pool and
``--max-running-requests``, fairly across HTTP requests (``serving.srt.kv_pool``), drops the
cancelled ones, then runs one step of the batch and answers what it produced: a streaming
sequence its increment, a finished one its result, and it leaves the batch at once. In a
tensor-parallel replica rank 0 broadcasts each step's joining and cancelled sequences
(``wire.GenerationStep``) and every rank runs the same step.
"""

from __future__ import annotations

import logging
import random
import time
from collections import deque
from dataclasses import dataclass
from typing import TYPE_CHECKING, cast

from launchspec.model_source import resolve_model
from serving import wire
from serving.errors import InputError
from serving.scheduler import BatchingScheduler, Queued, follow
from serving.srt.embedding import EmbedItem, take_texts
from serving.srt.engine import GenerationBatch
from serving.srt.kv_pool import KVPool, admit_fairly
from serving.srt.model_runner import ModelRunner
from serving.srt.sampling import Sequence
from serving.srt.static_batch import generate_static, static_batching_requested
from serving.threads import share_cpu_threads

if TYPE_CHECKING:
    from torch.distributed import TCPStore

    from bootstrap import WorkerContext
    from launchspec.server_args import ServerArgs
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
            server_args,
            current_platform,
            local_rank=ctx.local_rank,
            tp_size=tp_size,
            ranks_sharing=tp_size * dp_size // nnodes,
        )
        ctx.phase("model_loaded")
        runner.warm_up()
        ctx.phase("warmed_up")
        if ctx.tp_rank == 0:
            Scheduler(runner, server_args, ctx, store=store if remote else None).serve()
        else:
            batch = runner.new_batch(answers=False)
            follow(ctx, lambda work: follow_text_step(runner, batch, work))
    finally:
        if tp_size > 1:
            close_tp_group()


def load_runner(
    server_args: ServerArgs,
    platform: SRTPlatform,
    local_rank: int = 0,
    tp_size: int = 1,
    ranks_sharing: int = 1,
) -> ModelRunner:
    """A ``ModelRunner`` configured from ``server_args`` (``ranks_sharing``: the scheduler ranks
    on this node, which share a CPU's memory)."""
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
        context_length=server_args.context_length,
        max_total_tokens=server_args.max_total_tokens,
        chunked_prefill_size=server_args.chunked_prefill_size,
        max_batch_size=server_args.max_batch_size,
        trust_remote_code=server_args.trust_remote_code,
        ranks_sharing=ranks_sharing,
        tokenizer_path=server_args.tokenizer_path,
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

    @property
    def group(self) -> str:
        """The HTTP request it belongs to (fairness is across these)."""
        return self.request.group or self.request.rid

    @property
    def footprint(self) -> int:
        """The KV tokens it may take: prompt + ``max_new_tokens``."""
        return len(self.prompt_ids) + self.request.params.max_new_tokens

    def work(self) -> wire.SeqWork:
        r = self.request
        return wire.SeqWork(r.rid, self.prompt_ids, r.params, self.seed, r.stream)


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
        # Continuous batching, unless this is the benchmark's static baseline or the model's
        # cache cannot be batched that way.
        self.continuous = (
            runner.kind == "generation" and runner.continuous and not static_batching_requested()
        )
        self.batch: GenerationBatch | None = runner.new_batch() if self.continuous else None
        self.pool = KVPool(runner.max_total_tokens)
        self.max_running = server_args.max_running_requests or server_args.max_batch_size
        self.recent: deque[tuple[float, int]] = deque()  # (when, tokens) of the last steps

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
            prompt_ids=self.runner.encode_prompt(
                request.text, params.max_new_tokens, raw=request.raw
            ),
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

    # ---- continuous generation ---------------------------------------------------------------

    def step(self) -> None:
        """Embeddings (and statically batched generation): the next whole batch. Generation:
        one step of the running batch (the module's docstring)."""
        if self.batch is None:
            self.run_batch()
            return
        try:
            self.generation_step(self.batch)
        except Exception:
            self.batch.reset()
            self.pool.clear()
            raise

    def generation_step(self, batch: GenerationBatch) -> None:
        joining = self.admit_waiting(batch)
        cancel = [rid for rid in self.cancelled if rid in self.running]
        if self.ranks > 1:
            self.broadcast(wire.GenerationStep([q.work() for q in joining], cancel))
        batch.join(sequences([q.work() for q in joining]))
        stopped = batch.cancel(cancel)
        before = sum(len(seq.output_ids) for seq in batch.sequences())
        produced = self.runner.generate(batch)
        after = sum(len(seq.output_ids) for seq in batch.sequences())
        tokens = after - before + sum(len(seq.output_ids) for seq in produced if seq.finished)
        self.batches += 1
        self.generated_tokens += tokens
        now = time.monotonic()
        self.recent.append((now, tokens))
        while self.recent[0][0] < now - _RATE_WINDOW_S:
            self.recent.popleft()
        for seq in [*stopped, *produced]:
            self.answer(seq, batch.last_step_size)

    def admit_waiting(self, batch: GenerationBatch) -> list[GenerateItem]:
        """Move the queued sequences that are admitted now (``kv_pool.admit_fairly``) from the
        queue to ``running``, their KV room reserved."""
        room = self.max_running - len(batch)
        if room <= 0 or not self.queue:
            return []
        pool = self.pool

        def reserve(item: GenerateItem) -> bool:
            if not pool.fits(item.footprint):
                return False
            pool.reserve(item.rid, item.footprint)
            return True

        waiting = [q for q in self.queue if isinstance(q, GenerateItem)]
        running = [q.group for q in self.running.values() if isinstance(q, GenerateItem)]
        chosen = admit_fairly(waiting, running, room=room, reserve=reserve)
        if chosen:
            taken = {id(q) for q in chosen}
            self.queue = deque(q for q in self.queue if id(q) not in taken)
            self.begin(chosen)
        return chosen

    def answer(self, seq: Sequence, batch_size: int) -> None:
        """Send what ``seq`` produced (a streaming increment, or its result once finished), and
        let it go when finished."""
        item = self.running.get(seq.rid)
        if not isinstance(item, GenerateItem):
            return
        if seq.finished:
            self.aborted += seq.finish_reason == "abort"
            gone = seq.rid in self.cancelled
            self.finish([item])
            self.pool.release(seq.rid)
            if gone:
                return
        text = seq.take_increment() if seq.stream else seq.text
        if not seq.finished and (not seq.stream or not text):
            return
        self.send(
            item.identity,
            wire.Generated(
                seq.rid,
                text,
                item.prompt_tokens,
                len(seq.output_ids),
                finished=seq.finished,
                finish_reason=seq.finish_reason,
                seed=seq.seed,
                batch_size=max(batch_size, 1),
                logprobs=seq.take_logprobs(),
            ),
        )

    # ---- whole batches: embeddings, and static generation ----------------------------------

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
            self.run_static_generation(generations)

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

    def run_static_generation(self, batch: list[GenerateItem]) -> None:
        """A generation batch decoded to the end of its longest sequence (``static_batch``)."""
        work = [q.work() for q in batch]
        if self.ranks > 1:
            self.broadcast(wire.Batch(work))
        seqs = sequences(work)

        def emit(seq: Sequence) -> None:
            self.answer(seq, len(seqs))

        generate_static(self.runner, seqs, emit=emit, cancelled=self.poll)
        self.generated_tokens += sum(len(s.output_ids) for s in seqs)

    # ---- figures -----------------------------------------------------------------------------

    def stats(self) -> wire.TextStats:
        runner = self.runner
        now = time.monotonic()
        while self.recent and self.recent[0][0] < now - _RATE_WINDOW_S:
            self.recent.popleft()
        span = now - self.recent[0][0] if self.recent else 0.0
        rate = sum(n for _, n in self.recent) / max(span, 1.0) if self.recent else 0.0
        return self.counted(
            wire.TextStats(
                model=runner.describe(),
                memory=runner.memory_info(),
                running=len(self.batch) if self.batch is not None else len(self.running),
                queued=len(self.queue),
                kv_tokens_used=self.pool.used,
                kv_tokens_total=self.pool.total if runner.kind == "generation" else 0,
                generation_tokens_per_s=round(rate, 3),
            )
        )


# The window over which a scheduler reports its generation rate.
_RATE_WINDOW_S = 5.0


def follow_text_step(runner: ModelRunner, batch: GenerationBatch, work: wire.FollowerWork) -> None:
    """A tensor-parallel rank > 0: run rank 0's generation step (or static batch) in lockstep
    with it (no answers)."""
    if isinstance(work, wire.GenerationStep):
        batch.join(sequences(work.join))
        batch.cancel(work.cancel)
        runner.generate(batch)
    elif isinstance(work, wire.Batch):
        generate_static(runner, sequences(work.seqs))
