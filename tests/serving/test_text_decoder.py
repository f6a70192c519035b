"""The decode a generation stream uses: the same text as ``tokenizer.decode(ids,
skip_special_tokens=True)`` for every kind of tokenizer, on real tokenizers (BERT's WordPiece
from the embedded default package, a byte-level BPE trained here, one that cleans up spaces)."""

from __future__ import annotations

import random

import pytest

pytest.importorskip("transformers")

from support.gguf import train_tokenizer  # noqa: E402

from serving.srt.detokenize import text_decoder  # noqa: E402


def sequences(tokenizer, count: int = 200) -> list[list[int]]:
    """Random id runs over the whole vocabulary (special tokens and word pieces included), and
    every prefix of an encoded sentence with characters of several bytes."""
    rng = random.Random(7)
    size = len(tokenizer)
    runs = [[rng.randrange(size) for _ in range(rng.randrange(1, 24))] for _ in range(count)]
    ids = tokenizer("Größe über 20 °C, naïve café — ok? «ja» 東京", add_special_tokens=True)
    encoded = list(ids["input_ids"])
    return runs + [encoded[:n] for n in range(len(encoded) + 1)]


def assert_same_text(tokenizer) -> None:
    decode = text_decoder(tokenizer)
    for ids in sequences(tokenizer):
        assert decode(ids) == tokenizer.decode(ids, skip_special_tokens=True), ids


def test_wordpiece_decodes_as_transformers_does():
    from transformers import AutoTokenizer

    from launchspec.model_source import embedding_model_dir

    assert_same_text(AutoTokenizer.from_pretrained(str(embedding_model_dir())))


def test_byte_level_bpe_decodes_as_transformers_does_even_mid_character():
    from transformers import PreTrainedTokenizerFast

    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=train_tokenizer(), bos_token="<s>", eos_token="</s>"
    )
    assert_same_text(tokenizer)


def test_a_tokenizer_that_cleans_up_spaces_keeps_its_clean_up():
    from transformers import AutoTokenizer

    from launchspec.model_source import embedding_model_dir

    tokenizer = AutoTokenizer.from_pretrained(
        str(embedding_model_dir()), clean_up_tokenization_spaces=True
    )
    ids = tokenizer("hello , world . it 's fine", add_special_tokens=False)["input_ids"]
    assert text_decoder(tokenizer)(ids) == tokenizer.decode(ids, skip_special_tokens=True)
    assert_same_text(tokenizer)
