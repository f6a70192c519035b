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
    scheduler draws one (and reports it), so every rank of a replica samples identically.

    ``presence_penalty`` and ``frequency_penalty`` (OpenAI's meaning) are subtracted from the
    logits of every token id this sequence already generated, once and once per occurrence,
    before temperature. ``logprobs``: report the chosen token's log-probability at each step;
    ``top_logprobs`` (0..20): also that many most likely tokens. Log-probabilities are of the
    model's distribution after the penalties and before temperature, top-k and top-p.

    ``json_schema`` (a JSON Schema as a JSON string), ``regex`` and ``ebnf`` (SGLang's names):
    at most one is set; it constrains the tokens this sequence may generate to those of the
    grammar, every step, before penalties, sampling and log-probabilities are taken. A sequence
    whose grammar is complete may only end (EOS); one that reaches ``max_new_tokens`` first ends
    with ``"length"``. A grammar that does not compile fails the request with a 400."""

    max_new_tokens: int = 16
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    stop: tuple[str, ...] = ()
    ignore_eos: bool = False
    seed: int | None = None
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    logprobs: bool = False
    top_logprobs: int = 0
    json_schema: str | None = None
    regex: str | None = None
    ebnf: str | None = None


# ---- HTTP child -> scheduler -------------------------------------------------------------------


class EmbedRequest(msgspec.Struct, tag="embed"):
    """``inflight``: how many requests the sender has outstanding at this replica, this one
    included; once that many are queued, no more are on the way and the batch can start.
    ``kind`` (of every request struct): the kind of model that serves it."""

    kind: ClassVar[str] = "embedding"

    rid: str
    texts: list[str]
    inflight: int = 1


class GenerateRequest(msgspec.Struct, tag="generate"):
    """One sequence to generate. ``group``: the id of the HTTP request it belongs to (one
    sequence per prompt and per choice); when more sequences wait than fit, the group with the
    fewest running sequences is admitted first. ``raw``: tokenise ``text`` without adding the tokenizer's
    special tokens (a chat prompt rendered by the model's template writes its own). ``decoder``:
    the ``TextDecoder.identity`` of the tokenizer the HTTP child would decode the stream with; a
    scheduler whose own decoder has that identity answers a streamed request that has no stop
    strings and asks for no logprobs with token ids (``Generated.token_ids``), not text."""

    kind: ClassVar[str] = "generation"

    rid: str
    text: str
    params: SamplingParams
    stream: bool = False
    inflight: int = 1
    group: str = ""
    raw: bool = False
    decoder: str = ""


class ImageRequest(msgspec.Struct, tag="image"):
    """Generate ``n`` images of ``width`` x ``height`` for ``prompt`` (diffusion runtime).

    ``None`` for ``width``, ``height``, ``steps`` or ``guidance_scale`` means the pipeline's own
    default; ``seed=None`` means the worker draws one (and reports it). Image ``i`` of the
    request starts from the noise of seed ``seed + i`` (its own generator, whatever else shares
    the batch). ``output_format`` is ``png``, ``jpeg`` or ``webp``. With ``stream``, an
    ``ImageProgress`` answers each denoising step before the final ``Images``."""

    kind: ClassVar[str] = "image"

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


class FlushCache(msgspec.Struct, tag="flush_cache"):
    """Empty the prefix cache (``POST /flush_cache``): answered with ``FlushCacheResult`` by
    ``BatchingScheduler.flush_cache()``. A scheduler with a prefix cache flushes it only when no
    request is running or waiting (SGLang's rule), and refuses otherwise; the caller may retry."""

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


class TokenLogprob(msgspec.Struct, array_like=True):
    """One generated token: its id, its text decoded alone, its log-probability, and (with
    ``top_logprobs``) the most likely tokens of that step as ``(text, logprob)``, most likely
    first (empty otherwise)."""

    token_id: int
    token: str
    logprob: float
    top: list[tuple[str, float]]


class Generated(msgspec.Struct, tag="generated"):
    """A finished generation (or, with ``finished=False``, one streamed increment of it).

    ``text`` is the increment when streaming and the whole completion otherwise;
    ``finish_reason`` is ``"length"``, ``"stop"`` or ``"abort"``. ``logprobs`` (only when the
    request asked for them): one entry per token of this message, the tokens generated since
    the previous message when streaming, all of them otherwise. ``batch_size``: the sequences
    that ran in the step that finished (or advanced) this one. ``token_ids``: a stream the
    scheduler does not decode (``GenerateRequest.decoder``) carries the ids generated since the
    previous message here, and ``text`` is empty (the HTTP child decodes them).
    ``cached_tokens``: how many of the ``prompt_tokens`` had their KV taken from the prefix
    cache rather than prefilled (SGLang's ``meta_info.cached_tokens``), on every message of the
    sequence (a streamed increment's too); 0 without a cache.
    """

    rid: str
    text: str
    prompt_tokens: int
    completion_tokens: int
    finished: bool = True
    finish_reason: str | None = None
    seed: int | None = None
    batch_size: int = 1
    logprobs: list[TokenLogprob] | None = None
    token_ids: list[int] | None = None
    cached_tokens: int = 0


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


class FlushCacheResult(msgspec.Struct, tag="flush_cache_result"):
    """The answer to ``FlushCache``: ``ok`` when the prefix cache is now empty; otherwise
    ``message`` says why not (requests running or waiting; no prefix cache in this runtime);
    ``busy``: requests ran or waited there, so a later try may succeed."""

    rid: str
    ok: bool
    message: str = ""
    busy: bool = False


# ---- what a scheduler reports about itself: ready info (to the supervisor) and its Pong ---------


class CpuThreads(msgspec.Struct):
    """The process's torch CPU threads: the intra-op thread count and the OpenMP wait policy its
    pool started with (``OMP_WAIT_POLICY``; None when unset)."""

    intra_op: int
    omp_wait_policy: str | None


class Pooling(msgspec.Struct):
    """How an embedding model pools and normalises, and which file of its directory says so."""

    mode: str
    normalize: bool
    declared_by: str


class TextModel(msgspec.Struct):
    """A text model as served: embeddings (``pooling`` set) or generation (``kind``).
    ``max_input_tokens``: the longest prompt (or embedding input); ``context_length``: the
    longest prompt + completion of one request; ``max_total_tokens``: the KV pool of all running
    sequences together (generation; for embeddings the same as ``context_length``);
    ``model_class``: the class that runs it (transformers', or one a plugin registered)."""

    model_path: str
    served_model_name: str
    embedded_default: bool
    architecture: str
    kind: str
    device: str
    dtype: str
    attention: str
    tp_size: int
    max_input_tokens: int
    max_total_tokens: int
    context_length: int
    pooling: Pooling | None
    load_seconds: float
    cpu_threads: CpuThreads
    model_class: str = ""
    dtype_reason: str = ""  # why ``dtype`` (``auto: the CPU has AVX512-BF16``, ``--dtype X``)
    quantization: str | None = None  # the weight scheme (``int8wo``, ``int4wo-32``, ``gguf``)
    weights: str = ""  # what the weights are, as a sentence (``model_loader.weights``)


class TextMemory(msgspec.Struct):
    """The device's memory from the SRT platform, in bytes; None where the platform cannot tell."""

    total_bytes: int | None
    available_bytes: int | None
    used_bytes: int | None


class ImageAttention(msgspec.Struct):
    """The attention the platform named (``backend``), the processor classes the denoiser runs,
    and ``--attention-backend`` as asked (None: the platform's choice)."""

    backend: str
    processors: list[str]
    requested: str | None


class CustomOpUse(msgspec.Struct):
    """How many of the denoiser's layers are one ``CustomOp`` class, by the forward each resolved
    to."""

    count: int
    forward: dict[str, int]


class ImageParallel(msgspec.Struct):
    """A replica's ranks (two with ``--enable-cfg-parallel``) and the platform's parallel parts.
    ``backend``, ``device_id`` and ``split_steps`` (denoiser calls computed half on each rank)
    are reported only for a CFG-parallel replica."""

    ranks: int
    cfg_parallel: bool
    cpu_architecture: str
    all_to_all_communicator: str | None
    backend: str | msgspec.UnsetType = msgspec.UNSET
    device_id: str | None | msgspec.UnsetType = msgspec.UNSET
    split_steps: int | msgspec.UnsetType = msgspec.UNSET


class TorchCompile(msgspec.Struct):
    """``--enable-torch-compile``: the platform's backend and options (as strings)."""

    backend: str
    options: dict[str, str]


class ImageModel(msgspec.Struct):
    """A diffusers pipeline as served."""

    name: str
    path: str
    kind: str
    pipeline_class: str
    denoiser: str
    device: str
    dtype: str
    attention: ImageAttention | None
    custom_ops: dict[str, CustomOpUse]
    layerwise_offload: bool
    parallel: ImageParallel | None
    torch_compile: TorchCompile | None
    size_multiple: int | None
    default_size: int | None
    load_seconds: float
    cpu_threads: CpuThreads
    pid: int


class ImageMemory(msgspec.Struct):
    """The device's total and free memory from the diffusion platform, in GiB, or the error that
    kept the platform from telling."""

    total_gib: float | msgspec.UnsetType = msgspec.UNSET
    available_gib: float | msgspec.UnsetType = msgspec.UNSET
    error: str | msgspec.UnsetType = msgspec.UNSET


class SchedulerStats(msgspec.Struct, kw_only=True):
    """The counters every scheduler keeps: batches run, requests cancelled while they ran, and
    tokens generated (0 where the runtime generates none); and the metrics plugins defined in
    its process (``serving.plugin_metrics``: Prometheus' text format, "" when none)."""

    batches: int = 0
    aborted: int = 0
    generated_tokens: int = 0
    plugin_metrics: str = ""


class TextStats(SchedulerStats, tag="text", kw_only=True):
    """A text scheduler's counters, its model and its device's memory. Generation: ``running``
    sequences decoding (or prefilling) now, ``queued`` waiting to be admitted, the KV pool's
    tokens (``kv_tokens_total``, ``--max-total-tokens``) and those reserved by the running
    sequences (``kv_tokens_used``), and the tokens generated per second over the last few
    seconds. ``prompt_tokens_total``: the prompt tokens of every generation admitted since the
    scheduler started, ``cached_tokens_total`` those of them whose KV came from the prefix cache
    (their ratio is ``sglang:cache_hit_rate``)."""

    model: TextModel
    memory: TextMemory
    running: int = 0
    queued: int = 0
    kv_tokens_used: int = 0
    kv_tokens_total: int = 0
    generation_tokens_per_s: float = 0.0
    prompt_tokens_total: int = 0
    cached_tokens_total: int = 0


class ImageStats(SchedulerStats, tag="image", kw_only=True):
    """An image scheduler's counters (``images``: images sent), its pipeline and device memory."""

    model: ImageModel
    memory: ImageMemory
    images: int = 0


Stats = TextStats | ImageStats


class ReplicaReady(msgspec.Struct, kw_only=True):
    """What rank 0 of a replica reports ready with (as ``ctx.ready(**msgspec.to_builtins(it))``;
    the supervisor keeps it as JSON): where its request socket is, its model and memory, and
    ``devices``: how many devices of its model's kind torch sees on this node (None on the CPU),
    which bounds the replicas a scale may add."""

    dp_rank: int
    endpoint: str
    pid: int
    model: TextModel | ImageModel
    memory: TextMemory | ImageMemory
    devices: int | None = None


class RankReady(msgspec.Struct, kw_only=True):
    """What a rank > 0 of a replica (it follows rank 0, serves nobody) reports ready with."""

    dp_rank: int
    tp_rank: int
    pid: int


class Pong(msgspec.Struct, tag="pong"):
    """A scheduler's answer to ``Ping``: who it is, what it serves, how many requests wait in
    its queue, and its ``Stats`` (None from a scheduler that keeps none)."""

    rid: str
    dp_rank: int
    pid: int
    model: str
    kind: str
    queue_depth: int
    info: Stats | None = None


# ---- scheduler rank 0 -> the other ranks of its replica (tensor- or CFG-parallel) ------------------------


class SeqWork(msgspec.Struct):
    rid: str
    prompt_ids: list[int]
    params: SamplingParams
    seed: int
    stream: bool = False


class GenerationStep(msgspec.Struct, tag="generation_step"):
    """One step of the running generation batch: these sequences join it (rank 0 admitted
    them), these rids leave it cancelled; every rank then runs the same step. ``prepare``: the
    grammars (``(kind, text)``) of requests rank 0 queued since its last step, which the other
    ranks start compiling now, so that a sequence's grammar is ready when it joins."""

    join: list[SeqWork]
    cancel: list[str]
    flush: bool = False  # drop every cached prefix (the batch is empty: ``POST /flush_cache``)
    prepare: list[tuple[str, str]] = msgspec.field(default_factory=list)


class ImageWork(msgspec.Struct):
    """One request's share of an image batch (``n`` images from seed ``seed``)."""

    rid: str
    prompt: str
    n: int
    negative_prompt: str | None
    seed: int


class ImageBatch(msgspec.Struct, tag="image_batch"):
    """Start denoising these requests as pipeline call ``call`` of this shape, and run it to its
    first step; with ``--enable-cfg-parallel`` rank 1 runs the same call and computes the
    unconditional half of each step. Rank 1 takes every further step when ``ImageTurn`` says."""

    call: int
    width: int
    height: int
    steps: int
    guidance_scale: float
    jobs: list[ImageWork]


class ImageTurn(msgspec.Struct, tag="image_turn"):
    """Run pipeline call ``call`` to its next step (or its end): rank 0 takes the same step.
    Calls under way take turns this way, in the order rank 0 chooses."""

    call: int


class Tick(msgspec.Struct, tag="tick"):
    """Nothing to do yet (sent about once a second, so followers never wait on a silent group)."""


class Stop(msgspec.Struct, tag="stop"):
    """Rank 0 is stopping: leave the loop and the group."""


FollowerWork = GenerationStep | ImageBatch | ImageTurn
ToFollower = FollowerWork | Tick | Stop

Request = EmbedRequest | GenerateRequest | ImageRequest
ToScheduler = Request | Cancel | Ping | FlushCache
FromScheduler = (
    Embeddings | Generated | Images | ImageProgress | RequestFailed | Pong | FlushCacheResult
)

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
