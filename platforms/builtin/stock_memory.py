"""``StockMemory``: the KV memory factories of the built-in SRT platforms, as SGLang's own
platforms answer them: SGLang's stock classes, by SGLang's module names; ``StockGraphRunner``,
the graph runner of the platforms that capture device graphs (SGLang's ``CudaGraphRunner``).

The imports run when a method is called, never at import time, and name SGLang's modules only:
where sglang-launch runs, its aliases of SGLang's names make them the runtime's classes, as
they do for a vendor plugin that returns the same names; ``platforms`` names nothing of ours.
"""

from __future__ import annotations

import importlib


def _stock(module: str, name: str) -> type:
    cls: type = getattr(importlib.import_module(module), name)
    return cls


class StockMemory:
    """Mixed in before ``SRTPlatform``: the stock MHA pool and paged allocator."""

    def get_mha_kv_pool_cls(self) -> type:
        """SGLang's ``MHATokenToKVPool``: per-layer K and V buffers, any torch device."""
        return _stock("sglang.srt.mem_cache.memory_pool", "MHATokenToKVPool")

    def get_paged_allocator_cls(self) -> type:
        """SGLang's ``PagedTokenToKVPoolAllocator``."""
        return _stock("sglang.srt.mem_cache.allocator", "PagedTokenToKVPoolAllocator")


class StockGraphRunner:
    """Mixed in before ``SRTPlatform`` by a platform whose ``support_cuda_graph()`` is true."""

    def get_graph_runner_cls(self) -> type:
        """SGLang's ``CudaGraphRunner``: the decode step captured in device graphs."""
        return _stock("sglang.srt.model_executor.cuda_graph_runner", "CudaGraphRunner")
