"""The grammar backend in-process (``serving.srt.constrained``), with xgrammar and the byte-level
BPE tokenizer of ``support.structured``'s tiny model: a grammar compiles once per text (one
future for every request that names it), a bad grammar fails with the backend's words and no
C++ source position, a grammar object masks what its grammar does not allow and ends with it,
``--grammar-backend none`` makes no backend, and a tokenizer the backend cannot read leaves the
rank serving, with the message a constrained request gets."""

from __future__ import annotations

import pytest

pytest.importorskip("xgrammar")

from launchspec.server_args import ServerArgs  # noqa: E402
from serving.srt.constrained.base_grammar_backend import (  # noqa: E402
    GrammarError,
    backend_for_rank,
    create_grammar_backend,
    grammar_key,
)
from serving.wire import SamplingParams  # noqa: E402


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    from support.structured import build_tiny_bpe_llama
    from transformers import AutoTokenizer

    path = build_tiny_bpe_llama(tmp_path_factory.mktemp("grammar") / "tiny")
    return AutoTokenizer.from_pretrained(path)


@pytest.fixture(scope="module")
def backend(tokenizer):
    made = create_grammar_backend(ServerArgs(), tokenizer, len(tokenizer), {tokenizer.eos_token_id})
    yield made
    made.shutdown()


def test_a_grammar_compiles_once_per_text(backend):
    first = backend.get_future_value(("regex", "[ab]{2}"))
    assert backend.get_future_value(("regex", "[ab]{2}")) is first
    assert backend.get_future_value(("regex", "[ab]{3}")) is not first
    assert first.result(timeout=30) is not None


def test_a_bad_grammar_fails_with_the_backends_words(backend):
    future = backend.get_future_value(("regex", "[0-9"))
    with pytest.raises(GrammarError) as caught:
        future.result(timeout=30)
    assert (
        str(caught.value)
        == "regex does not compile: Regex parsing error at position 5: Unclosed '['"
    )
    with pytest.raises(GrammarError, match="json_schema is not valid JSON"):
        backend.get_value(("json_schema", "{nope"))


def test_a_grammar_object_allows_only_its_grammar_and_ends_with_it(backend, tokenizer):
    import torch

    grammar = backend.get_value(("regex", "ab"))
    vocab = len(tokenizer)
    picked = []
    while not grammar.is_terminated():
        row = grammar.apply_vocab_mask(torch.zeros(vocab))
        allowed = torch.nonzero(row != float("-inf")).flatten().tolist()
        assert allowed, "the grammar allowed nothing"
        token = allowed[0]
        grammar.accept_token(token)
        picked.append(token)
    assert picked[-1] == tokenizer.eos_token_id
    assert tokenizer.decode(picked[:-1]) == "ab"


def test_grammar_key_names_the_one_grammar_of_a_request():
    assert grammar_key(SamplingParams()) is None
    assert grammar_key(SamplingParams(regex="a+")) == ("regex", "a+")
    assert grammar_key(SamplingParams(ebnf='root ::= "a"')) == ("ebnf", 'root ::= "a"')


def config():
    from transformers import LlamaConfig

    return LlamaConfig(vocab_size=10)


def test_none_makes_no_backend_and_says_how_to_get_one(tokenizer):
    backend, refusal = backend_for_rank(
        ServerArgs(grammar_backend="none"), tokenizer, config(), {1}
    )
    assert backend is None
    assert "--grammar-backend none" in refusal and "--grammar-backend xgrammar" in refusal


def test_a_tokenizer_the_backend_cannot_read_leaves_the_rank_serving():
    backend, refusal = backend_for_rank(ServerArgs(), object(), config(), {1})
    assert backend is None
    assert refusal.startswith("--grammar-backend xgrammar cannot constrain this model's tokens")
