"""Token ids to text for a generation stream: ``text_decoder(tokenizer)`` gives the function
``GenerationBatch`` calls for every token (``serving.srt.sampling.Sequence`` decodes a short
window of the newest ids with it)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


def text_decoder(tokenizer: Any) -> Callable[[list[int]], str]:
    """``ids -> text`` as ``tokenizer.decode(ids, skip_special_tokens=True)`` gives it. For a fast
    tokenizer that neither overrides the decode nor cleans up spaces afterwards, that is its
    ``tokenizers`` backend's own decode, called directly: transformers' wrapper converts the ids
    and looks up its options on every call, which is most of a token's decode in a stream."""
    from transformers import PreTrainedTokenizerFast

    backend = getattr(tokenizer, "_tokenizer", None)
    plain = (
        isinstance(tokenizer, PreTrainedTokenizerFast)
        and type(tokenizer).decode is PreTrainedTokenizerFast.decode
        and type(tokenizer)._decode is PreTrainedTokenizerFast._decode
        and not getattr(tokenizer, "clean_up_tokenization_spaces", False)
        and callable(getattr(backend, "decode", None))
    )
    if plain and backend is not None:
        decode = backend.decode

        def fast(token_ids: list[int]) -> str:
            return str(decode(token_ids, skip_special_tokens=True))

        return fast

    def wrapped(token_ids: list[int]) -> str:
        return str(tokenizer.decode(token_ids, skip_special_tokens=True))

    return wrapped
