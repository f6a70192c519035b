"""serving.srt.mem_cache.radix_cache: SGLang's radix prefix cache, over the real pool and
allocators (serving.srt.mem_cache.memory_pool / allocator)."""

from __future__ import annotations

import random

import pytest
import torch

from serving.srt.mem_cache.allocator import PagedTokenToKVPoolAllocator, TokenToKVPoolAllocator
from serving.srt.mem_cache.memory_pool import MHATokenToKVPool, ReqToTokenPool
from serving.srt.mem_cache.radix_cache import MatchResult, RadixCache, TreeNode


def make(size: int = 64, page_size: int = 1, disable: bool = False):
    pool = MHATokenToKVPool(size, page_size, torch.float32, 1, 2, 1, "cpu")
    if page_size == 1:
        allocator = TokenToKVPoolAllocator(size, torch.float32, "cpu", pool)
    else:
        allocator = PagedTokenToKVPoolAllocator(size, page_size, torch.float32, "cpu", pool)
    req_to_token = ReqToTokenPool(4, 128, "cpu")
    return RadixCache(req_to_token, allocator, page_size=page_size, disable=disable), allocator


def put(cache: RadixCache, allocator, key: list[int]) -> int:
    """What a finished request does: its slots go to the tree; the duplicates are freed."""
    slots = allocator.alloc(len(key))
    assert slots is not None
    cached = cache.insert(key, slots)
    allocator.free(slots[:cached])
    return cached


def check_sizes(cache: RadixCache) -> None:
    evictable = protected = 0
    stack = list(cache.root_node.children.values())
    while stack:
        node = stack.pop()
        assert len(node.key) == len(node.value) and len(node.key) % cache.page_size == 0
        assert node.value.dtype == torch.int64
        if node.lock_ref:
            protected += len(node.key)
        else:
            evictable += len(node.key)
            assert all(c.lock_ref == 0 for c in node.children.values())
        for first, child in node.children.items():
            assert child.parent is node and child.key[: cache.page_size] == first
        stack.extend(node.children.values())
    assert (cache.evictable_size(), cache.protected_size()) == (evictable, protected)
    assert cache.total_size() == evictable + protected


def test_shared_prefixes_and_splits():
    cache, allocator = make()
    assert put(cache, allocator, [1, 2, 3, 4, 5]) == 0
    assert put(cache, allocator, [1, 2, 3, 9, 9]) == 3  # splits the first edge after 3
    assert put(cache, allocator, [1, 2, 3, 4, 5]) == 5
    assert cache.total_size() == 7 and allocator.available_size() == 64 - 7
    root = cache.root_node
    (head,) = root.children.values()
    assert head.key == (1, 2, 3) and len(head.children) == 2

    match = cache.match_prefix([1, 2, 3, 4, 7])
    assert isinstance(match, MatchResult) and isinstance(match.last_device_node, TreeNode)
    assert (
        match.device_indices.tolist()
        == cache.match_prefix([1, 2, 3, 4, 5]).device_indices[:4].tolist()
    )
    assert match.last_device_node.key == (4,)  # the match ended inside (4, 5): split there
    assert cache.match_prefix([7, 1]).device_indices.numel() == 0
    assert cache.match_prefix([]).last_device_node is root
    check_sizes(cache)


def test_slots_come_back_in_order_of_the_key():
    cache, allocator = make()
    slots = allocator.alloc(6)
    cache.insert([5, 6, 7, 8, 9, 10], slots)
    cache.match_prefix([5, 6, 7, 1])  # split
    found = cache.match_prefix([5, 6, 7, 8, 9, 10, 11]).device_indices
    assert found.dtype == torch.int64 and found.dim() == 1
    assert found.tolist() == slots.tolist()


