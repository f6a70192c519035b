"""``RadixAttention``: what an attention backend knows of one attention layer, as SGLang names
it (``layer_id``, head counts on this rank, ``head_dim``, ``scaling``, ``sliding_window_size``:
-1 for none). The runtime makes one per transformers attention module, the first time that
module runs over the KV pool (``hf_attention``)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class RadixAttention:
    layer_id: int
    tp_q_head_num: int
    tp_k_head_num: int
    tp_v_head_num: int
    head_dim: int
    scaling: float
    sliding_window_size: int = -1
    is_cross_attention: bool = False
