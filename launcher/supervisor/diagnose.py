"""Root causes built from what the supervisor saw go wrong.

Each function turns one kind of failure into the ``RootCause`` (``launchspec.causes``)
an operator acts on: which worker, in which phase, how its process ended, the worker's own report
when it sent one, and what to do. The supervisor decides which failure is the root cause (the
first); these only say what it was. (The records live apart, in ``causes``, because the embedded
``Launcher``'s lazy facade imports them and must not import ``bootstrap``.)
"""

from __future__ import annotations

import signal
from typing import TYPE_CHECKING

from bootstrap import phases
from bootstrap.children import describe_exit
from bootstrap.phases import signal_name
from launchspec.causes import SETUP_FAILURE, UNHEALTHY, ExitCode, RootCause

if TYPE_CHECKING:
    from bootstrap.messages import Failed
    from launcher.supervisor.state import WorkerState


def exited(worker: WorkerState, code: int | None, server_ready: bool = True) -> RootCause:
    """``worker``'s process ended with ``code`` and sent no failure report; ``server_ready``:
    every worker had reported ready by then (a worker that reported ready and died while others
    were still starting is said to have done so)."""
    after_ready = worker.ready
    phase = phases.SERVING if after_ready else phase_in_progress(worker.phase)
    how = describe_exit(code)
    if after_ready and not server_ready:
        summary = f"{worker.name} {how} after it reported ready, while other workers were starting"
    elif after_ready:
        summary = f"{worker.name} {how} after the server was ready"
    else:
        summary = f"{worker.name} {how} while {phases.DOING.get(phase, phase)}"
    return RootCause(
        summary=summary,
        exit_code=ExitCode.WORKER_DIED if after_ready else ExitCode.WORKER_FAILED,
        worker=worker.name,
        pid=worker.pid,
        node_rank=worker.node_rank,
        phase=phase,
        exitcode=code,
        signal=signal_name(code),
        message=(
            f"the worker sent no error report (the last phase it reported: {worker.phase}); "
            "its own output above may say more"
        ),
        hint=_exit_hint(code),
    )


def failed(worker: WorkerState, report: Failed, code: int | None) -> RootCause:
    """``worker`` sent the failure ``report``; its process ended with ``code`` (None: not yet).

    A ``launchspec.causes.SetupFailure`` raised before ready (a class the platform returned that
    the worker cannot use) is a set-up failure, exit 5, whose summary says so. A
    ``launchspec.causes.WorkerUnhealthy`` (a scheduler whose steps kept failing) carries its
    message in the summary, which names the plugin's hook to blame when there is one."""
    after_ready = report.phase in (phases.SERVING, phases.STOPPING)
    doing = phases.DOING.get(report.phase, report.phase)
    summary = f"{worker.name} failed while {doing}"
    exit_code = ExitCode.WORKER_DIED if after_ready else ExitCode.WORKER_FAILED
    hint = None
    if SETUP_FAILURE in report.exc_types and not after_ready:
        summary = f"{worker.name} cannot use what the platform provides (while {doing})"
        exit_code = ExitCode.SETUP_FAILED
        hint = (
            "fix the platform plugin's method named above (it must return SGLang's class or a "
            "subclass that constructs with SGLang's parameters), or select another platform "
            "with SGLANG_PLATFORM"
        )
    elif UNHEALTHY in report.exc_types:
        summary = f"{worker.name} is unhealthy: {report.message}"
        hint = (
            "fix or remove the plugin hook named above (a plugin leaves with SGLANG_PLUGINS "
            "naming only the others), or look at the model's error in the traceback; with "
            "--restart-policy on-failure the replica restarts, up to --max-restarts"
        )
    return RootCause(
        summary=summary,
        exit_code=exit_code,
        worker=worker.name,
        pid=worker.pid,
        node_rank=worker.node_rank,
        phase=report.phase,
        # A report sent while the worker goes on running (``alive``) says nothing of its exit.
        exitcode=code if code is not None or report.alive else report.exit_code,
        signal=signal_name(code),
        error_type=report.exc_type,
        message=report.message,
        traceback=report.traceback,
        hint=hint,
    )


def wrong_platform(worker: WorkerState, platform: str, selected: str) -> RootCause:
    """``worker`` selected ``platform`` where the supervisor selected ``selected``."""
    return RootCause(
        summary=f"{worker.name} selected platform {platform!r}, the launcher selected {selected!r}",
        worker=worker.name,
        pid=worker.pid,
        node_rank=worker.node_rank,
        phase=phases.READY,
        hint="the launcher and its workers must see the same installed plugins and SGLANG_* variables",
    )


def startup_timeout(waiting: list[WorkerState], total: int, timeout: float) -> RootCause:
    """``waiting`` (of ``total`` workers) were not ready within ``timeout`` seconds."""
    first = waiting[0]
    phase = phase_in_progress(first.phase)
    return RootCause(
        summary=f"start-up did not finish within {timeout:g}s",
        exit_code=ExitCode.STARTUP_TIMEOUT,
        worker=first.name,
        pid=first.pid,
        node_rank=first.node_rank,
        phase=phase,
        error_type="StartupTimeout",
        message=f"{len(waiting)} of {total} workers not ready: {_where(waiting)}",
        hint=f"raise --startup-timeout if {phase} is just slow, or look at why {first.name} hangs there",
    )


