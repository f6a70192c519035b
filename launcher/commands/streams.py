"""Writing to the launcher's own stdout and stderr, whose reader may go away at any moment.

``sglang-launch 2>&1 | head -n 1``, a ``tee`` that was killed, a log shipper that died: from then
on every write to that pipe fails with EPIPE (and raises SIGPIPE, which the launcher shrugs
off). What the launcher prints is a courtesy to the operator, never something the launch
depends on, so a broken stream degrades quietly:

- the first write that finds a stream's reader gone points that stream's file descriptor at
  ``/dev/null``: this process writes into nothing from then on (log records, the live table,
  the root-cause block, the interpreter's final flush), and so does every worker started later;
- any other write error (a full disk under a log file, a closed stream) drops that text alone.

Nothing is retried and nothing is reported about it: the ops events, the status snapshot and the
state file still say everything, and the exit status is the launch's own.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
from typing import TextIO


def write(stream: TextIO, text: str) -> None:
    """Write ``text`` to ``stream`` and flush it, quietly (see the module docstring)."""
    try:
        stream.write(text)
        stream.flush()
    except Exception as exc:  # noqa: BLE001 - output is a courtesy: it never breaks the launch
        failed(stream, exc)


def failed(stream: TextIO, exc: BaseException) -> None:
    """``exc`` was raised writing to ``stream``: a stream whose reader went away is pointed at
    ``/dev/null`` (what it still buffers drains there); any other error is dropped."""
    if not reader_gone(exc):
        return
    with contextlib.suppress(Exception):
        fd = stream.fileno()
        devnull = os.open(os.devnull, os.O_WRONLY)
        try:
            os.dup2(devnull, fd)
        finally:
            os.close(devnull)
    with contextlib.suppress(Exception):
        stream.flush()  # what the failed write left in the buffer goes to /dev/null now


def reader_gone(exc: BaseException) -> bool:
    """Whether ``exc`` says the reading end of the stream is gone for good."""
    return isinstance(exc, OSError) and exc.errno in (errno.EPIPE, errno.ECONNRESET)


class QuietStreamHandler(logging.StreamHandler["TextIO"]):
    """A ``logging.StreamHandler`` whose failed writes are handled as ``write`` handles them,
    with no "--- Logging error ---" report (it would go to the broken stream too); a record that
    cannot be formatted is still reported as ``logging`` does."""

    def handleError(self, record: logging.LogRecord) -> None:  # noqa: N802 - logging's name
        import sys

        exc = sys.exc_info()[1]
        if isinstance(exc, (OSError, ValueError)):  # ValueError: the stream was closed
            failed(self.stream, exc)
            return
        super().handleError(record)
