"""What stops a model's files from being served as the server arguments say: ``--load-format``
against the path, a GGUF file converted into the model cache (once: the first start of a file pays
for it, and shows its progress), a tokenizer the file lacks.

Standard library only (``launchspec.gguf_cache`` converts in a child process).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from launchspec.model_source import ModelSource
    from launchspec.server_args import ServerArgs


def model_file_problems(args: ServerArgs, source: ModelSource) -> list[str]:
    """What stops the model's files from being served as ``--load-format`` says; a GGUF file is
    converted into the model cache here, once (``launchspec.gguf_cache.prepare``: the first
    start of a file pays for it, and shows its progress)."""
    gguf = getattr(source, "gguf", None)
    if gguf is None:
        if args.load_format == "gguf":
            return [
                f"--load-format gguf needs --model-path a GGUF file, but {source.path} is a model "
                f"directory; drop --load-format gguf, or pass the .gguf file"
            ]
        return []
    from launchspec.gguf_cache import GgufError, prepare

    try:
        origin = prepare(gguf)
    except GgufError as exc:
        return exc.problems
    if origin.get("tokenizer") is False and args.tokenizer_path is None:
        return [
            f"{gguf.file} carries no tokenizer (no tokenizer.ggml.model in its header); pass "
            f"--tokenizer-path DIR, the folder of the model's Hugging Face tokenizer"
        ]
    return []