def test_page_size_4_matches_and_splits_whole_pages():
    cache, allocator = make(page_size=4)
    assert put(cache, allocator, list(range(8))) == 0
    # Shares 6 tokens, but only one whole page.
    assert put(cache, allocator, [0, 1, 2, 3, 4, 5, 90, 91]) == 4
    assert cache.match_prefix(list(range(7))).device_indices.numel() == 4
    assert cache.match_prefix([0, 1, 2]).device_indices.numel() == 0
    assert cache.match_prefix(list(range(10))).device_indices.numel() == 8
    with pytest.raises(AssertionError):
        cache.insert([1, 2, 3], torch.tensor([1, 2, 3]))
    check_sizes(cache)
    cache.evict(1000)
    assert cache.total_size() == 0 and allocator.available_size() == 64


def test_lru_order_of_eviction():
    cache, allocator = make()
    for first in (10, 20, 30):
        put(cache, allocator, [first, first + 1])
    cache.match_prefix([10, 11])  # 10 used last now; 20 is the oldest
    assert cache.evict(1) == 2
    assert cache.match_prefix([20, 21]).device_indices.numel() == 0
    assert cache.evict(1) == 2
    assert cache.match_prefix([30, 31]).device_indices.numel() == 0
    assert cache.match_prefix([10, 11]).device_indices.numel() == 2
    assert allocator.available_size() == 64 - 2


def test_a_parent_left_without_children_is_evicted_in_its_turn():
    cache, allocator = make()
    put(cache, allocator, [1, 2, 3])
    put(cache, allocator, [1, 2, 4])
    assert cache.evict(100) == 4
    assert cache.total_size() == 0 and allocator.available_size() == 64


def test_locked_nodes_are_never_evicted():
    cache, allocator = make()
    put(cache, allocator, [1, 2, 3, 4])
    put(cache, allocator, [1, 2, 7, 8])
    put(cache, allocator, [5, 6])
    node = cache.match_prefix([1, 2, 3, 4]).last_device_node
    assert cache.inc_lock_ref(node) == -4  # (1, 2) and (3, 4)
    assert (cache.evictable_size(), cache.protected_size()) == (4, 4)
    assert cache.evict(100) == 4  # (7, 8) and (5, 6) only
    assert cache.match_prefix([1, 2, 3, 4]).device_indices.numel() == 4
    check_sizes(cache)
    # A second holder of the same prefix; both must let go before it is evictable.
    cache.inc_lock_ref(node)
    assert cache.dec_lock_ref(node) == 0
    assert cache.evict(100) == 0
    assert cache.dec_lock_ref(node) == 4
    assert cache.evict(100) == 4 and allocator.available_size() == 64


def test_a_split_keeps_the_lock_of_the_node_it_cuts():
    cache, allocator = make()
    put(cache, allocator, [1, 2, 3, 4])
    node = cache.match_prefix([1, 2, 3, 4]).last_device_node
    cache.inc_lock_ref(node)
    put(cache, allocator, [1, 2, 9])  # splits the locked edge
    check_sizes(cache)
    assert (cache.evictable_size(), cache.protected_size()) == (1, 4)
    cache.dec_lock_ref(node)
    check_sizes(cache)
    assert cache.evict(100) == 5 and allocator.available_size() == 64


def test_disabled_cache_holds_nothing():
    cache, allocator = make(disable=True)
    slots = allocator.alloc(3)
    assert cache.insert([1, 2, 3], slots) == 0
    match = cache.match_prefix([1, 2, 3])
    assert match.device_indices.numel() == 0 and match.last_device_node is cache.root_node
    assert cache.total_size() == 0 and cache.evict(10) == 0


def test_reset_forgets_everything():
    cache, allocator = make()
    put(cache, allocator, [1, 2, 3])
    cache.reset()
    assert cache.total_size() == 0 and cache.evictable_size() == 0
    assert cache.match_prefix([1, 2, 3]).device_indices.numel() == 0


