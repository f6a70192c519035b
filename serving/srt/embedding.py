"""The text runtime's embedding requests as batches of texts shared fairly between requests.

A batch holds at most ``--max-batch-size`` texts (``take_texts``), taken from every queued request
in turn, oldest first, one text each round: a request of a few texts is in the next batch whatever
is queued before it, and a request of many texts runs over several batches, interleaved with the
requests that arrive meanwhile, and is answered once its last text is embedded. So a big request
delays a small one by at most one batch.

An ``EmbedReq`` has SGLang's request names, one entry per text: ``origin_input_text`` (the
texts), ``origin_input_ids`` (their token ids); ``sampling_params`` generates nothing
(``max_new_tokens=0``), ``output_ids`` is empty, and ``finished()`` says whether every text is
embedded.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from serving import wire
from serving.scheduler import Queued

# What an embedding request samples with: nothing (SGLang's embedding requests say the same).
NO_SAMPLING = wire.SamplingParams(max_new_tokens=0)


@dataclass(kw_only=True, eq=False)
class EmbedReq(Queued):
    """A queued embedding request: one token list per text, and how far it has got.

    ``taken``: its texts handed to batches so far; ``part``: its texts in the batch being run;
    ``vectors``: the rows of the batches it has run (packed, in text order); ``embedded``: its
    texts embedded so far; ``widest``: the most texts of a batch it ran in."""

    request: wire.EmbedRequest
    input_ids: list[list[int]]
    taken: int = 0
    part: range = range(0)
    vectors: list[bytes] = field(default_factory=list)
    embedded: int = 0
    widest: int = 0

    @property
    def origin_input_text(self) -> list[str]:
        return self.request.texts

    @property
    def origin_input_ids(self) -> list[list[int]]:
        return self.input_ids

    @property
    def sampling_params(self) -> wire.SamplingParams:
        return NO_SAMPLING

    @property
    def output_ids(self) -> list[int]:
        return []

    def finished(self) -> bool:
        """Every text of it is embedded."""
        return self.embedded >= len(self.input_ids)

    @property
    def load(self) -> int:
        """The batch room it takes: its texts."""
        return max(len(self.input_ids), 1)

    @property
    def prompt_tokens(self) -> int:
        return sum(map(len, self.input_ids))

    @property
    def started(self) -> bool:
        return self.taken > 0

    @property
    def complete(self) -> bool:
        """Every text of it has been handed to a batch."""
        return self.taken >= len(self.input_ids)

    def add_rows(self, rows: bytes, batch_texts: int) -> None:
        """The packed rows of ``part``, from a batch of ``batch_texts`` texts."""
        self.vectors.append(rows)
        self.embedded += len(self.part)
        self.widest = max(self.widest, batch_texts)

    def answer(self, dim: int) -> wire.Embeddings:
        """The answer of a request whose every text is embedded."""
        rows = self.vectors[0] if len(self.vectors) == 1 else b"".join(self.vectors)
        return wire.Embeddings(self.rid, rows, dim, self.prompt_tokens, batch_size=self.widest)


def take_texts(queue: list[EmbedReq], capacity: int) -> list[EmbedReq]:
    """The requests of the next batch, at most ``capacity`` texts in all, each with its ``part``
    set: one text from each queued request in turn, in queue order, until the batch is full or
    every text is taken. A request whose last text is taken leaves the queue (changed in place);
    the others keep their places."""
    share = dict.fromkeys(range(len(queue)), 0)
    room = max(capacity, 1)
    while room:
        progressed = False
        for at, item in enumerate(queue):
            if not room:
                break
            if item.taken + share[at] < len(item.input_ids):
                share[at] += 1
                room -= 1
                progressed = True
        if not progressed:
            break
    batch: list[EmbedReq] = []
    rest: list[EmbedReq] = []
    for at, item in enumerate(queue):
        if share[at] or not item.input_ids:
            item.part = range(item.taken, item.taken + share[at])
            item.taken += share[at]
            batch.append(item)
        if not item.complete:
            rest.append(item)
    queue[:] = rest
    return batch
