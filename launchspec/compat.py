"""SGLang's module paths and hook targets, and what they are here: the alias table.

``hooks.compat`` installs the table (the launcher's process before its plugins load, every
child from its ``ProcessSpec``), so a plugin written to SGLang's plugin documentation runs
unchanged where the real ``sglang`` is not installed. The table is data of the shared floor: the
launcher installs it and hands it to every child, check-platform does the same, and the names on
the right are this project's modules, the serving runtime's included, named by string and never
imported here.

Keep the three tables and ``TARGETS`` in step with docs/plugins.md ("SGLang's names"), which
tests check against them.
"""

from __future__ import annotations

from hooks.compat import AliasTable

# SGLang module (and every module below it) -> this project's module.
MODULES = {
    # The platform contract and selection, both runtimes.
    "sglang.srt.platforms": "platforms",
    "sglang.multimodal_gen.runtime.platforms": "platforms.diffusion",
    # General plugins and their hook registries.
    "sglang.srt.plugins": "hooks",
    "sglang.multimodal_gen.runtime.platforms.plugins": "hooks.diffusion",
    # The diffusion section's custom-op and layer modules.
    "sglang.multimodal_gen.runtime.layers.custom_op": "platforms.custom_op",
    "sglang.multimodal_gen.runtime.layers.layernorm": "platforms.diffusion.layers",
    # The modules of the documented hook targets.
    "sglang.srt.server_args": "launchspec.server_args",
    "sglang.srt.managers.scheduler": "serving.srt.scheduler",
    "sglang.srt.managers.tp_worker": "serving.srt.model_runner",
    "sglang.multimodal_gen.runtime.managers.scheduler": "serving.diffusion.scheduler",
    "sglang.multimodal_gen.runtime.managers.gpu_worker": "serving.diffusion.model_runner",
    # The KV memory classes a platform returns by SGLang's names (get_mha_kv_pool_cls, ...):
    # memory_pool, allocator, radix_cache.
    "sglang.srt.mem_cache": "serving.srt.mem_cache",
    # What one forward works on (an attention backend reads it).
    "sglang.srt.model_executor.forward_batch_info": "serving.srt.model_executor.forward_batch_info",
    # The graph runner a CUDA platform's get_graph_runner_cls() returns (a vendor may subclass it).
    "sglang.srt.model_executor.cuda_graph_runner": "serving.srt.model_executor.cuda_graph_runner",
    # Out-of-tree model classes (import-light: plugin callbacks call it in the launcher too).
    "sglang.srt.models.registry": "launchspec.model_registry",
    # Constrained decoding: the grammar backend a plugin replaces or wraps.
    "sglang.srt.constrained": "serving.srt.constrained",
}

# SGLang names this project spells otherwise, where the meaning matches.
NAMES = {
    "sglang.srt.managers.tp_worker.TpModelWorker": "serving.srt.model_runner.ModelRunner",
    "sglang.srt.managers.tp_worker.TpModelWorker.forward_batch_generation": (
        "serving.srt.model_runner.ModelRunner.generate"
    ),
    "sglang.srt.managers.tp_worker.TpModelWorker.forward_batch_embedding": (
        "serving.srt.model_runner.ModelRunner.embed_matrix"
    ),
    "sglang.multimodal_gen.runtime.managers.scheduler.Scheduler": (
        "serving.diffusion.scheduler.DiffusionScheduler"
    ),
    "sglang.multimodal_gen.runtime.managers.gpu_worker.GPUWorker": (
        "serving.diffusion.model_runner.DiffusionModelRunner"
    ),
}

# SGLang hook targets with no equivalent here -> the nearest target this project has.
ABSENT: dict[str, str] = {}

# This project's documented hook targets (docs/plugins.md and docs/diffusion.md), the
# candidates when an SGLang target matches nothing.
TARGETS = (
    "launchspec.server_args.ServerArgs.add_cli_args",
    "launchspec.server_args.ServerArgs.__post_init__",
    "launchspec.server_args.ServerArgs.check_server_args",
    "launchspec.server_args.ServerArgs.from_cli_args",
    "serving.srt.scheduler.run_scheduler_process",
    "serving.srt.scheduler.Scheduler.__init__",
    "serving.srt.scheduler.Scheduler.get_next_batch_to_run",
    "serving.srt.scheduler.Scheduler.run_batch",
    "serving.srt.scheduler.Scheduler.process_batch_result",
    "serving.srt.model_runner.ModelRunner.__init__",
    "serving.srt.model_runner.ModelRunner.generate",
    "serving.srt.model_runner.ModelRunner.embed_matrix",
    "serving.srt.constrained.base_grammar_backend.create_grammar_backend",
    "serving.http.server.run_http_server",
    "serving.http.server.build_app",
    "serving.diffusion.model_runner.DiffusionModelRunner.init_device_and_model",
    "serving.diffusion.model_runner.DiffusionModelRunner.load_pipeline",
    "serving.diffusion.model_runner.DiffusionModelRunner.denoise",
    "serving.diffusion.model_runner.DiffusionModelRunner.generate",
    "serving.diffusion.scheduler.run_scheduler_process",
    "serving.diffusion.scheduler.DiffusionScheduler.get_next_batch_to_run",
    "serving.diffusion.scheduler.DiffusionScheduler.run_batch",
    "serving.diffusion.scheduler.DiffusionScheduler.process_batch_result",
    "serving.diffusion.scheduler.DiffusionScheduler.admit",
)

# The SGLang release whose plugin surface (plugin-system.mdx) these tables provide: the aliased
# ``sglang`` package's ``__version__``.
SGLANG_VERSION = "0.5.23"

TABLE = AliasTable(
    modules=MODULES, names=NAMES, absent=ABSENT, known=TARGETS, version=SGLANG_VERSION
)
