"""The GGUF converter: ``python -m serving.srt.gguf_convert --gguf FILE --into DIR``.

The child process ``launchspec.gguf_cache.prepare`` runs (the caller never loads transformers),
through ``bootstrap.early_guard``, which arms its orphan protection before this module loads.
It reads the file's header with the ``gguf`` package's reader, refuses what transformers cannot
load before converting anything, then converts the file with transformers' own GGUF loading
(``from_pretrained(folder, gguf_file=...)``: the tokenizer, then the weights dequantised to
float32) and saves a Hugging Face model directory into ``DIR``, which the caller renames into the
cache once this process has exited 0.

Refusals (exit 2, the launcher's usage-error code), each naming the problem and the fix: a tensor
type transformers cannot dequantise, an architecture it cannot map to a model class, one that maps
to no causal LM. The result is one JSON line on the standard output (``{"ok": true, ...}`` or
``{"ok": false, "problems": [...]}``); everything else, progress included, goes to the standard
error: on a terminal transformers' progress bars with a line per step, elsewhere a plain line when
each step starts and ends.

The file is parsed once: the ``gguf`` reader (which parses every metadata array, the vocabulary
among them, when it opens a file) is shared by the header check and each of transformers' loads.
"""

from __future__ import annotations

import argparse
import collections
import datetime
import functools
import json
import os
import sys
import time
import traceback
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from launchspec.gguf_cache import FORMAT, ORIGIN_FILE, REFUSED

# How often the vocabulary arrays are parsed is what makes reading a GGUF file slow.
_READERS = 4


class Refused(Exception):
    """The file cannot be served; ``problems`` each name the fix."""

    def __init__(self, problems: list[str]) -> None:
        self.problems = problems
        super().__init__("; ".join(problems))


class Progress:
    """One line when each step starts and one with its time when it ends (stderr)."""

    def __init__(self, file: Path) -> None:
        self.file = file

    def say(self, text: str) -> None:
        print(f"sglang-launch: {self.file.name}: {text}", file=sys.stderr, flush=True)

    @contextmanager
    def step(self, what: str) -> Iterator[None]:
        started = time.monotonic()
        self.say(f"{what} ...")
        yield
        self.say(f"{what}: done in {time.monotonic() - started:.1f}s")


def _share_readers() -> None:
    """Make every ``gguf.GGUFReader(path)`` of this process return one reader per file."""
    import gguf

    original = gguf.GGUFReader

    @functools.lru_cache(maxsize=_READERS)
    def shared(path: str, mode: Any = "r") -> Any:
        return original(path, mode)

    def reader(path: str | os.PathLike[str], mode: Any = "r") -> Any:
        return shared(os.path.realpath(path), mode)

    # transformers imports the reader from the package at each load.
    gguf.GGUFReader = reader  # type: ignore[misc,assignment]


def read_header(file: Path) -> dict[str, Any]:
    """The file's architecture, model name, tensor types (name -> count) and whether it carries
    a tokenizer, from its header."""
    import gguf

    reader = gguf.GGUFReader(str(file))

    def text(key: str) -> str | None:
        field = reader.fields.get(key)
        if field is None:
            return None
        value = field.contents()
        return value if isinstance(value, str) else None

    types = collections.Counter(t.tensor_type.name for t in reader.tensors)
    return {
        "architecture": text("general.architecture") or "?",
        "name": text("general.name"),
        "tensor_types": dict(types.most_common()),
        "tensor_types_ids": sorted({int(t.tensor_type) for t in reader.tensors}),
        "tensors": len(reader.tensors),
        "tokenizer": "tokenizer.ggml.model" in reader.fields,
    }


def dequantisable(type_id: int, architecture: str) -> bool:
    """Whether transformers can turn tensors of ggml type ``type_id`` into floats, for a file of
    ``architecture``: one block of zeros is dequantised the way transformers' loader would (its
    own dequantiser for the architectures its newer GGUF path handles, the ``gguf`` package's
    for the others)."""
    import gguf
    import numpy as np

    qtype = gguf.GGMLQuantizationType(type_id)
    if qtype in (gguf.GGMLQuantizationType.F32, gguf.GGMLQuantizationType.F16):
        return True
    block = gguf.GGML_QUANT_SIZES.get(qtype)
    if block is None:
        return False
    if _newer_path(architecture):
        import torch
        from transformers.integrations.gguf import dequant

        if qtype == gguf.GGMLQuantizationType.BF16:
            return True
        try:
            dequant.dequantize(torch.zeros(block[1], dtype=torch.uint8), type_id)
        except ValueError:
            return False
        return True
    try:
        gguf.quants.dequantize(np.zeros((1, block[1]), dtype=np.uint8), qtype)
    except NotImplementedError:
        return False
    return True


def _newer_path(architecture: str) -> bool:
    """Whether transformers loads ``architecture`` through its newer GGUF path."""
    try:
        from transformers.integrations.gguf.utils import is_gguf_arch_supported
    except ImportError:
        return False
    return bool(is_gguf_arch_supported(architecture))


