"""What the operator sees on the terminal: an ops listener that renders launch events.

On a TTY, start-up is a live table under a header naming its columns (worker, process, latest
phase, how long that phase took), one line per worker redrawn in place as phases complete;
anywhere else (a pipe, a log file, journald) every event is one plain log line. Either way the
launch ends in one line: the ready line with the URL, or the root-cause block.

While the live table is on screen, nothing else may write to the terminal, or the table's redraw
would overwrite it: the workers' own output reaches the terminal through ``worker_output(line)``
(the supervisor reads it from a pipe per worker), which erases the table, prints the line where
the table was and draws the table again below it.

Every write goes through ``launcher.commands.streams``: a stream whose reader went away is
pointed at ``/dev/null``, never a failure of the launch.
"""

from __future__ import annotations

import os
import shutil
import sys
from typing import TextIO

from launcher.commands import streams
from launchspec.events import (
    Event,
    ReloadFailed,
    ReloadFinished,
    ReloadStarted,
    ReplicaReady,
    ReplicaRemoved,
    ReplicaReplaced,
    ReplicaRestarting,
    ReplicaServing,
    ScaleFailed,
    ScaleFinished,
    ScaleStarted,
    ServerFailed,
    ServerReady,
    ServerStarting,
    ServerStopped,
    ServerStopping,
    WorkerEvent,
    WorkerExited,
    WorkerPhase,
    WorkerReady,
)

PREFIX = "sglang-launch:"


class TerminalDisplay:
    def __init__(self, stream: TextIO | None = None, live: bool | None = None) -> None:
        self.stream = stream or sys.stderr
        self.live = _isatty(self.stream) if live is None else live
        self._rows: dict[str, str] = {}  # worker name -> its current line, in spawn order
        self._drawn = 0  # lines of the live table currently on screen
        self._starting = True

    def __call__(self, event: Event) -> None:
        match event:
            case ServerStarting():
                self._starting_line(event)
            case WorkerEvent():
                self._worker(event)
            case ServerReady():
                self._end_table()
                self._print(_ready_line(event))
            case ServerFailed():
                self._end_table()
                self._print(event.root_cause_text)
            case ServerStopping():
                self._end_table()
                self._print(f"{PREFIX} stopping ({event.reason})")
            case ReplicaRestarting():
                self._print(
                    f"{PREFIX} {event.replica} restarts (attempt {event.attempt} of "
                    f"{event.max_restarts}, in {event.backoff_s:.1f}s): {event.cause}"
                )
            case ReplicaReady():
                self._print(
                    f"{PREFIX} {event.replica} serves again ({event.down_s:.1f}s after it failed)"
                )
            case ServerStopped():
                cut = event.requests_cut or 0
                cut_text = (
                    f"{cut} request{'s' if cut != 1 else ''} still running when the grace "
                    f"period ran out {'were' if cut != 1 else 'was'} cut (each got a 503 or an "
                    "error event); "
                    if cut
                    else ""
                )
                self._print(
                    f"{PREFIX} stopped; {cut_text}every worker process is gone "
                    f"({event.teardown_s:.2f}s)"
                )
            case (
                ReloadStarted()
                | ReloadFinished()
                | ReloadFailed()
                | ScaleStarted()
                | ScaleFinished()
                | ScaleFailed()
                | ReplicaServing()
                | ReplicaReplaced()
                | ReplicaRemoved()
            ):
                self._print(f"{PREFIX} {_change_line(event)}")

    def _starting_line(self, event: ServerStarting) -> None:
        if event.cpu_fallback:
            self._print(
                f"{PREFIX} no accelerator and no platform plugin found: serving on the CPU platform "
                f"(set {_choosers(event.runtime)} to choose explicitly)"
            )
        elif event.platform == "builtin:base":
            self._print(
                f"{PREFIX} platform builtin:base, which cannot run models ({event.platform_reason}); "
                "set SGLANG_USE_CPU_ENGINE=1 to serve on the CPU, or install this hardware's platform plugin"
            )
        else:
            self._print(f"{PREFIX} platform {event.platform} ({event.platform_reason})")
        where = f"node {event.node_rank} of {event.nnodes}: " if event.nnodes > 1 else ""
        self._print(
            f"{PREFIX} {where}starting {len(event.workers)} workers: {', '.join(event.workers)}"
        )
        for name in event.workers:
            self._rows[name] = _row(name, None, "spawning", None)
        self._redraw()

    def _worker(self, event: WorkerEvent) -> None:
        name, phase = event.worker, event.phase
        duration = event.duration if isinstance(event, (WorkerPhase, WorkerReady)) else None
        if self.live and self._starting:
            self._rows[name] = _row(name, event.pid, phase, duration)
            self._redraw()
            return
        parts = [f"{PREFIX} {name}"]
        if event.pid:
            parts.append(f"(pid {event.pid})")
        parts.append(phase)
        if duration is not None:
            parts.append(f"{duration:.2f}s")
        if isinstance(event, WorkerExited):
            parts.append(event.signal or f"code {event.exitcode}")
        if self._starting:
            parts.append(f"[{event.ready_count}/{event.worker_count} ready]")
        self._print(" ".join(parts))

    def worker_output(self, line: str) -> None:
        """A line a worker wrote: above the live table while it is drawn, else as it is."""
        if not (self.live and self._starting and self._drawn):
            self._print(line)
            return
        # Back to the table's first line, erase from there down, the line, the table again.
        streams.write(self.stream, f"\x1b[{self._drawn}F\x1b[J" + line + "\n" + self._table())

    def _redraw(self) -> None:
        if not self.live or not self._starting:
            return
        # Back to the start of the table's first line, if it is on screen.
        back = f"\x1b[{self._drawn}F" if self._drawn else ""
        streams.write(self.stream, back + self._table())

    def _table(self) -> str:
        """The table's header and rows, each cleared first and cut to the terminal's width (a
        wrapped row would take two lines and leave a stale copy on the next redraw)."""
        width = _width(self.stream)
        lines = [HEADER, *self._rows.values()]
        self._drawn = len(lines)
        return "".join("\x1b[2K" + line[: width - 1] + "\n" for line in lines)

    def _end_table(self) -> None:
        self._starting = False

    def _print(self, text: str) -> None:
        streams.write(self.stream, text + "\n")


