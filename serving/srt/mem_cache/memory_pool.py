"""The request-to-token table (``ReqToTokenPool``) and the token-to-KV pool (``KVCache``,
``MHATokenToKVPool``), as SGLang names them.

A *slot* is one token's place in the KV pool: for every layer, its keys and values. Slot 0 is a
dummy that nothing owns: a padded index points there, so a gather over padding reads valid
memory. Slots ``1..size`` are handed out by an allocator (``allocator``).

``ReqToTokenPool`` maps a running request (a row, ``req_pool_idx``) to the slots of its tokens in
order: ``req_to_token[row, i]`` is the slot of the request's token ``i``.

``MHATokenToKVPool`` holds per-layer key and value buffers of ``size + page_size`` slots, each
``[slots, head_num, head_dim]``, allocated once when it is made and never resized or copied.
A vendor's subclass may override any method; the runtime writes keys and values only through
``set_kv_buffer`` and reads them only through ``get_key_buffer`` / ``get_value_buffer``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch


class ReqToTokenPool:
    """``size`` rows of ``max_context_len`` slots: row ``r`` lists the slots of request ``r``'s
    tokens. Rows are taken with ``alloc`` and given back with ``free``."""

    def __init__(
        self,
        size: int,
        max_context_len: int,
        device: str | torch.device,
        enable_memory_saver: bool = False,
    ) -> None:
        import torch

        self.size = int(size)
        self.max_context_len = int(max_context_len)
        self.device = device
        self.req_to_token = torch.zeros(
            (self.size, self.max_context_len), dtype=torch.int32, device=device
        )
        self.free_slots = list(range(self.size))

    def write(self, indices: Any, values: torch.Tensor) -> None:
        """``req_to_token[indices] = values`` (SGLang's spelling of the write)."""
        self.req_to_token[indices] = values

    def available_size(self) -> int:
        return len(self.free_slots)

    def alloc(self, need_size: int) -> list[int] | None:
        """``need_size`` free rows, or None when fewer are free."""
        if need_size > len(self.free_slots):
            return None
        taken, self.free_slots = self.free_slots[:need_size], self.free_slots[need_size:]
        return taken

    def free(self, free_index: int | list[int]) -> None:
        if isinstance(free_index, int):
            self.free_slots.append(free_index)
        else:
            self.free_slots.extend(free_index)

    def clear(self) -> None:
        self.free_slots = list(range(self.size))


class KVCache:
    """The base of every token-to-KV pool: ``size`` slots of ``layer_num`` layers, in pages of
    ``page_size`` slots, on ``device``, in ``dtype``."""

    def __init__(
        self,
        size: int,
        page_size: int,
        dtype: torch.dtype,
        layer_num: int,
        device: str | torch.device,
        enable_memory_saver: bool = False,
        start_layer: int | None = None,
        end_layer: int | None = None,
    ) -> None:
        self.size = int(size)
        self.page_size = int(page_size)
        self.dtype = dtype
        self.store_dtype = dtype
        self.layer_num = int(layer_num)
        self.device = device
        self.start_layer = start_layer or 0
        self.end_layer = end_layer if end_layer is not None else self.layer_num - 1

    def get_key_buffer(self, layer_id: int) -> torch.Tensor:
        raise NotImplementedError

    def get_value_buffer(self, layer_id: int) -> torch.Tensor:
        raise NotImplementedError

    def get_kv_buffer(self, layer_id: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.get_key_buffer(layer_id), self.get_value_buffer(layer_id)

    def set_kv_buffer(
        self,
        layer: Any,
        loc: torch.Tensor,
        cache_k: torch.Tensor,
        cache_v: torch.Tensor,
        k_scale: float | None = None,
        v_scale: float | None = None,
    ) -> None:
        raise NotImplementedError

    def get_kv_size_bytes(self) -> tuple[int, int]:
        raise NotImplementedError


def layer_id_of(layer: Any) -> int:
    """The layer index ``set_kv_buffer`` was given: an int, or an object with ``layer_id`` (an
    SGLang ``RadixAttention``)."""
    return layer if isinstance(layer, int) else int(layer.layer_id)


class MHATokenToKVPool(KVCache):
    """Keys and values of multi-head (and grouped-query) attention: per layer a key buffer and a
    value buffer of ``[size + page_size, head_num, head_dim]`` (the module docstring)."""

    def __init__(
        self,
        size: int,
        page_size: int,
        dtype: torch.dtype,
        head_num: int,
        head_dim: int,
        layer_num: int,
        device: str | torch.device,
        enable_memory_saver: bool = False,
        start_layer: int | None = None,
        end_layer: int | None = None,
        **kwargs: Any,
    ) -> None:
        import torch

        super().__init__(
            size, page_size, dtype, layer_num, device, enable_memory_saver, start_layer, end_layer
        )
        self.head_num = int(head_num)
        self.head_dim = int(head_dim)
        self.v_head_dim = int(kwargs.get("v_head_dim") or head_dim)
        shape = (self.size + self.page_size, self.head_num)
        # Uninitialised, so the memory is committed as slots are first written; the dummy page
        # is zeroed, as a padded read lands there (a masked read of garbage could be NaN).
        self.k_buffer = [
            torch.empty((*shape, self.head_dim), dtype=dtype, device=device)
            for _ in range(self.layer_num)
        ]
        self.v_buffer = [
            torch.empty((*shape, self.v_head_dim), dtype=dtype, device=device)
            for _ in range(self.layer_num)
        ]
        for buffer in (*self.k_buffer, *self.v_buffer):
            buffer[: self.page_size].zero_()

    def get_key_buffer(self, layer_id: int) -> torch.Tensor:
        return self.k_buffer[layer_id - self.start_layer]

    def get_value_buffer(self, layer_id: int) -> torch.Tensor:
        return self.v_buffer[layer_id - self.start_layer]

    def set_kv_buffer(
        self,
        layer: Any,
        loc: torch.Tensor,
        cache_k: torch.Tensor,
        cache_v: torch.Tensor,
        k_scale: float | None = None,
        v_scale: float | None = None,
    ) -> None:
        """Write ``cache_k`` / ``cache_v`` (``[tokens, head_num, head_dim]``) into the slots
        ``loc`` of ``layer``'s buffers (``k_scale`` / ``v_scale`` divide them first, as SGLang's
        quantised caches do)."""
        index = layer_id_of(layer) - self.start_layer
        if k_scale is not None:
            cache_k = cache_k / k_scale
        if v_scale is not None:
            cache_v = cache_v / v_scale
        self.k_buffer[index].index_copy_(0, loc, cache_k.to(self.store_dtype))
        self.v_buffer[index].index_copy_(0, loc, cache_v.to(self.store_dtype))

    def get_kv_size_bytes(self) -> tuple[int, int]:
        """Bytes of all key buffers and of all value buffers."""
        k = sum(b.numel() * b.element_size() for b in self.k_buffer)
        v = sum(b.numel() * b.element_size() for b in self.v_buffer)
        return k, v
