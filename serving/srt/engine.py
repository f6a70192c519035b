"""The running generation batch of one rank: continuous batching over one padded KV cache.

``GenerationBatch`` holds the sequences of a replica that are generating. Sequences ``join``
at any step and leave as soon as they finish or are cancelled (``cancel``); each ``step()`` is
one unit of work:

1. at most one prefill forward of at most ``chunk_tokens`` tokens (padded): either several
   waiting prompts together, or the next chunk of one prompt longer than a chunk (a long prompt
   is prefilled over several steps); a prompt whose prefill completes samples its first token
   and joins the decoding rows;
2. one decode forward of every decoding row, one new token each.

So a new prompt costs the running sequences about one chunk of work per step, and a short
request that arrives while a long one decodes starts at the next step.

The decoding rows share one ``transformers`` ``DynamicCache``: row ``i`` holds its tokens at
the right end of the cache, padded on the left to the longest row (the attention mask marks the
padding), positions counted per row. A joining group is padded to the same width and appended;
leaving rows are selected out, and columns that became padding for every row are dropped.

Every rank of a tensor-parallel replica holds the same batch: rank 0 decides what joins and
what is cancelled before each step (``serving.srt.scheduler``) and broadcasts it, and every
rank runs the same ``step`` on the same logits with the same per-sequence generators, so they
pick the same tokens and finish the same sequences without exchanging them.

A model whose KV cache has layers this batch cannot pad, join or trim (``check_cache``: a
linear-attention layer, say) runs in the same batch without joining (``joins=False``): the
scheduler admits sequences only into an empty batch, they are prefilled together in one forward
and decode together, a finished or cancelled row stays in the cache (fed a pad token, its
logits unread) until every row has finished, and then the batch is empty again. The sampling is
the same code.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from serving.srt.sampling import Sequence, select_token

if TYPE_CHECKING:
    import torch

    from serving.detokenize import TextDecoder

log = logging.getLogger("sglang_launch.engine")


class UnsupportedCache(RuntimeError):
    """The model's KV cache has layers this batch cannot pad, join or trim."""


@dataclass
class _Prefill:
    """A prompt longer than one chunk, part way through its prefill (its own cache)."""

    seq: Sequence
    cache: Any
    done: int = 0  # prompt tokens already in ``cache``


