"""``torch_native``: PyTorch's scaled dot-product attention over each sequence's slots of the KV
pool (SGLang's backend of that name, written for this runtime's ``ForwardBatch``).

An extend segment attends causally to its prefix and itself: with no prefix its new keys are
used as they come (no read of the pool); otherwise its keys and values are gathered from its
slots. The decode rows run together: their slots form one padded ``(rows, width)`` matrix (the
dummy slot 0 where a row is shorter), a mask hides the padding, and each query head group shares
its key/value head without the keys being repeated. Where the C kernel serves the layer
(``decode_kernel``: bfloat16 on a CPU with AVX-512 BF16), the decode rows read their slots in
place instead, with no gather.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from serving.srt.layers.attention.base_attn_backend import AttentionBackend
from serving.srt.layers.attention.decode_kernel import decode_attention, fits

if TYPE_CHECKING:
    import torch

    from serving.srt.layers.radix_attention import RadixAttention
    from serving.srt.model_executor.forward_batch_info import ForwardBatch


class TorchNativeAttnBackend(AttentionBackend):
    """The module docstring; the contract is ``AttentionBackend``'s."""

    def init_forward_metadata(self, forward_batch: ForwardBatch) -> None:
        self._decode_masks: dict[int, torch.Tensor | None] = {}
        positions = forward_batch.decode_positions
        self._decode_lengths = None if positions is None else (positions + 1).contiguous()

    def forward(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        layer: RadixAttention,
        forward_batch: ForwardBatch,
    ) -> torch.Tensor:
        import torch

        self.token_to_kv_pool.set_kv_buffer(layer, forward_batch.out_cache_loc, k, v)
        extend = forward_batch.extend_tokens
        if not forward_batch.decode_rows:
            return self.forward_extend(q, k, v, layer, forward_batch)
        if not extend:
            return self.forward_decode(q, layer, forward_batch)
        out = torch.empty_like(q)
        out[:extend] = self.forward_extend(q[:extend], k[:extend], v[:extend], layer, forward_batch)
        out[extend:] = self.forward_decode(q[extend:], layer, forward_batch)
        return out

    def forward_extend(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        layer: RadixAttention,
        forward_batch: ForwardBatch,
    ) -> torch.Tensor:
        import torch
        from torch.nn.functional import scaled_dot_product_attention as sdpa

        pool = self.token_to_kv_pool
        window = layer.sliding_window_size
        gqa = layer.tp_q_head_num != layer.tp_k_head_num
        outs = []
        start = 0
        for n, prefix, slots in zip(
            forward_batch.extend_seq_lens,
            forward_batch.extend_prefix_lens,
            forward_batch.extend_slots,
            strict=True,
        ):
            qi = q[start : start + n].transpose(0, 1).unsqueeze(0)
            if prefix == 0 and (window < 0 or n <= window):
                ki = k[start : start + n].transpose(0, 1).unsqueeze(0)
                vi = v[start : start + n].transpose(0, 1).unsqueeze(0)
                o = sdpa(qi, ki, vi, is_causal=True, scale=layer.scaling, enable_gqa=gqa)
            else:
                ki = pool.get_key_buffer(layer.layer_id).index_select(0, slots)
                vi = pool.get_value_buffer(layer.layer_id).index_select(0, slots)
                ki, vi = ki.transpose(0, 1).unsqueeze(0), vi.transpose(0, 1).unsqueeze(0)
                kpos = torch.arange(prefix + n, device=q.device)
                qpos = kpos[prefix:, None]
                mask = kpos[None, :] <= qpos
                if window >= 0:
                    mask &= kpos[None, :] > qpos - window
                o = sdpa(qi, ki, vi, attn_mask=mask, scale=layer.scaling, enable_gqa=gqa)
            outs.append(o[0].transpose(0, 1))
            start += n
        return outs[0] if len(outs) == 1 else torch.cat(outs)

    def forward_decode(
        self, q: torch.Tensor, layer: RadixAttention, forward_batch: ForwardBatch
    ) -> torch.Tensor:
        from torch.nn.functional import scaled_dot_product_attention as sdpa

        pool = self.token_to_kv_pool
        slots = forward_batch.decode_slots
        assert slots is not None
        rows, heads, dim = q.shape
        kv_heads = layer.tp_k_head_num
        key_buffer = pool.get_key_buffer(layer.layer_id)
        value_buffer = pool.get_value_buffer(layer.layer_id)
        lengths = getattr(self, "_decode_lengths", None)
        if lengths is not None and fits(q, key_buffer, value_buffer, layer.sliding_window_size):
            scale = layer.scaling if layer.scaling is not None else dim**-0.5
            return decode_attention(q, key_buffer, value_buffer, slots, lengths, scale)
        flat = forward_batch.decode_flat_slots
        width = slots.shape[1]
        keys = key_buffer.index_select(0, flat)
        keys = keys.view(rows, width, kv_heads, dim).transpose(1, 2)
        values = value_buffer.index_select(0, flat)
        values = values.view(rows, width, kv_heads, -1).transpose(1, 2)
        # One query position per row: a key/value head's query heads attend as its queries.
        grouped = q.reshape(rows, kv_heads, heads // kv_heads, dim)
        mask = self._decode_mask(layer.sliding_window_size, forward_batch)
        out = sdpa(grouped, keys, values, attn_mask=mask, scale=layer.scaling)
        return out.reshape(rows, heads, dim)

    def _decode_mask(self, window: int, forward_batch: ForwardBatch) -> torch.Tensor | None:
        """``(rows, 1, 1, width)``: the row's own tokens (within ``window`` of its new one);
        None when every row attends to all ``width`` (rows of one length, no window)."""
        masks: dict[int, torch.Tensor | None] | None = getattr(self, "_decode_masks", None)
        if masks is None:
            masks = self._decode_masks = {}
        if window in masks:
            return masks[window]
        import torch

        valid = forward_batch.decode_valid
        slots = forward_batch.decode_slots
        assert slots is not None and forward_batch.decode_positions is not None
        if window >= 0:
            kpos = torch.arange(slots.shape[1], device=slots.device)[None, :]
            near = kpos > forward_batch.decode_positions[:, None] - window
            valid = near if valid is None else valid & near
        mask = masks[window] = None if valid is None else valid[:, None, None, :]
        return mask