def check(file: Path, header: dict[str, Any]) -> Any:
    """The file's transformers config, or ``Refused`` naming every problem found in its header."""
    import gguf
    import transformers
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING

    version = f"transformers {transformers.__version__}"
    architecture = header["architecture"]
    problems = []
    refused = {}
    for type_id in header["tensor_types_ids"]:
        if not dequantisable(type_id, architecture):
            refused[gguf.GGMLQuantizationType(type_id).name] = header["tensor_types"].get(
                gguf.GGMLQuantizationType(type_id).name, 0
            )
    if refused:
        kinds = ", ".join(f"{n} tensors as {name}" for name, n in refused.items())
        problems.append(
            f"{file} stores {kinds}, a quantisation {version} cannot dequantise; quantise the "
            f"model again with a type it reads (Q4_0, Q4_1, Q8_0, Q4_K, Q5_K, Q6_K, F16 among "
            f"others), or pass the model's Hugging Face directory"
        )
    config = None
    try:
        config = transformers.AutoConfig.from_pretrained(
            str(file.parent), gguf_file=file.name, local_files_only=True
        )
    except ValueError as exc:
        problems.append(
            f"{file} holds a {architecture!r} model, an architecture {version} cannot map to a "
            f"model class ({exc}); pass the model's Hugging Face directory, or a GGUF file of an "
            f"architecture it reads ({', '.join(supported_architectures())})"
        )
    if config is not None and type(config) not in MODEL_FOR_CAUSAL_LM_MAPPING:
        problems.append(
            f"{file} holds a {architecture!r} model ({type(config).__name__}), which {version} "
            f"has no causal LM class for: a GGUF file is served as a causal LM; pass the model's "
            f"Hugging Face directory instead"
        )
    if problems:
        raise Refused(problems)
    return config


def supported_architectures() -> list[str]:
    """The GGUF architectures transformers can load (as ``general.architecture`` names them)."""
    names: set[str] = set()
    try:
        from transformers.modeling_gguf_pytorch_utils import GGUF_SUPPORTED_ARCHITECTURES

        names.update(GGUF_SUPPORTED_ARCHITECTURES)
    except ImportError:
        pass
    try:
        from transformers.integrations.gguf.gguf_conversion_mapping import GGUF_ARCHS

        names.update(GGUF_ARCHS)
    except ImportError:
        pass
    return sorted(names - {"general", "tokenizer"})


def convert(file: Path, into: Path, sha256: str, progress: Progress) -> dict[str, Any]:
    """Convert ``file`` into a model directory at ``into``; what ``ORIGIN_FILE`` records."""
    started = time.monotonic()
    if not _has("gguf"):
        raise Refused(
            [
                f"reading {file} needs the 'gguf' package, which is not installed; install the "
                f"serving extra (scripts/install.sh, or pip install 'sglang-launch[serve]')"
            ]
        )
    _share_readers()
    with progress.step("reading the GGUF header"):
        header = read_header(file)
    types = ", ".join(f"{name} x{n}" for name, n in header["tensor_types"].items())
    progress.say(
        f"{header['architecture']} model {header['name'] or ''!s}, {header['tensors']} tensors "
        f"({types}); converting it into a model directory, which only the first start does"
    )
    with progress.step("checking that transformers can load it"):
        import torch
        import transformers

        config = check(file, header)
    into.mkdir(parents=True)
    folder, name = str(file.parent), file.name
    if header["tokenizer"]:
        with progress.step("converting the tokenizer"):
            tokenizer = transformers.AutoTokenizer.from_pretrained(
                folder, gguf_file=name, local_files_only=True
            )
            tokenizer.save_pretrained(into)
    with progress.step(f"dequantising {header['tensors']} tensors to float32"):
        model = transformers.AutoModelForCausalLM.from_pretrained(
            folder, gguf_file=name, config=config, dtype=torch.float32, local_files_only=True
        )
    with progress.step(f"saving the model directory ({_size(model)})"):
        # The loaded model remembers it came from GGUF blocks; its weights are plain floats now.
        model.hf_quantizer = None  # type: ignore[assignment]
        if hasattr(model.config, "quantization_config"):
            del model.config.quantization_config
        model.save_pretrained(into)
    origin = {
        "format": FORMAT,
        "gguf_file": str(file),
        "sha256": sha256,
        "size": file.stat().st_size,
        "architecture": header["architecture"],
        "name": header["name"],
        "tensor_types": header["tensor_types"],
        "tokenizer": header["tokenizer"],
        "dtype": "float32",
        "transformers": transformers.__version__,
        "converted_at": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "seconds": round(time.monotonic() - started, 1),
    }
    (into / ORIGIN_FILE).write_text(json.dumps(origin, indent=1), encoding="utf-8")
    return origin


def _size(model: Any) -> str:
    count = sum(p.numel() for p in model.parameters())
    return f"{count:,} parameters, {count * 4 / 1e6:.1f} MB"


def _has(module: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(module) is not None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m serving.srt.gguf_convert")
    parser.add_argument("--gguf", required=True, type=Path)
    parser.add_argument("--into", required=True, type=Path)
    parser.add_argument("--sha256", required=True)
    args = parser.parse_args(argv)
    # The result goes to the real standard output; anything a library prints, to stderr.
    result_out = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)
    if not sys.stderr.isatty():
        # Bars redrawn with carriage returns are noise in a log: plain step lines only.
        os.environ["TQDM_DISABLE"] = "1"
        os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    progress = Progress(args.gguf)
    try:
        result: dict[str, Any] = {
            "ok": True,
            **convert(args.gguf, args.into, args.sha256, progress),
        }
        code = 0
    except Refused as exc:
        result, code = {"ok": False, "problems": exc.problems}, REFUSED
    except Exception as exc:  # noqa: BLE001 - reported to the caller, with the traceback above
        traceback.print_exc()
        result, code = {"ok": False, "error": f"{type(exc).__name__}: {exc}"}, 1
    result_out.write(json.dumps(result) + "\n")
    result_out.flush()
    return code


if __name__ == "__main__":
    sys.exit(main())
