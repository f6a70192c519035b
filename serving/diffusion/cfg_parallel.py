"""``--enable-cfg-parallel``: each classifier-free-guidance step of the denoiser split over the two
ranks of a replica.

Rank 0 computes the conditional half of the denoiser's batch, rank 1 the unconditional half, and
both get the whole noise prediction back (an all-gather on the replica's group), so both step
identically. ``GuidanceSplit`` does it with a forward pre-hook (keep this rank's half of every
batched input) and a forward hook (gather the halves) on the denoiser, active only inside
``splitting(images)`` in the thread that entered it (calls under way in other threads, taking
turns with it, are not split unless they split themselves); ``uses_guidance`` tells whether a
pipeline has a guidance half to split.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch


def uses_guidance(pipe: Any) -> bool:
    """Whether ``pipe`` (a diffusers pipeline) batches an unconditional and a conditional half
    when its guidance scale is above 1 (diffusers' ``do_classifier_free_guidance`` says so)."""
    if not isinstance(getattr(type(pipe), "do_classifier_free_guidance", None), property):
        return False
    missing = object()
    saved = pipe.__dict__.get("_guidance_scale", missing)
    pipe._guidance_scale = 2.0
    try:
        return bool(pipe.do_classifier_free_guidance)
    except Exception:  # noqa: BLE001 - a property that needs more of a call: cannot tell
        return False
    finally:
        if saved is missing:
            del pipe._guidance_scale
        else:
            pipe._guidance_scale = saved


class GuidanceSplit:
    """The split of one rank (``rank`` 0: the conditional half, 1: the unconditional one)."""

    def __init__(self, rank: int) -> None:
        self.rank = rank
        self._calls = threading.local()  # per thread: the images of its split call, if any
        self.steps = 0  # denoiser calls computed half here, half on the other rank

    @property
    def images(self) -> int | None:
        """The images of the split call running in this thread, else None."""
        images: int | None = getattr(self._calls, "images", None)
        return images

    def install(self, denoiser: torch.nn.Module) -> None:
        """Hook the split into ``denoiser`` (it acts only inside ``splitting``)."""
        denoiser.register_forward_pre_hook(self.own_half, with_kwargs=True)
        denoiser.register_forward_hook(self.both_halves)

    @contextmanager
    def splitting(self, images: int | None) -> Iterator[None]:
        """Split the denoiser's calls of a pipeline call of ``images`` images (None: do not)."""
        self._calls.images = images
        try:
            yield
        finally:
            self._calls.images = None

    def own_half(
        self, module: torch.nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> tuple[tuple[Any, ...], dict[str, Any]] | None:
        """Denoiser pre-hook: keep this rank's half of every batched input (diffusers puts the
        unconditional rows first)."""
        images = self.images
        if images is None:
            return None
        import torch

        first = next(
            (v for v in (*args, *kwargs.values()) if isinstance(v, torch.Tensor) and v.dim()),
            None,
        )
        rows = 0 if first is None else int(first.shape[0])
        if rows != 2 * images:
            raise RuntimeError(
                f"--enable-cfg-parallel expects the denoiser's batch to be the unconditional and "
                f"conditional halves of {images} image(s), {2 * images} rows, not {rows}"
            )
        keep = slice(images, 2 * images) if self.rank == 0 else slice(0, images)

        def half(value: object) -> object:
            if isinstance(value, torch.Tensor) and value.dim() and value.shape[0] == rows:
                return value[keep]
            if isinstance(value, dict):
                return {k: half(v) for k, v in value.items()}
            return value

        return tuple(half(a) for a in args), {k: half(v) for k, v in kwargs.items()}

    def both_halves(self, module: torch.nn.Module, args: tuple[Any, ...], output: Any) -> Any:
        """Denoiser hook: the whole noise prediction, unconditional half (rank 1's) first."""
        if self.images is None:
            return None
        import torch

        from serving.distributed import all_gather_tensor

        def joined(mine: torch.Tensor) -> torch.Tensor:
            cond, uncond = all_gather_tensor(mine)
            self.steps += 1
            return torch.cat([uncond, cond])

        if isinstance(output, torch.Tensor):
            return joined(output)
        if isinstance(output, tuple):
            return (joined(output[0]), *output[1:])
        output.sample = joined(output.sample)
        return output
