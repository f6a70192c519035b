"""What can be known of a served model before any worker loads it: facts from its config.json.

The launcher checks the server arguments against these facts in ``check_server_args`` (an
encoder cannot be sharded with ``--tp-size 2``; a tp size must divide the key/value heads), so
such a mistake exits with a usage error before a worker is spawned. Workers use the same facts
when they load the model. Standard library only: the config is read as JSON, with no model
library, so the check costs a file read.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

# Architectures served as generation (causal LMs); every other architecture is served as an
# embedding model.
CAUSAL_SUFFIXES = ("ForCausalLM", "LMHeadModel")


def is_causal_lm(architecture: str) -> bool:
    """True for a causal LM architecture name (``LlamaForCausalLM``, ``GPT2LMHeadModel``)."""
    return architecture.endswith(CAUSAL_SUFFIXES)


@dataclass(frozen=True)
class ModelFacts:
    """The model directory's ``architecture`` (the first of ``architectures``, None when the
    config names none) and its key/value head count (None when the config has none)."""

    path: Path
    architecture: str | None
    kv_heads: int | None


def read_model_facts(path: str | Path) -> ModelFacts | None:
    """The facts in ``path``/config.json, or None when it cannot be read as a JSON object (the
    worker that loads the model then reports the model library's own error)."""
    folder = Path(path)
    try:
        config = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(config, dict):
        return None
    architectures = config.get("architectures")
    architecture = (
        architectures[0]
        if isinstance(architectures, list) and architectures and isinstance(architectures[0], str)
        else None
    )
    heads = config.get("num_key_value_heads") or config.get("num_attention_heads")
    return ModelFacts(folder, architecture, heads if isinstance(heads, int) and heads > 0 else None)


def tp_problems(facts: ModelFacts | None, tp_size: int, dp_size: int) -> list[str]:
    """What stops ``--tp-size tp_size`` from sharding the model, each with what to pass instead
    (empty when nothing does, or when the facts are unknown)."""
    if facts is None or tp_size <= 1:
        return []
    scale = f"serve it with --tp-size 1 and scale out with --dp-size {tp_size * dp_size}"
    if facts.architecture is not None and not is_causal_lm(facts.architecture):
        return [
            f"--tp-size {tp_size} needs a causal LM, but the model in {facts.path} is a "
            f"{facts.architecture} encoder (its config.json says so), which cannot be split over "
            f"tensor-parallel ranks; {scale}"
        ]
    if facts.kv_heads is not None and facts.kv_heads % tp_size:
        return [
            f"--tp-size {tp_size} does not divide the model's {facts.kv_heads} key/value heads "
            f"(from its config.json); pass a tp size that divides {facts.kv_heads}, or {scale}"
        ]
    return []


# What a model directory serves: the kinds of API a server of it answers.
EMBEDDING, GENERATION, IMAGE = "embedding", "generation", "image"


def model_kind(path: str | Path) -> str | None:
    """What the model directory at ``path`` serves, from its files alone: ``"generation"`` (a
    causal LM's config.json), ``"embedding"`` (any other config.json), ``"image"`` (a diffusers
    pipeline's model_index.json); None when it holds neither."""
    facts = read_model_facts(path)
    if facts is not None:
        causal = facts.architecture is not None and is_causal_lm(facts.architecture)
        return GENERATION if causal else EMBEDDING
    if (Path(path) / "model_index.json").is_file():
        return IMAGE
    return None
