"""Token ids to text for generation: ``TextDecoder(tokenizer)`` decodes a list of ids as
``tokenizer.decode(ids, skip_special_tokens=True)`` does, and ``stream()`` gives a sequence its
own ``TextStream``, which keeps the text of the sequence's ids as they grow by one a step.

A stream's text is always that of the whole sequence decoded at once, except that while the
sequence runs, characters still incomplete (a token that ends part-way through a character of
several bytes) are held back; ``settle`` adds them when the sequence ends. A plain fast tokenizer
streams through its ``tokenizers`` backend's own incremental decoder (one call a token, in Rust);
any other decodes a short window of the newest ids again each step.

The scheduler and the HTTP child each load the model's tokenizer. ``TextDecoder.identity`` names
a plain fast tokenizer by what its ``tokenizers`` backend decodes with (a digest of its model's
vocabulary, its added tokens and which of them are special, and its decoder; not the encoding's
settings, such as padding, which each process sets its own way), so that two
processes can tell that they decode the same ids to the same text. A streamed request whose
decoder the scheduler shares is answered with token ids, and ``IdStream`` turns them into the
same text increments in the HTTP child (SGLang's detokenizer, off the scheduler's step).
"""

from __future__ import annotations

import hashlib
from typing import Any

# Window streams: tokens decoded again before the new ones, so that a tokenizer that joins or
# spaces tokens by their neighbours decodes the new text as it would in the whole sequence.
_CONTEXT_TOKENS = 4
# Window streams: tokens decoded since the last anchor before the anchor moves on (bounds each
# step's decode).
_ANCHOR_EVERY = 16


class TextDecoder:
    """``decoder(ids)``: the text of ``ids``, as ``tokenizer.decode(ids,
    skip_special_tokens=True)`` gives it. For a fast tokenizer that neither overrides the decode
    nor cleans up spaces afterwards (``plain``), that is its ``tokenizers`` backend's own decode
    called directly: transformers' wrapper converts the ids and looks up its options on every
    call, which is most of a token's decode in a stream."""

    def __init__(self, tokenizer: Any) -> None:
        from transformers import PreTrainedTokenizerFast

        backend = getattr(tokenizer, "_tokenizer", None)
        self.tokenizer = tokenizer
        self.plain = (
            isinstance(tokenizer, PreTrainedTokenizerFast)
            and type(tokenizer).decode is PreTrainedTokenizerFast.decode
            and type(tokenizer)._decode is PreTrainedTokenizerFast._decode
            and not getattr(tokenizer, "clean_up_tokenization_spaces", False)
            and callable(getattr(backend, "decode", None))
        )
        self.backend = backend if self.plain else None
        self._identity: str | None = None

    @property
    def identity(self) -> str:
        """A digest of the ``tokenizers`` backend of a plain tokenizer (equal digests decode
        equal ids to equal text); "" when the tokenizer is not plain (its decode is its own)."""
        if self._identity is None:
            self._identity = ""
            if self.backend is not None:
                try:
                    self._identity = _decoding_digest(self.backend)
                except Exception:  # noqa: BLE001 - a backend that cannot say what it is: no identity
                    pass
        return self._identity

    def __call__(self, token_ids: list[int]) -> str:
        if self.backend is not None:
            return str(self.backend.decode(token_ids, skip_special_tokens=True))
        return str(self.tokenizer.decode(token_ids, skip_special_tokens=True))

    def stream(self) -> TextStream:
        """A new sequence's stream: the backend's incremental decoder when the tokenizer is
        plain and its ``tokenizers`` has one, else windows decoded by this decoder."""
        if self.backend is not None:
            try:
                from tokenizers.decoders import DecodeStream
            except ImportError:
                return WindowStream(self)
            return BackendStream(self, DecodeStream(skip_special_tokens=True))
        return WindowStream(self)


