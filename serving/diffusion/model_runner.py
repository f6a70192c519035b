"""``DiffusionModelRunner``: one diffusers pipeline on one rank, set up through the diffusion platform.

Every device and execution decision is a call of ``platforms.diffusion.current_platform``:

- ``init_device_and_model()`` (the counterpart of the spec's ``GPUWorker.init_device_and_model()``,
  where rank-aware hooks go): ``get_device(local_rank)``, ``set_device()``,
  ``get_local_torch_device()``, ``seed_everything()``, then ``load_pipeline()``;
- ``load_pipeline()``: ``verify_model_arch()`` with the pipeline class of ``model_index.json``
  before anything is loaded; the denoiser's norms become ``CustomOp``s (``platforms.diffusion.layers``); the
  attention that runs is the one ``get_attn_backend_cls_str()`` names; ``optimize_vae()``;
  ``enable_dit_layerwise_offload_by_default()`` unless ``--dit-layerwise-offload`` says otherwise;
  ``get_compile_backend()`` / ``get_compile_options()`` under ``--enable-torch-compile``;
- ``denoise()``: the pipeline call, inside ``inference_mode()``, with one generator per image
  seeded from the request (image ``i`` of a request seeded ``s`` uses ``s + i``);
- ``memory_info()``: ``get_device_total_memory()`` and ``get_available_gpu_memory()``.

``load_pipeline``, ``denoise`` and ``generate`` are hook targets too. Errors
(``serving.errors``): ``ModelLoadError`` at start-up (names the fix); ``InputError`` for one
request's values (a 400 for its client). A CFG-parallel replica's split of each guidance step is
``serving.diffusion.cfg_parallel``.
"""

from __future__ import annotations

import contextlib
import copy
import io
import logging
import math
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import msgspec

from bootstrap import TargetError, resolve
from launchspec.model_source import DIFFUSION_EXTRA, pipeline_class_name, resolve_pipeline
from serving.diffusion.cfg_parallel import GuidanceSplit, uses_guidance
from serving.diffusion.stepping import DenoiseStopped, StepCallback
from serving.errors import InputError, ModelLoadError
from serving.threads import cpu_threads
from serving.wire import (
    CustomOpUse,
    ImageAttention,
    ImageMemory,
    ImageModel,
    ImageParallel,
    TorchCompile,
)

if TYPE_CHECKING:
    import torch
    from PIL.Image import Image

    from launchspec.server_args import ServerArgs
    from platforms.diffusion import Platform

log = logging.getLogger("sglang_launch.diffusion")

OUTPUT_FORMATS = {"png": "PNG", "jpeg": "JPEG", "webp": "WEBP"}
MAX_SIDE = 4096
_GIB = float(1 << 30)
_DTYPES = {"float32": "float32", "float16": "float16", "bfloat16": "bfloat16"}


@dataclass
class ImageJob:
    """One request's share of a pipeline batch."""

    rid: str
    prompt: str
    n: int
    negative_prompt: str | None
    seed: int
    output_format: str


@dataclass(frozen=True)
class ReplicaGroup:
    """This rank's place in a replica of several ranks (``--enable-cfg-parallel``: two)."""

    dp_rank: int
    rank: int
    size: int
    runtime_dir: str
    timeout_s: float = 300.0


@dataclass(frozen=True)
class Shape:
    """What requests must share to run in one pipeline call."""

    width: int
    height: int
    steps: int
    guidance_scale: float


