"""The decode step compiled with ``torch.compile`` (SGLang's ``--enable-torch-compile``), with
the platform's compile backend and options.

What is compiled is a decode step's whole model forward (embedding, every decoder layer, the
final norm, the LM head) except attention: each layer's attention calls the custom op
``sglang_launch::pool_attention`` (``attention_op``), opaque to the compiler, which runs the
batch's attention backend over the KV pool eagerly, as SGLang's piecewise graphs split at
attention. The compiler fuses what lies between (norms, rotary embedding, activations). A linear
layer already packed for oneDNN (``serving.srt.layers.linear``) stays one opaque call too.

Shapes (``CompiledDecodeStep``): a decode step of ``rows`` rows is one token per row. The graph
has its token dimension dynamic, so one compile serves every batch size from 2 to ``max_bs``
(``--torch-compile-max-bs``); a step of one row is padded to two (a padded row writes nothing to
the pool, attends to nothing and its logits are dropped). Steps of more rows than ``max_bs``, and
steps with prompt tokens (extend, mixed), run eager. A subclass may pad to fixed buckets instead
(``dynamic = False``), one graph each (``cuda_graph_runner``).

``capture()`` (start-up warm-up) runs a decode step of each captured batch size through the
model runner, logging each with its time; inductor's caches live under sglang-launch's cache
directory (``TORCHINDUCTOR_CACHE_DIR``, unless the environment sets it), so a later start of
the same model reuses its compiled kernels.

With inductor (the CPU platform's backend) the step is compiled ahead of time and saved whole
(``SavedStep``): dynamo's trace, its guards and inductor's code, in one file under
``<inductor cache>/decode-steps`` named by a key of everything the graph depends on. A later
start loads that file instead of tracing the model again. A file that cannot be loaded is
compiled afresh and replaced; a backend whose output cannot be saved, or a model dynamo
cannot trace whole, compiles at the first step as before.

The runner contract (``decode_runner``, SGLang's ``CudaGraphRunner`` shape): constructed with
the model runner; ``can_run(forward_batch)`` says whether it runs that forward;
``replay(forward_batch)`` returns the logits of its tokens as (tokens, 1, vocab).
"""

from __future__ import annotations

import logging
import os
import time
from typing import TYPE_CHECKING, Any

from serving.srt.layers.attention.hf_attention import COMPILED_DECODE
from serving.srt.layers.packed_op import (
    COMPILED_STEPS,
    LIVE_ROWS,
    RUNNING,
    packed_linear_op,
    packed_modules,
)
from serving.srt.model_executor.forward_batch_info import ForwardMode

if TYPE_CHECKING:
    import torch

    from serving.srt.model_executor.forward_batch_info import ForwardBatch

log = logging.getLogger("sglang_launch.compiled_step")

OP_NAMESPACE = "sglang_launch"
# The most rows the dynamic graph is compiled for (``--torch-compile-max-bs`` is capped to it).
ROWS_BOUND = 1024
# The forward running a compiled graph now and its layers by id: what the attention op reads.
_STEP: list[Any] = [None]
_REGISTERED: set[str] = set()


def attention_op() -> Any:
    """``torch.ops.sglang_launch.pool_attention(q, k, v, layer_id)``, registered once: the
    attention of layer ``layer_id`` over the pool for the forward ``CompiledDecodeStep`` runs
    (``q``: (tokens, heads, head_dim), rows past the forward's own tokens are padding, whose
    output is zeros). It writes the pool (``set_kv_buffer``), which is none of its arguments."""
    import torch

    if "attention" not in _REGISTERED:
        unsafe = getattr(torch.Tag, "cudagraph_unsafe", None)

        @torch.library.custom_op(
            f"{OP_NAMESPACE}::pool_attention",
            mutates_args=(),
            schema="(Tensor q, Tensor k, Tensor v, int layer_id) -> Tensor",
            tags=(unsafe,) if unsafe is not None else (),
        )
        def pool_attention(
            q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layer_id: int
        ) -> torch.Tensor:
            batch, layers = _STEP[0]
            rows = int(batch.out_cache_loc.shape[0])
            out: torch.Tensor = batch.attn_backend.forward(
                q[:rows], k[:rows], v[:rows], layers[layer_id], batch
            )
            if rows == q.shape[0]:
                return out
            full = q.new_zeros((q.shape[0], q.shape[1], out.shape[-1]))
            full[:rows] = out
            return full

        @pool_attention.register_fake
        def _(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layer_id: int) -> torch.Tensor:
            return q.new_empty((q.shape[0], q.shape[1], v.shape[-1]))

        _REGISTERED.add("attention")
    return torch.ops.sglang_launch.pool_attention


