"""The decode a generation stream uses: the same text as ``tokenizer.decode(ids,
skip_special_tokens=True)`` for every kind of tokenizer, on real tokenizers (BERT's WordPiece
from the embedded default package, a byte-level BPE trained here, one that cleans up spaces),
whether the ids are decoded at once or streamed a token at a time."""

from __future__ import annotations

import random

import pytest

pytest.importorskip("transformers")

from support.gguf import train_tokenizer  # noqa: E402

from serving.detokenize import BackendStream, TextDecoder, WindowStream  # noqa: E402


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
    """At once, and streamed: every step's text is the whole text so far less trailing
    incomplete characters, and the settled text is the whole text."""
    decode = TextDecoder(tokenizer)
    for ids in sequences(tokenizer):
        whole = tokenizer.decode(ids, skip_special_tokens=True)
        assert decode(ids) == whole, ids
        stream = decode.stream()
        for n in range(1, len(ids) + 1):
            so_far = tokenizer.decode(ids[:n], skip_special_tokens=True)
            assert stream.push(ids[:n]) == so_far.rstrip("\ufffd"), ids[:n]
        if ids:
            assert stream.settle(ids) == whole, ids


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
    assert TextDecoder(tokenizer)(ids) == tokenizer.decode(ids, skip_special_tokens=True)
    assert isinstance(TextDecoder(tokenizer).stream(), WindowStream)
    assert_same_text(tokenizer)


def test_a_plain_fast_tokenizer_streams_through_its_backend():
    from transformers import AutoTokenizer

    from launchspec.model_source import embedding_model_dir

    tokenizer = AutoTokenizer.from_pretrained(str(embedding_model_dir()))
    assert isinstance(TextDecoder(tokenizer).stream(), BackendStream)


def test_a_stream_the_backend_refuses_goes_on_by_windows():
    from transformers import AutoTokenizer

    from launchspec.model_source import embedding_model_dir

    tokenizer = AutoTokenizer.from_pretrained(str(embedding_model_dir()))
    ids = tokenizer("the launcher starts the scheduler", add_special_tokens=False)["input_ids"]
    stream = TextDecoder(tokenizer).stream()
    assert isinstance(stream, BackendStream)
    stream.push(ids[:2])

    def refuse(tokenizer, token):
        raise RuntimeError("refused")

    stream.step = refuse
    for n in range(3, len(ids) + 1):
        text = stream.push(ids[:n])
    assert text == tokenizer.decode(ids, skip_special_tokens=True)


def test_the_http_childs_id_stream_gives_the_schedulers_text_increments():
    """``IdStream`` (the HTTP child's side of a stream answered with token ids) sends, answer by
    answer, the pieces the scheduler's own stream would have sent: nothing incomplete while the
    sequence runs, the whole text once it settles; ids in answers of one or of several."""
    from transformers import PreTrainedTokenizerFast

    from serving.detokenize import IdStream

    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=train_tokenizer(), bos_token="<s>", eos_token="</s>"
    )
    decode = TextDecoder(tokenizer)
    for ids in sequences(tokenizer):
        if not ids:
            continue
        whole = tokenizer.decode(ids, skip_special_tokens=True)
        for size in (1, 3):
            stream, sent = IdStream(decode), ""
            answers = [ids[at : at + size] for at in range(0, len(ids), size)]
            for k, answer in enumerate(answers):
                last = k == len(answers) - 1
                sent += stream.push(answer, settle=last)
                if not last:
                    so_far = tokenizer.decode(ids[: (k + 1) * size], skip_special_tokens=True)
                    assert sent == so_far.rstrip("\ufffd"), ids[: (k + 1) * size]
            assert sent == whole, ids


def test_tokenizers_decoding_alike_share_an_identity_and_others_do_not():
    """The scheduler's tokenizer (``AutoTokenizer``, padded on the left) and the HTTP child's
    (``load_tokenizer``) of one model directory share ``TextDecoder.identity``; another
    tokenizer's differs, and a tokenizer whose decode is its own has none."""
    from transformers import AutoTokenizer, PreTrainedTokenizerFast

    from launchspec.model_source import embedding_model_dir
    from serving.http.chat_template import load_tokenizer

    path = str(embedding_model_dir())
    scheduler_side = AutoTokenizer.from_pretrained(path)
    scheduler_side.padding_side = "left"
    mine = TextDecoder(scheduler_side).identity
    assert mine and mine == TextDecoder(load_tokenizer(path)).identity
    bpe = PreTrainedTokenizerFast(tokenizer_object=train_tokenizer(), eos_token="</s>")
    assert TextDecoder(bpe).identity not in ("", mine)
    cleaned = AutoTokenizer.from_pretrained(path, clean_up_tokenization_spaces=True)
    assert TextDecoder(cleaned).identity == ""