def hung(worker: WorkerState, quiet: float, timeout: float) -> RootCause:
    """``worker`` sent no heartbeat for ``quiet`` seconds (``--watchdog-timeout`` ``timeout``)."""
    return RootCause(
        summary=f"{worker.name} stopped answering: no heartbeat for {quiet:.1f}s after the server was ready",
        exit_code=ExitCode.WORKER_DIED,
        worker=worker.name,
        pid=worker.pid,
        node_rank=worker.node_rank,
        phase=phases.SERVING,
        error_type="WatchdogTimeout",
        message=f"--watchdog-timeout is {timeout:g}s; the process is alive but silent",
        hint="a stopped process (SIGSTOP, a debugger) or one hung holding the GIL; raise "
        "--watchdog-timeout if a worker can legitimately stall longer",
    )


def stuck(worker: WorkerState, busy: float, timeout: float) -> RootCause:
    """``worker``'s step has run ``busy`` seconds, past ``--watchdog-timeout`` ``timeout``."""
    return RootCause(
        summary=f"{worker.name}'s step has run for {busy:.1f}s, past --watchdog-timeout "
        f"{timeout:g}s",
        exit_code=ExitCode.WORKER_DIED,
        worker=worker.name,
        pid=worker.pid,
        node_rank=worker.node_rank,
        phase=phases.SERVING,
        error_type="WatchdogTimeout",
        message="the process is alive and sends heartbeats, but its step (get_next_batch_to_run, "
        "run_batch, process_batch_result and what they call) has not returned",
        hint="a step stuck in a plugin's hook or in the model: look at the hooks "
        "`sglang-launch plugins` lists on the scheduler's seams; raise --watchdog-timeout if a "
        "step can legitimately run longer",
    )


def restart_timeout(replica: str, waiting: list[WorkerState], timeout: float) -> RootCause:
    """The restarted ``replica``'s ranks ``waiting`` were not ready within ``timeout`` seconds."""
    first = waiting[0]
    return RootCause(
        summary=f"{replica} did not become ready again within {timeout:g}s of its restart",
        exit_code=ExitCode.WORKER_DIED,
        worker=first.name,
        pid=first.pid,
        node_rank=first.node_rank,
        phase=phase_in_progress(first.phase),
        error_type="StartupTimeout",
        message=_where(waiting),
        hint="raise --startup-timeout if a restart is just slow",
    )


def restart_impossible(replica: str, after: RootCause, error: BaseException) -> RootCause:
    """Restarting ``replica`` after the failure ``after`` raised ``error``."""
    return RootCause(
        summary=f"{replica} could not be restarted after: {after.summary}",
        exit_code=ExitCode.WORKER_DIED,
        error_type=type(error).__name__,
        message=str(error),
    )


def join_timeout(replica: str, waiting: list[WorkerState], timeout: float) -> RootCause:
    """The ranks ``waiting`` of ``replica``, started by a reload or a scale, were not ready
    within ``timeout`` seconds (or the replica did not answer its probe by then)."""
    first = waiting[0] if waiting else None
    return RootCause(
        summary=f"{replica} was not serving within {timeout:g}s of its start"
        + ("" if waiting else " (it did not answer its probe request)"),
        exit_code=ExitCode.STARTUP_TIMEOUT,
        worker=first.name if first else None,
        pid=first.pid if first else None,
        node_rank=first.node_rank if first else 0,
        phase=phase_in_progress(first.phase) if first else phases.READY,
        error_type="StartupTimeout",
        message=_where(waiting) if waiting else None,
        hint="raise --startup-timeout if loading the model is just slow",
    )


def probe_failed(replica: str, error: str) -> RootCause:
    """``replica``, started by a reload or a scale, was ready but failed its probe request."""
    return RootCause(
        summary=f"{replica} failed its probe request: {error}",
        exit_code=ExitCode.WORKER_FAILED,
        phase=phases.READY,
        error_type="ProbeFailed",
        message=error,
        hint="the model loaded but cannot answer a request; look at the replica's output above",
    )


def spawn_failed(replica: str, error: BaseException) -> RootCause:
    """Starting a process of ``replica`` (for a reload or a scale) raised ``error``."""
    return RootCause(
        summary=f"{replica} could not be started",
        exit_code=ExitCode.WORKER_FAILED,
        error_type=type(error).__name__,
        message=str(error),
    )


def phase_in_progress(last: str) -> str:
    """The bootstrap phase a worker was working towards, given the last one it reported."""
    if last in phases.PHASES[:-1]:
        return phases.PHASES[phases.PHASES.index(last) + 1]
    if last == phases.READY:
        return phases.SERVING
    if last == "starting":
        return phases.SPAWNED
    return phases.READY  # a worker's own phase (e.g. model_loaded): still on its way to ready


def _where(waiting: list[WorkerState]) -> str:
    return ", ".join(f"{w.name} in {phase_in_progress(w.phase)}" for w in waiting)


def _exit_hint(code: int | None) -> str | None:
    if code == -signal.SIGKILL:
        return "SIGKILL from outside is often the kernel's OOM killer: check `dmesg` and the memory in use"
    if code == 0:
        return "a worker target must keep running until ctx.stopping is set"
    return None
