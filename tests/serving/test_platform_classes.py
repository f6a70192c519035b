"""serving.srt.mem_cache.platform_classes: the platform chooses the KV memory classes, in
process, with platform objects of every kind a vendor writes (the real entry-point launches are
in tests/e2e/test_platform_memory.py)."""

from __future__ import annotations

import pytest
import torch

from launchspec.causes import SetupFailure
from platforms import SRTPlatform
from serving.srt.mem_cache.allocator import (
    BaseTokenToKVPoolAllocator,
    PagedTokenToKVPoolAllocator,
    TokenToKVPoolAllocator,
)
from serving.srt.mem_cache.memory_pool import MHATokenToKVPool
from serving.srt.mem_cache.platform_classes import (
    PlatformClassUnusable,
    build_memory,
    check_factory,
    memory_classes,
)

SHAPE = dict(size=16, dtype=torch.float32, head_num=2, head_dim=4, layer_num=3, device="cpu")


class VendorPool(MHATokenToKVPool):
    writes = 0

    def set_kv_buffer(self, layer, loc, cache_k, cache_v, k_scale=None, v_scale=None):
        VendorPool.writes += 1
        super().set_kv_buffer(layer, loc, cache_k, cache_v, k_scale, v_scale)


class VendorAllocator(PagedTokenToKVPoolAllocator):
    pass


class NarrowPool(MHATokenToKVPool):
    def __init__(self, size, page_size):  # cannot take SGLang's parameters
        raise AssertionError("never constructed")


def _stock_named(module: str, name: str, base: type = object) -> type:
    """A class named as SGLang's (a real ``sglang``'s, where one is installed)."""
    cls = type(name, (base,), {})
    cls.__module__ = module
    return cls


def _returning(factory):
    return lambda self, **kwargs: factory()


def platform(**methods) -> SRTPlatform:
    """An SRT platform whose methods ``name`` return ``methods[name]()``."""
    body = {name: _returning(factory) for name, factory in methods.items()}
    return type("VendorPlatform", (SRTPlatform,), body)()


def test_the_contract_default_gets_this_projects_classes():
    plain = SRTPlatform()
    assert memory_classes(plain, 1) == (MHATokenToKVPool, TokenToKVPoolAllocator)
    assert memory_classes(plain, 4) == (MHATokenToKVPool, PagedTokenToKVPoolAllocator)


def test_a_subclass_is_used_and_constructs_with_sglangs_parameters():
    vendor = platform(
        get_mha_kv_pool_cls=lambda: VendorPool, get_paged_allocator_cls=lambda: VendorAllocator
    )
    assert memory_classes(vendor, 4) == (VendorPool, VendorAllocator)
    assert memory_classes(vendor, 1) == (VendorPool, TokenToKVPoolAllocator)
    pool, allocator = build_memory(vendor, page_size=4, **SHAPE)
    assert type(pool) is VendorPool and type(allocator) is VendorAllocator
    assert allocator.get_kvcache() is pool and allocator.available_size() == 16
    assert pool.k_buffer[0].shape == (20, 2, 4) and len(pool.v_buffer) == 3
    before = VendorPool.writes
    pool.set_kv_buffer(1, allocator.alloc(4), torch.ones(4, 2, 4), torch.ones(4, 2, 4))
    assert VendorPool.writes == before + 1


def test_get_kv_pool_cls_comes_first_and_none_means_the_next():
    vendor = platform(get_kv_pool_cls=lambda: VendorPool)
    assert memory_classes(vendor, 1)[0] is VendorPool
    both = platform(get_kv_pool_cls=lambda: None, get_mha_kv_pool_cls=lambda: VendorPool)
    assert memory_classes(both, 1)[0] is VendorPool


def test_sglangs_stock_classes_by_name_are_this_projects():
    vendor = platform(
        get_mha_kv_pool_cls=lambda: _stock_named(
            "sglang.srt.mem_cache.memory_pool", "MHATokenToKVPool"
        ),
        get_paged_allocator_cls=lambda: _stock_named(
            "sglang.srt.mem_cache.allocator", "PagedTokenToKVPoolAllocator"
        ),
    )
    assert memory_classes(vendor, 2) == (MHATokenToKVPool, PagedTokenToKVPoolAllocator)
    assert "(SGLang's stock class: serving.srt.mem_cache.memory_pool.MHATokenToKVPool)" in (
        check_factory(vendor, "get_mha_kv_pool_cls")
    )


def test_a_class_that_is_not_a_subclass_is_refused_naming_it():
    vendor = platform(get_mha_kv_pool_cls=lambda: dict)
    with pytest.raises(PlatformClassUnusable) as caught:
        memory_classes(vendor, 1)
    error = caught.value
    assert isinstance(error, SetupFailure) and error.hint
    assert error.method == "get_mha_kv_pool_cls()"
    assert str(error).startswith(
        "test_platform_classes.VendorPlatform.get_mha_kv_pool_cls() returned builtins.dict"
    )
    assert "not a subclass of serving.srt.mem_cache.memory_pool.MHATokenToKVPool" in str(error)
    allocator = platform(get_paged_allocator_cls=lambda: MHATokenToKVPool)
    memory_classes(allocator, 1)  # page size 1 never asks for the paged allocator
    with pytest.raises(
        PlatformClassUnusable, match="not a subclass of .*BaseTokenToKVPoolAllocator"
    ):
        memory_classes(allocator, 4)
    with pytest.raises(
        PlatformClassUnusable, match="returned 'MHATokenToKVPool', which is not a class"
    ):
        memory_classes(platform(get_mha_kv_pool_cls=lambda: "MHATokenToKVPool"), 1)


def test_a_method_that_raises_is_named():
    def broken():
        raise ImportError("cannot import name 'Pool' from 'sglang.srt.mem_cache.memory_pool'")

    with pytest.raises(
        PlatformClassUnusable,
        match=r"get_mha_kv_pool_cls\(\) raised ImportError: cannot import name 'Pool'",
    ):
        memory_classes(platform(get_mha_kv_pool_cls=broken), 1)


def test_a_class_that_does_not_construct_is_refused_naming_it():
    vendor = platform(get_mha_kv_pool_cls=lambda: NarrowPool)
    assert memory_classes(vendor, 1)[0] is NarrowPool  # a subclass: only building it fails
    with pytest.raises(PlatformClassUnusable) as caught:
        build_memory(vendor, page_size=1, **SHAPE)
    assert (
        "test_platform_classes.NarrowPool, which failed to construct with SGLang's parameters: TypeError"
        in str(caught.value)
    )
    with pytest.raises(PlatformClassUnusable, match="NarrowPool, which failed to construct"):
        check_factory(vendor, "get_mha_kv_pool_cls")


def test_this_projects_own_errors_are_not_the_platforms():
    with pytest.raises(RuntimeError) as caught:  # torch refuses the size, not the platform
        build_memory(SRTPlatform(), page_size=1, **{**SHAPE, "size": -5})
    assert not isinstance(caught.value, SetupFailure)


def test_check_factory_describes_what_a_launch_does():
    with pytest.raises(NotImplementedError):
        check_factory(SRTPlatform(), "get_mha_kv_pool_cls")
    vendor = platform(get_paged_allocator_cls=lambda: VendorAllocator)
    assert check_factory(vendor, "get_paged_allocator_cls") == (
        "test_platform_classes.VendorAllocator: a launch uses it at --page-size > 1; it constructs "
        "with SGLang's parameters"
    )
    assert issubclass(VendorAllocator, BaseTokenToKVPoolAllocator)