def _choosers(runtime: str) -> str:
    """The variables that choose ``runtime``'s platform: ``"SGLANG_PLATFORM or
    SGLANG_USE_CPU_ENGINE=1"`` for SRT."""
    from platforms.runtimes import RUNTIMES

    spec = RUNTIMES.get(runtime)
    if spec is None:
        return "the platform selector"
    cpu = spec.builtin("cpu")
    flag = f" or {cpu.env_flag}=1" if cpu is not None and cpu.env_flag else ""
    return spec.selector_env + flag


def _row(name: str, pid: int | None, phase: str, duration: float | None) -> str:
    pid_text = f"pid {pid}" if pid else ""
    took = f"{duration:6.2f}s" if duration is not None else ""
    return f"  {name:<14} {pid_text:<11} {phase:<22} {took}"


# The live table's first line: what each column of ``_row`` is. The last column is how long the
# worker's latest phase took, not the time since the launch started.
HEADER = f"  {'WORKER':<14} {'PROCESS':<11} {'LATEST PHASE':<22} {'THAT PHASE TOOK'}"


def _ready_line(event: ServerReady) -> str:
    after = f" in {event.startup_s:.1f}s"
    if event.url:
        return f"{PREFIX} ready at {event.url} ({event.worker_count} workers{after})"
    return f"{PREFIX} node {event.node_rank} ready ({event.worker_count} workers{after})"


def _change_line(event: Event) -> str:
    """One line for an event of a reload or a scale."""
    match event:
        case ReloadStarted():
            also = f"; also {', '.join(event.changes)}" if event.changes else ""
            return (
                f"reload {event.id} ({event.reason}): replacing {len(event.replicas)} replica(s) "
                f"one at a time with {event.served_name} ({event.model_path}){also}"
            )
        case ReloadFinished():
            return f"reload {event.id} done in {event.seconds:.1f}s: serving {event.served_name}"
        case ReloadFailed():
            return (
                f"reload {event.id} failed and was rolled back (dp={event.rolled_back}): "
                f"{event.root_cause.summary}; serving {event.served_name}"
            )
        case ScaleStarted():
            return (
                f"scale {event.id} ({event.reason}): {event.previous_dp_size} -> "
                f"{event.dp_size} replica(s)"
            )
        case ScaleFinished():
            return f"scale {event.id} done in {event.seconds:.1f}s: {event.dp_size} replica(s)"
        case ScaleFailed():
            return (
                f"scale {event.id} failed: {event.root_cause.summary}; "
                f"{event.dp_size} replica(s) serve"
            )
        case ReplicaServing():
            return f"{event.replica} serves ({event.change})"
        case ReplicaReplaced():
            return f"{event.replica} replaced by scheduler dp={event.by} in {event.seconds:.1f}s"
        case ReplicaRemoved():
            return f"{event.replica} removed" + (f": {event.cause}" if event.cause else "")
    return event.topic


def _width(stream: TextIO) -> int:
    try:
        return os.get_terminal_size(stream.fileno()).columns or 80
    except (AttributeError, ValueError, OSError):
        return shutil.get_terminal_size().columns


def _isatty(stream: TextIO) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False
