"""The KV memory of one rank, as the running batch uses it: which slots each sequence's tokens
have, what it may still take, and what the radix prefix cache keeps (SGLang's
``cache_unfinished_req`` / ``cache_finished_req``).

A sequence is *claimed* before its prefill: it gets a row of the request-to-token table, the
longest prefix of its prompt the radix cache holds (those slots are the tree's, locked while the
sequence runs; at least the prompt's last token is computed, for its logits), and a reservation
of every slot it may still allocate (its uncached prompt tokens plus ``max_new_tokens``, in whole
pages). A claim is granted only when the reservation fits in ``budget()``: free slots plus what
the cache could evict, less the reservations of the other claimed sequences. So allocation never
fails for a claimed sequence: when the allocator is short, the cache evicts its least recently
used unlocked leaves first, and never a slot a running sequence uses.

Once a prompt is prefilled, its tokens go into the cache (other requests share them while it
runs); when a sequence finishes or is cancelled, every token whose keys and values were computed
goes in, duplicates of what was already cached are freed, and so is a last partial page. With
no cache (``--disable-radix-cache``) every slot is freed at the end.

Every rank of a tensor-parallel replica makes the same calls in the same order, so their caches
hold the same prefixes and every forward has the same shape on every rank.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

    from serving.srt.mem_cache.allocator import BaseTokenToKVPoolAllocator
    from serving.srt.mem_cache.memory_pool import KVCache, ReqToTokenPool


@dataclass(eq=False)
class Claim:
    """The memory of one claimed sequence: ``row`` of the request-to-token table, the first
    ``length`` of whose slots hold computed (or cached) tokens; ``cached`` of them came from the
    cache at the claim; ``node`` is the locked cache node covering the first ``locked`` tokens;
    ``reserved`` slots it may still allocate."""

    row: int
    length: int
    cached: int
    locked: int
    node: Any
    reserved: int


def build_kv_memory(
    platform: Any,
    config: Any,
    *,
    size: int,
    page_size: int,
    dtype: torch.dtype,
    device: torch.device,
    tp_size: int,
    running: int,
    context_length: int,
    radix_cache: bool,
) -> KVMemory:
    """The KV memory of one rank of a model with ``config``: a pool of ``size`` slots (whole
    pages) holding this rank's key/value heads of every layer, of the classes ``platform``
    chooses (``platform_classes.build_memory``), the request-to-token table for ``running``
    sequences of up to ``context_length`` tokens, and the radix cache unless ``radix_cache`` is
    False. ``ModelLoadError`` when ``size`` holds no page."""
    from serving.errors import ModelLoadError
    from serving.srt.mem_cache.memory_pool import ReqToTokenPool
    from serving.srt.mem_cache.platform_classes import build_memory
    from serving.srt.mem_cache.radix_cache import RadixCache

    text = config.get_text_config(decoder=True) if hasattr(config, "get_text_config") else config
    heads = int(getattr(text, "num_attention_heads", 0) or 1)
    kv_heads = int(getattr(text, "num_key_value_heads", 0) or heads)
    head_dim = int(
        getattr(text, "head_dim", None) or int(getattr(text, "hidden_size", 0) or 64) // heads
    )
    slots = size // page_size * page_size
    if slots < page_size:
        raise ModelLoadError(
            f"--max-total-tokens {size} holds no page of --page-size {page_size}; raise it or "
            f"lower the page size"
        )
    pool, allocator = build_memory(
        platform,
        size=slots,
        page_size=page_size,
        dtype=dtype,
        head_num=max(1, kv_heads // tp_size),
        head_dim=head_dim,
        layer_num=int(getattr(text, "num_hidden_layers", 0) or 1),
        device=device,
    )
    table = ReqToTokenPool(running + 1, context_length + 1, device)
    tree = RadixCache(table, allocator, page_size=page_size) if radix_cache else None
    return KVMemory(table, pool, allocator, tree)


class KVMemory:
    """The module docstring. ``tree`` is a ``RadixCache`` or None (no prefix cache)."""

    def __init__(
        self,
        req_to_token_pool: ReqToTokenPool,
        token_to_kv_pool: KVCache,
        allocator: BaseTokenToKVPoolAllocator,
        tree: Any = None,
    ) -> None:
        self.req_to_token_pool = req_to_token_pool
        self.token_to_kv_pool = token_to_kv_pool
        self.allocator = allocator
        self.tree = tree
        self.page_size = int(allocator.page_size)
        self.size = int(allocator.size)
        self.outstanding = 0  # slots the claimed sequences may still allocate
        self.prompt_tokens_total = 0
        self.cached_tokens_total = 0

    # ---- room ------------------------------------------------------------------------------

    def evictable(self) -> int:
        return int(self.tree.evictable_size()) if self.tree is not None else 0

    def budget(self) -> int:
        """Slots a new claim may reserve (the module docstring)."""
        return self.allocator.available_size() + self.evictable() - self.outstanding

    def used(self) -> int:
        """Slots held by running sequences and the prefixes they lock (not evictable)."""
        return self.size - self.allocator.available_size() - self.evictable()

    def pages(self, tokens: int) -> int:
        """``tokens`` rounded up to whole pages."""
        page = self.page_size
        return -(-tokens // page) * page

    def footprint(self, prompt_tokens: int, max_new_tokens: int) -> int:
        """The most slots a sequence can reserve (no cached prefix)."""
        return self.pages(prompt_tokens + max_new_tokens)

    # ---- a sequence's life ----------------------------------------------------------------

    def claim(self, prompt: list[int], max_new_tokens: int) -> Claim | None:
        """Claim memory for a sequence with ``prompt`` (the module docstring), or None when it
        does not fit now (nothing changed)."""
        import torch

        rows = self.req_to_token_pool.alloc(1)
        if rows is None:
            return None
        row = rows[0]
        node: Any = None
        prefix = 0
        cached = torch.empty(0, dtype=torch.int64)
        if self.tree is not None:
            match = self.tree.match_prefix(prompt[:-1])
            node, cached = match.last_device_node, match.device_indices
            prefix = int(cached.numel())
            self.tree.inc_lock_ref(node)
        need = self.pages(len(prompt) - prefix + max_new_tokens)
        if need > self.budget():
            if node is not None:
                self.tree.dec_lock_ref(node)
            self.req_to_token_pool.free(row)
            return None
        if prefix:
            self.req_to_token_pool.req_to_token[row, :prefix] = cached.to(torch.int32)
        self.outstanding += need
        self.prompt_tokens_total += len(prompt)
        self.cached_tokens_total += prefix
        return Claim(row, prefix, prefix, prefix, node, need)

    def _alloc(self, n: int) -> torch.Tensor:
        """``n`` slots (a multiple of the page size), evicting from the cache if short."""
        slots = self.allocator.alloc(n)
        if slots is None and self.tree is not None:
            self.tree.evict(n - self.allocator.available_size())
            slots = self.allocator.alloc(n)
        if slots is None:  # a claim reserved them: this is a bookkeeping bug, not a full pool
            raise RuntimeError(
                f"the KV pool has no room for {n} reserved slots "
                f"({self.allocator.available_size()} free, {self.evictable()} evictable)"
            )
        return slots

    def extend(self, claim: Claim, n: int) -> torch.Tensor:
        """Slots for the next ``n`` tokens of a claimed sequence, written to its row: with pages,
        the rest of its last page first, then whole new pages."""
        import torch

        table = self.req_to_token_pool.req_to_token
        start = claim.length
        if self.page_size == 1:
            new = self._alloc(n)
            taken = n
        else:
            own = min((-start) % self.page_size, n)
            parts = []
            if own:
                last = int(table[claim.row, start - 1])
                parts.append(torch.arange(last + 1, last + 1 + own, dtype=torch.int64))
            taken = self.pages(n - own) if n > own else 0
            if taken:
                parts.append(self._alloc(taken)[: n - own])
            new = parts[0] if len(parts) == 1 else torch.cat(parts)
        claim.reserved -= taken
        self.outstanding -= taken
        claim.length += n
        table[claim.row, start : start + n] = new.to(torch.int32)
        return new

    def decode_slots(self, claims: list[Claim]) -> torch.Tensor:
        """One new slot for each of ``claims`` (their next token), written to their rows."""
        import torch

        if self.page_size > 1:
            return torch.cat([self.extend(c, 1) for c in claims])
        new = self._alloc(len(claims))
        rows = [c.row for c in claims]
        cols = [c.length for c in claims]
        for c in claims:
            c.length += 1
            c.reserved -= 1
        self.outstanding -= len(claims)
        self.req_to_token_pool.req_to_token[rows, cols] = new.to(torch.int32)
        return new

    def cache_prompt(self, claim: Claim, prompt: list[int]) -> None:
        """The prefilled ``prompt`` goes into the cache while its sequence runs (SGLang's
        ``cache_unfinished_req``): the sequence then uses (and locks) the cached slots."""
        if self.tree is not None:
            self._insert(claim, prompt, keep=True)

    def release(self, claim: Claim, tokens: list[int]) -> None:
        """The sequence ended: ``tokens`` are its tokens whose keys and values were computed
        (at most ``claim.length``); they go into the cache, the rest is freed (the module
        docstring)."""
        import torch

        table = self.req_to_token_pool.req_to_token
        if self.tree is not None:
            aligned = self._insert(claim, tokens[: claim.length], keep=False)
        else:
            aligned = 0
        if claim.length > aligned:
            # Past the cached part (page-aligned): the sequence's own slots and pages.
            self.allocator.free(table[claim.row, aligned : claim.length].to(torch.int64))
        if claim.node is not None:
            self.tree.dec_lock_ref(claim.node)
            claim.node = None
        self.outstanding -= claim.reserved
        claim.reserved = 0
        self.req_to_token_pool.free(claim.row)

    def _insert(self, claim: Claim, tokens: list[int], *, keep: bool) -> int:
        """Insert ``tokens`` (page-aligned) with the claim's slots into the cache; free the
        sequence's own slots that duplicate what was cached already; with ``keep``, point the
        row at the cached slots and lock the new node instead of the old. Returns the aligned
        length."""
        import torch

        tree = self.tree
        table = self.req_to_token_pool.req_to_token
        aligned = len(tokens) // self.page_size * self.page_size
        if aligned <= claim.locked:
            return claim.locked if not keep else aligned
        key = tokens[:aligned]
        slots = table[claim.row, :aligned].to(torch.int64)
        present = int(tree.insert(key, slots.clone()))
        if present > claim.locked:  # cached meanwhile by another sequence: ours are copies
            self.allocator.free(slots[claim.locked : present])
        if keep:
            match = tree.match_prefix(key)
            table[claim.row, : int(match.device_indices.numel())] = match.device_indices.to(
                torch.int32
            )
            tree.inc_lock_ref(match.last_device_node)
            tree.dec_lock_ref(claim.node)
            claim.node = match.last_device_node
            claim.locked = int(match.device_indices.numel())
        return aligned

    # ---- the whole pool --------------------------------------------------------------------

    def reset(self) -> None:
        """Forget every claim and every cached prefix (after a failed step, or a flush)."""
        self.allocator.clear()
        self.req_to_token_pool.clear()
        if self.tree is not None:
            self.tree.reset()
        self.outstanding = 0
