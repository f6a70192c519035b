"""Picking the next token, and deciding when a sequence is finished.

Each sequence samples with its own ``torch.Generator`` seeded from its request, so a request's
tokens do not depend on what else shares its batch, and every tensor-parallel rank (which sees
the same logits and the same seed) picks the same token without exchanging it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from serving.wire import SamplingParams

if TYPE_CHECKING:
    import torch


def select_token(logits: torch.Tensor, params: SamplingParams, generator: torch.Generator) -> int:
    """The next token id for one sequence from its last-position ``logits`` (vocab,)."""
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


@dataclass
class Sequence:
    """One request's progress through a generation batch."""

    rid: str
    prompt_ids: list[int]
    params: SamplingParams
    seed: int
    stream: bool = False
    output_ids: list[int] = field(default_factory=list)
    text: str = ""
    sent: int = 0  # characters of ``text`` already streamed
    finish_reason: str | None = None

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None

    def advance(self, token: int, eos_ids: set[int], decode: Callable[[list[int]], str]) -> None:
        """Append ``token``; set ``finish_reason`` on EOS, a stop string or the length limit."""
        self.output_ids.append(token)
        self.text = decode(self.output_ids)
        if token in eos_ids and not self.params.ignore_eos:
            self.finish_reason = "stop"
            return
        for stop in self.params.stop:
            at = self.text.find(stop)
            if at >= 0:
                self.text = self.text[:at]
                self.finish_reason = "stop"
                return
        if len(self.output_ids) >= self.params.max_new_tokens:
            self.finish_reason = "length"

    def take_increment(self) -> str:
        """Text not streamed yet that can no longer change: while running, hold back a tail that
        could still become a stop string or an incomplete character."""
        end = len(self.text)
        if not self.finished:
            hold = max((len(s) - 1 for s in self.params.stop), default=0)
            end = max(self.sent, end - hold)
            while end > self.sent and self.text[end - 1] == "\ufffd":
                end -= 1
        piece = self.text[self.sent : end]
        self.sent = end
        return piece
