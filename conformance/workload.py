"""The workload rows: the serving runtime's own path, run on the platform under test.

``workload.srt_forward`` builds a tiny BERT encoder with random weights and a word-piece
vocabulary of its own in the check's scratch directory (no download, no installed model needed),
then does what a scheduler worker does with it: ``ServerArgs`` for that model (so the platform's
``apply_server_args_defaults`` applies), ``load_runner`` from the scheduler (the runtime's
``ModelRunner``: ``seed_everything``, ``get_device``, ``get_default_attention_backend``, the dtype
rule), the worker's warm-up, and one embedding forward at batch 1 through ``embed_matrix``, the
method requests pass through. The row passes when the vector is finite, has the model's width
and matches the same model computed on the CPU in float32.

This runs in the check process, which is a worker process started through the bootstrap, so it
imports the serving runtime (``serving``) there; the launcher process never does. More
runtimes add their own ``workload.*`` rows here; every one must pass for "conforms".

``workload.diffusion_step`` is the diffusion runtime's: a tiny UNet and VAE (diffusers' classes,
random weights seeded, built in memory) whose norms are the runtime's custom ops
(``platforms.diffusion.layers``, resolved after ``init_backend()``), one denoising step and a VAE
decode on the platform's device inside ``inference_mode()`` after ``optimize_vae()``, checked
against the same step on the CPU.
"""

from __future__ import annotations

import importlib
import os
from typing import TYPE_CHECKING, Any

from .catalog import check
from .rows import CheckFailed, Skip

if TYPE_CHECKING:
    from .probe import Probe

_VOCAB = [
    "[PAD]",
    "[UNK]",
    "[CLS]",
    "[SEP]",
    "[MASK]",
    "a",
    "launch",
    "will",
    "work",
    "on",
    "this",
    "platform",
    "check",
    "##s",
    "the",
    "model",
]
_TEXT = "a launch will work on this platform"
_MIN_COSINE = 0.99  # device vs CPU float32: loose enough for half precision, tight enough for bugs


def build_tiny_encoder(folder: str) -> str:
    """Write a tiny BERT model directory (config, random weights seeded, tokenizer) into
    ``folder``; returns its path."""
    import torch
    import transformers

    transformers.utils.logging.disable_progress_bar()  # no shard-writing bar in the report
    os.makedirs(folder, exist_ok=True)
    vocab = os.path.join(folder, "vocab.txt")
    with open(vocab, "w", encoding="utf-8") as f:
        f.write("\n".join(_VOCAB) + "\n")
    transformers.BertTokenizer(vocab_file=vocab, do_lower_case=True).save_pretrained(folder)
    config = transformers.BertConfig(
        vocab_size=len(_VOCAB),
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=64,
        pad_token_id=0,
    )
    torch.manual_seed(0)
    transformers.BertModel(config).save_pretrained(folder)
    return folder


@check(
    "workload.srt_forward",
    "a tiny model loads through the runtime's ModelRunner and runs a batch-1 forward",
    "a scheduler worker can load a model on the platform (its device, dtype and attention) and "
    "run a forward whose output matches the CPU's",
    runtimes=("srt",),
    needs=("device.get_device", "subsystems.get_default_attention_backend"),
)
def srt_forward(probe: Probe) -> str:
    try:
        import transformers  # noqa: F401 - the serving runtime's model library
    except ImportError as exc:
        raise Skip(
            f"the serving runtime is not installed ({exc}); install the serve extra "
            "(pip install 'sglang-launch[serve]')"
        ) from exc
    torch = probe.torch
    folder = build_tiny_encoder(os.path.join(probe.workdir, "tiny-encoder"))
    args = importlib.import_module("launchspec.server_args").ServerArgs(
        runtime=probe.runtime, model_path=folder
    )
    scheduler = importlib.import_module("serving.srt.scheduler")
    runner = scheduler.load_runner(args, probe.platform, local_rank=0)
    runner.warm_up()
    ids = runner.encode_embedding_input(_TEXT)
    vector = runner.embed_matrix([ids])
    if tuple(vector.shape) != (1, runner.dimensions):
        raise CheckFailed(
            f"embed_matrix gave shape {tuple(vector.shape)}, expected (1, {runner.dimensions})"
        )
    if not bool(torch.isfinite(vector).all()):
        raise CheckFailed(
            f"the forward on {runner.device} ({runner.dtype}) produced non-finite values"
        )
    reference = _cpu_reference(folder, ids, runner)
    cosine = float(torch.nn.functional.cosine_similarity(vector.float(), reference, dim=1)[0])
    if cosine < _MIN_COSINE:
        raise CheckFailed(
            f"the vector computed on {runner.device} ({runner.dtype}, attention "
            f"{runner.attn_implementation}) differs from the CPU's: cosine {cosine:.4f}"
        )
    dtype = str(runner.dtype).replace("torch.", "")
    return (
        f"{runner.architecture} on {runner.device}, {dtype}, attention {runner.attn_implementation}: "
        f"1 x {runner.dimensions} vector, cosine {cosine:.4f} to the CPU float32 result"
    )


