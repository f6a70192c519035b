"""General-plugin callbacks of the demo package: one harmless, observable hook per runtime.

Each registers an AFTER hook on ``launchspec.server_args.ServerArgs.__post_init__`` that changes
nothing: it appends ``"<runtime> <pid>"`` to ``CALLS`` and, when ``DEMO_PLATFORM_HOOK_LOG`` names
a file, appends the line ``post_init <runtime> <pid>`` to it. The diffusion callback also puts a
BEFORE hook on the diffusion worker's device-and-model set-up
(``serving.diffusion.model_runner.DiffusionModelRunner.init_device_and_model``, the spec's
``GPUWorker.init_device_and_model()``), the place for rank-aware set-up: it appends
``init_device_and_model <pid> <local_rank>`` to the log. ``DEMO_PLATFORM_FAIL_HOOKS=1`` makes
the callbacks raise instead (to exercise plugin-failure handling).
"""

import os

TARGET = "launchspec.server_args.ServerArgs.__post_init__"

CALLS: list = []

WORKER_SETUP = "serving.diffusion.model_runner.DiffusionModelRunner.init_device_and_model"


def _before_worker_setup(worker, *args, **kwargs):
    log = os.environ.get("DEMO_PLATFORM_HOOK_LOG")
    if log:
        with open(log, "a", encoding="utf-8") as f:
            f.write(f"init_device_and_model {os.getpid()} {worker.local_rank}\n")


def _observer(runtime: str):
    def after_post_init(result, *args, **kwargs):
        CALLS.append(f"{runtime} {os.getpid()}")
        log = os.environ.get("DEMO_PLATFORM_HOOK_LOG")
        if log:
            with open(log, "a", encoding="utf-8") as f:
                f.write(f"post_init {runtime} {os.getpid()}\n")
        return None  # keep the original result

    return after_post_init


def _check_failure_switch() -> None:
    if os.environ.get("DEMO_PLATFORM_FAIL_HOOKS", "").strip() == "1":
        raise RuntimeError("demo plugin: DEMO_PLATFORM_FAIL_HOOKS=1")


def register() -> None:
    """``sglang.srt.plugins`` callback."""
    _check_failure_switch()
    from hooks.hook_registry import HookRegistry, HookType

    HookRegistry.register(TARGET, _observer("srt"), HookType.AFTER)


def register_diffusion() -> None:
    """``sglang.multimodal_gen.plugins`` callback."""
    _check_failure_switch()
    from hooks.diffusion import HookRegistry, HookType

    HookRegistry.register(TARGET, _observer("diffusion"), HookType.AFTER)
    HookRegistry.register(WORKER_SETUP, _before_worker_setup, HookType.BEFORE)
