"""The diffusion runtime's worker target: ``run_scheduler_process(server_args, ctx)``.

One process per data-parallel replica, two with ``--enable-cfg-parallel`` (the diffusion runtime
has no tensor parallelism; see ``run_scheduler_process``). It sets the device up and loads the
pipeline through ``DiffusionModelRunner`` (every decision a call of
``platforms.diffusion.current_platform``), then serves the HTTP child with ``DiffusionScheduler``,
the shared ``BatchingScheduler`` of ``serving.scheduler`` (socket, waiting queue, batch timing,
the step loop, failure policy). What is the image runtime's own: requests are checked on arrival
(a bad one gets a 400 naming the field and the limit at once, one that asks for more than
``--max-pixel-steps`` included), and those of the same size, step count and guidance scale that
wait together run as one pipeline batch (a ``PipelineCall``) of at most ``--max-batch-size``
images.

Pipeline calls take turns a denoising step at a time (``serving.diffusion.stepping``): up to
``MAX_CALLS`` calls are under way at once, and the next step goes to the call that has had the
least work so far (pixels times images of each step it ran; a call that starts is counted level
with the least served one). So a small request runs its steps between a big one's steps and waits
at most one of them at a time. With SGLang's names, each step:

- ``get_next_batch_to_run()`` starts a pipeline call of the waiting queue's next batch when one
  is due and there is room, and returns the call that takes this step: one whose every request
  is cancelled first (it ends at this step, ``stop``), else the least served;
- ``run_batch(call)`` runs that call to its next denoising step (or its end) and returns whether
  it ended;
- ``process_batch_result(call, ended)`` tells the call's streamed requests (``stream``) of the
  step (``ImageProgress``), or, once it ended, answers its requests with their images and lets
  them go.

A cancelled request is dropped from the waiting queue, or, when every request of a call under
way is cancelled, the call ends at its next step and frees the worker.
"""

from __future__ import annotations

import itertools
import logging
import random
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from serving import wire
from serving.diffusion.model_runner import (
    OUTPUT_FORMATS,
    DiffusionModelRunner,
    ImageJob,
    ReplicaGroup,
    Shape,
)
from serving.diffusion.stepping import DenoiseStopped, StepCallback, SteppedCall
from serving.errors import InputError
from serving.scheduler import BatchingScheduler, Queued, follow
from serving.threads import share_cpu_threads

if TYPE_CHECKING:
    from bootstrap import WorkerContext
    from launchspec.server_args import ServerArgs

log = logging.getLogger("sglang_launch.diffusion")

# The most pipeline calls under way at once, taking turns; more requests wait in the queue.
MAX_CALLS = 8


def run_scheduler_process(server_args: ServerArgs, ctx: WorkerContext) -> None:
    """The bootstrap's diffusion target: set up, load, report ready, serve until stopping.

    With ``--enable-cfg-parallel`` the replica is two ranks (``ctx.tp_size`` 2): both join the
    replica's process group in ``init_device_and_model()``; rank 0 serves, rank 1 follows rank
    0's broadcasts, running the unconditional half of each CFG batch."""
    from platforms.diffusion import current_platform
    from serving.distributed import close_tp_group

    ranks = max(ctx.tp_size, 1)
    if current_platform.is_cpu():
        share_cpu_threads(ranks_on_node=ranks * max(ctx.dp_size, 1))
    group = (
        ReplicaGroup(ctx.dp_rank, ctx.tp_rank, ranks, ctx.runtime_dir, server_args.startup_timeout)
        if ranks > 1
        else None
    )
    worker = DiffusionModelRunner(
        server_args, current_platform, local_rank=ctx.local_rank, group=group
    )
    try:
        worker.init_device_and_model()
        ctx.phase("model_loaded")
        if group is None or group.rank == 0:
            DiffusionScheduler(worker, server_args, ctx).serve()
        else:
            follow(ctx, ImageFollower(worker))
    finally:
        if group is not None:
            close_tp_group()


