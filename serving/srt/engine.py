"""The running generation batch of one rank: continuous batching over the KV pool.

``GenerationBatch`` holds the sequences of a replica that are generating. Sequences ``join``
at any step and leave as soon as they finish or are cancelled (``cancel``). Each sequence's
keys and values live in the rank's KV pool (``serving.srt.mem_cache``): a sequence *claims* its
memory when it joins (``KVMemory.claim``: a row of the request-to-token table, the longest
cached prefix of its prompt, a reservation of what it may still take), so nothing in the cache
is padded, copied or grown per step.

Each ``step()`` is one forward of the model over one flat row of tokens (no padding):

1. extend segments: prompt tokens not yet in the pool, at most ``chunk_tokens`` of them: either
   several whole prompts, or the next chunk of one prompt longer than that (a long prompt is
   prefilled over several steps); a prompt whose prefill completes samples its first token
   and joins the decoding rows;
2. the decoding rows: one new token each.

So a new prompt costs the running sequences about one chunk of work per step, and a short
request that arrives while a long one decodes starts at the next step. Attention runs through
the batch's attention backend (``serving.srt.layers.attention``) inside the model's own layers.

Every rank of a tensor-parallel replica holds the same batch: rank 0 decides what joins and
what is cancelled before each step (``serving.srt.scheduler``) and broadcasts it, and every
rank runs the same ``join``, ``cancel`` and ``step`` on the same logits with the same
per-sequence generators, so they pick the same tokens, claim and free the same memory and
finish the same sequences without exchanging them.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from serving.srt.mem_cache.kv_memory import Claim, KVMemory
from serving.srt.model_executor.forward_batch_info import ForwardBatch
from serving.srt.sampling import Sequence, select_token

if TYPE_CHECKING:
    import torch

    from serving.detokenize import TextDecoder

log = logging.getLogger("sglang_launch.engine")


class GenerationBatch:
    """The generating sequences of one rank (see the module docstring).

    ``forward(input_ids, forward_batch, keep)`` runs the model over ``input_ids`` (a list, the
    flat row) and returns the logits of the positions ``keep`` lists, as (len(keep), 1, vocab)
    (``keep`` None: every position); ``memory`` is the rank's ``KVMemory``; ``attn_backend``
    the attention backend object; ``decode`` (a ``TextDecoder``) turns token ids into text,
    ``token_text`` one token id into its text alone; ``chunk_tokens`` bounds the prompt tokens
    of one step (``None``: no bound); ``inference_mode`` is the platform's no-grad context each
    step runs in; ``answers`` (rank 0) computes what only answers need (logprobs)."""

    def __init__(
        self,
        *,
        forward: Callable[..., torch.Tensor],
        memory: KVMemory,
        attn_backend: Any,
        device: torch.device,
        eos_ids: set[int],
        decode: TextDecoder,
        token_text: Callable[[int], str],
        chunk_tokens: int | None,
        inference_mode: Callable[[], Any],
        answers: bool = True,
    ) -> None:
        self.forward = forward
        self.memory = memory
        self.attn_backend = attn_backend
        self.device = device
        self.eos_ids = eos_ids
        self.decode = decode
        self.token_text = token_text
        self.chunk_tokens = chunk_tokens
        self.inference_mode = inference_mode
        self.answers = answers
        self.waiting: deque[Sequence] = deque()  # joined, prefill not started
        self.partial: Sequence | None = None  # a long prompt part way through its prefill
        self.rows: list[Sequence] = []  # decoding
        self.claims: dict[str, Claim] = {}
        self.steps = 0
        self.last_step_size = 0  # decoding rows of the last step
        self.last_step_tokens = 0  # tokens the last step generated
        self.inside_held = False  # in ``held()``: steps do not enter the inference mode
        self._host_logits: bool | None = None  # the model's logits: float32 on the CPU

    # ---- what is in it -------------------------------------------------------------------

    def __len__(self) -> int:
        """Sequences in the batch: waiting for prefill, prefilling, or decoding."""
        return len(self.waiting) + (self.partial is not None) + len(self.rows)

    def sequences(self) -> list[Sequence]:
        partial = [self.partial] if self.partial is not None else []
        return [*self.rows, *partial, *self.waiting]

    def fits(self, prompt_tokens: int, max_new_tokens: int, pending: int = 0) -> bool:
        """Whether a sequence of that size can join now, with ``pending`` slots already promised
        to others admitted in the same round (read-only: admission on rank 0 asks it)."""
        need = self.memory.footprint(prompt_tokens, max_new_tokens)
        return pending + need <= self.memory.budget()

    def join(self, seqs: Iterable[Sequence]) -> None:
        """``seqs`` join the batch: their memory is claimed now, in order, while it fits (the
        rest is claimed at later steps), and they are prefilled from the next step on."""
        self.waiting.extend(seqs)
        self._claim_waiting()

    def _claim_waiting(self) -> None:
        claims, memory = self.claims, self.memory
        for seq in self.waiting:
            if seq.rid in claims:
                continue
            claim = memory.claim(seq.prompt_ids, seq.params.max_new_tokens)
            if claim is None:
                return  # in order: a later one does not pass one that waits for room
            claims[seq.rid] = claim
            seq.cached_tokens = claim.cached

    def cancel(self, rids: Iterable[str]) -> list[Sequence]:
        """Stop the sequences named ``rids`` now (finish reason ``"abort"``) and return them."""
        gone = set(rids)
        if not gone:
            return []
        stopped = [s for s in self.sequences() if s.rid in gone]
        for seq in stopped:
            seq.finish_reason = "abort"
            self._release(seq)
        self.waiting = deque(s for s in self.waiting if s.rid not in gone)
        if self.partial is not None and self.partial.rid in gone:
            self.partial = None
        self.rows = [s for s in self.rows if s.rid not in gone]
        return stopped

    def reset(self) -> None:
        """Forget every sequence and the whole KV memory (after a failed step)."""
        self.waiting.clear()
        self.partial = None
        self.rows = []
        self.claims.clear()
        self.memory.reset()

    def flush(self) -> bool:
        """Drop every cached prefix; only while no sequence is in the batch (whether it did)."""
        if len(self):
            return False
        self.memory.reset()
        return True

    # ---- one step ------------------------------------------------------------------------

    @contextmanager
    def held(self) -> Iterator[None]:
        """Inside, every step runs in one entry of the platform's inference mode, entered here
        once (a serving loop), instead of entering it again for each step."""
        with self.inference_mode():
            self.inside_held = True
            try:
                yield
            finally:
                self.inside_held = False

    def step(self) -> list[Sequence]:
        """One forward (the module docstring). Returns the sequences that got a token or
        finished in it, each once, in batch order."""
        self.last_step_tokens = 0
        if self.inside_held:
            touched = self._step()
        else:
            with self.inference_mode():
                touched = self._step()
        self.steps += 1
        return touched

    def _select_extend(self) -> list[tuple[Sequence, int]]:
        """The extend segments of this step: (sequence, new tokens)."""
        budget = self.chunk_tokens if self.chunk_tokens is not None else 1 << 62
        claims = self.claims
        if self.partial is not None:
            seq = self.partial
            return [(seq, min(len(seq.prompt_ids) - claims[seq.rid].length, budget))]
        self._claim_waiting()
        work: list[tuple[Sequence, int]] = []
        waiting = self.waiting
        while waiting and waiting[0].rid in claims:
            seq = waiting[0]
            need = len(seq.prompt_ids) - claims[seq.rid].length
            if need <= budget:
                work.append((waiting.popleft(), need))
                budget -= need
            elif not work:  # longer than a chunk: prefilled over several steps
                self.partial = waiting.popleft()
                work.append((seq, budget))
                break
            else:
                break
        return work

    def _step(self) -> list[Sequence]:
        import torch

        extend = self._select_extend()
        rows = self.rows
        if not extend and not rows:
            return []
        memory, claims, device = self.memory, self.claims, self.device
        table = memory.req_to_token_pool.req_to_token
        ids: list[int] = []
        positions: list[int] = []
        locs: list[torch.Tensor] = []
        keep: list[int] = []
        prefilled: list[Sequence] = []
        batch = ForwardBatch(
            token_to_kv_pool=memory.token_to_kv_pool,
            attn_backend=self.attn_backend,
            out_cache_loc=None,  # type: ignore[arg-type]
            positions=None,  # type: ignore[arg-type]
        )
        for seq, n in extend:
            claim = claims[seq.rid]
            start = claim.length
            ids.extend(seq.prompt_ids[start : start + n])
            positions.extend(range(start, start + n))
            locs.append(memory.extend(claim, n))
            batch.extend_seq_lens.append(n)
            batch.extend_prefix_lens.append(start)
            batch.extend_slots.append(table[claim.row, : start + n].to(torch.int64))
            if start + n == len(seq.prompt_ids):
                keep.append(len(ids) - 1)
                prefilled.append(seq)
        if self.partial is not None and prefilled and prefilled[-1] is self.partial:
            self.partial = None
        if rows:
            row_claims = [claims[s.rid] for s in rows]
            first = len(ids)
            for seq, claim in zip(rows, row_claims, strict=True):
                ids.append(seq.output_ids[-1])
                positions.append(claim.length)
            locs.append(memory.decode_slots(row_claims))
            lengths = [c.length for c in row_claims]
            width = max(lengths)
            slots = table[[c.row for c in row_claims], :width].to(torch.int64)
            if min(lengths) < width:  # shorter rows read the dummy slot, masked out
                valid = torch.arange(width)[None, :] < torch.tensor(lengths)[:, None]
                slots.masked_fill_(~valid, 0)
                batch.decode_valid = valid.to(device)
            batch.decode_slots = slots.to(device)
            batch.decode_flat_slots = batch.decode_slots.view(-1)
            batch.decode_positions = torch.tensor(lengths, device=device) - 1
            keep.extend(range(first, len(ids)))
        batch.out_cache_loc = (locs[0] if len(locs) == 1 else torch.cat(locs)).to(device)
        batch.positions = torch.tensor(positions, dtype=torch.int64, device=device)
        self.attn_backend.init_forward_metadata(batch)
        every = len(keep) == len(ids)
        logits = self.forward(ids, batch, None if every else keep)
        picked = [*prefilled, *rows]
        self.last_step_size = len(rows)
        self._pick(picked, logits)
        for seq in prefilled:
            if not seq.finished:
                memory.cache_prompt(claims[seq.rid], seq.prompt_ids)
        self.rows = [s for s in picked if not s.finished]
        for seq in picked:
            if seq.finished:
                self._release(seq)
        return picked

    def _release(self, seq: Sequence) -> None:
        """``seq`` leaves: its computed tokens go to the cache, its memory back to the pool."""
        claim = self.claims.pop(seq.rid, None)
        if claim is not None:
            computed = [*seq.prompt_ids, *seq.output_ids][: claim.length]
            self.memory.release(claim, computed)

    def _pick(self, seqs: list[Sequence], logits: torch.Tensor) -> None:
        """Each sequence's next token from its row of ``logits`` (rows, positions, vocab: the
        last position's)."""
        if all(s.plain for s in seqs):  # the common case: every row takes its most likely token
            eos_ids, decode = self.eos_ids, self.decode
            for seq, token in zip(seqs, self._greedy(logits), strict=True):
                seq.advance(token, eos_ids, decode)
            self.last_step_tokens += len(seqs)
            return
        import torch

        last = logits[:, -1, :]
        plain = [i for i, s in enumerate(seqs) if s.plain]
        chosen: dict[int, int] = {}
        if plain:
            index = torch.tensor(plain, device=last.device)
            best = greedy(last.index_select(0, index))
            chosen.update(zip(plain, best, strict=True))
        if len(plain) < len(seqs):
            host = last.float().cpu()
            for i, seq in enumerate(seqs):
                if i in chosen:
                    continue
                row = seq.shape_logits(host[i])
                chosen[i] = select_token(row, seq.params, seq.sampler())
                if self.answers:
                    seq.note_logprob(row, chosen[i], self.token_text)
        for i, seq in enumerate(seqs):
            seq.advance(chosen[i], self.eos_ids, self.decode)
        self.last_step_tokens += len(seqs)

    def _greedy(self, logits: torch.Tensor) -> list[int]:
        """The most likely token of each row's last position in ``logits`` (rows, positions,
        vocab). Float32 logits on the CPU go to numpy at once (``greedy``), with no tensor
        operation before: whether they are is read from the first logits and kept."""
        if self._host_logits is None:
            import torch

            self._host_logits = logits.device.type == "cpu" and logits.dtype == torch.float32
        if self._host_logits:
            best: list[int] = logits.numpy()[:, -1].argmax(axis=-1).tolist()
            return best
        return greedy(logits[:, -1, :])


def greedy(logits: torch.Tensor) -> list[int]:
    """The most likely token of each row of ``logits`` (rows, vocab), the first on a tie. On the
    CPU through numpy (half-precision logits made float32 first), whose vectorised argmax takes
    a few microseconds where torch's takes about 0.1 ms a row (its CPU argmax is a scalar
    loop)."""
    import torch

    if logits.device.type == "cpu":
        rows = logits.detach() if logits.requires_grad else logits  # no op when not needed
        if rows.dtype != torch.float32:  # half precision: numpy has none, and one copy is cheap
            rows = rows.float()
        best: list[int] = rows.numpy().argmax(axis=-1).tolist()
        return best
    return list(torch.argmax(logits, dim=-1).tolist())
