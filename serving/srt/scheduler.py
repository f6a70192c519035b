"""The text runtime's scheduler: one per data-parallel replica (every tensor-parallel rank of it
runs this target).

``run_scheduler_process(server_args, ctx)``: join the replica's tensor-parallel group when
``ctx.tp_size > 1`` (the platform's distributed backend), load the model (``model_runner``), run
one warm-up batch, then serve: rank 0 runs ``Scheduler`` (the shared ``BatchingScheduler`` of
``serving.scheduler``: socket, waiting queue, batch timing, the step loop, failure policy), ranks
> 0 ``follow`` rank 0's broadcasts in lockstep.

What is the text runtime's own: a request is tokenised on arrival (an embedding request counts
its texts, a generation request draws its seed unless it gave one; input over the limits, or a
sequence that could never fit the KV pool, is a 400 at once), and becomes a ``Req`` (generation)
or an ``EmbedReq`` in ``waiting_queue``. Each step, with SGLang's names:

- ``get_next_batch_to_run()``: generation admits waiting requests into ``running_batch`` (the
  ``ScheduleBatch`` of every running request) while they fit the KV pool (each counted at its
  prompt + ``max_new_tokens``, against the free slots and what the prefix cache could evict,
  ``GenerationBatch.fits``) and ``--max-running-requests``, in ``waiting_queue`` order and
  fairly across HTTP requests (``serving.srt.kv_pool``), and returns it (None when nothing
  runs); embeddings return a new
  batch of at most ``--max-batch-size`` texts shared between the waiting requests
  (``serving.srt.embedding``: a request of many texts runs over several batches, interleaved
  with the others);
- ``run_batch(batch)``: generation joins the newly admitted requests to the engine's batch
  (``serving.srt.engine``; in a tensor-parallel replica rank 0 first broadcasts them and the
  cancelled rids, ``wire.GenerationStep``, and every rank runs the same step), stops the
  cancelled ones and runs one step through the model worker, ``ModelRunner.generate``
  (``GenerationBatchResult``); embeddings run ``ModelRunner.embed_matrix`` on the batch's texts
  (``EmbeddingBatchResult``);
- ``process_batch_result(batch, result)``: a streaming sequence gets its increment, a finished
  one its result, and it leaves the batch and the KV pool at once; an embedding request whose
  last texts these were gets its vectors.
"""

from __future__ import annotations

import gc
import logging
import random
import time
from collections import deque
from concurrent.futures import FIRST_COMPLETED
from concurrent.futures import wait as wait_futures
from typing import TYPE_CHECKING

from launchspec.model_source import resolve_model
from serving import wire
from serving.errors import InputError
from serving.scheduler import BatchingScheduler, follow
from serving.srt.constrained.base_grammar_backend import (
    BaseGrammarBackend,
    backend_for_rank,
    grammar_key,
)
from serving.srt.embedding import EmbedReq, take_texts
from serving.srt.engine import GenerationBatch
from serving.srt.kv_pool import admit_fairly
from serving.srt.model_executor.decode_runner import DecodeOptions, choose_decode_runner
from serving.srt.model_runner import ModelRunner
from serving.srt.sampling import Sequence
from serving.srt.schedule_batch import (
    EmbeddingBatchResult,
    GenerationBatchResult,
    Req,
    ScheduleBatch,
)
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
        # The decode step's runner: the platform's graph runner, or the compiled step (compiled
        # now, each batch size logged), or none (decode_runner).
        choose_decode_runner(runner, DecodeOptions.of(server_args))
        # What start-up made (the model, the libraries) lives as long as the process: frozen, a
        # full collection no longer walks it, which would stall a step now and then.
        gc.collect()
        gc.freeze()
        ctx.phase("warmed_up")
        if ctx.tp_rank == 0:
            Scheduler(runner, server_args, ctx, store=store if remote else None).serve()
        else:
            batch = runner.new_batch(answers=False)
            grammars = grammar_backend(runner, server_args)[0]
            follow(ctx, lambda work: follow_text_step(runner, batch, work, grammars))
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
        max_running_requests=server_args.max_running_requests,
        page_size=server_args.page_size,
        disable_radix_cache=server_args.disable_radix_cache,
        trust_remote_code=server_args.trust_remote_code,
        ranks_sharing=ranks_sharing,
        tokenizer_path=server_args.tokenizer_path,
        quantization=server_args.quantization,
        wide_step_tokens=server_args.wide_step_tokens,
        torchao_config=server_args.torchao_config,
    )