def _contents(cache: RadixCache) -> dict[tuple[int, ...], tuple[int, ...]]:
    """Every cached page-aligned prefix -> the slots of its last page."""
    ps = cache.page_size
    found: dict[tuple[int, ...], tuple[int, ...]] = {}
    stack: list[tuple[TreeNode, tuple[int, ...]]] = [(cache.root_node, ())]
    while stack:
        node, prefix = stack.pop()
        for child in node.children.values():
            slots = child.value.tolist()
            for end in range(ps, len(child.key) + 1, ps):
                found[prefix + child.key[:end]] = tuple(slots[end - ps : end])
            stack.append((child, prefix + child.key))
    return found


def _cached_len(model: dict, key: list[int], page_size: int) -> int:
    n = 0
    while n + page_size <= len(key) and tuple(key[: n + page_size]) in model:
        n += page_size
    return n


@pytest.mark.parametrize("page_size", [1, 4])
@pytest.mark.parametrize("seed", range(6))
def test_random_operations_against_a_reference_model(seed, page_size):
    rng = random.Random(seed)
    size = 96
    ps = page_size
    cache, allocator = make(size=size, page_size=page_size)
    model: dict[
        tuple[int, ...], tuple[int, ...]
    ] = {}  # page-aligned prefix -> its last page's slots
    locks: list[tuple[TreeNode, tuple[int, ...]]] = []
    stems = [[rng.randrange(4) for _ in range(rng.randrange(0, 12))] for _ in range(4)]

    def random_key() -> list[int]:
        key = rng.choice(stems) + [rng.randrange(4) for _ in range(rng.randrange(0, 10))]
        return key[: len(key) - len(key) % ps]

    for _ in range(300):
        op = rng.random()
        if op < 0.4:
            key = random_key()
            if not key:
                continue
            if allocator.available_size() < len(key):
                cache.evict(len(key) - allocator.available_size())
                after = _contents(cache)
                model = {k: v for k, v in model.items() if k in after}
            slots = allocator.alloc(len(key))
            if slots is None:
                continue
            cached = cache.insert(key, slots)
            assert cached == _cached_len(model, key, ps)
            allocator.free(slots[:cached])
            for end in range(cached + ps, len(key) + 1, ps):
                model[tuple(key[:end])] = tuple(slots[end - ps : end].tolist())
        elif op < 0.65:
            key = random_key() + [9]
            match = cache.match_prefix(key)
            n = _cached_len(model, key, ps)
            expected = [s for end in range(ps, n + 1, ps) for s in model[tuple(key[:end])]]
            assert match.device_indices.tolist() == expected
            if n and rng.random() < 0.5:
                cache.inc_lock_ref(match.last_device_node)
                locks.append((match.last_device_node, tuple(key[:n])))
        elif op < 0.8 and locks:
            node, _ = locks.pop(rng.randrange(len(locks)))
            cache.dec_lock_ref(node)
        else:
            want = rng.randrange(1, 20)
            freed = cache.evict(want)
            after = _contents(cache)
            removed = set(model) - set(after)
            assert len(removed) * ps == freed
            assert freed >= want or cache.evictable_size() == 0
            assert not set(after) - set(model)
            for _, prefix in locks:  # a held prefix stays whole
                assert all(prefix[:end] in after for end in range(ps, len(prefix) + 1, ps))
            model = {k: v for k, v in model.items() if k in after}
        assert _contents(cache) == model
        check_sizes(cache)
        held = cache.all_values_flatten().tolist()
        assert len(held) == len(set(held)) == cache.total_size()
        assert allocator.available_size() + cache.total_size() == size

    for node, _ in locks:
        cache.dec_lock_ref(node)
    assert cache.protected_size() == 0
    cache.evict(size)
    assert cache.total_size() == 0 and allocator.available_size() == size
    # Every slot handed out again exactly once: nothing was freed twice.
    everything = allocator.alloc(size)
    assert everything is not None and len(set(everything.tolist())) == size
    assert allocator.alloc(ps) is None
