"""Platform plugins (real dist-info entry points) whose memory factories are each kind a vendor
writes: a subclass of SGLang's stock pool that records its ``set_kv_buffer`` calls in the file
named by ``MARK_KV_WRITES``, SGLang's stock classes by SGLang's module names, and a class a
launch cannot use. Used by tests/e2e/test_platform_memory.py and
tests/conformance/test_check_platform_memory.py."""

from __future__ import annotations

from pathlib import Path

from support.plugins import platform_plugin

_ATTENTION = "def get_default_attention_backend(self):\n    return 'torch_native'\n"

SUBCLASS = (
    _ATTENTION
    + """
def get_mha_kv_pool_cls(self):
    import os
    from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool

    class MarkingPool(MHATokenToKVPool):
        def set_kv_buffer(self, layer, loc, cache_k, cache_v, k_scale=None, v_scale=None):
            path = os.environ.get("MARK_KV_WRITES")
            if path:
                with open(path, "a") as f:
                    f.write(f"{getattr(layer, 'layer_id', layer)} {len(loc)}\\n")
            super().set_kv_buffer(layer, loc, cache_k, cache_v, k_scale, v_scale)

    return MarkingPool
"""
)

STOCK = (
    _ATTENTION
    + """
def get_mha_kv_pool_cls(self):
    from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool
    return MHATokenToKVPool

def get_paged_allocator_cls(self):
    from sglang.srt.mem_cache.allocator import PagedTokenToKVPoolAllocator
    return PagedTokenToKVPoolAllocator
"""
)

BAD = (
    _ATTENTION
    + """
def get_mha_kv_pool_cls(self):
    return dict

def get_paged_allocator_cls(self):
    from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool

    class NarrowAllocator(MHATokenToKVPool):
        pass

    return NarrowAllocator
"""
)


def memory_plugins(site: Path) -> dict[str, str]:
    """Write the three platforms into ``site``: ``{"subpool": package, "stockpool": ...,
    "badpool": ...}`` (select one with ``SGLANG_PLATFORM=<key>``)."""
    return {
        name: platform_plugin(site, name, class_body=body, tag="mem")
        for name, body in (("subpool", SUBCLASS), ("stockpool", STOCK), ("badpool", BAD))
    }
