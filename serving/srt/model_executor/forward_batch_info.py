"""``ForwardBatch``: what one forward of a generation model works on, as SGLang names it.

The tokens of every sequence in the forward are laid end to end in one row (no padding): first
the *extend* segments (prompt tokens being prefilled, after whatever prefix of the prompt is
already in the KV pool), then the *decode* rows (one new token per running sequence). Each token
has a position (``positions``) and a slot of the KV pool it writes its keys and values to
(``out_cache_loc``). An attention backend reads the earlier tokens of a sequence from the pool
through the sequence's slots: ``extend_slots[i]`` (prefix and new tokens of extend segment
``i``), ``decode_slots`` (the rows' slots, padded with the dummy slot 0 where ``decode_valid``
is False).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import IntEnum
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

    from serving.srt.mem_cache.memory_pool import KVCache


class ForwardMode(IntEnum):
    EXTEND = 1
    DECODE = 2
    MIXED = 3  # extend segments and decode rows in one forward


@dataclass(eq=False)
class ForwardBatch:
    """One forward (the module docstring). ``attn_backend`` is the backend object that runs
    attention; ``token_to_kv_pool`` the pool it reads and writes."""

    token_to_kv_pool: KVCache
    attn_backend: Any
    out_cache_loc: torch.Tensor  # (tokens,) int64
    positions: torch.Tensor  # (tokens,) int64
    extend_seq_lens: list[int] = field(default_factory=list)
    extend_prefix_lens: list[int] = field(default_factory=list)
    extend_slots: list[torch.Tensor] = field(default_factory=list)  # int64, prefix + new
    decode_slots: torch.Tensor | None = None  # (rows, width) int64
    decode_flat_slots: torch.Tensor | None = None  # decode_slots as one (rows * width,) row
    decode_valid: torch.Tensor | None = None  # (rows, width) bool; None: every slot is the row's
    decode_positions: torch.Tensor | None = None  # (rows,) int64: each row's new position
    input_ids: torch.Tensor | None = None  # (tokens,) int64, for a decode runner's replay

    @property
    def extend_tokens(self) -> int:
        return sum(self.extend_seq_lens)

    @property
    def decode_rows(self) -> int:
        return 0 if self.decode_slots is None else int(self.decode_slots.shape[0])

    @property
    def forward_mode(self) -> ForwardMode:
        if self.decode_rows and self.extend_seq_lens:
            return ForwardMode.MIXED
        return ForwardMode.DECODE if self.decode_rows else ForwardMode.EXTEND

    @property
    def batch_size(self) -> int:
        return len(self.extend_seq_lens) + self.decode_rows
