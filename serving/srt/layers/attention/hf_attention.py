"""Attention over the KV pool for transformers models, through transformers' own attention
interface: the function registered as ``IMPLEMENTATION`` is what every attention module of a
model loaded with ``attn_implementation=IMPLEMENTATION`` calls, whatever its architecture.

Called inside a forward of the runtime (``forward_batch=`` among the model's keyword arguments,
which transformers hands down to attention), it runs the batch's attention backend on the
module's queries, keys and values, with the one row of tokens flattened into
``(tokens, heads, head_dim)``. Called without one (``model.generate()`` on the same model
object), it is transformers' SDPA attention, so the model still works as transformers' own.

A module this runtime cannot run over the pool (attention logit soft-capping, attention sinks,
non-causal attention) raises ``UnsupportedAttention`` naming its class.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from serving.srt.layers.radix_attention import RadixAttention

if TYPE_CHECKING:
    import torch

IMPLEMENTATION = "sglang_pool"

# ``forward_batch=COMPILED_DECODE``: a forward traced by ``torch.compile`` for a compiled decode
# step (``serving.srt.model_executor.compiled_step``); attention calls that step's custom op.
COMPILED_DECODE = "compiled_decode"


class UnsupportedAttention(RuntimeError):
    """An attention module whose kind of attention the KV pool's backends do not compute."""


def describe(
    module: Any, query: torch.Tensor, key: torch.Tensor, kwargs: dict[str, Any]
) -> RadixAttention:
    """The ``RadixAttention`` of ``module`` (checked once, the first time it runs)."""
    name = type(module).__name__
    if kwargs.get("softcap") is not None or getattr(module, "attn_logit_softcapping", None):
        raise UnsupportedAttention(f"{name} caps attention logits (softcap)")
    if getattr(module, "sinks", None) is not None:
        raise UnsupportedAttention(f"{name} has attention sinks")
    if getattr(module, "is_causal", True) is False:
        raise UnsupportedAttention(f"{name} is not causal attention")
    layer_idx = getattr(module, "layer_idx", None)
    if layer_idx is None:
        raise UnsupportedAttention(f"{name} has no layer_idx")
    # Mistral-like modules pass their window to attention; Gemma-like ones keep it.
    window = kwargs.get("sliding_window") or getattr(module, "sliding_window", None)
    scaling = kwargs.get("scaling")
    return RadixAttention(
        layer_id=int(layer_idx),
        tp_q_head_num=int(query.shape[1]),
        tp_k_head_num=int(key.shape[1]),
        tp_v_head_num=int(key.shape[1]),
        head_dim=int(query.shape[-1]),
        scaling=float(scaling) if scaling is not None else float(query.shape[-1]) ** -0.5,
        sliding_window_size=int(window) if window else -1,
    )


def pool_attention(
    module: Any,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """transformers' attention-function signature (the module docstring)."""
    batch = kwargs.get("forward_batch")
    if batch is None:
        from transformers.integrations.sdpa_attention import sdpa_attention_forward

        return sdpa_attention_forward(module, query, key, value, attention_mask, **kwargs)
    if batch is COMPILED_DECODE:
        import torch

        out = torch.ops.sglang_launch.pool_attention(
            query[0].transpose(0, 1),
            key[0].transpose(0, 1),
            value[0].transpose(0, 1),
            int(module.layer_idx),
        )
        return out.unsqueeze(0), None
    layer = module.__dict__.get("_radix_attention")
    if layer is None:
        layer = module.__dict__["_radix_attention"] = describe(module, query, key, kwargs)
    out = batch.attn_backend.forward(
        query[0].transpose(0, 1), key[0].transpose(0, 1), value[0].transpose(0, 1), layer, batch
    )
    return out.unsqueeze(0), None


def layers_off_the_pool(model: Any) -> str:
    """What in ``model`` did not run its attention over the pool in a forward ("" when every
    decoder layer did): layer types from its config, else how many layers never called
    ``pool_attention`` with a batch."""
    config = model.config
    text = config.get_text_config(decoder=True) if hasattr(config, "get_text_config") else config
    other = set(getattr(text, "layer_types", None) or ()) - {"full_attention", "sliding_attention"}
    if other:
        return f"its layers of type {', '.join(sorted(other))}"
    ran = sum(1 for m in model.modules() if "_radix_attention" in m.__dict__)
    layers = int(getattr(text, "num_hidden_layers", 0) or 0)
    if ran < layers:
        return (
            f"{layers - ran} of its {layers} decoder layers attend otherwise than through "
            f"transformers' attention interface"
        )
    return ""


def register() -> None:
    """Register ``pool_attention`` (and transformers' SDPA mask for ``generate()``)."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    AttentionInterface.register(IMPLEMENTATION, pool_attention)
    AttentionMaskInterface.register(IMPLEMENTATION, sdpa_mask)
