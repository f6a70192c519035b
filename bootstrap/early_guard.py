"""Orphan protection from a child's first instruction, before ``orphan.arm`` can run in it.

``orphan.arm`` runs once the child's own code starts. Before that a ``spawn`` child runs the
interpreter's start-up, unpickles its preparation data, re-runs the parent's main module and
unpickles its target; a plain child (``python -m MODULE``) imports its module and whatever that
imports. A supervisor SIGKILLed meanwhile leaves the child running on its own until it gets
there, seconds on a busy machine. Two ways in, each the earliest point a parent can reach:

- ``ArmedName(name, parent_pid)``: the ``name`` of a ``multiprocessing`` spawn process. The name
  is among the first entries of the preparation data, unpickled before the parent's main module
  or anything of the target is imported, and it unpickles by calling ``armed``.
- ``python -m bootstrap.early_guard PARENT_PID MODULE [ARG ...]``: runs ``orphan.arm`` with no
  guard process (the parent-death signal, the subreaper and the watch thread: for a child that
  starts no processes of its own, such as the GGUF converter) and only then runs ``MODULE`` as
  ``__main__`` with ``ARG ...`` as its arguments (``command`` builds the line).

``armed`` asks the kernel to SIGKILL the child when its parent dies (``PR_SET_PDEATHSIG``, Linux)
and then re-checks the race the signal cannot cover: a parent that died before it was armed
(the child was re-parented already) makes the child exit at once with ``EXIT_PARENT_GONE``.
``orphan.arm`` lifts that signal once the guard it forks stands (see there).

Standard library only.
"""

from __future__ import annotations

import os
import runpy
import sys
from typing import Any

from bootstrap import orphan
from bootstrap.phases import EXIT_PARENT_GONE

_armed_for: int | None = None  # the parent pid ``armed`` checked in this process, once


def armed(name: str, parent_pid: int) -> str:
    """Arm the parent-death signal for ``parent_pid`` (once per process) and return ``name``;
    exit at once with ``EXIT_PARENT_GONE`` when ``parent_pid`` is no longer the parent."""
    global _armed_for
    if _armed_for != parent_pid:
        _armed_for = parent_pid
        orphan.set_parent_death_signal()
        if os.getppid() != parent_pid:
            os._exit(EXIT_PARENT_GONE)
    return name


class ArmedName(str):
    """A process name that, unpickled in the spawned child, arms it (``armed``) first."""

    parent_pid: int

    def __new__(cls, name: str, parent_pid: int | None = None) -> ArmedName:
        self = super().__new__(cls, name)
        self.parent_pid = os.getpid() if parent_pid is None else parent_pid
        return self

    def __reduce__(self) -> tuple[Any, tuple[str, int]]:
        return armed, (str(self), self.parent_pid)


def command(module: str, args: list[str], parent_pid: int | None = None) -> list[str]:
    """The command line that runs ``python -m module *args`` armed for ``parent_pid`` (this
    process by default) from its first import on."""
    parent = os.getpid() if parent_pid is None else parent_pid
    return [sys.executable, "-m", __name__, str(parent), module, *args]


def main(argv: list[str] | None = None) -> None:
    """``PARENT_PID MODULE [ARG ...]``: arm, then run ``MODULE`` as ``__main__``."""
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) < 2 or not args[0].isdigit():
        sys.exit("usage: python -m bootstrap.early_guard PARENT_PID MODULE [ARG ...]")
    orphan.arm(int(args[0]), guard=False)
    sys.argv = [args[1], *args[2:]]
    runpy.run_module(args[1], run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
