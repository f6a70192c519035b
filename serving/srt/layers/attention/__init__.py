"""Attention backends over the KV pool, chosen by name (``--attention-backend``, else the
platform's ``get_default_attention_backend()``).

``register_attention_backend(name, cls)`` adds a backend (a plugin may call it from its
``sglang.srt.plugins`` callback or a hook); ``attention_backend_class(name)`` finds one. A
backend is an ``AttentionBackend`` (``base_attn_backend``): constructed with the model runner's
KV pool, it runs one layer's attention of a ``ForwardBatch``. Built in: ``torch_native``
(``torch_native_backend``: PyTorch's scaled dot-product attention over each sequence's slots).
SGLang's other backend names (``flashinfer``, ``triton``, ``fa3``, ``intel_amx``, ...) name
kernels this runtime does not ship; they run as ``torch_native``, and the start-up log says so.
"""

from __future__ import annotations

import logging

from serving.srt.layers.attention.base_attn_backend import AttentionBackend

log = logging.getLogger("sglang_launch.attention")

_BACKENDS: dict[str, type[AttentionBackend]] = {}

# SGLang backend names whose kernels this runtime does not ship: they run as torch_native.
SUBSTITUTED = frozenset(
    {
        "torch",
        "native",
        "sdpa",
        "eager",
        "flashinfer",
        "triton",
        "fa3",
        "fa4",
        "flashmla",
        "cutlass_mla",
        "trtllm_mha",
        "intel_amx",
        "intel_xpu",
        "ascend",
        "aiter",
        "wave",
        "flash_attention_2",
        "flash_attention_3",
    }
)


def register_attention_backend(name: str, cls: type[AttentionBackend]) -> None:
    """Make ``cls`` the backend called ``name`` (replacing one of that name)."""
    if not (isinstance(cls, type) and issubclass(cls, AttentionBackend)):
        raise TypeError(
            f"attention backend {name!r}: {cls!r} is not a subclass of "
            f"serving.srt.layers.attention.base_attn_backend.AttentionBackend"
        )
    _BACKENDS[name.lower()] = cls


def registered_backends() -> list[str]:
    return sorted(_BACKENDS)


def attention_backend_class(name: str) -> tuple[type[AttentionBackend], str]:
    """The class of backend ``name`` and the name it runs as; ``KeyError`` (its message lists
    the registered names) for a name that is neither registered nor substituted."""
    key = name.lower()
    if key in _BACKENDS:
        return _BACKENDS[key], key
    if key in SUBSTITUTED:
        return _BACKENDS["torch_native"], "torch_native"
    raise KeyError(
        f"attention backend {name!r} is not registered; registered: "
        f"{', '.join(registered_backends())} (a plugin registers one with "
        f"serving.srt.layers.attention.register_attention_backend)"
    )


def choose_attention_backend(
    requested: str | None, platform_default: str | None
) -> tuple[type[AttentionBackend], str]:
    """The backend a generation model's attention runs through: ``--attention-backend``, else
    the platform's default, else ``torch_native``; with the pool's attention function
    registered in transformers (``hf_attention``). ``ModelLoadError`` for an unknown name."""
    from serving.errors import ModelLoadError
    from serving.srt.layers.attention import hf_attention

    hf_attention.register()
    name = requested or platform_default or "torch_native"
    try:
        cls, runs_as = attention_backend_class(name)
    except KeyError as exc:
        raise ModelLoadError(f"--attention-backend: {exc.args[0]}") from None
    if runs_as != name.lower():
        log.info("attention backend %r has no kernels here; it runs as %r", name, runs_as)
    return cls, runs_as


def _register_builtins() -> None:
    from serving.srt.layers.attention.torch_native_backend import TorchNativeAttnBackend

    register_attention_backend("torch_native", TorchNativeAttnBackend)


_register_builtins()
