"""Tiny text-to-image pipelines built on disk with diffusers' and transformers' real classes.

``build_tiny_pipeline(path)`` saves, with ``save_pretrained``, a ``StableDiffusionPipeline`` of a
small ``UNet2DConditionModel`` (two blocks, 32 channels), a small ``AutoencoderKL`` (scale factor
2), a two-layer ``CLIPTextModel`` whose tokenizer is a byte-level BPE trained here with
``tokenizers``, and a ``DDIMScheduler``. Weights are random (seeded): images are noise, but
real noise of the requested size, made by the real loading and denoising code. 32x32 with two
steps takes well under a second on one core. Nothing is downloaded. ``build_tiny_dit_pipeline``
does the same for a DiT whose attention normalises queries and keys with RMSNorm.
"""

from __future__ import annotations

from pathlib import Path

TRAINING_TEXT = [
    "a photo of a cat",
    "a red apple on a wooden table",
    "an astronaut riding a horse on the moon",
    "a watercolor painting of a lighthouse",
    "two dogs playing in the snow",
    "a bowl of fruit",
]
SIZE = 32  # a valid width and height for the tiny pipeline (multiples of 8)


def tiny_tokenizer():
    """A CLIP tokenizer whose byte-level BPE is trained here on a few captions."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import CLIPTokenizerFast

    bpe = Tokenizer(models.BPE(unk_token="<|endoftext|>"))
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    bpe.train_from_iterator(
        TRAINING_TEXT,
        trainers.BpeTrainer(
            vocab_size=320,
            special_tokens=["<|startoftext|>", "<|endoftext|>"],
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        ),
    )
    return CLIPTokenizerFast(
        tokenizer_object=bpe,
        bos_token="<|startoftext|>",
        eos_token="<|endoftext|>",
        unk_token="<|endoftext|>",
        pad_token="<|endoftext|>",
        model_max_length=16,
    )


def _text_config(tokenizer, **extra):
    from transformers import CLIPTextConfig

    return CLIPTextConfig(
        vocab_size=len(tokenizer),
        hidden_size=32,
        intermediate_size=37,
        num_hidden_layers=2,
        num_attention_heads=4,
        max_position_embeddings=16,
        bos_token_id=0,
        eos_token_id=1,
        pad_token_id=1,
        **extra,
    )


def _vae(**extra):
    from diffusers import AutoencoderKL

    return AutoencoderKL(
        in_channels=3,
        out_channels=3,
        down_block_types=("DownEncoderBlock2D",) * 2,
        up_block_types=("UpDecoderBlock2D",) * 2,
        block_out_channels=(8, 16),
        latent_channels=4,
        layers_per_block=1,
        norm_num_groups=8,
        sample_size=32,
        **extra,
    )


def build_tiny_pipeline(path: Path, seed: int = 0, guidance_distilled: bool = False) -> Path:
    """Build and save the tiny UNet pipeline (``StableDiffusionPipeline``) into ``path``: the
    UNet, VAE and scheduler are check-platform's own tiny denoising parts. ``guidance_distilled``
    gives the UNet a guidance embedding (``time_cond_proj_dim``, as LCM's has), with which the
    pipeline runs no classifier-free guidance whatever the guidance scale."""
    import torch
    from diffusers import StableDiffusionPipeline, UNet2DConditionModel
    from transformers import CLIPTextModel

    from conformance.workload import tiny_denoising_parts

    tokenizer = tiny_tokenizer()
    unet, vae, scheduler = tiny_denoising_parts(torch, seed)
    if guidance_distilled:
        config = {k: v for k, v in unet.config.items() if not k.startswith("_")}
        unet = UNet2DConditionModel.from_config({**config, "time_cond_proj_dim": 32})
    pipe = StableDiffusionPipeline(
        vae=vae,
        text_encoder=CLIPTextModel(_text_config(tokenizer)),
        tokenizer=tokenizer,
        unet=unet,
        scheduler=scheduler,
        safety_checker=None,
        feature_extractor=None,
        requires_safety_checker=False,
    )
    path.mkdir(parents=True, exist_ok=True)
    pipe.save_pretrained(path)
    return path


def build_tiny_dit_pipeline(path: Path, seed: int = 0) -> Path:
    """Build and save a tiny DiT pipeline (``StableDiffusion3Pipeline``: an ``SD3Transformer2DModel``
    with RMSNorm on queries and keys, two small CLIP text encoders, no T5) into ``path``."""
    import torch
    from diffusers import (
        FlowMatchEulerDiscreteScheduler,
        SD3Transformer2DModel,
        StableDiffusion3Pipeline,
    )
    from transformers import CLIPTextModelWithProjection

    torch.manual_seed(seed)
    tokenizer = tiny_tokenizer()
    transformer = SD3Transformer2DModel(
        sample_size=16,
        patch_size=2,
        in_channels=4,
        num_layers=2,
        attention_head_dim=8,
        num_attention_heads=4,
        caption_projection_dim=32,
        joint_attention_dim=32,
        pooled_projection_dim=64,
        out_channels=4,
        qk_norm="rms_norm",
    )
    encoders = [
        CLIPTextModelWithProjection(_text_config(tokenizer, projection_dim=32)) for _ in range(2)
    ]
    pipe = StableDiffusion3Pipeline(
        transformer=transformer,
        scheduler=FlowMatchEulerDiscreteScheduler(),
        vae=_vae(
            shift_factor=0.0609,
            scaling_factor=1.5035,
            use_quant_conv=False,
            use_post_quant_conv=False,
        ),
        text_encoder=encoders[0],
        tokenizer=tokenizer,
        text_encoder_2=encoders[1],
        tokenizer_2=tokenizer,
        text_encoder_3=None,
        tokenizer_3=None,
    )
    path.mkdir(parents=True, exist_ok=True)
    pipe.save_pretrained(path)
    return path
