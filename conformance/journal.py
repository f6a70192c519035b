"""The check process's journal: one JSON record per line, written as each check starts and ends.

The child writes it into the private directory the parent made, so whatever the child reached
survives its death (``os._exit`` in a plugin, a signal): the parent reads the rows that finished
and knows the check that was running. Records:

- ``{"kind": "begin", "id": ...}``: a check starts;
- ``{"kind": "row", "row": {...}}``: it ended with that ``Row``;
- ``{"kind": "platform", ...}``: what was selected (key, class, entry point, distribution, reason).

Each record is one ``write`` on an ``O_APPEND`` descriptor, so a crash never leaves half a line
behind a finished one.
"""

from __future__ import annotations

import json
import os
from typing import NamedTuple

from .rows import Row

FILE_NAME = "check-journal.jsonl"


class Journal:
    """The child's writer."""

    def __init__(self, directory: str) -> None:
        self.path = os.path.join(directory, FILE_NAME)
        self._fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)

    def _write(self, record: dict) -> None:
        os.write(self._fd, (json.dumps(record, default=repr) + "\n").encode())

    def platform(self, **info: object) -> None:
        self._write({"kind": "platform", **info})

    def begin(self, check_id: str) -> None:
        self._write({"kind": "begin", "id": check_id})

    def row(self, row: Row) -> None:
        self._write({"kind": "row", "row": row.to_dict()})

    def close(self) -> None:
        os.close(self._fd)


class Reading(NamedTuple):
    """What a journal holds: the platform info, finished rows by id, the check left unfinished."""

    platform: dict | None
    rows: dict[str, Row]
    running: str | None


def read(directory: str) -> Reading:
    """Read the journal in ``directory`` (empty when the child never got to write one)."""
    platform, finished, running = None, {}, None
    try:
        with open(os.path.join(directory, FILE_NAME), encoding="utf-8") as f:
            lines = f.read().splitlines()
    except FileNotFoundError:
        lines = []
    for line in lines:
        try:
            record = json.loads(line)
        except ValueError:
            continue  # cannot happen with whole-line writes; ignore rather than crash the report
        kind = record.get("kind")
        if kind == "platform":
            platform = {k: v for k, v in record.items() if k != "kind"}
        elif kind == "begin":
            running = record.get("id")
        elif kind == "row":
            row = Row.from_dict(record["row"])
            finished[row.id] = row
            if running == row.id:
                running = None
    return Reading(platform, finished, running)