class GenerationBatch:
    """The generating sequences of one rank and their KV cache (see the module docstring).

    ``forward(input_ids, attention_mask, position_ids, cache, last_only)`` runs the model and
    returns its logits (rows, positions, vocab; the last position's pick the next tokens);
    ``new_cache()`` makes an empty cache for it; ``decode`` (a
    ``TextDecoder``) turns token ids into text, ``token_text`` one token id into its text alone; ``chunk_tokens`` bounds one
    prefill forward (``None``: no bound); ``inference_mode`` is the platform's no-grad context
    each step runs in; ``answers`` (rank 0) computes what only answers need (logprobs);
    ``joins``: sequences may join a batch that is running and leave it as they finish (the
    module docstring says what ``False`` means)."""

    def __init__(
        self,
        *,
        forward: Callable[..., torch.Tensor],
        new_cache: Callable[[], Any],
        device: torch.device,
        eos_ids: set[int],
        pad_id: int,
        decode: TextDecoder,
        token_text: Callable[[int], str],
        chunk_tokens: int | None,
        inference_mode: Callable[[], Any],
        answers: bool = True,
        joins: bool = True,
    ) -> None:
        self.forward = forward
        self.new_cache = new_cache
        self.device = device
        self.eos_ids = eos_ids
        self.pad_id = pad_id
        self.decode = decode
        self.token_text = token_text
        self.chunk_tokens = chunk_tokens
        self.inference_mode = inference_mode
        self.answers = answers
        self.joins = joins
        self.waiting: deque[Sequence] = deque()  # joined, prefill not started
        self.partial: _Prefill | None = None
        self.rows: list[Sequence] = []  # decoding, in cache row order
        self.cache: Any = None
        self.mask: Any = None  # (rows, width) long: 1 where a row has a token
        self.positions: Any = None  # (rows, 1) long: the position of each row's next token
        self.steps = 0
        self.last_step_size = 0  # decoding rows of the last step
        self.last_step_tokens = 0  # tokens the last step generated
        self.inside_held = False  # in ``held()``: steps do not enter the inference mode
        # A decode step's inputs made without a tensor operation (each is rebuilt when the
        # batch's rows change): the mask grows into room made ahead; on the CPU the input column
        # and the positions are written through a memoryview of the tensors' own memory.
        self.on_host = device.type == "cpu"
        self._mask: _GrowingMask | None = None
        self._ids: _HostColumn | None = None
        self._positions: _HostColumn | None = None
        self._host_logits: bool | None = None  # the model's logits: float32 on the CPU

    # ---- what is in it -------------------------------------------------------------------

    def __len__(self) -> int:
        """Sequences in the batch: waiting for prefill, prefilling, or decoding."""
        return len(self.waiting) + (self.partial is not None) + len(self.rows)

    def sequences(self) -> list[Sequence]:
        partial = [self.partial.seq] if self.partial is not None else []
        return [*self.rows, *partial, *self.waiting]

    @property
    def width(self) -> int:
        """Token columns of the decoding rows' cache (the longest row)."""
        return 0 if self.mask is None else int(self.mask.shape[1])

    def join(self, seqs: Iterable[Sequence]) -> None:
        """``seqs`` join the batch: prefilled in order, from the next step on."""
        self.waiting.extend(seqs)

    def cancel(self, rids: Iterable[str]) -> list[Sequence]:
        """Stop the sequences named ``rids`` now (finish reason ``"abort"``) and return them."""
        gone = set(rids)
        if not gone:
            return []
        stopped = [s for s in self.sequences() if s.rid in gone]
        for seq in stopped:
            seq.finish_reason = "abort"
        self.waiting = deque(s for s in self.waiting if s.rid not in gone)
        if self.partial is not None and self.partial.seq.rid in gone:
            self.partial = None
        self._drop_finished()
        return stopped

    def reset(self) -> None:
        """Forget every sequence and the cache (after a failed step)."""
        self.waiting.clear()
        self.partial = None
        self.rows = []
        self.cache = self.mask = self.positions = None
        self._mask = self._ids = self._positions = None

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
        """One unit of work (the module docstring). Returns the sequences that got a token or
        finished in it, each once, in batch order."""
        self.last_step_tokens = 0
        if self.inside_held:
            touched = self._step()
        else:
            with self.inference_mode():
                touched = self._step()
        self.steps += 1
        return touched

    def _step(self) -> list[Sequence]:
        prefilled = self._prefill()
        if not self.rows:
            return prefilled
        self.last_step_size = len(self.rows)
        decoded = self._decode_step()
        if not prefilled:
            return decoded
        touched = {seq.rid: seq for seq in prefilled}
        touched.update((seq.rid, seq) for seq in decoded)
        return list(touched.values())

    def _prefill(self) -> list[Sequence]:
        """At most one prefill forward; the sequences that got their first token."""
        if self.partial is not None:
            return self._continue_partial()
        if not self.waiting:
            return []
        chunk = self.chunk_tokens
        head = self.waiting[0]
        if chunk is not None and len(head.prompt_ids) > chunk:
            self.waiting.popleft()
            self.partial = _Prefill(head, self.new_cache())
            return self._continue_partial()
        group = [self.waiting.popleft()]
        longest = len(group[0].prompt_ids)
        while self.waiting:
            nxt = len(self.waiting[0].prompt_ids)
            if chunk is not None and (len(group) + 1) * max(longest, nxt) > chunk:
                break
            group.append(self.waiting.popleft())
            longest = max(longest, nxt)
        return self._prefill_group(group)

    def _prefill_group(self, group: list[Sequence]) -> list[Sequence]:
        """Prefill whole prompts together (left-padded), sample their first tokens, and join
        those that go on to the decoding rows."""
        import torch

        width = max(len(s.prompt_ids) for s in group)
        ids = torch.full((len(group), width), self.pad_id, dtype=torch.long)
        mask = torch.zeros((len(group), width), dtype=torch.long)
        for i, s in enumerate(group):
            ids[i, width - len(s.prompt_ids) :] = torch.tensor(s.prompt_ids)
            mask[i, width - len(s.prompt_ids) :] = 1
        positions = (mask.cumsum(dim=1) - 1).clamp(min=0)
        ids, mask = ids.to(self.device), mask.to(self.device)
        cache = self.new_cache()
        logits = self.forward(ids, mask, positions.to(self.device), cache, last_only=True)
        self._pick(group, logits)
        self._append_rows(group, cache, mask)
        return group

    def _continue_partial(self) -> list[Sequence]:
        """The next chunk of the long prompt being prefilled; when it is the last one, its first
        token, and the sequence joins the decoding rows."""
        import torch

        part = self.partial
        assert part is not None and self.chunk_tokens is not None
        prompt = part.seq.prompt_ids
        end = min(len(prompt), part.done + self.chunk_tokens)
        ids = torch.tensor([prompt[part.done : end]], dtype=torch.long, device=self.device)
        mask = torch.ones((1, end), dtype=torch.long, device=self.device)
        positions = torch.arange(part.done, end, dtype=torch.long, device=self.device)[None, :]
        logits = self.forward(ids, mask, positions, part.cache, last_only=True)
        part.done = end
        if end < len(prompt):
            return []
        self.partial = None
        self._pick([part.seq], logits)
        self._append_rows([part.seq], part.cache, mask)
        return [part.seq]

    def _decode_step(self) -> list[Sequence]:
        """One new token for every decoding row; finished rows leave at once."""
        rows = self.rows
        if self._mask is None or self._mask.current is not self.mask:
            self._mask = _GrowingMask(self.mask)
        self.mask = self._mask.grow()
        if self.on_host:
            ids = self._ids
            if ids is None or len(ids.cells) != len(rows):
                ids = self._ids = _HostColumn([0] * len(rows))
            cells = ids.cells
            if self.joins:
                for i, s in enumerate(rows):
                    cells[i] = s.output_ids[-1]
            else:  # finished rows stay until every row has finished, fed a pad token
                for i, s in enumerate(rows):
                    cells[i] = self.pad_id if s.finished else s.output_ids[-1]
            positions = self._positions
            if positions is None or positions.tensor is not self.positions:
                positions = self._positions = _HostColumn(self.positions)
                self.positions = positions.tensor
            logits = self.forward(ids.tensor, self.mask, self.positions, self.cache)
            positions.advance()
        else:
            import torch

            column = [
                self.pad_id if s.finished and not self.joins else s.output_ids[-1] for s in rows
            ]
            last = torch.tensor([[t] for t in column], dtype=torch.long, device=self.device)
            logits = self.forward(last, self.mask, self.positions, self.cache)
            self.positions = self.positions + 1
        if not self.joins:
            live = [i for i, s in enumerate(rows) if not s.finished]
            if len(live) < len(rows):
                import torch

                index = torch.tensor(live, dtype=torch.long, device=logits.device)
                rows, logits = [rows[i] for i in live], logits.index_select(0, index)
        self._pick(rows, logits)
        self._drop_finished()
        return rows

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
                row = seq.apply_penalties(host[i])
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

    # ---- the cache -----------------------------------------------------------------------

    def _append_rows(self, group: list[Sequence], cache: Any, mask: torch.Tensor) -> None:
        """Add the prefilled ``group`` (its ``cache`` and ``mask``) to the decoding rows, but
        not those of its sequences that already finished."""
        import torch

        if not self.joins:  # the whole group is the batch; its finished rows stay in it
            if self.cache is not None:
                raise UnsupportedCache("this batch cannot join sequences to a running batch")
            if not all(s.finished for s in group):
                self.cache, self.mask, self.positions = cache, mask, mask.sum(dim=1, keepdim=True)
                self.rows = group
            return
        keep = [i for i, s in enumerate(group) if not s.finished]
        if not keep:
            return
        if len(keep) < len(group):
            index = torch.tensor(keep, dtype=torch.long, device=self.device)
            _select_rows(cache, index)
            mask = mask.index_select(0, index)
            group = [group[i] for i in keep]
        positions = mask.sum(dim=1, keepdim=True)
        if self.cache is None:
            check_cache(cache)
            self.cache, self.mask, self.positions, self.rows = cache, mask, positions, group
            return
        width = max(self.width, int(mask.shape[1]))
        _pad_cache(self.cache, width)
        _pad_cache(cache, width)
        for mine, theirs in zip(_layers(self.cache), _layers(cache), strict=True):
            mine.keys = torch.cat([mine.keys, theirs.keys], dim=0)
            mine.values = torch.cat([mine.values, theirs.values], dim=0)
        self.mask = torch.cat([_pad_left(self.mask, width), _pad_left(mask, width)], dim=0)
        self.positions = torch.cat([self.positions, positions])
        self.rows = [*self.rows, *group]

    def _drop_finished(self) -> None:
        """Rows that finished leave the cache; columns now padding in every row go too."""
        import torch

        keep = [i for i, s in enumerate(self.rows) if not s.finished]
        if len(keep) == len(self.rows):
            return
        if not self.joins and keep:
            return  # rows leave together, once every one has finished
        if not keep:
            self.rows, self.cache, self.mask, self.positions = [], None, None, None
            return
        index = torch.tensor(keep, dtype=torch.long, device=self.device)
        _select_rows(self.cache, index)
        self.mask = self.mask.index_select(0, index)
        self.positions = self.positions.index_select(0, index)
        self.rows = [self.rows[i] for i in keep]
        used = self.mask.any(dim=0).nonzero()
        start = int(used[0].item()) if used.numel() else self.width
        if start > 0:
            width = self.width - start
            self.mask = self.mask[:, start:]
            _trim_cache(self.cache, width)


