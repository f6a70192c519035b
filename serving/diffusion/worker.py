"""The diffusion runtime's worker target: ``run_diffusion_worker(server_args, ctx)``.

One process per data-parallel replica, two with ``--enable-cfg-parallel`` (the diffusion runtime
has no tensor parallelism; see ``run_diffusion_worker``). It sets
the device up and loads the pipeline through ``DiffusionWorker`` (every decision a call of
``platforms.diffusion.current_platform``), then serves the HTTP child on the same socket and
with the same queue as the text scheduler (``serving.srt.scheduler.Scheduler``): requests
are checked on arrival (a bad one gets a 400 naming the field and the limit at once), queued,
and those of the same size, step count and guidance scale that arrive together run as one
pipeline batch of at most ``--max-batch-size`` images. A streamed request (``stream``) hears of
each denoising step of its batch (``ImageProgress``) before its images. A cancelled request is
dropped from the queue, or, when every request of the running batch is cancelled, the denoising
loop stops at the next step.
"""

from __future__ import annotations

import logging
import os
import random
import time
from dataclasses import dataclass
from typing import Any, cast

from serving import wire as m
from serving.diffusion.runner import (
    OUTPUT_FORMATS,
    DiffusionWorker,
    ImageJob,
    InputError,
    ReplicaGroup,
    Shape,
)
from serving.srt.scheduler import _TICK_SECONDS, Scheduler, _Queued

log = logging.getLogger("sglang_launch.diffusion")


