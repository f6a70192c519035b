"""The xgrammar backend (``--grammar-backend xgrammar``, the default).

The tokenizer's vocabulary is read once (``xgrammar.TokenizerInfo``, padded to the logits'
width, the model's end-of-sequence tokens as the grammar's stop tokens); each grammar compiles
against it (``GrammarCompiler``); each sequence runs its own ``GrammarMatcher``, which fills a
bitmask of the tokens allowed next, applied to the sequence's logits row on the CPU.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from serving.srt.constrained.base_grammar_backend import (
    BaseGrammarBackend,
    BaseGrammarObject,
    GrammarError,
)

if TYPE_CHECKING:
    import torch


class XGrammarGrammar(BaseGrammarObject):
    """One sequence's ``GrammarMatcher`` and its one-row bitmask."""

    def __init__(self, matcher: Any, vocab_size: int) -> None:
        import xgrammar

        self.matcher = matcher
        self.vocab_size = vocab_size
        self.bitmask = xgrammar.allocate_token_bitmask(1, vocab_size)

    def accept_token(self, token: int) -> None:
        if not self.matcher.accept_token(token):
            # Only a token the mask allowed is picked; anything else is a bug, not user input.
            raise RuntimeError(f"the grammar does not accept token {token}")

    def apply_vocab_mask(self, logits: torch.Tensor) -> torch.Tensor:
        import xgrammar

        self.matcher.fill_next_token_bitmask(self.bitmask, 0)
        row = (
            logits if logits.dtype.is_floating_point and logits.is_contiguous() else logits.float()
        )
        xgrammar.apply_token_bitmask_inplace(row, self.bitmask[0], vocab_size=self.vocab_size)
        return row

    def is_terminated(self) -> bool:
        return bool(self.matcher.is_terminated())


class XGrammarGrammarBackend(BaseGrammarBackend):
    """Compiles JSON schemas, regular expressions and EBNF grammars with xgrammar."""

    name = "xgrammar"

    def __init__(self, tokenizer: Any, vocab_size: int, eos_token_ids: list[int]) -> None:
        import xgrammar

        super().__init__()
        self.vocab_size = vocab_size
        info = xgrammar.TokenizerInfo.from_huggingface(
            tokenizer, vocab_size=vocab_size, stop_token_ids=eos_token_ids or None
        )
        self.compiler = xgrammar.GrammarCompiler(info, max_threads=1, cache_enabled=False)

    def compile(self, kind: str, text: str) -> Any:
        compiler = self.compiler
        if kind == "json_schema":
            try:
                json.loads(text)
            except ValueError as exc:
                raise GrammarError(f"json_schema is not valid JSON: {exc}") from None
            return compiler.compile_json_schema(text, any_whitespace=False, strict_mode=True)
        if kind == "regex":
            return compiler.compile_regex(text)
        if kind == "ebnf":
            return compiler.compile_grammar(text)
        raise GrammarError(f"unknown grammar kind {kind!r}")

    def new_grammar(self, compiled: Any) -> BaseGrammarObject:
        import xgrammar

        return XGrammarGrammar(xgrammar.GrammarMatcher(compiled), self.vocab_size)