def _cpu_reference(folder: str, ids: list[int], runner: Any) -> Any:
    """The same model and input, computed plainly on the CPU in float32, pooled the runner's way."""
    import torch
    import transformers

    pooling = importlib.import_module("serving.srt.pooling")
    model = transformers.AutoModel.from_pretrained(
        folder, dtype=torch.float32, attn_implementation="eager"
    )
    model.eval()
    enc = {
        "input_ids": torch.tensor([ids]),
        "attention_mask": torch.ones((1, len(ids)), dtype=torch.long),
    }
    if "token_type_ids" in runner.tokenizer.model_input_names:
        enc["token_type_ids"] = torch.zeros_like(enc["input_ids"])
    with torch.inference_mode():
        hidden = model(**enc).last_hidden_state
        return pooling.pool(hidden, enc["attention_mask"], runner.pooling).float()


def tiny_denoising_parts(torch: Any, seed: int = 0) -> tuple[Any, Any, Any]:
    """A seeded, randomly initialised UNet, VAE and DDIM scheduler small enough for one step on
    any device in well under a second (diffusers' real classes; nothing is downloaded)."""
    from diffusers import AutoencoderKL, DDIMScheduler, UNet2DConditionModel

    torch.manual_seed(seed)
    unet = UNet2DConditionModel(
        sample_size=16,
        in_channels=4,
        out_channels=4,
        layers_per_block=1,
        block_out_channels=(32, 32),
        down_block_types=("CrossAttnDownBlock2D", "DownBlock2D"),
        up_block_types=("UpBlock2D", "CrossAttnUpBlock2D"),
        cross_attention_dim=32,
        attention_head_dim=8,
        norm_num_groups=8,
    )
    vae = AutoencoderKL(
        in_channels=3,
        out_channels=3,
        down_block_types=("DownEncoderBlock2D",) * 2,
        up_block_types=("UpDecoderBlock2D",) * 2,
        block_out_channels=(8, 16),
        latent_channels=4,
        layers_per_block=1,
        norm_num_groups=8,
    )
    scheduler = DDIMScheduler(
        beta_schedule="scaled_linear",
        beta_start=0.00085,
        beta_end=0.012,
        clip_sample=False,
        steps_offset=1,
    )
    parts: tuple[Any, Any, Any] = (unet, vae, scheduler)
    for part in parts[:2]:
        part.eval()
    return parts


@check(
    "workload.diffusion_step",
    "one denoising step of a tiny pipeline with the runtime's custom ops",
    "a UNet whose norms are the runtime's CustomOps (platforms.diffusion.layers, resolved after "
    "init_backend()) runs one denoising step and a VAE decode on get_device(0) inside "
    "inference_mode(), with optimize_vae() applied, and matches the same step on the CPU",
    runtimes=("diffusion",),
    needs=("device.get_device",),
)
def diffusion_step(probe: Probe) -> str:
    torch, platform, device = probe.torch, probe.platform, probe.device
    try:
        import diffusers  # noqa: F401
    except ImportError:
        raise Skip(
            "diffusers is not installed; install the diffusion extra "
            "(pip install 'sglang-launch[diffusion]')"
        ) from None
    from platforms.diffusion.layers import adopt_custom_ops, custom_op_report

    unet, vae, scheduler = tiny_denoising_parts(torch)
    adopt_custom_ops(unet)
    ops = custom_op_report(unet)
    scheduler.set_timesteps(2)
    step = scheduler.timesteps[0]
    generator = torch.Generator("cpu").manual_seed(0)
    latents = torch.randn(1, 4, 16, 16, generator=generator)
    context = torch.randn(1, 8, 32, generator=generator)

    def run(where: Any, decoder: Any) -> Any:
        with platform.inference_mode():
            noise = unet.to(where)(
                latents.to(where), step, encoder_hidden_states=context.to(where)
            ).sample
            prev = scheduler.step(noise, step, latents.to(where)).prev_sample
            image = decoder.to(where).decode(prev / decoder.config.scaling_factor).sample
        platform.synchronize()
        return image.float().cpu()

    reference = run(torch.device("cpu"), vae)
    image = run(device, platform.optimize_vae(vae))
    if tuple(image.shape) != (1, 3, 32, 32):
        raise CheckFailed(
            f"the decoded image has shape {tuple(image.shape)}, expected (1, 3, 32, 32)"
        )
    if not bool(torch.isfinite(image).all()):
        raise CheckFailed("the denoising step produced NaN or infinite values on the device")
    diff = float((image - reference).abs().max())
    if diff > 1e-2:
        raise CheckFailed(
            f"the step on {device} differs from the CPU by up to {diff:.3g} (allowed 0.01)"
        )
    how = ", ".join(
        f"{name} x{entry['count']}: {'/'.join(entry['forward'])}"
        for name, entry in sorted(ops.items())
    )
    return f"1 step + VAE decode on {device}, max |diff| vs CPU {diff:.2g}; custom ops {how}"
