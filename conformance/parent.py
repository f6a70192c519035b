"""Run the checks in a spawned child through the same bootstrap as workers, and collect them.

``run_child(runtime, timeout)`` makes a private directory (mode 0700) and starts one bootstrap
child there whose target is ``child.run_checks``, through ``bootstrap.children``, the mechanism
the supervisor starts and watches its workers with (the same status socket, sentinel, settle
wait and process-tree stop). Nothing is pinned: the child selects its platform from the same
environment a launch reads, so this process never imports torch (built-in probing would). It
waits for ``ready`` or the child's exit under one deadline; on ``ready`` it stops the child
(SIGTERM, then SIGKILL after a grace period), and whatever happens it leaves no process behind.
The child's stdout is pointed at this process's stderr, so a plugin that prints cannot corrupt
``--json`` output.
"""

from __future__ import annotations

import asyncio
import shutil
import tempfile
from dataclasses import dataclass
from typing import TYPE_CHECKING, NamedTuple

from . import journal

if TYPE_CHECKING:
    from bootstrap import ProcessSpec
    from bootstrap.children import Child

TARGET = "conformance.child:run_checks"
# Run where the first check process stopped after selecting its platform (a required plugin
# failed to load, say): the selection checks alone, in a process that loads no general plugin.
SELECTION_TARGET = "conformance.child:run_selection_checks"
_STOP_GRACE_S = 10.0  # for the child to wind down after SIGTERM (once ready) before it is killed
_FAILED_GRACE_S = 2.0  # for a child that timed out before ready


class SetupError(RuntimeError):
    """This process could not prepare or start the check process; the message names the fix."""


@dataclass
class _CheckArgs:
    """The check process's ServerArgs payload: only the runtime (every other field keeps its
    default in the child, where the bootstrap decodes it into the real ServerArgs class)."""

    runtime: str


class ChildResult(NamedTuple):
    """How the check process went: its journal, the last bootstrap phase it reported
    (``"starting"`` if none), its ``failed`` report (``bootstrap.messages`` as a dict) if any,
    its exit code (negative: killed by that signal), and whether it finished or timed out.
    ``selection``: where the process stopped after it had selected its platform and before the
    checks ran, the journal of a second process that ran the selection checks without general
    plugins (None otherwise)."""

    journal: journal.Reading
    reached: str
    failure: dict | None
    exitcode: int | None
    ready: bool
    timed_out: bool
    timeout: float
    selection: journal.Reading | None = None


class _Status:
    """What the check process reported, and an event set when it is ready or gone."""

    def __init__(self) -> None:
        self.reached = "starting"
        self.failure: dict | None = None
        self.ready = False
        self.changed = asyncio.Event()

    def take(self, _child: Child, message: object) -> None:
        from bootstrap import messages

        if isinstance(message, messages.Phase):
            self.reached = message.phase
        elif isinstance(message, messages.Ready):
            self.ready = True
            self.changed.set()
        elif isinstance(message, messages.Failed):
            self.failure = messages.to_dict(message)

    def exited(self, _child: Child) -> None:
        self.changed.set()


async def _watch(
    spec: ProcessSpec, endpoint: str, timeout: float, status: _Status
) -> tuple[Child, bool]:
    """Start the check process, wait for ready or its exit, stop it; its ``Child`` and whether
    it timed out."""
    import zmq
    import zmq.asyncio

    from bootstrap.children import Children

    context = zmq.asyncio.Context()
    try:
        try:
            children = Children(context, endpoint, status.take, status.exited)
        except zmq.ZMQError as exc:
            raise SetupError(
                f"cannot listen on {endpoint}: {exc}; set TMPDIR to a short, writable directory"
            ) from exc
        child = children.add(spec)
        timed_out = False
        try:
            children.spawn(child, output=2, streams=(1,))  # prints go to stderr, never to --json
            try:
                await asyncio.wait_for(status.changed.wait(), timeout)
            except TimeoutError:
                timed_out = True
            # A worker runs until asked to stop: once ready the checks are done.
            await children.stop([child], _STOP_GRACE_S if status.ready else _FAILED_GRACE_S)
            if not timed_out:
                await children.settle(child)
        finally:
            children.close()
        return child, timed_out
    finally:
        context.destroy(linger=0)


def run_child(runtime: str, timeout: float) -> ChildResult:
    """Run the checks of ``runtime`` in a spawned bootstrap child; never leaves it running.

    Where that child stopped after selecting its platform but before any check ran (a plugin
    of the platform's distribution failed to load or apply, say), the selection checks run again
    in a second child that loads no general plugin, so the report still says what was selected.
    """
    import time

    started = time.monotonic()
    result = _run(runtime, timeout, TARGET)
    if _selected_then_stopped(result):
        left = timeout - (time.monotonic() - started)
        if left > 0:
            again = _run(runtime, left, SELECTION_TARGET, _without_plugins())
            if again.journal.platform is not None:
                result = result._replace(selection=again.journal)
    return result


def _selected_then_stopped(result: ChildResult) -> bool:
    from bootstrap.phases import PHASES, PLATFORM_INITIALIZED

    return (
        not result.ready
        and result.journal.platform is None
        and result.reached in PHASES
        and PHASES.index(result.reached) >= PHASES.index(PLATFORM_INITIALIZED)
    )


def _without_plugins() -> tuple[tuple[str, str, str, str | None], ...]:
    """This process's entry-point table without the general plugins' groups (the platform
    groups unchanged, so the second child selects exactly as the first did)."""
    from platforms import entrypoints

    return tuple(row for row in entrypoints.snapshot() if not row[0].endswith(".plugins"))


def _run(
    runtime: str,
    timeout: float,
    target: str,
    entry_points: tuple[tuple[str, str, str, str | None], ...] | None = None,
) -> ChildResult:
    import bootstrap
    from launchspec.compat import TABLE
    from launchspec.server_args import ARGS_CLASS

    try:
        workdir = tempfile.mkdtemp(prefix="sglang-check-")
    except OSError as exc:
        raise SetupError(
            f"cannot create a private directory for the check process: {exc}; set TMPDIR to a "
            "writable directory"
        ) from exc
    status = _Status()
    try:
        endpoint = f"ipc://{workdir}/status"
        spec = bootstrap.ProcessSpec(
            role="check",
            target=target,
            payload=bootstrap.encode_payload(_CheckArgs(runtime)),
            args_class=ARGS_CLASS,
            aliases=TABLE.to_dict(),
            status_endpoint=endpoint,
            runtime=runtime,
            platform_key=None,  # select in the child, from the same environment a launch reads,
            serving_fallback=True,  # and by the same rule a launch follows
            runtime_dir=workdir,
            log_level="warning",
            entry_points=entry_points,
        )
        child, timed_out = asyncio.run(_watch(spec, endpoint, timeout, status))
        reading = journal.read(workdir)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    return ChildResult(
        journal=reading,
        reached=status.reached,
        failure=status.failure,
        exitcode=child.exitcode,
        ready=status.ready,
        timed_out=timed_out and not status.ready,
        timeout=timeout,
    )
