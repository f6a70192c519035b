"""What can be known of a served model before any worker loads it: facts from its config.json.

The launcher checks the server arguments against these facts in ``check_server_args`` (an
encoder cannot be sharded with ``--tp-size 2``; a tp size must divide the key/value heads), so
such a mistake exits with a usage error before a worker is spawned. Workers use the same facts
when they load the model, and the HTTP process when it decides which routes serve: one rule,
``is_causal_model``, says whether a model generates text or embeds it. Standard library only:
the config is read as JSON, with no model library, so the check costs a file read.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

# The endings of the class names transformers gives its causal LMs (``LlamaForCausalLM``,
# ``GPT2LMHeadModel``); CAUSAL_CLASSES and NOT_CAUSAL_CLASSES are the classes of its causal-LM
# mapping (``AutoModelForCausalLM``) whose names say otherwise, and the one class outside it
# whose name looks causal (tests/launcher/test_model_config.py checks both lists against the
# installed transformers).
CAUSAL_SUFFIXES = ("ForCausalLM", "LMHeadModel")
CAUSAL_CLASSES = frozenset(
    {
        "BertGenerationDecoder",
        "ReformerModelWithLMHead",
        "Gemma3ForConditionalGeneration",
        "Gemma3nForConditionalGeneration",
        "Gemma4ForConditionalGeneration",
        "Gemma4UnifiedForConditionalGeneration",
        "GotOcr2ForConditionalGeneration",
        "MossTranscribeDiarizeForConditionalGeneration",
    }
)
NOT_CAUSAL_CLASSES = frozenset({"FlaubertWithLMHeadModel"})
# The Auto class a model with its own code (``auto_map``) is generated with.
CAUSAL_AUTO_CLASS = "AutoModelForCausalLM"


def is_causal_lm(architecture: str) -> bool:
    """True for the class name of a causal LM (``LlamaForCausalLM``, ``GPT2LMHeadModel``)."""
    if architecture in CAUSAL_CLASSES:
        return True
    return architecture.endswith(CAUSAL_SUFFIXES) and architecture not in NOT_CAUSAL_CLASSES


def is_causal_model(architecture: str | None, auto_map: object = None) -> bool:
    """Whether a model generates text (a causal LM) rather than embeds it, from its config's
    ``architectures[0]`` and ``auto_map``, as transformers would load it.

    A model that brings its own code (``auto_map``, served with ``--trust-remote-code``) is
    loaded through the Auto class its ``auto_map`` names for its architecture's class: a causal
    LM when that is ``AutoModelForCausalLM``; when the architecture is none of the classes named
    there, an ``AutoModelForCausalLM`` entry makes it one. Every other model is judged by the
    class its config names (``is_causal_lm``)."""
    if isinstance(auto_map, dict) and auto_map:
        for auto_class, reference in auto_map.items():
            if architecture and _class_of(reference) == architecture:
                return bool(auto_class == CAUSAL_AUTO_CLASS)
        if CAUSAL_AUTO_CLASS in auto_map:
            return True
    return architecture is not None and is_causal_lm(architecture)


def _class_of(reference: object) -> str | None:
    """The class name in an ``auto_map`` value (``"module.Class"``, ``"repo--module.Class"``, or
    a list of them, the first the model's)."""
    if isinstance(reference, (list, tuple)) and reference:
        reference = reference[0]
    if not isinstance(reference, str) or not reference:
        return None
    return reference.rsplit(".", 1)[-1]


@dataclass(frozen=True)
class ModelFacts:
    """The model directory's ``architecture`` (the first of ``architectures``, None when the
    config names none), whether it is a causal LM (``is_causal_model``), and its key/value head
    count (None when the config has none)."""

    path: Path
    architecture: str | None
    kv_heads: int | None
    causal: bool = False


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
    return ModelFacts(
        folder,
        architecture,
        heads if isinstance(heads, int) and heads > 0 else None,
        is_causal_model(architecture, config.get("auto_map")),
    )


def tp_problems(facts: ModelFacts | None, tp_size: int, dp_size: int) -> list[str]:
    """What stops ``--tp-size tp_size`` from sharding the model, each with what to pass instead
    (empty when nothing does, or when the facts are unknown)."""
    if facts is None or tp_size <= 1:
        return []
    scale = f"serve it with --tp-size 1 and scale out with --dp-size {tp_size * dp_size}"
    if facts.architecture is not None and not facts.causal:
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
        return GENERATION if facts.causal else EMBEDDING
    if (Path(path) / "model_index.json").is_file():
        return IMAGE
    return None