def grammar_backend(
    runner: ModelRunner, server_args: ServerArgs
) -> tuple[BaseGrammarBackend | None, str]:
    """The grammar backend of a generation rank and the refusal a constrained request gets
    without one (``backend_for_rank``); (None, "") for an embedding model."""
    if runner.kind != "generation":
        return None, ""
    return backend_for_rank(server_args, runner.tokenizer, runner.model.config, runner.eos_ids)


TextReq = EmbedReq | Req
TextBatch = ScheduleBatch[TextReq]
TextResult = GenerationBatchResult | EmbeddingBatchResult


def sequences(work: list[wire.SeqWork]) -> list[Sequence]:
    """The decode state of each broadcast sequence (the same on every rank)."""
    return [Sequence(w.rid, w.prompt_ids, w.params, w.seed, w.stream) for w in work]


class Scheduler(
    BatchingScheduler[wire.EmbedRequest | wire.GenerateRequest, TextReq, TextBatch, TextResult]
):
    """Rank 0 of a text replica: embeddings or generation on a ``ModelRunner`` (SGLang's
    ``TpModelWorker``, here ``tp_worker``). ``waiting_queue``: the requests not admitted yet,
    in the order admission takes them; ``running_batch``: the running generation requests."""

    def __init__(
        self,
        tp_worker: ModelRunner,
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
            model=tp_worker.source.served_name,
            kind=tp_worker.kind,
            ranks=tp_worker.tp_size,
            platform=tp_worker.platform,
            store=store,
        )
        self.tp_worker = tp_worker
        self.is_generation = tp_worker.kind == "generation"
        self.running_batch: ScheduleBatch[Req] = ScheduleBatch()
        # This rank's decode state of the running batch (every rank holds the same).
        self.engine: GenerationBatch | None = tp_worker.new_batch() if self.is_generation else None
        self.max_running = server_args.max_running_requests or server_args.max_batch_size
        self.finished_in_step = False  # a running request finished (it leaves running_batch next)
        self.recent: deque[tuple[float, int]] = deque()  # (when, tokens) of the last steps
        # Streams whose request names this decoder are answered with ids (``sends_ids``).
        self.decoder = tp_worker.decoder_identity if self.is_generation else ""
        # Constrained decoding: the backend compiles off the step (``serving.srt.constrained``).
        self.grammar_backend, self.grammar_refusal = grammar_backend(tp_worker, server_args)
        self.grammars_to_prepare: list[tuple[str, str]] = []  # for the other ranks' compiles

    def serve(self) -> None:
        """``BatchingScheduler.serve``; a generation model's steps all run inside one entry of
        the platform's inference mode (``GenerationBatch.held``)."""
        if self.engine is None:
            super().serve()
            return
        with self.engine.held():
            super().serve()

    def admit(self, identity: bytes, request: wire.EmbedRequest | wire.GenerateRequest) -> TextReq:
        """Tokenise ``request``; ``InputError`` names the text (``input[i]`` of several) or the
        limit it is over."""
        if isinstance(request, wire.EmbedRequest):
            return EmbedReq(
                identity=identity, request=request, input_ids=self.encode_texts(request.texts)
            )
        params = request.params
        prompt = self.tp_worker.encode_prompt(request.text, params.max_new_tokens, raw=request.raw)
        seed = params.seed if params.seed is not None else random.getrandbits(31)
        seq = Sequence(request.rid, prompt, params, seed, request.stream)
        seq.decodes = not self.sends_ids(request)
        key = grammar_key(params)
        if key is None:
            return Req(identity=identity, request=request, seq=seq)
        if self.grammar_backend is None:
            raise InputError(self.grammar_refusal, key[0])
        future = self.grammar_backend.get_future_value(key)
        if self.ranks > 1:
            self.grammars_to_prepare.append(key)
        return Req(identity=identity, request=request, seq=seq, grammar=future)

    def sends_ids(self, request: wire.GenerateRequest) -> bool:
        """Whether ``request`` is answered with token ids that the HTTP child decodes: a stream
        with no stop strings (they are found in the text) and no logprobs, whose HTTP child
        decodes with this scheduler's tokenizer (``GenerateRequest.decoder``) and had at most
        ``ID_STREAMS`` requests outstanding here when it sent it. That takes the decode off the
        step while the HTTP child has time to spare between tokens; with more streams the step
        decodes them, where they do not add to the HTTP child's work per chunk."""
        params = request.params
        return (
            request.stream
            and request.inflight <= ID_STREAMS
            and bool(self.decoder)
            and request.decoder == self.decoder
            and not params.stop
            and not params.logprobs
        )

    def encode_texts(self, texts: list[str]) -> list[list[int]]:
        input_ids = []
        for i, text in enumerate(texts):
            try:
                input_ids.append(self.tp_worker.encode_embedding_input(text))
            except InputError as exc:
                if len(texts) == 1:
                    raise
                raise InputError(f"input[{i}]: {exc}", f"input[{i}]") from None
        return input_ids

    # ---- the step: SGLang's three seams ------------------------------------------------------

    def get_next_batch_to_run(self) -> TextBatch | None:
        """What this step runs (the module docstring): generation, ``running_batch`` after
        admitting what fits (None when it is empty); embeddings, the next batch of texts."""
        if not self.is_generation:
            if not self.waiting_queue:
                return None
            return ScheduleBatch(take_texts(self.waiting_queue, self.max_batch_size))  # type: ignore[arg-type]
        batch = self.running_batch
        if self.finished_in_step:  # those that finished in the last step leave
            batch.filter_batch()
            self.finished_in_step = False
        if self.waiting_queue:
            batch.reqs.extend(self.admit_waiting())
        return batch if batch.reqs else None  # type: ignore[return-value]

    def run_batch(self, batch: TextBatch) -> TextResult:
        """One step of ``batch`` through the model worker (the module docstring)."""
        if self.engine is None:
            return self.run_embeddings(batch.reqs)  # type: ignore[arg-type]
        engine = self.engine
        joining: list[Req] = []
        if len(batch.reqs) > len(self.running):  # admitted since the last step
            joining = [r for r in batch.reqs if isinstance(r, Req) and not r.joined]
            for req in joining:
                req.joined = True
            self.begin(joining)
        cancel = [rid for rid in self.cancelled if rid in self.running] if self.cancelled else []
        if self.ranks > 1:
            prepare, self.grammars_to_prepare = self.grammars_to_prepare, []
            self.broadcast(
                wire.GenerationStep([r.work() for r in joining], cancel, prepare=prepare)
            )
        if joining:
            engine.join([r.seq for r in joining])
        stopped = engine.cancel(cancel) if cancel else []
        produced = self.tp_worker.generate(engine)
        return GenerationBatchResult(
            [*stopped, *produced] if stopped else produced,
            engine.last_step_tokens,
            engine.last_step_size,
        )

    def process_batch_result(self, batch: TextBatch, result: TextResult) -> None:
        """Send what the step produced and release what finished (the module docstring)."""
        self.batches += 1
        if isinstance(result, EmbeddingBatchResult):
            self.answer_embeddings(batch.reqs, result)  # type: ignore[arg-type]
            return
        self.count_tokens(result.tokens)
        for seq in result.sequences:
            self.answer(seq, result.batch_size)

    def recover(self) -> None:
        """After a failed generation step: the engine's batch, its KV memory (the prefix cache
        too) and the running batch start empty (the failure policy answered every running
        request)."""
        if self.engine is not None:
            self.engine.reset()
            self.running_batch.reqs.clear()

    def flush_cache(self) -> tuple[bool, str]:
        """Drop every cached prefix (``POST /flush_cache``), only while no request runs or
        waits (SGLang's rule); every rank of the replica flushes."""
        engine = self.engine
        if engine is None:
            return False, "an embedding model has no prefix cache"
        busy = len(self.running) + len(self.waiting_queue)
        if busy or len(engine):
            return False, f"{busy} requests are running or waiting; retry when they are done"
        if self.ranks > 1:
            self.broadcast(wire.GenerationStep([], [], flush=True))
        engine.flush()
        return True, ""

    def in_step(self) -> list[TextReq]:
        """A failed generation step loses every running request (they share one cache), those
        ``get_next_batch_to_run`` admitted into ``running_batch`` before it failed included."""
        if self.engine is not None:
            held: dict[str, TextReq] = dict(self.running)
            for req in self.running_batch.reqs:
                held.setdefault(req.rid, req)
            return list(held.values())
        return list(super().in_step())

    # ---- generation --------------------------------------------------------------------------

    def admit_waiting(self) -> list[Req]:
        """Take the waiting requests admitted now (``kv_pool.admit_fairly``) out of the waiting
        queue: each fits the KV pool beside the running ones and those admitted before it."""
        engine = self.engine
        assert engine is not None
        room = self.max_running - len(self.running_batch.reqs)
        if room <= 0:
            return []
        promised = 0

        def reserve(item: Req) -> bool:
            nonlocal promised
            params = item.seq.params
            if not engine.fits(len(item.seq.prompt_ids), params.max_new_tokens, promised):
                return False
            promised += engine.memory.footprint(len(item.seq.prompt_ids), params.max_new_tokens)
            return True

        waiting = [
            q for q in list(self.waiting_queue) if isinstance(q, Req) and self.grammar_ready(q)
        ]
        if not waiting and not self.running_batch.reqs and self.waiting_queue:
            # Nothing runs and every waiting request's grammar is compiling: wait for one (a
            # while; the loop reads its socket in between), no request's tokens are held up.
            self.wait_for_grammar()
            waiting = [
                q for q in list(self.waiting_queue) if isinstance(q, Req) and self.grammar_ready(q)
            ]
        running = [q.group for q in self.running_batch.reqs]
        chosen = admit_fairly(waiting, running, room=room, reserve=reserve)
        if chosen:
            taken = {id(q) for q in chosen}
            self.waiting_queue[:] = [q for q in self.waiting_queue if id(q) not in taken]
        return chosen

    def grammar_ready(self, req: Req) -> bool:
        """Whether ``req`` may be admitted: it has no grammar, or its grammar compiled (its
        sequence now has its grammar object). A grammar that failed to compile answers the
        request with a 400 naming the error and takes it out of the waiting queue."""
        future = req.grammar
        if future is None:
            return True
        if not future.done():
            return False
        req.grammar = None
        key = grammar_key(req.seq.params)
        assert key is not None and self.grammar_backend is not None
        exc = future.exception()
        if exc is None:
            req.seq.grammar = self.grammar_backend.new_grammar(future.result())
            return True
        self.waiting_queue[:] = [q for q in self.waiting_queue if q is not req]
        self.send(req.identity, wire.RequestFailed(req.rid, 400, str(exc), key[0]))
        return False

    def wait_for_grammar(self) -> None:
        """Wait (at most ``GRAMMAR_WAIT_S``) for a compile a waiting request needs."""
        pending = [q.grammar for q in self.waiting_queue if isinstance(q, Req) and q.grammar]
        if pending:
            wait_futures(pending, timeout=GRAMMAR_WAIT_S, return_when=FIRST_COMPLETED)

    def wait_ms(self) -> int:
        """The shared loop's wait, none while a waiting request's grammar compiles (the step's
        ``wait_for_grammar`` waits for it instead)."""
        if self.declined and any(isinstance(q, Req) and q.grammar for q in self.waiting_queue):
            return 0
        return super().wait_ms()

    def answer(self, seq: Sequence, batch_size: int) -> bool:
        """Send what ``seq`` produced (a streaming increment, or its result once finished), and
        let it go when finished; whether it finished."""
        item = self.running.get(seq.rid)
        if item is None:
            return False
        finished = seq.finish_reason is not None
        if finished:
            self.finished_in_step = True
            self.aborted += seq.finish_reason == "abort"
            gone = seq.rid in self.cancelled
            self.finish([item])
            if gone:
                return True
        ids = None
        if not seq.decodes:  # the HTTP child decodes the ids
            text, ids = "", seq.take_ids()
            if not finished and not ids:
                return False
        else:
            text = seq.take_increment() if seq.stream else seq.text
            if not finished and (not seq.stream or not text):
                return False
        self.send(
            item.identity,
            wire.Generated(
                seq.rid,
                text,
                len(seq.prompt_ids),
                len(seq.output_ids),
                finished=finished,
                finish_reason=seq.finish_reason,
                seed=seq.seed,
                batch_size=max(batch_size, 1),
                logprobs=seq.take_logprobs(),
                token_ids=ids,
                cached_tokens=seq.cached_tokens,
            ),
        )
        return finished

    def count_tokens(self, tokens: int) -> None:
        self.generated_tokens += tokens
        now = time.monotonic()
        recent = self.recent
        recent.append((now, tokens))
        while recent[0][0] < now - _RATE_WINDOW_S:
            recent.popleft()

    # ---- embeddings --------------------------------------------------------------------------

    def run_embeddings(self, batch: list[EmbedReq]) -> EmbeddingBatchResult:
        """Embed each request's ``part`` (``ModelRunner.embed_matrix``)."""
        self.begin(batch)
        inputs = [ids for item in batch for ids in item.input_ids[item.part.start : item.part.stop]]
        matrix = self.tp_worker.embed_matrix(inputs)
        return EmbeddingBatchResult(wire.pack_vectors(matrix), int(matrix.shape[1]), len(inputs))

    def answer_embeddings(self, batch: list[EmbedReq], result: EmbeddingBatchResult) -> None:
        """Give each request its rows; answer those whose last texts these were."""
        packed, dim = result.rows, result.dim
        row = dim * 4
        at = 0
        for item in batch:
            n = len(item.part)
            item.add_rows(packed[at * row : (at + n) * row], result.texts)
            at += n
            if item.finished() and item.rid not in self.cancelled:
                self.send(item.identity, item.answer(dim))
        self.finish(batch)

    # ---- figures -----------------------------------------------------------------------------

    def stats(self) -> wire.TextStats:
        worker = self.tp_worker
        memory = self.engine.memory if self.engine is not None else None
        now = time.monotonic()
        while self.recent and self.recent[0][0] < now - _RATE_WINDOW_S:
            self.recent.popleft()
        span = now - self.recent[0][0] if self.recent else 0.0
        rate = sum(n for _, n in self.recent) / max(span, 1.0) if self.recent else 0.0
        return self.counted(
            wire.TextStats(
                model=worker.describe(),
                memory=worker.memory_info(),
                running=len(self.running),
                queued=len(self.waiting_queue),
                kv_tokens_used=memory.used() if memory is not None else 0,
                kv_tokens_total=memory.size if memory is not None else 0,
                prompt_tokens_total=memory.prompt_tokens_total if memory is not None else 0,
                cached_tokens_total=memory.cached_tokens_total if memory is not None else 0,
                generation_tokens_per_s=round(rate, 3),
            )
        )


