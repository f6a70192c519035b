"""The diffusion runtime's worker target: ``run_diffusion_worker(server_args, ctx)``.

One process per data-parallel replica, two with ``--enable-cfg-parallel`` (the diffusion runtime
has no tensor parallelism; see ``run_diffusion_worker``). It sets the device up and loads the
pipeline through ``DiffusionWorker`` (every decision a call of
``platforms.diffusion.current_platform``), then serves the HTTP child with ``ImageScheduler``,
the shared ``BatchingScheduler`` of ``serving.scheduler`` (socket, queue, batch timing, failure
policy). What is the image runtime's own: requests are checked on arrival (a bad one gets a 400
naming the field and the limit at once), and those of the same size, step count and guidance
scale that wait together run as one pipeline batch of at most ``--max-batch-size`` images. A
streamed request (``stream``) hears of each denoising step of its batch (``ImageProgress``)
before its images. A cancelled request is dropped from the queue, or, when every request of the
running batch is cancelled, the denoising loop stops at the next step.
"""

from __future__ import annotations

import logging
import random
from dataclasses import dataclass
from typing import TYPE_CHECKING

from serving import wire
from serving.diffusion.runner import (
    OUTPUT_FORMATS,
    DiffusionWorker,
    ImageJob,
    ReplicaGroup,
    Shape,
)
from serving.errors import InputError
from serving.scheduler import BatchingScheduler, Queued, follow
from serving.threads import share_cpu_threads

if TYPE_CHECKING:
    from bootstrap import WorkerContext
    from launcher.server_args import ServerArgs

log = logging.getLogger("sglang_launch.diffusion")


def run_diffusion_worker(server_args: ServerArgs, ctx: WorkerContext) -> None:
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
    worker = DiffusionWorker(server_args, current_platform, local_rank=ctx.local_rank, group=group)
    try:
        worker.init_device_and_model()
        ctx.phase("model_loaded")
        if group is None or group.rank == 0:
            ImageScheduler(worker, server_args, ctx).serve()
        else:
            follow(ctx, lambda work: follow_image_batch(worker, work))
    finally:
        if group is not None:
            close_tp_group()


def follow_image_batch(worker: DiffusionWorker, work: wire.FollowerWork) -> None:
    """Rank 1 of a CFG-parallel replica: denoise rank 0's batch alongside it (no decoding, no
    answer)."""
    if not isinstance(work, wire.ImageBatch):
        return
    shape = Shape(work.width, work.height, work.steps, work.guidance_scale)
    jobs = [ImageJob(j.rid, j.prompt, j.n, j.negative_prompt, j.seed, "png") for j in work.jobs]
    worker.denoise(shape, jobs)


@dataclass(kw_only=True)
class ImageItem(Queued):
    """A queued image request, its checked ``Shape`` and the seed of its first image."""

    request: wire.ImageRequest
    shape: Shape
    seed: int


class ImageScheduler(BatchingScheduler[wire.ImageRequest, ImageItem]):
    """Rank 0 of an image replica: pipeline batches on a ``DiffusionWorker``."""

    def __init__(
        self, worker: DiffusionWorker, server_args: ServerArgs, ctx: WorkerContext
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

    def admit(self, identity: bytes, request: wire.ImageRequest) -> ImageItem:
        self.check(request)
        shape = self.worker.shape_of(
            request.width, request.height, request.steps, request.guidance_scale
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

    def take_batch(self) -> list[ImageItem]:
        """The oldest request and the queued ones of its shape, at most ``max_batch_size``
        images in all; the others keep their places."""
        first = self.queue.popleft()
        batch, images, rest = [first], first.request.n, []
        while self.queue:
            item = self.queue.popleft()
            if item.shape == first.shape and images + item.request.n <= self.max_batch_size:
                batch.append(item)
                images += item.request.n
            else:
                rest.append(item)
        self.queue.extendleft(reversed(rest))
        return batch

    def execute(self, batch: list[ImageItem]) -> None:
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
        split = self.worker.splits(shape)
        streamed = [q for q in batch if q.request.stream]
        rids = {q.rid for q in batch}

        def every_step(done: int, total: int) -> bool:
            cancelled = self.poll()
            if not split:
                self.tick_followers()  # rank 1 is idle through this batch
            for q in streamed:  # each streamed request of the batch hears of every step
                if q.rid not in cancelled:
                    self.send(q.identity, wire.ImageProgress(q.rid, done, total))
            return rids <= cancelled

        if split:
            self.broadcast(cfg_batch(shape, jobs))  # rank 1 computes the other CFG half
        encoded = self.worker.generate(shape, jobs, every_step)
        images = sum(j.n for j in jobs)
        for item, job, blobs in zip(batch, jobs, encoded, strict=True):
            if job.rid in self.cancelled:
                self.aborted += 1
                continue
            self.send(
                item.identity,
                wire.Images(
                    job.rid,
                    blobs,
                    job.seed,
                    shape.width,
                    shape.height,
                    shape.steps,
                    batch_size=images,
                ),
            )
            self.images_made += job.n

    def stats(self) -> wire.ImageStats:
        worker = self.worker
        stats = wire.ImageStats(model=worker.describe(), memory=worker.memory_info())
        stats.images = self.images_made
        return self.counted(stats)


def cfg_batch(shape: Shape, jobs: list[ImageJob]) -> wire.ImageBatch:
    """What rank 1 of a CFG-parallel replica needs to run ``jobs`` alongside rank 0."""
    return wire.ImageBatch(
        shape.width,
        shape.height,
        shape.steps,
        shape.guidance_scale,
        [wire.ImageWork(j.rid, j.prompt, j.n, j.negative_prompt, j.seed) for j in jobs],
    )
