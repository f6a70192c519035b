"""Messages between the HTTP child and the schedulers (msgspec msgpack, one frame each).

The HTTP child holds one DEALER socket per data-parallel replica; a scheduler's rank 0 binds a
ROUTER socket at ``ctx.endpoint(scheduler_endpoint_name(dp_rank))``. Requests go one way, results
come back tagged with the request's ``rid``. Every struct is tagged so one decoder reads the union.
Nothing here is pickled: a malformed frame is a ``msgspec.DecodeError`` the receiver logs and drops.
"""

from __future__ import annotations

import array
import sys
from typing import TYPE_CHECKING, ClassVar

import msgspec

if TYPE_CHECKING:
    import torch


def scheduler_endpoint_name(dp_rank: int) -> str:
    """The name passed to ``ctx.endpoint`` for replica ``dp_rank``'s request socket."""
    return f"scheduler-{dp_rank}.sock"


class SamplingParams(msgspec.Struct, frozen=True):
    """How to pick each new token. ``temperature == 0`` is greedy; ``seed=None`` means the
    scheduler draws one (and reports it), so every rank of a replica samples identically."""

    max_new_tokens: int = 16
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    stop: tuple[str, ...] = ()
    ignore_eos: bool = False
    seed: int | None = None


# ---- HTTP child -> scheduler -------------------------------------------------------------------


class EmbedRequest(msgspec.Struct, tag="embed"):
    """``inflight``: how many requests the sender has outstanding at this replica, this one
    included; once that many are queued, no more are on the way and the batch can start."""

    rid: str
    texts: list[str]
    inflight: int = 1


class GenerateRequest(msgspec.Struct, tag="generate"):
    rid: str
    text: str
    params: SamplingParams
    stream: bool = False
    inflight: int = 1


class ImageRequest(msgspec.Struct, tag="image"):
    """Generate ``n`` images of ``width`` x ``height`` for ``prompt`` (diffusion runtime).

    ``None`` for ``width``, ``height``, ``steps`` or ``guidance_scale`` means the pipeline's own
    default; ``seed=None`` means the worker draws one (and reports it). Image ``i`` of the
    request starts from the noise of seed ``seed + i`` (its own generator, whatever else shares
    the batch). ``output_format`` is ``png``, ``jpeg`` or ``webp``. With ``stream``, an
    ``ImageProgress`` answers each denoising step before the final ``Images``."""

    rid: str
    prompt: str
    n: int = 1
    negative_prompt: str | None = None
    width: int | None = None
    height: int | None = None
    steps: int | None = None
    guidance_scale: float | None = None
    seed: int | None = None
    output_format: str = "png"
    stream: bool = False
    inflight: int = 1


class Cancel(msgspec.Struct, tag="cancel"):
    """The client went away: drop ``rid`` if queued, stop it at the next step if running."""

    rid: str


class Ping(msgspec.Struct, tag="ping"):
    """Answered with ``Pong`` by a scheduler that has loaded its model and run the warm-up."""

    rid: str


# ---- scheduler -> HTTP child -------------------------------------------------------------------


class Embeddings(msgspec.Struct, tag="embeddings"):
    """``vectors``: one row of ``dim`` float32 values per input text, little-endian, row after
    row (``pack_vectors`` / ``unpack_vectors``): 4 bytes a value rather than 9 as msgpack floats,
    and no Python float per value in the scheduler."""

    rid: str
    vectors: bytes
    dim: int
    prompt_tokens: int
    batch_size: int = 1


def pack_vectors(matrix: torch.Tensor) -> bytes:
    """The bytes of ``Embeddings.vectors`` from a 2-D float32 CPU tensor (rows ``i..j`` of it are
    bytes ``i * dim * 4 .. j * dim * 4`` of the result)."""
    rows = matrix.contiguous().numpy()
    return (rows if sys.byteorder == "little" else rows.astype("<f4")).tobytes()


def unpack_vectors(data: bytes, dim: int) -> list[list[float]]:
    """``Embeddings.vectors`` back as rows of Python floats (the float32 values exactly)."""
    values = array.array("f")
    values.frombytes(data)
    if sys.byteorder != "little":
        values.byteswap()
    flat = values.tolist()
    return [flat[at : at + dim] for at in range(0, len(flat), dim)] if dim > 0 else []


