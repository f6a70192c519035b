"""The dtype a model computes in and the form its weights take (``--dtype``, ``--quantization``,
``--torchao-config``, a GGUF file's own tensors), each decided through the platform.

``--dtype auto``: for a generation model, what the platform's ``get_default_dtype()`` says (the
CPU platform: bfloat16 where the CPU has AVX512-BF16 or AMX-BF16, else float32); without an
answer, float32 on the CPU and the checkpoint's dtype on an accelerator. An embedding model on
the CPU stays in float32 under ``auto`` (its vectors are compared with other runs' to many
digits). The reason is part of what ``/get_server_info`` shows (``TextModel.dtype_reason``).

The weight scheme is ``launchspec.quantization.resolve`` on the worker's platform; ``apply_scheme``
lays it into the model once it is loaded (``serving.srt.layers.quantization``,
``gguf_weights``) and returns what the weights are, as ``/get_model_info`` says.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from launchspec.quantization import QuantizationError, resolve
from serving.errors import ModelLoadError
from serving.srt.layers.quantization import linear_names, quantize_linear, replace_module

if TYPE_CHECKING:
    import torch

    from launchspec.model_source import ModelSource

_DTYPES = {
    "float32": "float32",
    "fp32": "float32",
    "float": "float32",
    "float16": "float16",
    "fp16": "float16",
    "half": "float16",
    "bfloat16": "bfloat16",
    "bf16": "bfloat16",
}


def resolve_dtype(
    requested: str, config: Any, platform: Any, device: torch.device, kind: str
) -> tuple[torch.dtype, str]:
    """``(dtype, reason)`` for ``--dtype requested`` (module docstring); ``ModelLoadError`` for
    a name that is none of auto, float32, float16, bfloat16."""
    import torch

    name = (requested or "auto").lower()
    if name != "auto":
        if name not in _DTYPES:
            raise ModelLoadError(
                f"--dtype {requested!r} is not supported; use one of auto, float32, float16, "
                f"bfloat16"
            )
        return getattr(torch, _DTYPES[name]), f"--dtype {requested}"
    cpu = platform.is_cpu() or device.type == "cpu"
    if kind == "generation":
        chosen = platform.get_default_dtype()
        if chosen is not None and chosen.dtype in _DTYPES:
            return getattr(torch, _DTYPES[chosen.dtype]), f"auto: {chosen.reason}"
    if cpu:
        why = "an embedding model on the CPU" if kind != "generation" else "the CPU"
        return torch.float32, f"auto: float32 for {why}"
    saved = getattr(config, "dtype", None) or getattr(config, "torch_dtype", None)
    if isinstance(saved, torch.dtype):
        return saved, "auto: the checkpoint's dtype"
    if saved and isinstance(getattr(torch, str(saved), None), torch.dtype):
        return getattr(torch, str(saved)), "auto: the checkpoint's dtype"
    return torch.float32, "auto: the checkpoint names no dtype"


@dataclass(frozen=True)
class WeightsReport:
    """What the served weights are: ``quantization`` (the scheme's name, None: none) and
    ``summary``, a sentence (``/get_model_info``'s ``weights.precision``)."""

    quantization: str | None
    summary: str


def apply_scheme(
    model: Any,
    source: ModelSource,
    platform: Any,
    *,
    quantization: str | None,
    torchao_config: str | None,
    dtype: torch.dtype,
    tp_size: int,
    wide_step_tokens: int = 0,
) -> WeightsReport:
    """Lay the weight scheme the flags and the platform decide into ``model`` (loaded at
    ``dtype``); ``ModelLoadError`` when it cannot be served. ``wide_step_tokens`` > 0: each
    quantized layer also keeps a dense copy that computes the steps of at least that many tokens
    (``--wide-step-tokens``, ``layers.quantization.keep_wide_copies``)."""
    rest = str(dtype).replace("torch.", "")
    gguf = source.gguf
    try:
        chosen = resolve(platform, quantization, torchao_config, gguf_file=gguf is not None)
    except QuantizationError as exc:
        raise ModelLoadError(str(exc)) from exc
    scheme = chosen.scheme
    if scheme is not None and tp_size > 1:
        if chosen.asked is not None and (quantization or torchao_config):
            raise ModelLoadError(
                f"quantization {scheme.name} cannot be split over --tp-size {tp_size} ranks; "
                f"serve it with --tp-size 1 (and --dp-size N to scale out)"
            )
        scheme = None
    note = f"; {chosen.note}" if chosen.note else ""
    if scheme is None:
        return WeightsReport(None, f"every weight {rest}{note}")
    if scheme.method == "gguf":
        assert gguf is not None
        from serving.srt.model_loader.gguf_weights import LAYOUTS, load_gguf_linears

        laid = load_gguf_linears(model, gguf.file, model.config, dtype)
        parts = [
            f"{n} {kind} linears as {LAYOUTS[kind]}"
            if kind in LAYOUTS
            else f"{n} {kind.split()[0]} linears dequantised to {rest} (a shape the kernel does "
            f"not take)"
            for kind, n in sorted(laid.items())
        ]
        what = "; ".join(parts) if parts else "no linear in a Q4_0, Q4_1 or Q8_0 tensor"
        wide = _wide_copies(model, wide_step_tokens, rest)
        return WeightsReport(scheme.name, f"GGUF tensors: {what}{wide}; the rest {rest}{note}")
    done = kept = 0
    for name in linear_names(model):
        layer = quantize_linear(model.get_submodule(name), scheme.method, scheme.group_size, dtype)
        if layer is None:
            kept += 1
            continue
        replace_module(model, name, layer)
        done += 1
    layout = (
        "int8 weight-only (a scale per output channel)"
        if scheme.method == "int8wo"
        else f"int4 weight-only (group {scheme.group_size})"
    )
    unfit = f", {kept} whose shape the kernel does not take {rest}" if kept else ""
    wide = _wide_copies(model, wide_step_tokens, rest)
    return WeightsReport(
        scheme.name, f"{done} linears as {layout}{unfit}{wide}; the rest {rest}{note}"
    )


def _wide_copies(model: Any, wide_step_tokens: int, rest: str) -> str:
    """Lay out what ``--wide-step-tokens`` asks for (``keep_wide_copies``); what the summary
    says of it."""
    if wide_step_tokens <= 0:
        return ""
    from serving.srt.layers.quantization import keep_wide_copies

    copies, on_amx = keep_wide_copies(model, wide_step_tokens)
    amx = "through the AMX kernel over their quantized values"
    dense = f"by a dense {rest} copy of their values"
    if copies and on_amx:
        how = f"{on_amx} of these {amx} and {copies} {dense}"
    elif on_amx or copies:
        how = f"these {on_amx or copies} {amx if on_amx else dense}"
    else:
        return ""
    return f"; a step of {wide_step_tokens} tokens or more multiplies {how} (--wide-step-tokens)"
