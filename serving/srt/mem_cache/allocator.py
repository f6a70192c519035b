"""Which KV slots are free: ``TokenToKVPoolAllocator`` (one slot at a time) and
``PagedTokenToKVPoolAllocator`` (whole pages of ``page_size`` slots), as SGLang names them.

Slots are ``1..size`` of the pool they allocate for (``kvcache``, a ``KVCache``); slot 0 (page 0
of a paged allocator) is the pool's dummy and never handed out. ``alloc(n)`` returns ``n`` slot
indices (an int64 tensor) or None when fewer are free; ``free(indices)`` gives slots back (a
paged allocator frees the pages the indices fall in: a page is owned by one holder, who frees it
whole). Frees are merged into the free list at the next ``alloc`` (sorted with ``need_sort``,
so that slots handed out together lie together).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

    from serving.srt.mem_cache.memory_pool import KVCache


class BaseTokenToKVPoolAllocator:
    """What every allocator offers (the module docstring)."""

    def __init__(
        self,
        size: int,
        page_size: int,
        dtype: torch.dtype,
        device: str | torch.device,
        kvcache: KVCache,
        need_sort: bool = False,
    ) -> None:
        self.size = int(size)
        self.page_size = int(page_size)
        self.dtype = dtype
        self.device = device
        self._kvcache = kvcache
        self.need_sort = need_sort
        self.clear()

    def get_kvcache(self) -> KVCache:
        return self._kvcache

    # The free list holds units: slots (page_size 1) or page numbers.
    def clear(self) -> None:
        import torch

        units = self.size // self.page_size
        self.free_units = torch.arange(1, units + 1, dtype=torch.int64, device=self.device)
        self.released: list[torch.Tensor] = []

    def _merge(self) -> None:
        import torch

        if self.released:
            merged = torch.cat([self.free_units, *self.released])
            self.free_units = merged.sort().values if self.need_sort else merged
            self.released = []

    def available_size(self) -> int:
        """Free slots."""
        pending = sum(int(r.numel()) for r in self.released)
        return (int(self.free_units.numel()) + pending) * self.page_size

    def _take(self, units: int) -> torch.Tensor | None:
        if units > self.free_units.numel():
            self._merge()
            if units > self.free_units.numel():
                return None
        taken, self.free_units = self.free_units[:units], self.free_units[units:]
        return taken

    def alloc(self, need_size: int) -> torch.Tensor | None:
        raise NotImplementedError

    def free(self, free_index: torch.Tensor) -> None:
        raise NotImplementedError


class TokenToKVPoolAllocator(BaseTokenToKVPoolAllocator):
    """One slot at a time."""

    def __init__(
        self,
        size: int,
        dtype: torch.dtype,
        device: str | torch.device,
        kvcache: KVCache,
        need_sort: bool = False,
    ) -> None:
        super().__init__(size, 1, dtype, device, kvcache, need_sort)

    def alloc(self, need_size: int) -> torch.Tensor | None:
        return self._take(need_size)

    def free(self, free_index: torch.Tensor) -> None:
        if free_index.numel():
            self.released.append(free_index.to(dtype=self.free_units.dtype))


class PagedTokenToKVPoolAllocator(BaseTokenToKVPoolAllocator):
    """Whole pages of ``page_size`` slots: ``alloc(n)`` needs ``n`` a multiple of
    ``page_size`` and returns the slots of ``n / page_size`` pages, each page's in order. Its
    constructor is the base's (SGLang's parameters)."""

    def alloc(self, need_size: int) -> torch.Tensor | None:
        import torch

        if need_size % self.page_size:
            raise ValueError(
                f"a paged allocator hands out whole pages: {need_size} is not a multiple of "
                f"page_size {self.page_size}"
            )
        pages = self._take(need_size // self.page_size)
        if pages is None:
            return None
        offsets = torch.arange(self.page_size, dtype=torch.int64, device=pages.device)
        return (pages[:, None] * self.page_size + offsets).reshape(-1)

    def free(self, free_index: torch.Tensor) -> None:
        import torch

        if free_index.numel():
            self.released.append(torch.unique(free_index.to(torch.int64) // self.page_size))