def _decoding_digest(backend: Any) -> str:
    """A digest of what ``backend`` (a ``tokenizers.Tokenizer``) decodes with: its model's
    serialisation (the vocabulary), its decoder's, and its added tokens with their special flag."""
    digest = hashlib.sha256(backend.model.__getstate__())
    decoder = backend.decoder
    digest.update(b"\0" + (decoder.__getstate__() if decoder is not None else b""))
    added = sorted(
        (i, t.content, bool(t.special)) for i, t in backend.get_added_tokens_decoder().items()
    )
    digest.update(b"\0" + repr(added).encode())
    return digest.hexdigest()


class TextStream:
    """The text of one sequence's ids, kept up to date one token at a time."""

    def __init__(self, decoder: TextDecoder) -> None:
        self.decoder = decoder
        self.text = ""

    def push(self, ids: list[int]) -> str:
        """The text of ``ids``, which are the ids of the last call and one more."""
        raise NotImplementedError

    def settle(self, ids: list[int]) -> str:
        """The text of ``ids`` with nothing held back (the sequence has ended)."""
        whole = self.decoder(ids)
        if whole.startswith(self.text):
            self.text = whole
        return self.text


class BackendStream(TextStream):
    """The ``tokenizers`` backend's ``DecodeStream``: each call decodes only the new token
    against the few before it, and answers nothing until a character is complete. Should it
    ever refuse a token, the sequence goes on with a ``WindowStream``."""

    def __init__(self, decoder: TextDecoder, stream: Any) -> None:
        super().__init__(decoder)
        self.step = stream.step
        self.fallback: WindowStream | None = None

    def push(self, ids: list[int]) -> str:
        if self.fallback is not None:
            self.text = self.fallback.push(ids)
            return self.text
        try:
            piece = self.step(self.decoder.backend, ids[-1])
        except Exception:  # noqa: BLE001 - any refusal: decode by windows from here on
            self.fallback = WindowStream(self.decoder)
            self.text = self.fallback.push(ids)
            return self.text
        if piece:
            self.text += piece
        return self.text


class WindowStream(TextStream):
    """The settled text up to an anchor, and the tokens after it decoded with a few tokens
    before them for context (the whole sequence again when the context does not decode to the
    same text alone). The anchor moves on every ``_ANCHOR_EVERY`` tokens, where the text ends in
    a complete character."""

    def __init__(self, decoder: TextDecoder) -> None:
        super().__init__(decoder)
        self.anchor = 0  # ids whose text is settled in ``anchor_text``
        self.anchor_text = ""
        self.anchor_context: str | None = None  # the text of the context ids before the anchor
        self.raw = ""  # the text of the ids, trailing incomplete characters included

    def push(self, ids: list[int]) -> str:
        decode = self.decoder
        start = max(0, self.anchor - _CONTEXT_TOKENS)
        context = self.anchor_context
        if context is None:  # decoded once per anchor, not once per token
            context = decode(ids[start : self.anchor]) if self.anchor > start else ""
            self.anchor_context = context
        window = decode(ids[start:])
        if window.startswith(context):
            raw = self.anchor_text + window[len(context) :]
        else:
            raw = decode(ids)
        if len(ids) - self.anchor >= _ANCHOR_EVERY and not raw.endswith("\ufffd"):
            self.anchor, self.anchor_text, self.anchor_context = len(ids), raw, None
        self.raw = raw
        self.text = raw.rstrip("\ufffd")
        return self.text

    def settle(self, ids: list[int]) -> str:
        self.text = self.raw
        return self.text


class IdStream:
    """The text increments of one streamed sequence answered with token ids (the HTTP child's
    side of a stream the scheduler does not decode): ``push(ids, settle)`` takes the ids of one
    answer and returns the text that follows what it returned before. The text is the one the
    scheduler's own stream would have sent: characters still incomplete wait for the next ids,
    and ``settle`` (the sequence ended by EOS or its length) adds what was held back."""

    def __init__(self, decoder: TextDecoder) -> None:
        self.ids: list[int] = []
        self.stream = decoder.stream()
        self.sent = 0

    def push(self, ids: list[int], settle: bool = False) -> str:
        text = self.stream.text
        for token in ids:
            self.ids.append(token)
            text = self.stream.push(self.ids)
        if settle:
            text = self.stream.settle(self.ids)
        piece = text[self.sent :]
        self.sent = len(text)
        return piece
