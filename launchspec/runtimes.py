"""What serving each runtime takes: the launcher's fields of the one runtime table.

``platforms.runtimes`` describes each runtime's platform selection and plugin loading; this
module extends each of its records, keyed by the same name, with what a launch of that runtime
needs: the worker target started once per rank, the check that turns ``--model-path`` into a
served model, the API routes the HTTP child adds, and which kinds of parallelism a replica
supports. The launcher is the composition root:
it names the serving runtime's functions by dotted path and never imports them; the bootstrap and
the HTTP child resolve them where they run. Adding a runtime is a record here and one in
``platforms.runtimes``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

from launchspec.model_source import ModelSource, resolve_model, resolve_pipeline
from platforms.runtimes import DIFFUSION, RUNTIMES, SRT, RuntimeSpec


class ServingSpec(NamedTuple):
    """One runtime's serving: its ``platform`` record and the launcher's fields.

    - ``worker_target``: the default ``--scheduler-target`` ("module.function", one per rank);
    - ``model_check(model_path, served_model_name) -> ModelSource``: standard library only, run
      by ``ServerArgs.check_server_args`` before any worker starts and by the HTTP child; raises
      ``ValueError`` saying what is wrong with the path;
    - ``api_routes``: "module:function(kit)" returning the routes the HTTP child adds for this
      runtime (None: the text routes only);
    - ``tensor_parallel``: a replica may span several ranks (``--tp-size`` > 1);
    - ``cfg_parallel``: ``--enable-cfg-parallel`` applies (two ranks split classifier-free
      guidance).
    """

    platform: RuntimeSpec
    worker_target: str
    model_check: Callable[[str | None, str | None], ModelSource]
    api_routes: str | None
    tensor_parallel: bool
    cfg_parallel: bool

    @property
    def name(self) -> str:
        return self.platform.name


SERVING: dict[str, ServingSpec] = {
    SRT.name: ServingSpec(
        platform=SRT,
        worker_target="serving.srt.scheduler.run_scheduler_process",
        model_check=resolve_model,
        api_routes=None,
        tensor_parallel=True,
        cfg_parallel=False,
    ),
    DIFFUSION.name: ServingSpec(
        platform=DIFFUSION,
        worker_target="serving.diffusion.scheduler.run_scheduler_process",
        model_check=resolve_pipeline,
        api_routes="serving.http.images:add_image_routes",
        tensor_parallel=False,
        cfg_parallel=True,
    ),
}

if set(SERVING) != set(RUNTIMES):  # a runtime added to one table and not the other
    raise RuntimeError(
        f"launchspec.runtimes serves {sorted(SERVING)} but platforms.runtimes has "
        f"{sorted(RUNTIMES)}; give every runtime a record in both"
    )


def serving_spec(name: str) -> ServingSpec:
    """The ``ServingSpec`` of runtime ``name``; ``ValueError`` names the known runtimes."""
    try:
        return SERVING[name]
    except KeyError:
        raise ValueError(
            f"unknown runtime {name!r}; known runtimes: {', '.join(SERVING)}"
        ) from None