class ImageFollower:
    """Rank 1 of a CFG-parallel replica: denoise rank 0's pipeline calls alongside it, step for
    step in the order rank 0 runs them (no decoding, no answer)."""

    def __init__(self, worker: DiffusionModelRunner) -> None:
        self.worker = worker
        self.calls: dict[int, SteppedCall[object]] = {}

    def __call__(self, work: wire.FollowerWork) -> None:
        if isinstance(work, wire.ImageBatch):
            shape = Shape(work.width, work.height, work.steps, work.guidance_scale)
            jobs = [
                ImageJob(j.rid, j.prompt, j.n, j.negative_prompt, j.seed, "png") for j in work.jobs
            ]

            def run(step: StepCallback) -> object:
                self.worker.bind_thread()
                return self.worker.denoise(shape, jobs, step)

            self.calls[work.call] = SteppedCall(run, f"image-call-{work.call}")
        elif not isinstance(work, wire.ImageTurn):
            return
        call = self.calls[work.call]
        if call.advance():
            del self.calls[work.call]
            if call.error is not None and not isinstance(call.error, DenoiseStopped):
                raise call.error


@dataclass(kw_only=True, eq=False)
class ImageItem(Queued):
    """A queued image request, its checked ``Shape`` and the seed of its first image."""

    request: wire.ImageRequest
    shape: Shape
    seed: int


@dataclass(eq=False)
class PipelineCall:
    """A pipeline batch under way: its number, requests (``reqs``), shape and jobs, whether it
    runs on both ranks (``split``), the call itself, the work it has had (``served``,
    pixel-steps), and whether its next step ends it (``stop``: every request is cancelled)."""

    number: int
    reqs: list[ImageItem]
    shape: Shape
    jobs: list[ImageJob]
    split: bool
    call: SteppedCall[list[list[bytes]]]
    served: float = 0.0
    stop: bool = False
    images: int = field(init=False)

    def __post_init__(self) -> None:
        self.images = sum(job.n for job in self.jobs)

    @property
    def step_cost(self) -> int:
        """The work of one of its steps: its pixels times its images."""
        return self.shape.width * self.shape.height * self.images


