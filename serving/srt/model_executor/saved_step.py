"""A compiled decode step saved whole, so a later start does not trace the model again.

``torch.compile(...).aot_compile`` traces the step once (dynamo), compiles it (inductor) and
returns a function that can be written to a file with its guards; loading that file gives the
same function without tracing. ``SavedStep`` names the file by a key of everything the traced
graph depends on, and keeps only the guards on the step's own inputs (the token ids and
positions: their dtype, rank and the dynamic row count's bounds). Every other guard dynamo
would keep (the model's modules, their attributes, the library versions) is covered by the key
instead; the key is:

- the versions of Python, torch and transformers, and the CPU's vector capability;
- the source of sglang-launch's ``serving`` package (what the forward calls into);
- the model's architecture, its config, its module tree (``repr``), and the name, shape and
  dtype of every parameter and buffer;
- the dtype, the weight scheme (quantization, torchao config, wide-step tokens), the attention
  implementation and backend, and the device;
- the backend, its options, the row bounds and the forward's keyword arguments.

So a changed model, library or sglang-launch source gets a file of its own, and an entry that
guards would have rejected is never looked up. The weights themselves are inputs of the graph,
not part of it: two checkpoints of one architecture and shape share a file.
"""

from __future__ import annotations

import hashlib
import json
import logging
import sys
from pathlib import Path
from typing import Any

log = logging.getLogger("sglang_launch.compiled_step")

FOLDER = "decode-steps"
SERVING = Path(__file__).resolve().parents[2]  # the ``serving`` package
_SOURCE_DIGEST: list[str] = []
_INPUTS = ("L['ids']", "L['positions']")


def source_digest() -> str:
    """A digest of every ``.py`` file of the ``serving`` package (computed once)."""
    if not _SOURCE_DIGEST:
        digest = hashlib.sha256()
        for path in sorted(SERVING.rglob("*.py")):
            digest.update(str(path.relative_to(SERVING)).encode())
            digest.update(path.read_bytes())
        _SOURCE_DIGEST.append(digest.hexdigest())
    return _SOURCE_DIGEST[0]


def step_key(step: Any) -> str:
    """The key of ``step``'s graph (the module docstring), as 24 hex digits. ``step``: a
    ``compiled_step.CompiledDecodeStep`` (its model runner, backend, options and row bounds)."""
    import torch
    import transformers

    runner = step.model_runner
    model = runner.model
    tensors = [
        (name, list(t.shape), str(t.dtype))
        for name, t in (*model.named_parameters(), *model.named_buffers())
    ]
    parts = {
        "python": sys.version,
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "cpu": torch.backends.cpu.get_cpu_capability(),
        "serving": source_digest(),
        "architecture": runner.architecture,
        "config": _config_without_path(model.config),
        "modules": repr(model),
        "tensors": tensors,
        "dtype": str(runner.dtype),
        "scheme": list(getattr(runner, "_scheme", ())),
        "attention": [
            str(getattr(runner, "attn_implementation", "")),
            str(getattr(runner, "attention_backend", "")),
        ],
        "device": str(runner.device),
        "backend": step.backend,
        "options": repr(sorted(step.options.items())),
        "rows": [step.min_rows, step.rows_bound],
        "keep": sorted(step._keep),
    }
    blob = json.dumps(parts, sort_keys=True, default=str).encode()
    return hashlib.sha256(blob).hexdigest()[:24]


def _config_without_path(config: Any) -> str:
    """The model's config as JSON, less the directory it was read from (``_name_or_path``): two
    checkpoints of one architecture and size make the same graph."""
    values = json.loads(config.to_json_string(use_diff=False))
    values.pop("_name_or_path", None)
    return json.dumps(values, sort_keys=True)


def keep_input_guards(entries: Any) -> list[bool]:
    """The guard filter of a saved step: the guards on its inputs and the shape guards (the
    dynamic row count's bounds); every other guard is covered by the file's key."""
    return [entry.name.startswith(_INPUTS) or entry.guard_type == "SHAPE_ENV" for entry in entries]


class SavedStep:
    """The saved file of one compiled decode step: ``load()`` it, or ``compile_and_save()``."""

    def __init__(self, step: Any) -> None:
        self.step = step
        name = f"{step.model_runner.architecture}-{step_key(step)}.bin"
        self.path = Path(step.cache_dir) / FOLDER / name

    def load(self) -> Any:
        """The saved function (called as ``function(step, ids, positions)``), None when there is
        no file or it cannot be loaded (an unloadable file is removed)."""
        from torch._dynamo.aot_compile import AOTCompiledFunction

        try:
            data = self.path.read_bytes()
        except FileNotFoundError:
            return None
        except OSError as exc:
            log.warning("cannot read the saved decode step %s (%s); compiling it", self.path, exc)
            return None
        try:
            return AOTCompiledFunction.deserialize(data, external_closure_data={"step": self.step})
        except Exception as exc:  # noqa: BLE001 - any failure means: compile it again
            log.warning(
                "the saved decode step %s cannot be loaded (%s: %s); compiling it again",
                self.path,
                type(exc).__name__,
                exc,
            )
            self.path.unlink(missing_ok=True)
            return None

    def compile_and_save(self) -> Any:
        """Trace and compile the step now and save it; the function, or None when the model
        cannot be compiled whole or the result cannot be saved (logged: the step then compiles
        at its first run)."""
        import torch

        step = self.step
        device = step.model_runner.device
        ids = torch.zeros((1, step.min_rows), dtype=torch.long, device=device)
        positions = torch.zeros((1, step.min_rows), dtype=torch.long, device=device)
        for tensor in (ids, positions):
            torch._dynamo.mark_dynamic(tensor, 1, min=step.min_rows, max=step.rows_bound)
        options = dict(step.options)
        options["guard_filter_fn"] = keep_input_guards
        try:
            compiled: Any = torch.compile(
                step._forward, backend=step.backend, options=options, fullgraph=True
            )
            with torch.inference_mode():
                function = compiled.aot_compile(((ids, positions), {}))
        except Exception as exc:  # noqa: BLE001 - the lazy compile remains
            log.warning(
                "the decode step cannot be compiled ahead of time (%s: %s); it compiles at its "
                "first run and is not saved",
                type(exc).__name__,
                exc,
            )
            torch._dynamo.reset()
            return None
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            function.save_compiled_function(str(self.path), external_data={"step": step})
        except Exception as exc:  # noqa: BLE001 - serve it unsaved
            log.warning(
                "the compiled decode step cannot be saved to %s (%s: %s); the next start "
                "compiles it again",
                self.path,
                type(exc).__name__,
                exc,
            )
        return function
