"""``CudaGraphRunner``: the decode step captured in CUDA graphs, SGLang's class of that name
(``sglang.srt.model_executor.cuda_graph_runner.CudaGraphRunner`` through the aliases), the
runner a CUDA platform's ``get_graph_runner_cls()`` returns.

It is the compiled decode step (``compiled_step``) with inductor's CUDA graphs: the graph of a
decode step is split at attention (the ``pool_attention`` op is tagged ``cudagraph_unsafe``, and
inductor's graph partition leaves it out of the captured pieces, as SGLang's piecewise CUDA
graphs do), and the pieces between are captured once per batch size. Batch sizes are buckets
(``capture_sizes``: 1, 2, 4, 8, then every multiple of 8 up to ``--cuda-graph-max-bs``,
default 32); a step is padded to the next bucket, and a step of more rows runs eager.

Constructed with the model runner, as SGLang's is; the maximum batch size comes from
``model_runner.server_args.cuda_graph_max_bs`` when the model runner has server arguments.
"""

from __future__ import annotations

import bisect
from typing import Any

from serving.srt.model_executor.compiled_step import CompiledDecodeStep

DEFAULT_MAX_BS = 32


class CudaGraphRunner(CompiledDecodeStep):
    """The module docstring; the runner contract is ``CompiledDecodeStep``'s."""

    dynamic = False  # one graph per bucket, each captured
    min_rows = 1

    def __init__(self, model_runner: Any) -> None:
        args = getattr(model_runner, "server_args", None)
        max_bs = getattr(args, "cuda_graph_max_bs", None) or DEFAULT_MAX_BS
        super().__init__(model_runner, max_bs=max_bs)
        self.buckets = capture_sizes(self.max_bs)

    def compile_options(self, platform_options: dict[str, Any]) -> dict[str, Any]:
        if self.backend != "inductor":
            return platform_options
        return {**platform_options, "triton.cudagraphs": True, "graph_partition": True}

    def padded_rows(self, rows: int) -> int:
        return self.buckets[bisect.bisect_left(self.buckets, rows)]

    def capture_sizes(self) -> list[int]:
        return list(self.buckets)


def capture_sizes(max_bs: int) -> list[int]:
    """1, 2, 4, 8, then the multiples of 8, up to and including ``max_bs``."""
    sizes = [s for s in (1, 2, 4, 8) if s < max_bs] + list(range(16, max_bs, 8))
    return sorted({*sizes, max_bs})