def run_diffusion_worker(server_args: Any, ctx: Any) -> None:
    """The bootstrap's diffusion target: set up, load, report ready, serve until stopping.

    With ``--enable-cfg-parallel`` the replica is two ranks (``ctx.tp_size`` 2): both join the
    replica's process group in ``init_device_and_model()``; rank 0 serves, rank 1 follows rank
    0's broadcasts, running the unconditional half of each CFG batch."""
    from platforms.diffusion import current_platform
    from serving.distributed import close_tp_group
    from serving.srt.scheduler import follow, share_cpu_threads

    ranks = max(int(getattr(ctx, "tp_size", 1) or 1), 1)
    if current_platform.is_cpu():
        share_cpu_threads(ranks_on_node=ranks * max(int(getattr(ctx, "dp_size", 1) or 1), 1))
    group = (
        ReplicaGroup(
            ctx.dp_rank,
            ctx.tp_rank,
            ranks,
            ctx.runtime_dir,
            float(getattr(server_args, "startup_timeout", 300.0) or 300.0),
        )
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
            ctx.ready(dp_rank=ctx.dp_rank, tp_rank=ctx.tp_rank, pid=os.getpid())
            follow(worker, ctx, run=lambda work: follow_image_batch(worker, work))
    finally:
        if group is not None:
            close_tp_group()


def follow_image_batch(worker: DiffusionWorker, work: Any) -> None:
    """Rank 1 of a CFG-parallel replica: denoise rank 0's batch alongside it (no decoding, no
    answer). A failure is logged: rank 0 meets the same one and answers its clients."""
    if not isinstance(work, m.ImageBatch):
        return
    shape = Shape(work.width, work.height, work.steps, work.guidance_scale)
    jobs = [ImageJob(j.rid, j.prompt, j.n, j.negative_prompt, j.seed, "png") for j in work.jobs]
    try:
        worker.denoise(shape, jobs)
    except Exception:  # noqa: BLE001 - one failed batch must not end the rank
        log.exception("CFG-parallel batch of %d request(s) failed on rank 1", len(jobs))


@dataclass
class Queued(_Queued):
    """A queued image request and its checked ``Shape``."""

    shape: Shape | None = None


class ImageScheduler(Scheduler):
    """The text scheduler's socket, queue and batching rules, running image requests."""

    def __init__(
        self, worker: DiffusionWorker, server_args: Any, ctx: Any, store: Any = None
    ) -> None:
        super().__init__(worker, server_args, ctx, store=store)  # type: ignore[arg-type]
        self.runner: Any = worker
        self.images_made = 0

    def enqueue(self, identity: bytes, req: Any) -> None:
        if not isinstance(req, m.ImageRequest):
            return super().enqueue(identity, req)  # answers that this server serves images
        try:
            self.check(req)
            shape = self.runner.shape_of(req.width, req.height, req.steps, req.guidance_scale)
        except InputError as exc:
            self.send(identity, m.RequestFailed(req.rid, 400, str(exc), exc.param))
            return
        item = Queued(identity, cast(Any, req), time.monotonic(), shape=shape)
        item.seed = req.seed if req.seed is not None else random.getrandbits(31)
        self.queue.append(item)

    def check(self, req: m.ImageRequest) -> None:
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

    def take_batch(self) -> list[Any]:
        """The oldest request and the queued ones of its shape, at most ``max_batch_size``
        images in all; the others keep their places."""
        first: Any = self.queue.popleft()
        batch, images, rest = [first], first.request.n, []
        while self.queue:
            item: Any = self.queue.popleft()
            if item.shape == first.shape and images + item.request.n <= self.max_batch_size:
                batch.append(item)
                images += item.request.n
            else:
                rest.append(item)
        self.queue.extendleft(reversed(rest))
        return batch

    def run_batch(self) -> None:
        batch = self.take_batch()
        self.batches += 1
        rids = {item.request.rid for item in batch}
        jobs = [
            ImageJob(
                q.request.rid,
                q.request.prompt,
                q.request.n,
                q.request.negative_prompt,
                q.seed,
                q.request.output_format,
            )
            for q in batch
        ]

        shape = batch[0].shape
        split = self.runner.splits(shape)
        streamed = [q for q in batch if q.request.stream]

        def every_step(done: int, total: int) -> bool:
            self.drain()  # take in cancellations (and queue new requests) between steps
            if self.runner.tp_size > 1 and not split:
                self.keep_followers_waiting()  # rank 1 is idle through this batch
            for q in streamed:  # each streamed request of the batch hears of every step
                if q.request.rid not in self.cancelled:
                    self.send(q.identity, m.ImageProgress(q.request.rid, done, total))
            return rids <= self.cancelled

        try:
            if split:
                self._broadcast(cfg_batch(shape, jobs))  # rank 1 computes the other CFG half
            encoded = self.runner.generate(shape, jobs, every_step)
            images = sum(j.n for j in jobs)
            item: Any
            for item, job, blobs in zip(batch, jobs, encoded, strict=True):
                if job.rid in self.cancelled:
                    self.aborted += 1
                    continue
                shape = item.shape
                self.send(
                    item.identity,
                    m.Images(
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
        except Exception as exc:  # noqa: BLE001 - one failed batch must not end the worker
            log.exception("image batch of %d request(s) failed", len(batch))
            for item in batch:
                self.send(
                    item.identity,
                    m.RequestFailed(
                        item.request.rid,
                        500,
                        (f"the pipeline failed on this batch: {type(exc).__name__}: {exc}"),
                    ),
                )
            self.runner.platform.empty_cache()
        finally:
            self.cancelled.clear()

    def keep_followers_waiting(self) -> None:
        """A ``Tick`` to rank 1 when rank 0 has been silent a while, so that its wait for the
        next broadcast never reaches the group's timeout during a batch rank 0 runs alone."""
        if time.monotonic() - self.last_broadcast > _TICK_SECONDS:
            self._broadcast(m.Tick())

    def pong(self, rid: str) -> m.Pong:
        pong = super().pong(rid)
        pong.info["images"] = self.images_made
        pong.info["pid"] = os.getpid()
        return pong


def cfg_batch(shape: Shape, jobs: list[ImageJob]) -> m.ImageBatch:
    """What rank 1 of a CFG-parallel replica needs to run ``jobs`` alongside rank 0."""
    return m.ImageBatch(
        shape.width,
        shape.height,
        shape.steps,
        shape.guidance_scale,
        [m.ImageWork(j.rid, j.prompt, j.n, j.negative_prompt, j.seed) for j in jobs],
    )
