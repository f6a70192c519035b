"""Where the served pipeline comes from: ``--model-path``, a diffusers pipeline directory.

``resolve_pipeline`` is the diffusion runtime's ``model_check`` (``platforms.runtimes``): the
launcher runs it in ``check_server_args``, before any worker starts, so it imports only the
standard library (it looks ``diffusers`` up without importing it).
"""

from __future__ import annotations

import importlib.util
import json
import os
from pathlib import Path

from launcher.workers.model_source import ModelSource, ModelSourceError

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


def resolve_pipeline(model_path: str | os.PathLike | None, served_model_name: str | None = None) -> ModelSource:
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
