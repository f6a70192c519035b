"""``serving.srt.limits.GenerationLimits``: the longest prompt, the context length and the KV pool
of one generation replica, from the model and the options (no model needed)."""

from __future__ import annotations

import pytest

from serving.errors import InputError
from serving.srt.limits import GenerationLimits


def limits(positions=8192, pool=65536, **options):
    options.setdefault("max_input_tokens", None)
    options.setdefault("context_length", None)
    return GenerationLimits.of(positions, pool_tokens=pool, pool_given=False, **options)


def test_by_default_a_prompt_may_fill_the_context_but_one_token():
    chat = limits()
    assert (chat.max_input_tokens, chat.context_length) == (8191, 8192)
    assert "max_position_embeddings (8192)" in chat.input_limit
    chat.check(8000, 191)  # a long system prompt with retrieved context fits
    with pytest.raises(InputError, match=r"8192 tokens, more than the limit of 8191"):
        chat.check(8192, 1)


def test_a_context_length_option_bounds_the_prompt_too():
    short = limits(context_length=2048)
    assert (short.max_input_tokens, short.input_limit) == (2047, "--context-length")


def test_a_pool_smaller_than_the_context_bounds_the_prompt_and_says_so():
    small = limits(pool=1000)
    assert small.max_input_tokens == 999
    with pytest.raises(InputError, match=r"limit of 999 \(the KV pool of 1000 tokens"):
        small.check(1500, 1)


def test_max_input_tokens_lowers_the_limit_and_never_raises_it():
    lowered = limits(max_input_tokens=512)
    assert (lowered.max_input_tokens, lowered.input_limit) == (512, "--max-input-tokens")
    with pytest.raises(InputError, match=r"limit of 512 \(--max-input-tokens\)"):
        lowered.check(513, 1)
    assert limits(max_input_tokens=100_000).max_input_tokens == 8191


def test_a_request_that_pages_would_round_past_the_pool_is_refused_naming_the_pages():
    """With --page-size 16 a sequence takes whole pages: 689 tokens take 704 slots, more than a
    pool of 688, so it could never be admitted and is refused at once instead of waiting."""
    import dataclasses

    paged = dataclasses.replace(limits(4096, pool=688), page_size=16)
    paged.check(600, 88)  # 688: exactly 43 pages
    with pytest.raises(InputError, match="in pages of 16"):
        paged.check(600, 89)
