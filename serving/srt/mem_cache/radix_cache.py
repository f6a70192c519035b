"""SGLang's RadixAttention prefix cache: the KV slots of token sequences, kept in a radix tree.

Each edge of the tree holds a run of token ids (``TreeNode.key``) and the KV slots of those
tokens (``TreeNode.value``, an int64 tensor of the same length). The path from the root to a node
spells a token prefix; its slots are the concatenation of the values on the path. The tree owns
the slots it holds: it frees them (``token_to_kv_pool_allocator.free``) only when it evicts them.

Contracts:

- Every key and value length in the tree is a multiple of ``page_size``: ``insert`` asserts its
  arguments are, ``match_prefix`` matches whole pages only and splits nodes at page boundaries,
  so each node owns whole pages (what a paged allocator frees).
- ``match_prefix(key)`` returns the slots of the longest cached page-aligned prefix of ``key`` and
  the node where it ends (splitting a node when the match ends inside it), and refreshes the
  access time of every node on the path.
- ``insert(key, value)`` stores ``key -> value`` and returns how many leading tokens of ``key``
  were cached already: ``value[:n]`` are then duplicates of slots the tree holds, which the
  caller frees; the tree keeps a copy of the rest of ``value``.
- ``inc_lock_ref(node)`` / ``dec_lock_ref(node)`` lock / unlock the whole path from ``node`` to
  the root (a running request's prefix). A node with ``lock_ref > 0`` is never evicted.
  ``evictable_size()`` counts the tokens of unlocked nodes, ``protected_size()`` those of locked
  ones, exactly; their sum is ``total_size()``.
- ``evict(num_tokens)`` frees unlocked leaves, least recently used first (a parent left without
  children becomes a candidate in its turn), until ``num_tokens`` are freed or nothing is left
  to evict; it returns the number of tokens freed.
- ``reset()`` forgets every node without freeing slots (whoever resets also clears the
  allocator and the pools, as SGLang's ``flush_cache`` does).

With ``disable=True`` the tree stays empty: ``match_prefix`` returns an empty match at the root,
``insert`` stores nothing and returns 0, ``evict`` frees nothing.
"""

from __future__ import annotations

import heapq
import itertools
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, NamedTuple

if TYPE_CHECKING:
    import torch


class TreeNode:
    """One edge of the radix tree and the node it leads to.

    ``children`` maps the first page of a child's key (a tuple of ``page_size`` token ids) to the
    child; ``key`` is this edge's token ids, ``value`` their slots (int64, same length);
    ``lock_ref`` counts the requests holding this node; ``last_access_time`` orders eviction.
    """

    _ids = itertools.count()

    def __init__(self) -> None:
        self.children: dict[tuple[int, ...], TreeNode] = {}
        self.parent: TreeNode | None = None
        self.key: tuple[int, ...] = ()
        self.value: Any = None  # torch.Tensor (int64); an empty one at the root
        self.lock_ref = 0
        self.last_access_time = 0.0
        self.id = next(TreeNode._ids)

    def __repr__(self) -> str:
        head = ", ".join(map(str, self.key[:8])) + (", ..." if len(self.key) > 8 else "")
        return f"TreeNode(id={self.id}, key=[{head}] ({len(self.key)}), lock_ref={self.lock_ref})"


class MatchResult(NamedTuple):
    """What ``match_prefix`` found: ``device_indices``, the slots of the cached prefix (int64,
    1-D, possibly empty), and ``last_device_node``, the node where that prefix ends (the root for
    an empty match), the node a request locks to hold its prefix."""

    device_indices: torch.Tensor
    last_device_node: TreeNode