class DiffusionScheduler(BatchingScheduler[wire.ImageRequest, ImageItem, PipelineCall, bool]):
    """Rank 0 of an image replica: pipeline batches on a ``DiffusionModelRunner``, taking turns."""

    def __init__(
        self, worker: DiffusionModelRunner, server_args: ServerArgs, ctx: WorkerContext
    ) -> None:
        super().__init__(
            server_args,
            ctx,
            serves=(wire.ImageRequest,),
            model=worker.source.served_name,
            kind=worker.kind,
            ranks=worker.tp_size,
            platform=worker.platform,
        )
        self.worker = worker
        self.images_made = 0
        self.max_pixel_steps = server_args.max_pixel_steps
        self.calls: list[PipelineCall] = []  # under way, taking turns
        self.numbers = itertools.count()

    def admit(self, identity: bytes, request: wire.ImageRequest) -> ImageItem:
        self.check(request)
        shape = self.worker.shape_of(
            request.width, request.height, request.steps, request.guidance_scale
        )
        cost = shape.width * shape.height * request.n * shape.steps
        if cost > self.max_pixel_steps:
            raise InputError(
                f"this request asks for {shape.width}x{shape.height} pixels x {request.n} "
                f"image(s) x {shape.steps} steps = {cost:,} pixel-steps, more than this server's "
                f"limit of {self.max_pixel_steps:,} (--max-pixel-steps); ask for fewer steps, "
                f"fewer images or a smaller size",
                "num_inference_steps",
            )
        seed = request.seed if request.seed is not None else random.getrandbits(31)
        return ImageItem(identity=identity, request=request, shape=shape, seed=seed)

    def check(self, req: wire.ImageRequest) -> None:
        """Raise ``InputError`` for what is wrong with ``req`` that the pipeline does not check."""
        if not req.prompt.strip():
            raise InputError("prompt is empty; send the text to draw", "prompt")
        if not 1 <= req.n <= self.max_batch_size:
            raise InputError(
                f"n {req.n} must be between 1 and {self.max_batch_size} (--max-batch-size)", "n"
            )
        if req.output_format not in OUTPUT_FORMATS:
            raise InputError(
                f"output_format {req.output_format!r} is not one of {', '.join(OUTPUT_FORMATS)}",
                "output_format",
            )
        if req.seed is not None and not 0 <= req.seed < 2**63 - req.n:
            raise InputError(f"seed {req.seed} must be between 0 and 2**63 - n", "seed")

    # ---- the step: SGLang's three seams ------------------------------------------------------

    def get_next_batch_to_run(self) -> PipelineCall | None:
        """Start a pipeline call of the waiting queue's next batch when one is due and there is
        room; return the call that takes this step (the module docstring), None when none is
        under way."""
        if self.waiting_queue and self.batch_due() and len(self.calls) < MAX_CALLS:
            batch = same_shape_batch(self.waiting_queue, self.max_batch_size)
            self.batches += 1
            self.begin(batch)
            self.start(batch)
        for call in self.calls:
            if all(q.rid in self.cancelled for q in call.reqs):
                call.stop = True
                return call
        return min(self.calls, key=lambda c: c.served) if self.calls else None

    def run_batch(self, batch: PipelineCall) -> bool:
        """Run ``batch`` to its next step (``stop``: end it there); whether it ended. With
        ``--enable-cfg-parallel`` rank 1 takes the same step of the same call."""
        call = batch
        if call.split and (call.call.started or not call.stop):
            self.broadcast(
                wire.ImageTurn(call.number)
                if call.call.started
                else cfg_batch(call.number, call.shape, call.jobs)
            )
        elif not call.split:
            self.tick_followers()  # rank 1 is idle through this call
        return call.call.advance(call.stop)

    def process_batch_result(self, batch: PipelineCall, result: bool) -> None:
        """Tell the call's streamed requests of the step, or, when it ended, answer its
        requests and let them go. A call that raised leaves with its exception (the failure
        policy answers its requests)."""
        call = batch
        if not result:
            call.served += call.step_cost
            for q in call.reqs:
                if q.request.stream and q.rid not in self.cancelled:
                    self.send(
                        q.identity, wire.ImageProgress(q.rid, call.call.done, call.call.total)
                    )
            return
        self.calls.remove(call)
        error = call.call.error
        if isinstance(error, DenoiseStopped):
            self.aborted += len(call.reqs)
        elif error is not None:
            raise error
        else:
            self.answer(call)
        self.finish(call.reqs)

    def recover(self) -> None:
        """After a failed step (its requests answered by the failure policy): a pipeline call
        none of whose requests is running any more ends at the step it is paused at and leaves
        ``calls``, so that it neither runs on nor answers again."""
        for call in [c for c in self.calls if not any(q.rid in self.running for q in c.reqs)]:
            self.calls.remove(call)
            call.call.advance(stop=True)

    def start(self, batch: list[ImageItem]) -> None:
        """``batch`` becomes a pipeline call under way (it takes its first step in its turn)."""
        shape = batch[0].shape
        jobs = [
            ImageJob(
                q.rid,
                q.request.prompt,
                q.request.n,
                q.request.negative_prompt,
                q.seed,
                q.request.output_format,
            )
            for q in batch
        ]
        number = next(self.numbers)

        def run(step: StepCallback) -> list[list[bytes]]:
            self.worker.bind_thread()
            return self.worker.generate(shape, jobs, step)

        call = PipelineCall(
            number,
            batch,
            shape,
            jobs,
            self.worker.splits(shape),
            SteppedCall(run, f"image-call-{number}"),
            served=min((c.served for c in self.calls), default=0.0),
        )
        self.calls.append(call)

    def answer(self, call: PipelineCall) -> None:
        encoded = call.call.result or []
        for item, job, blobs in zip(call.reqs, call.jobs, encoded, strict=True):
            if job.rid in self.cancelled:
                self.aborted += 1
                continue
            self.send(
                item.identity,
                wire.Images(
                    job.rid,
                    blobs,
                    job.seed,
                    call.shape.width,
                    call.shape.height,
                    call.shape.steps,
                    batch_size=call.images,
                ),
            )
            self.images_made += job.n

    def stats(self) -> wire.ImageStats:
        worker = self.worker
        stats = wire.ImageStats(model=worker.describe(), memory=worker.memory_info())
        stats.images = self.images_made
        return self.counted(stats)


def cfg_batch(number: int, shape: Shape, jobs: list[ImageJob]) -> wire.ImageBatch:
    """What rank 1 of a CFG-parallel replica needs to run pipeline call ``number`` of ``jobs``
    alongside rank 0."""
    return wire.ImageBatch(
        number,
        shape.width,
        shape.height,
        shape.steps,
        shape.guidance_scale,
        [wire.ImageWork(j.rid, j.prompt, j.n, j.negative_prompt, j.seed) for j in jobs],
    )


def same_shape_batch(queue: list[ImageItem], max_images: int) -> list[ImageItem]:
    """Take the oldest request of ``queue`` and the waiting ones of its shape, at most
    ``max_images`` images in all, out of it (changed in place); the others keep their places."""
    first = queue[0]
    batch, images, rest = [first], first.request.n, []
    for item in queue[1:]:
        if item.shape == first.shape and images + item.request.n <= max_images:
            batch.append(item)
            images += item.request.n
        else:
            rest.append(item)
    queue[:] = rest
    return batch