def inductor_cache_dir() -> str:
    """Where inductor keeps its caches: ``$TORCHINDUCTOR_CACHE_DIR`` when the environment sets it
    (to anything but inductor's own default, which inductor writes there itself once asked),
    else set here to ``<sglang-launch's cache>/inductor`` (``launchspec.gguf_cache.cache_root``)."""
    from torch._inductor.runtime.cache_dir_utils import default_cache_dir

    from launchspec.gguf_cache import cache_root

    current = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
    if current is None or os.path.abspath(current) == os.path.abspath(default_cache_dir()):
        current = os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(cache_root() / "inductor")
    return current


def _compile_options(platform: Any) -> dict[str, Any]:
    """The platform's ``get_compile_options()`` (a method of the diffusion contract an SRT
    platform may have too), {} without one."""
    method = getattr(platform, "get_compile_options", None)
    options = method() if callable(method) else None
    return dict(options or {})


class CompiledDecodeStep:
    """The compiled decode step (the module docstring). ``max_bs``: the most rows it runs."""

    dynamic = True  # one graph, its token dimension dynamic from ``min_rows`` to ``rows_bound``
    min_rows = 2  # a dynamic dimension of size 1 would be specialised: one row is padded
    rows_bound = ROWS_BOUND

    def __init__(self, model_runner: Any, max_bs: int = 32) -> None:
        import torch

        self.model_runner = model_runner
        platform = model_runner.platform
        running = model_runner.memory.req_to_token_pool.size
        self.max_bs = max(1, min(int(max_bs), int(running), ROWS_BOUND))
        self.backend = str(platform.get_compile_backend())
        self.options = self.compile_options(_compile_options(platform))
        self.cache_dir = inductor_cache_dir()
        attention_op()
        packed_linear_op()  # registered before any trace: registering inside one breaks it
        self.layers: dict[int, Any] = {}  # filled by the first replay (after the eager warm-up)
        self._no_mask = torch.ones((1, 1, 1, 1), dtype=torch.bool, device=model_runner.device)
        self._keep: dict[str, Any] = {"logits_to_keep": 0} if model_runner._logits_to_keep else {}
        self._compiled: Any = torch.compile(
            self._forward,
            backend=self.backend,
            options=self.options or None,
            dynamic=False if not self.dynamic else None,
        )
        self.compile_seconds: dict[int, float] = {}
        # How this start got its graph: "loaded" (a saved step), "saved" (compiled ahead of
        # time and saved now) or "traced" (compiled at the first step, not saved).
        self.origin = "traced"
        self.saved_path: str | None = None  # the saved step's file, when there is one

    def compile_options(self, platform_options: dict[str, Any]) -> dict[str, Any]:
        """The options ``torch.compile`` gets (a subclass adds its own)."""
        return platform_options

    # ---- the runner contract -------------------------------------------------------------

    def can_run(self, forward_batch: ForwardBatch) -> bool:
        """A decode forward of at most ``max_bs`` rows."""
        return (
            forward_batch.forward_mode == ForwardMode.DECODE
            and forward_batch.decode_rows <= self.max_bs
            and forward_batch.input_ids is not None
        )

    def padded_rows(self, rows: int) -> int:
        """The rows a forward of ``rows`` rows runs as."""
        return max(rows, self.min_rows)

    def replay(self, forward_batch: ForwardBatch) -> torch.Tensor:
        """The logits of ``forward_batch``'s rows, (rows, 1, vocab)."""
        import torch

        ids, positions = forward_batch.input_ids, forward_batch.positions
        assert ids is not None
        rows = int(ids.shape[0])
        pad = self.padded_rows(rows) - rows
        if pad:
            zeros = torch.zeros(pad, dtype=ids.dtype, device=ids.device)
            ids, positions = torch.cat([ids, zeros]), torch.cat([positions, zeros])
        ids, positions = ids[None, :], positions[None, :]
        if self.dynamic:  # one bound whatever --torch-compile-max-bs is, so the graph and its
            # cache entry are the same for every start (an entry cached for 16 rows was reused,
            # with its guard, by a start asking for 32, which then failed)
            torch._dynamo.mark_dynamic(ids, 1, min=self.min_rows, max=self.rows_bound)
            torch._dynamo.mark_dynamic(positions, 1, min=self.min_rows, max=self.rows_bound)
        if not self.layers:
            self.layers = _radix_layers(self.model_runner.model)
        _STEP[0] = (forward_batch, self.layers)
        LIVE_ROWS[0] = rows
        RUNNING[0] = packed_modules(self.model_runner.model)
        COMPILED_STEPS[0] += 1
        try:
            logits: torch.Tensor = self._compiled(ids, positions)
        finally:
            _STEP[0] = LIVE_ROWS[0] = RUNNING[0] = None
        return logits[0, :rows, None, :]

    def _forward(self, ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        out = self.model_runner.model(
            input_ids=ids,
            position_ids=positions,
            attention_mask=self._no_mask,
            use_cache=False,
            forward_batch=COMPILED_DECODE,
            **self._keep,
        )
        logits: torch.Tensor = out.logits
        return logits

    # ---- start-up ------------------------------------------------------------------------

    def capture_sizes(self) -> list[int]:
        """The batch sizes ``capture`` runs: the smallest and the largest (one dynamic graph)."""
        return sorted({1, self.max_bs})

    def capture(self) -> None:
        """Run a decode step of each ``capture_sizes()`` batch size through the model runner
        (which compiles what is not compiled yet), logging each with its time; the KV memory is
        left empty."""
        from serving.srt.sampling import Sequence
        from serving.wire import SamplingParams

        runner = self.model_runner
        params = SamplingParams(max_new_tokens=2, temperature=0.0, ignore_eos=True)
        prompt = runner.encode_prompt("warm-up", 2)
        log.info(
            "compiling the decode step (backend %r, options %s) for 1..%d rows; inductor's "
            "cache: %s",
            self.backend,
            self.options,
            self.max_bs,
            self.cache_dir,
        )
        if self.dynamic and self.backend == "inductor":
            self._use_saved_step()
        for size in self.capture_sizes():
            started = time.monotonic()
            seqs = [Sequence(f"capture-{size}-{i}", prompt, params, seed=0) for i in range(size)]
            runner.run_to_end(seqs)
            self.compile_seconds[size] = seconds = time.monotonic() - started
            done = "run" if self.origin == "loaded" else "compiled and run"
            log.info("decode step of %d rows %s in %.1f s", size, done, seconds)
        runner.memory.reset()
        runner.memory.prompt_tokens_total = runner.memory.cached_tokens_total = 0
        _stop_compile_workers()

    def _use_saved_step(self) -> None:
        """Load this model's saved step, or compile it ahead of time and save it; on a failure
        to do either the step compiles at its first run, as a backend that cannot save does."""
        from serving.srt.model_executor.saved_step import SavedStep

        saved = SavedStep(self)
        started = time.monotonic()
        function = saved.load()
        if function is not None:
            self.origin = "loaded"
            log.info(
                "loaded the compiled decode step from %s in %.1f s",
                saved.path,
                time.monotonic() - started,
            )
        else:
            function = saved.compile_and_save()
            if function is None:
                return  # no file: ``saved_path`` stays None
            self.origin = "saved"
            log.info(
                "compiled the decode step ahead of time in %.1f s; saved to %s",
                time.monotonic() - started,
                saved.path,
            )

        self.saved_path = str(saved.path)

        def compiled(ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
            return function(self, ids, positions)  # type: ignore[no-any-return]

        self._compiled = compiled


def _stop_compile_workers() -> None:
    """Stop inductor's compile worker processes, which start-up is done with: left running, one
    keeps a core busy and every later step runs many times slower on a small machine."""
    try:
        from torch._inductor.async_compile import shutdown_compile_workers
    except ImportError:
        return
    shutdown_compile_workers()


def _radix_layers(model: Any) -> dict[int, Any]:
    """Each attention module's ``RadixAttention`` by layer id (made by the eager warm-up)."""
    layers = {}
    for module in model.modules():
        layer = module.__dict__.get("_radix_attention")
        if layer is not None:
            layers[layer.layer_id] = layer
    return layers