class RadixCache:
    """The prefix cache (the module docstring states its contracts)."""

    def __init__(
        self,
        req_to_token_pool: Any,
        token_to_kv_pool_allocator: Any,
        page_size: int = 1,
        disable: bool = False,
    ) -> None:
        import torch

        if page_size < 1:
            raise ValueError(f"page_size must be at least 1, not {page_size}")
        self.req_to_token_pool = req_to_token_pool
        self.token_to_kv_pool_allocator = token_to_kv_pool_allocator
        self.page_size = int(page_size)
        self.disable = disable
        device = getattr(token_to_kv_pool_allocator, "device", None)
        self.device = torch.device(device) if device is not None else torch.device("cpu")
        self._last_time = 0.0
        self.reset()

    # -- public API ----------------------------------------------------------------------------
    def reset(self) -> None:
        """Forget every node (slots are not freed: the module docstring)."""
        import torch

        self._empty = torch.empty((0,), dtype=torch.int64, device=self.device)
        self.root_node = TreeNode()
        self.root_node.value = self._empty
        self.root_node.lock_ref = 1  # never evicted, never counted
        self.root_node.last_access_time = self._now()
        self.evictable_size_ = 0
        self.protected_size_ = 0
        self._evictable_leaves: set[TreeNode] = set()

    def match_prefix(self, key: Sequence[int]) -> MatchResult:
        """The longest cached prefix of ``key`` in whole pages (the module docstring)."""
        aligned = len(key) - len(key) % self.page_size
        if self.disable or aligned == 0:
            return MatchResult(self._empty, self.root_node)
        values, node = self._walk(tuple(key[:aligned]))
        return MatchResult(self._cat(values), node)

    def insert(self, key: Sequence[int], value: torch.Tensor) -> int:
        """Store ``key -> value``; the number of leading tokens of ``key`` already cached (the
        caller frees ``value[:n]``)."""
        if self.disable:
            return 0
        import torch

        assert len(key) == len(value), f"key of {len(key)} tokens, value of {len(value)} slots"
        assert len(key) % self.page_size == 0, (
            f"insert needs whole pages: {len(key)} tokens with page_size {self.page_size}"
        )
        key = tuple(key)
        now = self._now()
        node = self.root_node
        node.last_access_time = now
        matched = 0
        while matched < len(key):
            child = node.children.get(self._page(key, matched))
            if child is None:
                break
            child.last_access_time = now
            common = self._common(child.key, key, matched)
            matched += common
            node = self._split(child, common) if common < len(child.key) else child
            if common < len(child.key):
                break
        if matched < len(key):
            leaf = TreeNode()
            leaf.parent = node
            leaf.key = key[matched:]
            leaf.value = value[matched:].to(device=self.device, dtype=torch.int64, copy=True)
            leaf.last_access_time = now
            node.children[self._page(key, matched)] = leaf
            self.evictable_size_ += len(leaf.key)
            self._refresh_leaf(node)
            self._refresh_leaf(leaf)
        return matched

    def evict(self, num_tokens: int) -> int:
        """Free least-recently-used unlocked leaves until ``num_tokens`` are freed or none is
        left; the number of tokens freed."""
        if self.disable or num_tokens <= 0:
            return 0
        heap = [(leaf.last_access_time, leaf.id, leaf) for leaf in self._evictable_leaves]
        heapq.heapify(heap)
        freed = 0
        while freed < num_tokens and heap:
            _, _, leaf = heapq.heappop(heap)
            self.token_to_kv_pool_allocator.free(leaf.value)
            freed += len(leaf.key)
            parent = self._delete_leaf(leaf)
            if parent in self._evictable_leaves:
                heapq.heappush(heap, (parent.last_access_time, parent.id, parent))
        return freed

    def inc_lock_ref(self, node: TreeNode) -> int:
        """Lock the path from ``node`` to the root; the change of ``evictable_size()``."""
        if self.disable:
            return 0
        delta = 0
        while node is not self.root_node:
            if node.lock_ref == 0:
                self.evictable_size_ -= len(node.key)
                self.protected_size_ += len(node.key)
                delta -= len(node.key)
            node.lock_ref += 1
            self._refresh_leaf(node)
            node = self._parent(node)
        return delta

    def dec_lock_ref(self, node: TreeNode) -> int:
        """Unlock the path from ``node`` to the root; the change of ``evictable_size()``."""
        if self.disable:
            return 0
        delta = 0
        while node is not self.root_node:
            assert node.lock_ref > 0, f"{node!r} is not locked"
            if node.lock_ref == 1:
                self.evictable_size_ += len(node.key)
                self.protected_size_ -= len(node.key)
                delta += len(node.key)
            node.lock_ref -= 1
            self._refresh_leaf(node)
            node = self._parent(node)
        return delta

    def evictable_size(self) -> int:
        """Tokens held by unlocked nodes."""
        return self.evictable_size_

    def protected_size(self) -> int:
        """Tokens held by locked nodes (running requests' prefixes)."""
        return self.protected_size_

    def total_size(self) -> int:
        """Tokens held by the tree, counted node by node."""
        total, stack = 0, [self.root_node]
        while stack:
            node = stack.pop()
            total += len(node.key)
            stack.extend(node.children.values())
        return total

    def all_values_flatten(self) -> torch.Tensor:
        """Every slot the tree holds, concatenated (1-D int64)."""
        values, stack = [], [self.root_node]
        while stack:
            node = stack.pop()
            if node is not self.root_node:
                values.append(node.value)
            stack.extend(node.children.values())
        return self._cat(values)

    # -- internals -------------------------------------------------------------------------------
    def _now(self) -> float:
        """A monotonic clock that never repeats, so LRU order has no ties."""
        now = time.monotonic()
        self._last_time = now if now > self._last_time else self._last_time + 1e-9
        return self._last_time

    def _page(self, key: tuple[int, ...], start: int) -> tuple[int, ...]:
        return key[start : start + self.page_size]

    def _common(self, edge: tuple[int, ...], key: tuple[int, ...], start: int) -> int:
        """Tokens ``edge`` shares with ``key[start:]``, rounded down to whole pages."""
        limit = min(len(edge), len(key) - start)
        n = 0
        while n < limit and edge[n] == key[start + n]:
            n += 1
        return n - n % self.page_size

    def _walk(self, key: tuple[int, ...]) -> tuple[list[torch.Tensor], TreeNode]:
        now = self._now()
        node = self.root_node
        node.last_access_time = now
        values: list[torch.Tensor] = []
        matched = 0
        while matched < len(key):
            child = node.children.get(self._page(key, matched))
            if child is None:
                break
            child.last_access_time = now
            common = self._common(child.key, key, matched)
            if common < len(child.key):
                node = self._split(child, common)
                values.append(node.value)
                break
            values.append(child.value)
            matched += common
            node = child
        return values, node

    def _split(self, child: TreeNode, at: int) -> TreeNode:
        """Cut ``child``'s edge after ``at`` tokens (a whole number of pages, > 0): a new node
        takes the first part and becomes ``child``'s parent. Sizes do not change: both parts keep
        ``child``'s lock count."""
        parent = self._parent(child)
        head = TreeNode()
        head.parent = parent
        head.key, child.key = child.key[:at], child.key[at:]
        head.value, child.value = child.value[:at].clone(), child.value[at:].clone()
        head.lock_ref = child.lock_ref
        head.last_access_time = child.last_access_time
        parent.children[self._page(head.key, 0)] = head
        head.children[self._page(child.key, 0)] = child
        child.parent = head
        return head

    def _delete_leaf(self, leaf: TreeNode) -> TreeNode:
        parent = self._parent(leaf)
        del parent.children[self._page(leaf.key, 0)]
        self.evictable_size_ -= len(leaf.key)
        self._evictable_leaves.discard(leaf)
        leaf.parent = None
        self._refresh_leaf(parent)
        return parent

    def _refresh_leaf(self, node: TreeNode) -> None:
        if node is not self.root_node and node.lock_ref == 0 and not node.children:
            self._evictable_leaves.add(node)
        else:
            self._evictable_leaves.discard(node)

    def _parent(self, node: TreeNode) -> TreeNode:
        parent = node.parent
        assert parent is not None, f"{node!r} is not in this tree"
        return parent

    def _cat(self, values: list[torch.Tensor]) -> torch.Tensor:
        import torch

        if not values:
            return self._empty
        return values[0] if len(values) == 1 else torch.cat(values)
