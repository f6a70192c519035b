"""Why a launch ended badly: the root cause, the exit codes, and ``LaunchError``.

A launch has exactly one root cause, the first thing that went wrong; everything that fails after
it (ranks timing out on a dead peer, the HTTP child losing its scheduler) is a consequence and is
not reported as a cause. ``RootCause.format()`` renders it as one block that names the worker, the
phase, how the process ended (exit code or signal name) and the worker's own traceback.

Standard library only: ``launcher.LaunchError`` is part of the lazy facade.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from enum import IntEnum


class ExitCode(IntEnum):
    """Exit status of ``sglang-launch`` (serving); listed in ``sglang-launch --help``."""

    OK = 0  # stopped on request (SIGINT, SIGTERM, Launcher.stop())
    WORKER_FAILED = 1  # a worker failed or exited during start-up
    USAGE = 2  # invalid command line or server arguments
    STARTUP_TIMEOUT = 3  # not every worker was ready within --startup-timeout
    WORKER_DIED = 4  # a worker exited after the server was ready
    SETUP_FAILED = 5  # no platform, a required plugin, IPC, or a platform class a worker cannot use


EXIT_CODES_HELP = """\
exit codes:
  0  stopped on request (SIGINT, SIGTERM)
  1  a worker failed or exited during start-up (the root cause is printed)
  2  invalid command line or server arguments
  3  not every worker was ready within --startup-timeout
  4  a worker exited after the server was ready
  5  the launcher could not select a platform, load a required plugin or set up its IPC,
     or a worker could not use a class the platform returned (the root cause names it)"""


@dataclass
class RootCause:
    """The first failure of a launch, with everything an operator needs to act on it.

    ``worker`` is ``"<role>.<rank>"`` (None when the cause is not one worker's, e.g. a bad
    argument); ``phase`` is the phase the worker was in or failed in; ``exitcode`` and ``signal``
    say how its process ended (both None while it was still running); ``error_type``, ``message``
    and ``traceback`` come from the worker's own ``failed`` report when it sent one.
    """

    summary: str
    exit_code: int = ExitCode.WORKER_FAILED
    worker: str | None = None
    pid: int | None = None
    node_rank: int = 0
    phase: str | None = None
    exitcode: int | None = None
    signal: str | None = None
    error_type: str | None = None
    message: str | None = None
    traceback: str | None = None
    hint: str | None = None

    def to_dict(self) -> dict[str, object]:
        return asdict(self)

    def how_it_ended(self) -> str:
        if self.signal:
            return f"killed by {self.signal}"
        if self.exitcode is not None:
            return f"exited with code {self.exitcode}"
        return "still running (stopped by the launcher)"

    def format(self) -> str:
        """The one block printed for an operator (torchrun's error-file style)."""
        rule = "=" * 72
        lines = [rule, f"sglang-launch: {self.summary}"]
        if self.worker:
            pid = f" (pid {self.pid}, node {self.node_rank})" if self.pid else ""
            lines.append(f"  worker:     {self.worker}{pid}")
        if self.phase:
            lines.append(f"  phase:      {self.phase}")
        if self.worker:
            lines.append(f"  process:    {self.how_it_ended()}")
        if self.error_type:
            lines.append(f"  error:      {self.error_type}: {self.message or ''}".rstrip())
        elif self.message:
            lines.append(f"  note:       {self.message}")
        if self.hint:
            lines.append(f"  what to do: {self.hint}")
        if self.traceback:
            lines.append("  traceback (from the worker):" if self.worker else "  traceback:")
            lines.extend("    " + line for line in self.traceback.rstrip().splitlines())
        lines.append(rule)
        return "\n".join(lines)


class SetupFailure(RuntimeError):
    """A worker raises it (or a subclass) when what the platform or a plugin handed it cannot be
    used: a class the platform returned is not a subclass of the base the runtime needs, or does
    not construct with SGLang's parameters. The launch then stops as a set-up failure, exit 5
    (``ExitCode.SETUP_FAILED``), not as a worker failure (1): the worker is fine, the platform or
    plugin is not. The message names the vendor's class and the method that returned it; ``hint``
    says what to do.

    The worker's bootstrap reports the qualified names of the exception's classes
    (``bootstrap.messages.Failed.exc_types``); the supervisor looks for ``SETUP_FAILURE`` there.
    """

    def __init__(self, message: str, hint: str | None = None) -> None:
        super().__init__(message)
        self.hint = hint


# The qualified name a worker's failure report carries when it raised a ``SetupFailure``.
SETUP_FAILURE = f"{SetupFailure.__module__}.{SetupFailure.__qualname__}"


class WorkerUnhealthy(RuntimeError):
    """A worker that keeps running reports it (``ctx.report_failure``) when it can no longer do
    its work: a scheduler whose steps failed too many times in a row. The message says why and
    names who failed (a plugin's hook, or the model). The supervisor handles it as a failure of
    that worker (the replica restarts under ``--restart-policy on-failure``, else the launch
    stops, exit 4), with a summary that carries the message."""


# The qualified name a worker's failure report carries when it reported a ``WorkerUnhealthy``.
UNHEALTHY = f"{WorkerUnhealthy.__module__}.{WorkerUnhealthy.__qualname__}"


class LaunchError(RuntimeError):
    """A launch failed; ``root_cause`` (a ``RootCause``) says which worker, phase and why.

    Raised by ``Launcher.start()`` / ``wait_ready()`` in the embedding application; the
    application's own process is never signalled.
    """

    def __init__(self, root_cause: RootCause):
        super().__init__(root_cause.format())
        self.root_cause = root_cause

    @property
    def exit_code(self) -> int:
        return int(self.root_cause.exit_code)
