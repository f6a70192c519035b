"""``sglang-launch events [--pid PID] [--follow]``: a running launcher's events as JSON lines.

The first line is ``{"topic": "snapshot", "seq": N, "snapshot": {...}}``, the full current state,
so a subscriber that joins late misses nothing; with ``--follow`` every later event follows, one
JSON object per line (``launchspec.events`` describes them), until ``server.stopped``. Events carry
a sequence number: one that was published while the subscription was still being set up is
fetched from the launcher's event history instead, so the stream has no gaps and no duplicates.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import TYPE_CHECKING

from launcher.commands.options import add_launcher_options

if TYPE_CHECKING:
    import zmq

    from launcher.supervisor.rundir import LauncherRecord
    from launchspec.events import Event

_POLL_MS = 500


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="sglang-launch events",
        description="Print a running sglang-launch's state and events as JSON lines.",
        epilog="exit codes: 0 done (or the launcher stopped); 1 no launcher found, it did not "
        "answer, or it vanished without stopping; 2 bad options",
    )
    add_launcher_options(parser)  # no --json: it prints JSON lines always
    parser.add_argument(
        "--follow", "-f", action="store_true", help="keep printing events until the launcher stops"
    )
    return parser


def _print(line: str) -> None:
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def main(argv: list[str]) -> int:
    ns = _parser().parse_args(argv)
    import zmq

    from launcher.query import QueryError, find_launcher, query
    from launcher.supervisor.rundir import NoLauncherError, RuntimeDirError
    from launcher.supervisor.state import LaunchState
    from launchspec.events import EventError

    zctx = zmq.Context()
    sub = zctx.socket(zmq.SUB)
    sub.setsockopt(zmq.LINGER, 0)
    try:
        state = find_launcher(ns.pid)
        # Subscribe before asking for the snapshot: whatever happens after it then reaches us.
        sub.setsockopt(zmq.SUBSCRIBE, b"")
        sub.connect(state["ops_endpoint"])
        snapshot = query(state["query_endpoint"], {"query": "snapshot"}, ns.timeout, zctx)[
            "snapshot"
        ]
        now = LaunchState.from_snapshot(snapshot)
        _print(json.dumps({"topic": "snapshot", "seq": now.seq, "snapshot": snapshot}))
        if not ns.follow or now.phase == "stopped":
            return 0
        return _follow(sub, state, now.seq, ns.timeout, zctx)
    except (NoLauncherError, QueryError, RuntimeDirError, EventError, ValueError) as exc:
        print(f"sglang-launch events: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 0
    finally:
        sub.close()
        zctx.term()


def _follow(
    sub: zmq.Socket[bytes],
    state: LauncherRecord,
    last: int,
    timeout: float,
    zctx: zmq.Context[zmq.Socket[bytes]],
) -> int:
    from launcher.query import QueryError, query
    from launcher.supervisor.rundir import launcher_alive
    from launchspec import events

    def emit_after(new: list[Event], before: int | None = None) -> bool:
        """Print the events newer than ``last`` (and older than ``before``); True at the end."""
        nonlocal last
        for event in new:
            if event.seq > last and (before is None or event.seq < before):
                _print(json.dumps(events.to_dict(event)))
                last = event.seq
                if isinstance(event, events.ServerStopped):
                    return True
        return False

    def history() -> list[Event]:
        reply = query(state["query_endpoint"], {"query": "events", "after": last}, timeout, zctx)
        if not reply["complete"]:
            print(
                f"sglang-launch events: events after {last} were dropped from the history",
                file=sys.stderr,
            )
        entries = reply["events"]
        return [events.from_dict(entry) for entry in entries] if isinstance(entries, list) else []

    while True:
        if sub.poll(_POLL_MS):
            _, data = sub.recv_multipart()
            event = events.decode(data)
            if event.seq > last + 1 and emit_after(history(), before=event.seq):
                return 0
            if emit_after([event]):
                return 0
            continue
        # Quiet: close a gap left by a late subscription, and notice a launcher that vanished.
        if not launcher_alive(state):
            print(
                f"sglang-launch events: launcher {state['pid']} is gone without stopping",
                file=sys.stderr,
            )
            return 1
        try:
            if emit_after(history()):
                return 0
        except QueryError:
            if launcher_alive(state):
                raise
