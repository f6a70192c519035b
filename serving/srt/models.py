"""Which class loads a text model: one a plugin registered for its architecture
(``launchspec.model_registry.ModelRegistry``, SGLang's ``sglang.srt.models.registry``), else
transformers' auto class; and the contract a registered class follows.

A registered class is loaded and driven exactly as transformers' own classes are, so it is a
transformers ``PreTrainedModel`` and this runtime makes these calls on it, no others:

- ``cls.from_pretrained(path, dtype=..., attn_implementation=..., local_files_only=True,
  trust_remote_code=..., [distributed_config=DistributedConfig(tp_plan="auto", tp_size=N)])``
  (the last with ``--tp-size N``; the config's ``base_model_tp_plan`` shards it), then
  ``model.to(device)`` (``--tp-size 1``) and ``model.eval()``;
- it reads ``model.config``, ``model.generation_config`` (for the end-of-sequence ids, when it
  has one) and the parameter names of ``model.forward`` (``logits_to_keep``);
- generation (an architecture named ``...ForCausalLM`` or ``...LMHeadModel``): loaded with
  ``attn_implementation="sglang_pool"`` (``serving.srt.layers.attention.hf_attention``), then
  ``model(input_ids=, position_ids=, attention_mask=, use_cache=False, forward_batch=,
  [logits_to_keep=])``, the step's tokens in one row of (1, tokens), a 4-D placeholder mask,
  ``forward_batch`` handed down to every attention module, which calls transformers' attention
  interface; returning an object whose ``logits`` are (1, kept positions, vocab);
- embeddings (any other architecture): ``model(input_ids=, attention_mask=, [token_type_ids=])``
  returning an object whose ``last_hidden_state`` is (rows, tokens, hidden), pooled as the model
  directory declares.

The model directory's config is read with ``transformers.AutoConfig``; where its ``model_type``
is one transformers does not know, with the registered class's ``config_class``.

A class written for SGLang's own model runner (its ``forward(input_ids, positions,
forward_batch)`` takes SGLang's ``ForwardBatch``) cannot run here and is refused at load, as is
any class that is not a ``PreTrainedModel``.
"""

from __future__ import annotations

import inspect
from pathlib import Path
from typing import Any

from launchspec.model_config import read_model_facts
from launchspec.model_registry import ModelRegistry
from serving.errors import ModelLoadError

CONTRACT = 'docs/plugins.md, "Out-of-tree models"'


def registered_class(path: Path) -> type[Any] | None:
    """The class a plugin registered for the architecture in ``path``'s config.json, checked
    against the contract (``ModelLoadError`` naming what is wrong), or None."""
    facts = read_model_facts(path)
    architecture = facts.architecture if facts is not None else None
    if architecture is None:
        return None
    try:
        cls = ModelRegistry.find(architecture)
    except Exception as exc:  # noqa: BLE001 - a plugin's package failed to import or clashed
        raise ModelLoadError(
            f"the model classes plugins registered (ModelRegistry.register of "
            f"{', '.join(map(repr, ModelRegistry.packages()))}) could not be imported: "
            f"{type(exc).__name__}: {exc}"
        ) from exc
    if cls is not None:
        check_model_class(cls, architecture)
    return cls


def check_model_class(cls: type, architecture: str) -> None:
    """``ModelLoadError`` unless ``cls`` follows the contract this runtime drives (the module
    docstring)."""
    import transformers

    name = f"{cls.__module__}.{cls.__qualname__}"
    where = f"model class {name} (registered through ModelRegistry for architecture {architecture})"
    forward = getattr(cls, "forward", None)
    try:
        params = inspect.signature(forward).parameters if callable(forward) else {}
    except (TypeError, ValueError):
        params = {}
    if "forward_batch" in params:
        raise ModelLoadError(
            f"{where} is written for SGLang's model runner: its forward takes forward_batch "
            f"(SGLang's ForwardBatch), which this runtime does not have; register a transformers "
            f"PreTrainedModel whose forward takes input_ids, attention_mask, position_ids and "
            f"past_key_values ({CONTRACT}), or leave the architecture unregistered to serve it "
            f"with transformers' own class"
        )
    if not issubclass(cls, transformers.PreTrainedModel):
        raise ModelLoadError(
            f"{where} is not a transformers PreTrainedModel (its bases: "
            f"{', '.join(b.__name__ for b in cls.__mro__[1:-1]) or 'none'}); this runtime loads it "
            f"with from_pretrained and calls it as transformers' models are called ({CONTRACT})"
        )


def load_config(path: Path, trust_remote_code: bool, registered: type[Any] | None) -> Any:
    """The model's transformers config (``ModelLoadError`` naming the fix when it cannot be read)."""
    import transformers

    try:
        return transformers.AutoConfig.from_pretrained(
            path, local_files_only=True, trust_remote_code=trust_remote_code
        )
    except Exception as exc:  # noqa: BLE001 - any config failure is the same user error
        error: Exception = exc
    config_class: Any = getattr(registered, "config_class", None)
    if config_class not in (None, transformers.PretrainedConfig):
        try:  # a model_type transformers does not know: the registered class's own config
            return config_class.from_pretrained(path, local_files_only=True)
        except Exception as exc:  # noqa: BLE001
            error = exc
    raise ModelLoadError(
        f"cannot read the model config in {path}: {error}; pass --model-path a "
        f"Hugging Face model directory (add --trust-remote-code for custom architectures)"
    ) from error


def class_name(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"