class Generated(msgspec.Struct, tag="generated"):
    """A finished generation (or, with ``finished=False``, one streamed increment of it).

    ``text`` is the increment when streaming and the whole completion otherwise;
    ``finish_reason`` is ``"length"``, ``"stop"`` or ``"abort"``.
    """

    rid: str
    text: str
    prompt_tokens: int
    completion_tokens: int
    finished: bool = True
    finish_reason: str | None = None
    seed: int | None = None
    batch_size: int = 1


class Images(msgspec.Struct, tag="images"):
    """The encoded images answering an ``ImageRequest`` (``output_format`` bytes each), with the
    seed and size they were made with and how many images shared their pipeline batch."""

    rid: str
    images: list[bytes]
    seed: int
    width: int
    height: int
    steps: int
    batch_size: int = 1


class ImageProgress(msgspec.Struct, tag="image_progress"):
    """A streamed ``ImageRequest`` finished denoising step ``step`` of ``total_steps`` (counted
    from 1; the step advanced every image of the request). Never the final answer: ``Images``
    (or ``RequestFailed``) follows."""

    finished: ClassVar[bool] = False  # read by the HTTP child: more answers follow

    rid: str
    step: int
    total_steps: int


class RequestFailed(msgspec.Struct, tag="failed"):
    """The request could not run. ``status`` is the HTTP status the client gets (4xx for input
    the model rejects, 503 for an unavailable scheduler); ``message`` says what to change."""

    rid: str
    status: int
    message: str
    param: str | None = None  # the request field to change: "input", "max_new_tokens" or "model"


class Pong(msgspec.Struct, tag="pong"):
    rid: str
    dp_rank: int
    pid: int
    model: str
    kind: str
    queue_depth: int
    info: dict = {}


# ---- scheduler rank 0 -> the other ranks of its replica (tensor- or CFG-parallel) ------------------------


class SeqWork(msgspec.Struct):
    rid: str
    prompt_ids: list[int]
    params: SamplingParams
    seed: int
    stream: bool = False


class Batch(msgspec.Struct, tag="batch"):
    """Generate these sequences together; every rank runs the same decode loop."""

    seqs: list[SeqWork]


class ImageWork(msgspec.Struct):
    """One request's share of an image batch (``n`` images from seed ``seed``)."""

    rid: str
    prompt: str
    n: int
    negative_prompt: str | None
    seed: int


class ImageBatch(msgspec.Struct, tag="image_batch"):
    """Denoise these requests as one pipeline call of this shape; with ``--enable-cfg-parallel``
    rank 1 runs the same call and computes the unconditional half of each step."""

    width: int
    height: int
    steps: int
    guidance_scale: float
    jobs: list[ImageWork]


class Tick(msgspec.Struct, tag="tick"):
    """Nothing to do yet (sent about once a second, so followers never wait on a silent group)."""


class Stop(msgspec.Struct, tag="stop"):
    """Rank 0 is stopping: leave the loop and the group."""


ToFollower = Batch | ImageBatch | Tick | Stop

ToScheduler = EmbedRequest | GenerateRequest | ImageRequest | Cancel | Ping
FromScheduler = Embeddings | Generated | Images | ImageProgress | RequestFailed | Pong

_encoder = msgspec.msgpack.Encoder()
_to_scheduler = msgspec.msgpack.Decoder(ToScheduler)
_from_scheduler = msgspec.msgpack.Decoder(FromScheduler)
_to_follower = msgspec.msgpack.Decoder(ToFollower)


def encode(message: msgspec.Struct) -> bytes:
    return _encoder.encode(message)


def decode_to_scheduler(frame: bytes) -> ToScheduler:
    return _to_scheduler.decode(frame)


def decode_from_scheduler(frame: bytes) -> FromScheduler:
    return _from_scheduler.decode(frame)


def decode_to_follower(frame: bytes) -> ToFollower:
    return _to_follower.decode(frame)
