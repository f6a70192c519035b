"""The limits on one generation request, and the messages that refuse a request over them.

Three bounds, SGLang's names and meanings where SGLang has them: the prompt
(``--max-input-tokens``), prompt + completion of one request (``--context-length``, default
and cap the model's ``max_position_embeddings``), and the KV pool that all running sequences
share (``--max-total-tokens``, ``serving.srt.kv_pool``): a request that could not fit the pool
even alone is refused too. Each message names what really set the bound it is over: the option,
or the model's positions.

By default the prompt may be as long as the model allows, as in SGLang: one token less than the
smaller of the context length and the pool, so that a prompt of that length still has room for
one completion token. ``--max-input-tokens`` lowers it (never raises it past that).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from serving.errors import InputError

log = logging.getLogger("sglang_launch.model_runner")

# The context length of a model whose config names no max_position_embeddings (nor the option).
FALLBACK_CONTEXT = 2048
# The input limit of an embedding model that declares none (no positions, no max_seq_length).
FALLBACK_INPUT_TOKENS = 512


@dataclass(frozen=True)
class GenerationLimits:
    """The bounds in tokens, and for each the name of what set it."""

    max_input_tokens: int
    input_limit: str
    context_length: int
    context_limit: str
    pool_tokens: int
    pool_limit: str
    page_size: int = 1  # the pool hands out whole pages: a sequence takes its tokens rounded up

    @classmethod
    def of(
        cls,
        positions: int | None,
        *,
        max_input_tokens: int | None,
        context_length: int | None,
        pool_tokens: int,
        pool_given: bool,
    ) -> GenerationLimits:
        """The limits of a model with ``positions`` (its ``max_position_embeddings``) under the
        options (``context_length=None``: the model's positions; ``pool_given``: the pool size
        came from ``--max-total-tokens`` rather than its default; ``max_input_tokens=None``: the
        longest prompt the context and the pool leave room for)."""
        by_positions = f"the model's max_position_embeddings ({positions})"
        if context_length and (positions is None or context_length <= positions):
            context, context_by = context_length, "--context-length"
        elif positions:
            if context_length:
                log.warning(
                    "--context-length %d is beyond the model's %d positions; using %d",
                    context_length,
                    positions,
                    positions,
                )
            context, context_by = positions, by_positions
        else:
            context = FALLBACK_CONTEXT
            context_by = "--context-length (its default: the model's config names no positions)"
        pool_by = "--max-total-tokens" + ("" if pool_given else " (its default, from the memory)")
        # The longest prompt the model leaves room for: one completion token within the
        # context length and within the pool.
        room, room_by = context - 1, context_by
        if pool_tokens - 1 < room:
            room, room_by = (
                max(pool_tokens - 1, 1),
                f"the KV pool of {pool_tokens} tokens, {pool_by}",
            )
        if max_input_tokens is not None and max_input_tokens <= room:
            prompt, prompt_by = max_input_tokens, "--max-input-tokens"
        else:
            prompt, prompt_by = room, room_by
        return cls(prompt, prompt_by, context, context_by, pool_tokens, pool_by)

    def check(self, prompt_tokens: int, max_new_tokens: int) -> None:
        """``InputError`` when a prompt of ``prompt_tokens`` asking for ``max_new_tokens`` is
        over a limit, naming the limit that refused it."""
        if prompt_tokens > self.max_input_tokens:
            raise InputError(
                f"the prompt has {prompt_tokens} tokens, more than the limit of "
                f"{self.max_input_tokens} ({self.input_limit}); shorten it",
                "input",
            )
        total = prompt_tokens + max_new_tokens
        asked = f"prompt ({prompt_tokens} tokens) + max_new_tokens ({max_new_tokens})"
        if total > self.context_length and self.context_length <= self.pool_tokens:
            raise InputError(
                f"{asked} exceeds the context length of {self.context_length} tokens "
                f"({self.context_limit}); ask for fewer tokens",
                "max_new_tokens",
            )
        if -(-total // self.page_size) * self.page_size > self.pool_tokens:
            raise InputError(
                f"{asked} can never fit the KV pool of {self.pool_tokens} tokens that all "
                f"running sequences share ({self.pool_limit})"
                + (f" in pages of {self.page_size}" if self.page_size > 1 else "")
                + "; ask for fewer tokens, or raise --max-total-tokens",
                "max_new_tokens",
            )
