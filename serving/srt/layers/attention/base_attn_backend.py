"""``AttentionBackend``: the contract of an attention backend over the KV pool (SGLang's name).

``forward(q, k, v, layer, forward_batch)`` runs one layer's attention for every token of
``forward_batch`` (``serving.srt.model_executor.forward_batch_info``): ``q`` is
``(tokens, tp_q_head_num, head_dim)``, ``k`` and ``v`` ``(tokens, tp_k_head_num, head_dim)``, in
the batch's token order (extend segments, then decode rows). It first stores ``k`` and ``v`` in
the pool at ``forward_batch.out_cache_loc`` (through the pool's ``set_kv_buffer``), then returns
the attention output ``(tokens, tp_q_head_num, head_dim)``, each token attending to its own
sequence's earlier tokens and itself (within ``layer.sliding_window_size`` when it is not -1).
``init_forward_metadata(forward_batch)`` is called once per forward, before any layer.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

    from serving.srt.layers.radix_attention import RadixAttention
    from serving.srt.model_executor.forward_batch_info import ForwardBatch


class AttentionBackend:
    """Base class of attention backends (the module docstring)."""

    def __init__(self, token_to_kv_pool: Any) -> None:
        self.token_to_kv_pool = token_to_kv_pool

    def init_forward_metadata(self, forward_batch: ForwardBatch) -> None:
        """Per-forward preparation shared by every layer (default: none)."""

    def forward(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        layer: RadixAttention,
        forward_batch: ForwardBatch,
    ) -> torch.Tensor:
        raise NotImplementedError
