"""Picking the next token, and deciding when a sequence is finished.

Each sequence samples with its own ``torch.Generator`` seeded from its request, so a request's
tokens do not depend on what else shares its batch, and every tensor-parallel rank (which sees
the same logits and the same seed) picks the same token without exchanging it.

The order of one step, for one sequence: the penalties (``presence_penalty``,
``frequency_penalty``) are subtracted from the logits of the tokens it already generated; the
a sequence with a grammar (``SamplingParams.json_schema``, ``regex``, ``ebnf``) then has every
token its grammar does not allow next set to ``-inf`` (``Sequence.grammar``); the
log-probabilities it reports are of that distribution; then temperature, top-k and top-p shape
what it samples from (``temperature == 0``: the most likely token).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from serving.detokenize import TextDecoder, TextStream
from serving.wire import SamplingParams, TokenLogprob

if TYPE_CHECKING:
    import torch


def select_token(logits: torch.Tensor, params: SamplingParams, generator: torch.Generator) -> int:
    """The next token id for one sequence from its last-position ``logits`` (vocab,), after
    any penalties."""
    import torch

    if params.temperature <= 0.0:
        return int(torch.argmax(logits).item())
    scores = logits.float() / params.temperature
    if params.top_k and 0 < params.top_k < scores.shape[-1]:
        kth = torch.topk(scores, params.top_k).values[-1]
        scores = scores.masked_fill(scores < kth, float("-inf"))
    if params.top_p < 1.0:
        sorted_scores, order = torch.sort(scores, descending=True)
        cumulative = torch.softmax(sorted_scores, dim=-1).cumsum(dim=-1)
        # Drop a token when the tokens before it already cover top_p; the first always stays.
        drop = cumulative - torch.softmax(sorted_scores, dim=-1) >= params.top_p
        scores = scores.scatter(0, order, sorted_scores.masked_fill(drop, float("-inf")))
    probs = torch.softmax(scores, dim=-1)
    return int(torch.multinomial(probs, 1, generator=generator).item())


def needs_row_work(params: SamplingParams) -> bool:
    """Whether a sequence needs more than the batch's argmax: sampling, penalties, logprobs or
    a grammar."""
    return (
        params.temperature > 0.0
        or params.logprobs
        or params.presence_penalty != 0.0
        or params.frequency_penalty != 0.0
        or params.json_schema is not None
        or params.regex is not None
        or params.ebnf is not None
    )


@dataclass
class Sequence:
    """One request's progress through generation."""

    rid: str
    prompt_ids: list[int]
    params: SamplingParams
    seed: int
    stream: bool = False
    output_ids: list[int] = field(default_factory=list)
    text: str = ""
    sent: int = 0  # characters of ``text`` already streamed
    finish_reason: str | None = None
    generator: torch.Generator | None = None
    counts: dict[int, int] = field(default_factory=dict)  # generated token id -> occurrences
    logprobs: list[TokenLogprob] = field(default_factory=list)  # not sent yet
    detok: TextStream | None = field(default=None, repr=False)  # the text of ``output_ids``
    # Takes the batch's argmax with nothing else per row (``needs_row_work``); counts no tokens.
    plain: bool = field(init=False, repr=False)
    # False: a stream answered with token ids (the HTTP child decodes them); ``text`` stays "".
    decodes: bool = True
    ids_sent: int = 0  # ids already streamed (``decodes`` False)
    cached_tokens: int = 0  # prompt tokens whose KV came from the prefix cache
    # The grammar object of a constrained sequence (``serving.srt.constrained``), else None.
    grammar: Any = field(default=None, repr=False)

    def __post_init__(self) -> None:
        self.plain = not needs_row_work(self.params)

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None

    @property
    def penalised(self) -> bool:
        return self.params.presence_penalty != 0.0 or self.params.frequency_penalty != 0.0

    def sampler(self) -> torch.Generator:
        """This sequence's generator (seeded from its ``seed`` on first use)."""
        if self.generator is None:
            import torch

            self.generator = torch.Generator(device="cpu").manual_seed(int(self.seed))
        return self.generator

    def shape_logits(self, logits: torch.Tensor) -> torch.Tensor:
        """``logits`` (vocab,) as this sequence picks from them: less its penalties, and with
        the tokens its grammar does not allow next at ``-inf`` (may change ``logits``)."""
        row = self.apply_penalties(logits)
        if self.grammar is not None:
            row = self.grammar.apply_vocab_mask(row)
        return row

    def apply_penalties(self, logits: torch.Tensor) -> torch.Tensor:
        """``logits`` (vocab,) less this sequence's presence and frequency penalties."""
        if not self.counts or not self.penalised:
            return logits
        import torch

        ids = torch.tensor(list(self.counts), dtype=torch.long, device=logits.device)
        times = torch.tensor(list(self.counts.values()), dtype=logits.dtype, device=logits.device)
        penalty = self.params.presence_penalty + self.params.frequency_penalty * times
        out = logits.clone()
        out[ids] -= penalty
        return out

    def note_logprob(
        self, logits: torch.Tensor, token: int, token_text: Callable[[int], str]
    ) -> None:
        """Record the log-probability of ``token`` (and the top ones) from the penalised (and
        masked) ``logits``, when this sequence asked for them."""
        if not self.params.logprobs:
            return
        import torch

        logp = torch.log_softmax(logits.float(), dim=-1)
        top: list[tuple[str, float]] = []
        if self.params.top_logprobs > 0:
            values, ids = torch.topk(logp, min(self.params.top_logprobs, logp.shape[-1]))
            # A token the grammar rules out (-inf) is no candidate: fewer may be listed.
            top = [
                (token_text(i), float(v))
                for i, v in zip(ids.tolist(), values.tolist(), strict=True)
                if v != float("-inf")
            ]
        self.logprobs.append(TokenLogprob(token, token_text(token), float(logp[token]), top))

    def take_logprobs(self) -> list[TokenLogprob] | None:
        """The logprobs not sent yet (None when the request did not ask for them)."""
        if not self.params.logprobs:
            return None
        taken, self.logprobs = self.logprobs, []
        return taken

    def advance(self, token: int, eos_ids: set[int], decode: TextDecoder) -> None:
        """Append ``token`` (its grammar, if any, accepts it); set ``finish_reason`` on EOS (or
        the grammar's end), a stop string or the length limit. ``text`` follows (``decode``'s stream for this sequence): while the sequence runs it
        holds back characters still incomplete, and once it finished it is the whole text."""
        ids = self.output_ids
        ids.append(token)
        ended = token in eos_ids and not self.params.ignore_eos
        if not self.plain:  # the penalties read the counts
            self.counts[token] = self.counts.get(token, 0) + 1
            if self.grammar is not None:
                self.grammar.accept_token(token)
                ended = ended or self.grammar.is_terminated()
        if not self.decodes:  # no text, so no stop strings: EOS or the length ends it
            if ended:
                self.finish_reason = "stop"
            elif len(ids) >= self.params.max_new_tokens:
                self.finish_reason = "length"
            return
        detok = self.detok
        if detok is None:
            detok = self.detok = decode.stream()
        self.text = detok.push(ids)
        if ended:
            self.finish_reason = "stop"
            self.text = detok.settle(ids)
            return
        for stop in self.params.stop:
            at = self.text.find(stop)
            if at >= 0:
                self.text = self.text[:at]
                self.finish_reason = "stop"
                return
        if len(ids) >= self.params.max_new_tokens:
            self.finish_reason = "length"
            self.text = detok.settle(ids)

    def take_ids(self) -> list[int]:
        """The ids not streamed yet (a sequence that does not decode)."""
        taken = self.output_ids[self.ids_sent :]
        self.ids_sent = len(self.output_ids)
        return taken

    def take_increment(self) -> str:
        """Text not streamed yet that can no longer change: while running, hold back a tail that
        could still become a stop string (``text`` holds back incomplete characters itself)."""
        end = len(self.text)
        stop = self.params.stop
        if stop and not self.finished:
            end = max(self.sent, end - max(len(s) for s in stop) + 1)
        piece = self.text[self.sent : end]
        self.sent = end
        return piece