# The longest one step waits for a grammar's compile when nothing else can run.
GRAMMAR_WAIT_S = 0.1
# The window over which a scheduler reports its generation rate.
_RATE_WINDOW_S = 5.0
# The most requests an HTTP child may have outstanding at a replica for a new stream to be
# answered with token ids (``Scheduler.sends_ids``).
ID_STREAMS = 4


def follow_text_step(
    runner: ModelRunner,
    batch: GenerationBatch,
    work: wire.FollowerWork,
    grammars: BaseGrammarBackend | None = None,
) -> None:
    """A tensor-parallel rank > 0: run rank 0's generation step in lockstep with it (no
    answers). A joining constrained sequence gets the same grammar as on rank 0, so every rank
    picks the same tokens: compiled here too, started when rank 0 queued its request
    (``GenerationStep.prepare``), and waited for only if it is not done when it joins."""
    if isinstance(work, wire.GenerationStep):
        if work.flush:
            batch.flush()
            return
        if grammars is not None:
            for kind, text in work.prepare:  # compiled in the background before it joins
                grammars.get_future_value((kind, text))
        joining = sequences(work.join)
        for seq in joining:
            joins = grammar_key(seq.params)
            if joins is not None and grammars is not None:
                seq.grammar = grammars.get_value(joins)
        batch.join(joining)
        batch.cancel(work.cancel)
        runner.generate(batch)
