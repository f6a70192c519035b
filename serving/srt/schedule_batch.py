"""What the text scheduler's steps work on, with SGLang's names: ``Req``, ``ScheduleBatch``, and
what ``Scheduler.run_batch`` returns (``GenerationBatchResult``, ``EmbeddingBatchResult``).

A plugin reads these as it would SGLang's: a generation request (``Req``) has its ``rid``, its
prompt as text and as token ids (``origin_input_text``, ``origin_input_ids``), its
``sampling_params`` (``serving.wire.SamplingParams``: ``max_new_tokens``, ``temperature``, ...),
the tokens generated so far (``output_ids``) and ``finished()``; a batch has its ``reqs``. An
embedding request (``serving.srt.embedding.EmbedReq``) has the same names, for each of its
texts.
"""

from __future__ import annotations

from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any, Generic, Protocol, TypeVar

from serving import wire
from serving.scheduler import Queued
from serving.srt.sampling import Sequence


class Request(Protocol):
    """What a batch needs of its requests (``Req``, ``EmbedReq``)."""

    @property
    def rid(self) -> str: ...

    def finished(self) -> bool: ...


Q = TypeVar("Q", bound=Request)


@dataclass(kw_only=True, eq=False)
class Req(Queued):
    """A generation request, from its arrival in the waiting queue to its last answer: ``seq``
    is its decode state (the same ``Sequence`` the engine steps); ``joined``: it is in the
    engine's running batch (and in ``Scheduler.running``). ``grammar``: the compile of its
    grammar while it is under way (a constrained request is admitted once it is done)."""

    request: wire.GenerateRequest
    seq: Sequence
    joined: bool = False
    grammar: Future[Any] | None = None

    @property
    def origin_input_text(self) -> str:
        """The prompt as sent (a chat request's rendered template)."""
        return self.request.text

    @property
    def origin_input_ids(self) -> list[int]:
        """The prompt's token ids."""
        return self.seq.prompt_ids

    @property
    def sampling_params(self) -> wire.SamplingParams:
        return self.request.params

    @property
    def output_ids(self) -> list[int]:
        """The tokens generated so far."""
        return self.seq.output_ids

    def finished(self) -> bool:
        """Whether it has ended (``finish_reason``: ``"stop"``, ``"length"`` or ``"abort"``)."""
        return self.seq.finish_reason is not None

    @property
    def finish_reason(self) -> str | None:
        return self.seq.finish_reason

    @property
    def prompt_tokens(self) -> int:
        return len(self.seq.prompt_ids)

    @property
    def group(self) -> str:
        """The HTTP request it belongs to (admission is fair across these)."""
        return self.request.group or self.request.rid

    @property
    def footprint(self) -> int:
        """The KV tokens it may take: prompt + ``max_new_tokens``."""
        return len(self.seq.prompt_ids) + self.request.params.max_new_tokens

    def work(self) -> wire.SeqWork:
        """What the other ranks of a tensor-parallel replica need to step it alongside rank 0."""
        s = self.seq
        return wire.SeqWork(s.rid, s.prompt_ids, s.params, s.seed, s.stream)


class ScheduleBatch(Generic[Q]):
    """The requests one step works on (``reqs``). Generation: ``Scheduler.running_batch``, the
    running requests in the order they were admitted, one batch for the replica's life (a
    request joins it when admitted, and leaves it at the step after the one it finished in).
    Embeddings: a new batch each step, its requests' texts ``part``."""

    __slots__ = ("reqs",)

    def __init__(self, reqs: list[Q] | None = None) -> None:
        self.reqs: list[Q] = [] if reqs is None else reqs

    def __len__(self) -> int:
        return len(self.reqs)

    def is_empty(self) -> bool:
        return not self.reqs

    def filter_batch(self) -> None:
        """Drop the finished requests (generation: the scheduler does it at the start of the
        step after they finished, so that a hook on ``process_batch_result`` still sees them)."""
        self.reqs[:] = [r for r in self.reqs if not r.finished()]

    def __repr__(self) -> str:
        return f"ScheduleBatch({[q.rid for q in self.reqs]!r})"


@dataclass(slots=True)
class GenerationBatchResult:
    """One generation step: the sequences that got a token, finished or were cancelled in it
    (in batch order, each once), the tokens it generated, and the decoding rows it ran."""

    sequences: list[Sequence] = field(default_factory=list)
    tokens: int = 0
    batch_size: int = 0


@dataclass(slots=True)
class EmbeddingBatchResult:
    """One embedding batch: its vectors packed as float32 rows (``wire.pack_vectors``) in the
    order of the batch's texts, ``dim`` numbers each."""

    rows: bytes
    dim: int
    texts: int
