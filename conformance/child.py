"""``run_checks``: the worker target of the check process, called by ``bootstrap.run``.

By the time it runs, the bootstrap has selected the platform exactly as a launch would (the
same environment; nothing is pinned), run its ``init_backend()`` through
``initialize_current_platform()``, loaded the runtime's general plugins and applied their hooks.
It runs every check of the runtime in catalog order, journals each row as it goes (see
``journal``), reports ``ready`` with the number of rows, and then waits for the parent's stop
request, as every worker must.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .catalog import checks_for
from .journal import Journal
from .probe import Probe, evaluate

if TYPE_CHECKING:
    from bootstrap import WorkerContext
    from launchspec.server_args import ServerArgs


def run_checks(server_args: ServerArgs, ctx: WorkerContext, group: str | None = None) -> None:
    """Run the conformance checks of ``server_args.runtime`` (those of ``group`` only, when
    given) into ``ctx.runtime_dir``'s journal."""
    runtime = server_args.runtime
    journal = Journal(ctx.runtime_dir)
    try:
        probe = Probe(runtime, ctx.runtime_dir)
        sel, platform = probe.selection, probe.platform
        journal.platform(
            runtime=runtime,
            key=sel.key,
            qualname=sel.qualname,
            entry_point=sel.entry_point.describe() if sel.entry_point else None,
            distribution=sel.distribution,
            reason=sel.reason,
            device_name=str(getattr(platform, "device_name", "")),
            device_type=str(getattr(platform, "device_type", "")),
        )
        checks = [c for c in checks_for(runtime) if group is None or c.group == group]
        for check in checks:
            journal.begin(check.id)
            journal.row(evaluate(check, probe))
    finally:
        journal.close()
    ctx.ready(checks=len(checks))
    ctx.stopping.wait()


def run_selection_checks(server_args: ServerArgs, ctx: WorkerContext) -> None:
    """The selection checks alone (the parent runs them in a process without general plugins
    where the first check process stopped after selecting its platform)."""
    run_checks(server_args, ctx, group="selection")
