"""Workers' output through pipes the supervisor reads, passed on one line at a time.

With ``Supervisor(..., worker_output=sink)``, each worker is spawned with its ``streams`` (fds 1
and 2 by default) pointed at a pipe of its own; the read end is watched on the supervisor's
event loop and every complete line goes to ``sink(line)`` (the live terminal display draws it
above its table). A pipe reaches its end when every process holding its write end is gone (the
worker and whatever it started); what is left without a newline then goes out as a last line.
"""

from __future__ import annotations

import asyncio
import os
import select
from collections.abc import Callable

from bootstrap.children import Child, Children


class WorkerOutput:
    """The output pipes of one launch's workers (see the module docstring)."""

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        sink: Callable[[str], None],
        streams: tuple[int, ...] = (1, 2),
    ) -> None:
        self._loop = loop
        self._sink = sink
        self._streams = streams
        self._pipes: dict[int, bytearray] = {}  # read end -> the partial line read so far
        os.environ["PYTHONUNBUFFERED"] = "1"  # a worker's prints reach its pipe line by line

    def spawn(self, children: Children, child: Child) -> None:
        """Spawn ``child`` with its streams on a fresh pipe, and start reading that pipe."""
        read_end, write_end = os.pipe()
        try:
            children.spawn(child, output=write_end, streams=self._streams)
        except BaseException:
            os.close(read_end)
            raise
        finally:
            os.close(write_end)
        os.set_blocking(read_end, False)
        self._pipes[read_end] = bytearray()
        self._loop.add_reader(read_end, self._read, read_end)

    def drain(self) -> None:
        """Pass on what the workers wrote last (their pipes hold it after they are gone)."""
        for fd in list(self._pipes):
            while fd in self._pipes:
                before = len(self._pipes[fd])
                self._read(fd)
                if fd in self._pipes and len(self._pipes[fd]) == before and not _readable(fd):
                    self._close(fd)

    def _read(self, fd: int) -> None:
        """Pass on the complete lines in the pipe; at its end the rest, and close it."""
        try:
            data = os.read(fd, 65536)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        pending = self._pipes[fd]
        pending += data
        *lines, rest = pending.split(b"\n")
        self._pipes[fd] = bytearray(rest)
        for line in lines:
            self._sink(line.decode(errors="replace"))
        if not data:
            self._close(fd)

    def _close(self, fd: int) -> None:
        self._loop.remove_reader(fd)
        rest = self._pipes.pop(fd)
        if rest:
            self._sink(rest.decode(errors="replace"))
        os.close(fd)


def _readable(fd: int) -> bool:
    return bool(select.select([fd], [], [], 0)[0])
