"""The bootstrap's phases and the exit code a child uses when it fails in each.

A child walks the phases of ``PHASES`` in order and reports each one as it is *reached*, with the
time the step took. A failure names the phase the child was *working towards* (a failing
``init_backend()`` fails phase ``platform_initialized``) and ends the process with that phase's
code from ``EXIT_CODES``, so a supervisor that only sees an exit status still knows where the child
died. The codes sit in 80..89, clear of Python's 1, argparse's 2 and the shell's 126..165.

Standard library only: the supervisor maps exit codes without importing msgspec or zmq.
"""

from __future__ import annotations

import signal

SPAWNED = "spawned"
PLATFORM_INITIALIZED = "platform_initialized"
PLUGINS_LOADED = "plugins_loaded"
HOOKS_APPLIED = "hooks_applied"
ARGS_MATERIALIZED = "args_materialized"
WORKER_IMPORTED = "worker_imported"
READY = "ready"
# Failure-only phases: the worker target raised (or returned) after it reported ready, or while
# winding down after a stop request.
SERVING = "serving"
STOPPING = "stopping"
STOPPED = "stopped"

# The start-up phases, in the order a child reaches them.
PHASES = (
    SPAWNED,
    PLATFORM_INITIALIZED,
    PLUGINS_LOADED,
    HOOKS_APPLIED,
    ARGS_MATERIALIZED,
    WORKER_IMPORTED,
    READY,
)

# What each step does, for error reports ("failed while <doing>").
DOING = {
    SPAWNED: "arming orphan protection and connecting to the supervisor",
    PLATFORM_INITIALIZED: "selecting the platform and running its init_backend()",
    PLUGINS_LOADED: "loading general plugins (running their registration callbacks)",
    HOOKS_APPLIED: "applying plugin hooks to their targets",
    ARGS_MATERIALIZED: "decoding the ServerArgs payload",
    WORKER_IMPORTED: "importing the worker target",
    READY: "running the worker target before it reported ready",
    SERVING: "running the worker target after it reported ready",
    STOPPING: "winding down after a stop request",
}

# Exit status of a child that failed in a phase; distinct per phase.
EXIT_CODES = {
    SPAWNED: 80,
    PLATFORM_INITIALIZED: 81,
    PLUGINS_LOADED: 82,
    HOOKS_APPLIED: 83,
    ARGS_MATERIALIZED: 84,
    WORKER_IMPORTED: 85,
    READY: 86,
    SERVING: 87,
    STOPPING: 88,
}

# The child found its parent already gone when it armed orphan protection and exited at once,
# without reporting (nobody is left to report to).
EXIT_PARENT_GONE = 89

_PHASE_OF_CODE = {code: phase for phase, code in EXIT_CODES.items()}


def phase_of_exit_code(code: int | None) -> str | None:
    """The phase a bootstrap exit status stands for, or None if it is not one of ours."""
    if code is None:
        return None
    if code == EXIT_PARENT_GONE:
        return "parent_gone"
    return _PHASE_OF_CODE.get(code)


def signal_name(exitcode: int | None) -> str | None:
    """``"SIGKILL"`` for a ``multiprocessing`` exit code of ``-9``; None for a normal exit."""
    if exitcode is None or exitcode >= 0:
        return None
    try:
        return signal.Signals(-exitcode).name
    except ValueError:
        return f"signal {-exitcode}"
