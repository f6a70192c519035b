"""What a generation model's decode step runs through, chosen by the platform (SGLang's order):

1. when ``current_platform.support_cuda_graph()`` is true (and ``--disable-cuda-graph`` is not
   given): the class ``get_graph_runner_cls()`` returns, used as returned, constructed with the
   model runner (this project's ``CudaGraphRunner`` on CUDA, under SGLang's name
   ``sglang.srt.model_executor.cuda_graph_runner.CudaGraphRunner``);
2. else, with ``--enable-torch-compile``: the compiled decode step (``compiled_step``), with the
   platform's ``get_compile_backend()`` and ``get_compile_options()``, up to
   ``--torch-compile-max-bs`` rows;
3. else nothing: every step runs the model eagerly.

A runner is an object with ``can_run(forward_batch)`` and ``replay(forward_batch)`` (the
contract in ``compiled_step``); the model runner asks it for every forward and runs eagerly the
forwards it declines (prompt tokens, or more rows than it captured). This project's runners are
compiled or captured here, at start-up, in ``capture()``.

A platform that claims graph support but has no runner class, returns something that is not a
class, or a class that fails to construct or capture stops start-up (``ModelLoadError``) naming
the class and the way out (``--disable-cuda-graph``).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from serving.errors import ModelLoadError

log = logging.getLogger("sglang_launch.decode_runner")


@dataclass(frozen=True)
class DecodeOptions:
    """The server arguments the choice reads (SGLang's flags of those names)."""

    enable_torch_compile: bool = False
    torch_compile_max_bs: int = 32
    disable_cuda_graph: bool = False
    cuda_graph_max_bs: int | None = None

    @classmethod
    def of(cls, server_args: Any) -> DecodeOptions:
        return cls(
            enable_torch_compile=bool(getattr(server_args, "enable_torch_compile", False)),
            torch_compile_max_bs=int(getattr(server_args, "torch_compile_max_bs", 32) or 32),
            disable_cuda_graph=bool(getattr(server_args, "disable_cuda_graph", False)),
            cuda_graph_max_bs=getattr(server_args, "cuda_graph_max_bs", None),
        )


def _name(cls: Any) -> str:
    return f"{getattr(cls, '__module__', '?')}.{getattr(cls, '__qualname__', repr(cls))}"


def choose_decode_runner(model_runner: Any, options: DecodeOptions) -> Any:
    """The decode runner of ``model_runner`` (the module docstring), set as its
    ``graph_runner`` and captured; None when decode runs eagerly."""
    from serving.srt.model_executor.compiled_step import CompiledDecodeStep

    if model_runner.kind != "generation":
        return None
    platform = model_runner.platform
    model_runner.server_args = options
    runner: Any = None
    if not options.disable_cuda_graph and platform.support_cuda_graph():
        runner = _platform_runner(model_runner, platform)
    elif options.enable_torch_compile:
        if model_runner.tp_size > 1:
            log.warning(
                "--enable-torch-compile: the decode step runs eager with --tp-size %d (the "
                "compiled step runs on one rank's whole model only)",
                model_runner.tp_size,
            )
            return None
        runner = CompiledDecodeStep(model_runner, max_bs=options.torch_compile_max_bs)
    if runner is None:
        return None
    model_runner.graph_runner = runner
    if isinstance(runner, CompiledDecodeStep):
        try:
            runner.capture()
        except Exception as exc:
            model_runner.graph_runner = None
            raise ModelLoadError(
                f"compiling the decode step with {type(runner).__name__} (backend "
                f"{runner.backend!r}) failed: {type(exc).__name__}: {exc}; start without "
                f"--enable-torch-compile"
                + (" and with --disable-cuda-graph" if runner.dynamic is False else "")
            ) from exc
    return runner


def _platform_runner(model_runner: Any, platform: Any) -> Any:
    """An instance of the class the platform's ``get_graph_runner_cls()`` returns."""
    owner = type(platform).__qualname__
    try:
        cls = platform.get_graph_runner_cls()
    except NotImplementedError:
        raise ModelLoadError(
            f"the platform {owner} says support_cuda_graph() but does not implement "
            f"get_graph_runner_cls(); have it return a graph runner class (SGLang's "
            f"sglang.srt.model_executor.cuda_graph_runner.CudaGraphRunner is this project's), "
            f"or start with --disable-cuda-graph"
        ) from None
    if not isinstance(cls, type):
        raise ModelLoadError(
            f"the platform {owner}'s get_graph_runner_cls() returned {cls!r}, not a class; "
            f"have it return a graph runner class, or start with --disable-cuda-graph"
        )
    missing = [m for m in ("can_run", "replay") if not callable(getattr(cls, m, None))]
    if missing:
        raise ModelLoadError(
            f"the platform {owner}'s graph runner {_name(cls)} has no {' or '.join(missing)}(); "
            f"a graph runner has can_run(forward_batch) and replay(forward_batch), or start "
            f"with --disable-cuda-graph"
        )
    log.info("the decode step runs through the platform's graph runner %s", _name(cls))
    try:
        return cls(model_runner)
    except Exception as exc:
        raise ModelLoadError(
            f"the platform {owner}'s graph runner {_name(cls)} failed to start: "
            f"{type(exc).__name__}: {exc}; start with --disable-cuda-graph to decode without it"
        ) from exc