class _HostColumn:
    """A (rows, 1) long tensor on the CPU whose values are written through ``cells``, a
    memoryview of the tensor's own memory: no tensor or numpy operation per write."""

    def __init__(self, values: torch.Tensor | list[int]) -> None:
        import torch

        if isinstance(values, torch.Tensor):
            values = values.detach().reshape(-1).tolist()
        self.tensor = torch.tensor(values, dtype=torch.long).reshape(-1, 1)
        array: Any = self.tensor.numpy()  # numpy arrays export the buffer protocol
        self.cells = memoryview(array).cast("B").cast("q")

    def advance(self) -> None:
        """Every value one more."""
        cells = self.cells
        for i in range(len(cells)):
            cells[i] += 1


# Columns of ones a growing mask has room for before its buffer is made again, and how many of
# its views it makes at a time.
_MASK_ROOM = 256
_MASK_AHEAD = 32


class _GrowingMask:
    """An attention mask (rows, width) that grows by a column of ones a step (``grow``) with no
    tensor operation in most steps: it is a view of a buffer with room on the right, already
    ones, and the views of the next ``_MASK_AHEAD`` widths are made together. ``current``: the
    mask as last grown (a mask that is not it was changed elsewhere, and needs a new one)."""

    def __init__(self, mask: torch.Tensor) -> None:
        self.current = mask
        self.width = int(mask.shape[1])
        self.buffer = mask  # no room yet: the first ``grow`` makes the buffer
        self.ahead: deque[torch.Tensor] = deque()

    def grow(self) -> torch.Tensor:
        if not self.ahead:
            self._make_ahead()
        self.width += 1
        self.current = self.ahead.popleft()
        return self.current

    def _make_ahead(self) -> None:
        import torch

        width = self.width
        if width + _MASK_AHEAD > int(self.buffer.shape[1]):
            rows = int(self.current.shape[0])
            room = width + max(_MASK_ROOM, width // 4)
            buffer = torch.ones((rows, room), dtype=self.current.dtype, device=self.current.device)
            buffer[:, :width] = self.current
            self.buffer = buffer
        self.ahead.extend(self.buffer[:, :w] for w in range(width + 1, width + 1 + _MASK_AHEAD))


def greedy(logits: torch.Tensor) -> list[int]:
    """The most likely token of each row of ``logits`` (rows, vocab), the first on a tie. On the
    CPU through numpy, whose vectorised argmax takes a few microseconds where torch's takes
    about 0.1 ms a row (its CPU argmax is a scalar loop)."""
    import torch

    if logits.device.type == "cpu" and logits.dtype == torch.float32:
        rows = logits.detach() if logits.requires_grad else logits  # no op when not needed
        best: list[int] = rows.numpy().argmax(axis=-1).tolist()
        return best
    return list(torch.argmax(logits, dim=-1).tolist())


# ---- cache surgery (rows in dim 0, token columns in dim -2, right-aligned) --------------------


def _layers(cache: Any) -> list[Any]:
    return list(cache.layers)


def check_cache(cache: Any) -> None:
    """``UnsupportedCache`` unless every layer of ``cache`` is a plain or sliding-window
    attention layer (the kinds this batch pads, joins and trims)."""
    from transformers.cache_utils import DynamicLayer, DynamicSlidingWindowLayer

    kinds = {type(layer) for layer in _layers(cache)}
    other = kinds - {DynamicLayer, DynamicSlidingWindowLayer}
    if other:
        raise UnsupportedCache(
            f"the model's KV cache has layers of type {', '.join(sorted(k.__name__ for k in other))}"
        )


def _stored(layer: Any, width: int) -> int:
    """Columns ``layer`` keeps of a cache ``width`` wide (a sliding window keeps its last ones)."""
    window = getattr(layer, "sliding_window", None)
    return width if window is None else min(width, int(window) - 1)


def _pad_left(t: torch.Tensor, width: int, dim: int = -1) -> torch.Tensor:
    import torch

    missing = width - t.shape[dim]
    if missing <= 0:
        return t
    shape = list(t.shape)
    shape[dim] = missing
    return torch.cat([t.new_zeros(shape), t], dim=dim)


def _pad_cache(cache: Any, width: int) -> None:
    """Pad every layer of ``cache`` on the left to a cache ``width`` wide."""
    for layer in _layers(cache):
        if not layer.is_initialized:
            continue
        target = _stored(layer, width)
        layer.keys = _pad_left(layer.keys, target, dim=-2)
        layer.values = _pad_left(layer.values, target, dim=-2)
        if hasattr(layer, "cumulative_length"):
            layer.cumulative_length = width


def _trim_cache(cache: Any, width: int) -> None:
    """Keep the last ``width`` columns of every layer of ``cache``."""
    for layer in _layers(cache):
        if not layer.is_initialized:
            continue
        target = _stored(layer, width)
        if layer.keys.shape[-2] > target:
            layer.keys = layer.keys[..., -target:, :] if target else layer.keys[..., :0, :]
            layer.values = layer.values[..., -target:, :] if target else layer.values[..., :0, :]
        if hasattr(layer, "cumulative_length"):
            layer.cumulative_length = width


def _select_rows(cache: Any, index: torch.Tensor) -> None:
    for layer in _layers(cache):
        if layer.is_initialized:
            layer.keys = layer.keys.index_select(0, index)
            layer.values = layer.values.index_select(0, index)