class DiffusionModelRunner:
    """A diffusers pipeline on this rank's device. Construct, then ``init_device_and_model()``."""

    kind = "image"
    tp_size = 1

    def __init__(
        self,
        server_args: ServerArgs,
        platform: Platform | None = None,
        local_rank: int = 0,
        group: ReplicaGroup | None = None,
    ) -> None:
        """``group``: this rank's place in a CFG-parallel replica (None: a replica of one rank)."""
        if platform is None:
            from platforms.diffusion import current_platform

            platform = current_platform
        self.server_args = server_args
        self.platform: Platform = platform
        self.local_rank = local_rank
        self.group = group if group is not None and group.size > 1 else None
        self.tp_size = self.group.size if self.group else 1  # the scheduler's "ranks to follow"
        self.parallel: ImageParallel | None = None  # set up once the pipeline is loaded
        self.group_backend: tuple[str, str | None] = ("", None)  # the group's backend, device
        self.split: GuidanceSplit | None = None  # a CFG-parallel rank's split of each step
        self.source = resolve_pipeline(server_args.model_path, server_args.served_model_name)
        self.pipeline: Any = None
        self.denoiser_name: str = "unet"
        self.device: torch.device | None = None
        self.dtype: torch.dtype | None = None
        self.attention: ImageAttention | None = None
        self.custom_ops: dict[str, CustomOpUse] = {}
        self.offload = False
        self.compiled: TorchCompile | None = None
        self.pipeline_class = pipeline_class_name(self.source.path)
        self.load_seconds = 0.0
        self.platform_device: Any = None  # what get_device() gave for this rank

    # ---- set-up ---------------------------------------------------------------------------

    def init_device_and_model(self) -> None:
        """Bind this rank's device and load the pipeline onto it (a hook target for rank-aware
        set-up, the counterpart of the spec's ``GPUWorker.init_device_and_model()``)."""
        platform = self.platform
        device = self.platform_device = platform.get_device(self.local_rank)
        platform.set_device(device)
        self.device = platform.get_local_torch_device()
        if self.server_args.device:
            import torch

            self.device = torch.device(self.server_args.device)
        if self.group is not None:
            self.join_group()
        platform.seed_everything(self.server_args.seed)
        started = time.monotonic()
        self.pipeline = self.load_pipeline()
        self.load_seconds = time.monotonic() - started
        self.parallel = ImageParallel(
            ranks=self.tp_size,
            cfg_parallel=self.group is not None,
            cpu_architecture=platform.get_cpu_architecture().name.lower(),
            all_to_all_communicator=platform.get_all_to_all_communicator_cls(),
        )
        if self.group is not None:
            self.parallel.backend, self.parallel.device_id = self.group_backend
            self.split_guidance()

    def join_group(self) -> None:
        """Form this replica's process group: on ``get_torch_distributed_backend_str()``, bound
        to this rank's device when ``supports_distributed_device_id()`` (the launch's file-store
        rendezvous, as for SRT's tensor-parallel groups)."""
        from serving.distributed import init_tp_group

        group, platform = self.group, self.platform
        assert group is not None
        backend = platform.get_torch_distributed_backend_str()
        device_id = self.device if platform.supports_distributed_device_id() else None
        init_tp_group(
            backend,
            group.runtime_dir,
            group.dp_rank,
            group.rank,
            group.size,
            timeout_s=group.timeout_s,
            device_id=device_id,
        )
        self.group_backend = (backend, None if device_id is None else str(device_id))

    def split_guidance(self) -> None:
        """Split each classifier-free-guidance step of the denoiser over the two ranks
        (``cfg_parallel``). ``ModelLoadError`` when the pipeline has no CFG to split."""
        assert self.group is not None
        if not uses_guidance(self.pipeline):
            raise ModelLoadError(
                f"--enable-cfg-parallel splits classifier-free guidance, but {self.pipeline_class} "
                f"in {self.source.path} does not run it (no do_classifier_free_guidance, or a "
                f"guidance-distilled denoiser); serve it without --enable-cfg-parallel and scale "
                f"with --dp-size"
            )
        self.split = GuidanceSplit(self.group.rank)
        self.split.install(getattr(self.pipeline, self.denoiser_name))

    def splits(self, shape: Shape) -> bool:
        """Whether a batch of ``shape`` runs on both ranks of a CFG-parallel replica (it has
        guidance to split); otherwise rank 0 runs it alone."""
        return self.group is not None and shape.guidance_scale > 1

    def resolve_dtype(self) -> torch.dtype:
        import torch

        assert self.device is not None
        name = self.server_args.dtype or "auto"
        if name == "auto":
            return torch.float32 if self.device.type == "cpu" else torch.bfloat16
        if name not in _DTYPES:
            raise ModelLoadError(f"--dtype {name!r} is not one of auto, {', '.join(_DTYPES)}")
        dtype: torch.dtype = getattr(torch, _DTYPES[name])
        return dtype

    def load_pipeline(self) -> Any:
        """Load ``--model-path`` with diffusers and prepare it on the device (a hook target)."""
        platform = self.platform
        try:
            platform.verify_model_arch(self.pipeline_class)
        except Exception as exc:
            raise ModelLoadError(
                f"the platform {platform.__class__.__qualname__} refuses the pipeline {self.pipeline_class} "
                f"of {self.source.path}: {exc}; serve another pipeline or select another platform "
                f"(SGLANG_DIFFUSION_PLATFORM_OVERRIDE)"
            ) from exc
        try:
            import diffusers
        except ImportError as exc:
            raise ModelLoadError(
                f"the diffusion runtime needs 'diffusers' ({exc}); install the "
                f"diffusion extra ({DIFFUSION_EXTRA})"
            ) from exc
        from platforms.diffusion.layers import adopt_custom_ops, custom_op_report

        self.dtype = self.resolve_dtype()
        try:
            pipe = diffusers.DiffusionPipeline.from_pretrained(
                str(self.source.path),
                torch_dtype=self.dtype,
                local_files_only=True,
                **absent_components(self.source.path),
            )
        except Exception as exc:
            raise ModelLoadError(
                f"diffusers could not load the pipeline in {self.source.path}: "
                f"{type(exc).__name__}: {exc}"
            ) from exc
        pipe.set_progress_bar_config(disable=True)
        self.denoiser_name = (
            "transformer" if getattr(pipe, "transformer", None) is not None else "unet"
        )
        denoiser = getattr(pipe, self.denoiser_name, None)
        if denoiser is None or not hasattr(pipe, "vae"):
            raise ModelLoadError(
                f"{self.pipeline_class} in {self.source.path} has no unet or transformer "
                f"and vae; the diffusion runtime serves text-to-image pipelines"
            )
        adopt_custom_ops(denoiser)
        self.custom_ops = msgspec.convert(custom_op_report(denoiser), dict[str, CustomOpUse])
        self.set_attention(denoiser)
        pipe.vae = platform.optimize_vae(pipe.vae)
        offload = self.server_args.dit_layerwise_offload
        self.offload = bool(
            platform.enable_dit_layerwise_offload_by_default() if offload is None else offload
        )
        pipe.to(self.device)
        if self.offload:
            layerwise_offload(denoiser, self.device)
        if self.server_args.enable_torch_compile:
            import torch

            backend, options = platform.get_compile_backend(), platform.get_compile_options()
            setattr(
                pipe,
                self.denoiser_name,
                torch.compile(denoiser, backend=backend, options=dict(options) or None),
            )
            self.compiled = TorchCompile(backend, {k: str(v) for k, v in dict(options).items()})
        return pipe

    def set_attention(self, denoiser: Any) -> None:
        """Run the attention ``get_attn_backend_cls_str()`` names in every attention layer."""
        import torch.nn.functional as F

        requested = self.server_args.attention_backend
        heads = getattr(denoiser.config, "attention_head_dim", 0)
        head_size = heads[0] if isinstance(heads, (list, tuple)) else int(heads or 0)
        name = self.platform.get_attn_backend_cls_str(requested, head_size, self.dtype)
        try:
            target = resolve(str(name))
        except TargetError as exc:
            raise ModelLoadError(
                f"the platform's attention backend {name!r} cannot be imported ({exc}); "
                f"fix get_attn_backend_cls_str() or pass --attention-backend"
            ) from exc
        processors = getattr(denoiser, "attn_processors", None) or {}
        if target is F.scaled_dot_product_attention:
            # diffusers' own processors for this model call torch's SDPA: check, keep them.
            import inspect

            for proc in {type(p) for p in processors.values()}:
                if "scaled_dot_product_attention" not in inspect.getsource(proc.__call__):
                    raise ModelLoadError(
                        f"the platform asks for torch's scaled_dot_product_attention, but this pipeline's "
                        f"attention processor {proc.__name__} does not use it; name an attention "
                        f"processor class in get_attn_backend_cls_str() or --attention-backend"
                    )
        elif isinstance(target, type):
            if processors:
                denoiser.set_attn_processor(target())
        else:
            raise ModelLoadError(
                f"the attention backend {name!r} is neither torch's "
                f"scaled_dot_product_attention nor an attention processor class"
            )
        used = sorted(
            {type(p).__name__ for p in (getattr(denoiser, "attn_processors", None) or {}).values()}
        )
        self.attention = ImageAttention(str(name), used, requested)

    # ---- requests -------------------------------------------------------------------------

    @property
    def size_multiple(self) -> int:
        """Widths and heights must be multiples of this: the VAE's scale factor times the
        denoiser's own downsampling, and at least 8 (the pipelines' own check)."""
        pipe = self.pipeline
        factor = int(getattr(pipe, "vae_scale_factor", 8) or 8)
        config = getattr(pipe, self.denoiser_name).config
        blocks = getattr(config, "block_out_channels", None)
        down = 2 ** (len(blocks) - 1) if blocks else int(getattr(config, "patch_size", 1) or 1)
        need = factor * down
        return need * 8 // math.gcd(need, 8)

    def max_steps(self) -> int:
        """The most denoising steps the pipeline's scheduler can take: its training timesteps
        less its ``steps_offset`` (beyond that its timestep schedule runs off its table)."""
        config = getattr(self.pipeline.scheduler, "config", {})
        train = int(config.get("num_train_timesteps", 1000) or 1000)
        return max(1, train - int(config.get("steps_offset", 0) or 0))

    def default_size(self) -> int:
        config = getattr(self.pipeline, self.denoiser_name).config
        sample = getattr(config, "sample_size", 64)
        sample = sample[0] if isinstance(sample, (list, tuple)) else int(sample or 64)
        size = sample * int(getattr(self.pipeline, "vae_scale_factor", 8) or 8)
        multiple = self.size_multiple
        return max(multiple, size // multiple * multiple)

    def shape_of(
        self,
        width: int | None,
        height: int | None,
        steps: int | None,
        guidance_scale: float | None,
    ) -> Shape:
        """The checked ``Shape`` of a request (``None``: the pipeline's default); ``InputError``
        names the field and its limit."""
        default = self.default_size()
        multiple = self.size_multiple
        width = default if width is None else int(width)
        height = default if height is None else int(height)
        for field, value in (("width", width), ("height", height)):
            if not multiple <= value <= MAX_SIDE or value % multiple:
                raise InputError(
                    f"{field} {value} must be a multiple of {multiple} (the VAE scale factor "
                    f"times the denoiser's downsampling) between {multiple} and {MAX_SIDE}; "
                    f"for example {default}",
                    field,
                )
        steps = 50 if steps is None else int(steps)
        most = self.max_steps()
        if not 1 <= steps <= most:
            raise InputError(
                f"num_inference_steps {steps} must be between 1 and {most} (this pipeline's "
                f"scheduler has {most} usable training timesteps)",
                "num_inference_steps",
            )
        guidance = 7.5 if guidance_scale is None else float(guidance_scale)
        return Shape(width, height, steps, guidance)

    def generate(
        self, shape: Shape, jobs: list[ImageJob], step_callback: StepCallback | None = None
    ) -> list[list[bytes]]:
        """Run ``jobs`` as one pipeline batch of ``shape``; each job's images, encoded (a hook
        target). ``step_callback(done, total)`` runs after each denoising step; returning True
        ends the call there with ``DenoiseStopped``."""
        images = self.denoise(shape, jobs, step_callback)
        out, at = [], 0
        for job in jobs:
            out.append([encode_image(img, job.output_format) for img in images[at : at + job.n]])
            at += job.n
        return out

    def denoise(
        self, shape: Shape, jobs: list[ImageJob], step_callback: StepCallback | None = None
    ) -> list[Image]:
        """The pipeline call for ``jobs``: PIL images, ``sum(job.n)`` of them, in job order.
        Several calls may be under way at once, taking turns between their steps
        (``serving.diffusion.stepping``): each runs on a ``call_pipeline()`` of its own. A
        ``step_callback`` that returns True ends the call with ``DenoiseStopped`` (on both ranks
        of a CFG-parallel replica, at the same step)."""
        import torch

        prompts, negatives, generators = [], [], []
        for job in jobs:
            for i in range(job.n):
                prompts.append(job.prompt)
                negatives.append(job.negative_prompt or "")
                generators.append(torch.Generator("cpu").manual_seed(job.seed + i))
        pipe = self.call_pipeline()
        kwargs: dict[str, Callable[..., dict[str, Any]]] = {}
        split = self.splits(shape)
        if step_callback is not None or split:

            def on_step_end(
                pipeline: Any, step: int, timestep: Any, tensors: dict[str, Any]
            ) -> dict[str, Any]:
                # diffusers counts the loop's steps in num_timesteps (more than the steps asked
                # for with a second-order scheduler); the asked-for count where it has none.
                total = getattr(pipeline, "num_timesteps", None) or shape.steps
                stop = bool(step_callback(step + 1, total)) if step_callback is not None else False
                if split:  # rank 0 decides; both ranks stop at the same step
                    from serving.distributed import broadcast_flags

                    stop = broadcast_flags([stop])[0]
                if stop:
                    raise DenoiseStopped(f"stopped after step {step + 1} of {total}")
                return tensors

            kwargs["callback_on_step_end"] = on_step_end
        # Only rank 0 decodes: a CFG-parallel rank 1 stops at the latents.
        decode = self.group is None or self.group.rank == 0
        splitting = (
            self.split.splitting(len(prompts) if split else None)
            if self.split is not None
            else contextlib.nullcontext()
        )
        with splitting, self.platform.inference_mode():
            result = pipe(
                prompt=prompts,
                negative_prompt=negatives,
                width=shape.width,
                height=shape.height,
                num_inference_steps=shape.steps,
                guidance_scale=shape.guidance_scale,
                generator=generators,
                output_type="pil" if decode else "latent",
                **kwargs,
            )
        return list(result.images)

    def bind_thread(self) -> None:
        """Make this rank's device the current one of the calling thread (a pipeline call runs in
        a thread of its own, and a current device is per thread)."""
        if self.platform_device is not None:
            self.platform.set_device(self.platform_device)

    def call_pipeline(self) -> Any:
        """The pipeline for one call: the loaded components, shared, with a copy of its
        scheduler of its own (a diffusers scheduler keeps the state of the call it steps, and
        the pipeline the call's settings)."""
        pipe = copy.copy(self.pipeline)
        pipe.__dict__["scheduler"] = copy.deepcopy(self.pipeline.scheduler)
        return pipe

    # ---- reporting ------------------------------------------------------------------------

    def device_index(self) -> int:
        return (
            self.device.index
            if self.device is not None and self.device.index is not None
            else self.local_rank
        )

    def memory_info(self) -> ImageMemory:
        """The device's total and free memory in GiB, from the platform."""
        idx = self.device_index()
        memory = ImageMemory()
        try:
            memory.total_gib = round(self.platform.get_device_total_memory(idx) / _GIB, 3)
            memory.available_gib = round(
                float(self.platform.get_available_gpu_memory(idx, empty_cache=False)), 3
            )
        except Exception as exc:  # noqa: BLE001 - informative only
            memory.error = f"{type(exc).__name__}: {exc}"
        return memory

    def describe(self) -> ImageModel:
        """What is served and how: for ``/get_server_info`` and the ready report."""
        loaded = self.pipeline is not None
        parallel = self.parallel
        if parallel is not None and self.split is not None:
            parallel = msgspec.structs.replace(parallel, split_steps=self.split.steps)
        return ImageModel(
            name=self.source.served_name,
            path=str(self.source.path),
            kind=self.kind,
            pipeline_class=self.pipeline_class,
            denoiser=self.denoiser_name,
            device=str(self.device),
            dtype=str(self.dtype).replace("torch.", ""),
            attention=self.attention,
            custom_ops=self.custom_ops,
            layerwise_offload=self.offload,
            parallel=parallel,
            torch_compile=self.compiled,
            size_multiple=self.size_multiple if loaded else None,
            default_size=self.default_size() if loaded else None,
            load_seconds=round(self.load_seconds, 3),
            cpu_threads=cpu_threads(),
            pid=os.getpid(),
        )


def absent_components(path: Path) -> dict[str, None]:
    """``{name: None}`` for each component ``model_index.json`` records as saved without one
    (``[null, null]``, such as a pipeline saved without its third text encoder): diffusers wants
    those passed explicitly when loading."""
    import json

    with open(path / "model_index.json", encoding="utf-8") as f:
        index = json.load(f)
    return {
        name: None
        for name, value in index.items()
        if not name.startswith("_") and isinstance(value, list) and value[:2] == [None, None]
    }


def encode_image(image: Image, output_format: str) -> bytes:
    """``image`` (PIL) as ``png``, ``jpeg`` or ``webp`` bytes (the same bytes for the same pixels)."""
    fmt = OUTPUT_FORMATS.get(output_format)
    if fmt is None:
        raise InputError(
            f"output_format {output_format!r} is not one of {', '.join(OUTPUT_FORMATS)}",
            "output_format",
        )
    buf = io.BytesIO()
    image.convert("RGB").save(buf, format=fmt)
    return buf.getvalue()


def layerwise_offload(model: Any, device: Any) -> None:
    """Keep ``model``'s top-level blocks on the host and move each to ``device`` only while it runs."""
    import torch

    host = torch.device("cpu")
    blocks: list[Any] = []
    for child in model.children():
        blocks.extend(child if isinstance(child, torch.nn.ModuleList) else [child])
    for block in blocks:
        block.to(host)

        def to_device(module: Any, args: Any, _device: Any = device) -> None:
            module.to(_device)

        def to_host(module: Any, args: Any, output: Any, _host: Any = host) -> None:
            module.to(_host)

        block.register_forward_pre_hook(to_device)
        block.register_forward_hook(to_host)
