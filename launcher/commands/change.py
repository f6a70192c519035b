"""What ``sglang-launch reload`` and ``scale`` share: ask a running launcher for a change, then
follow its events to the change's end and say how it went.

The launcher answers the request at once (refused, or the change's ``id``); the change itself
is told by events. The subscription is open before the request is sent, and what it missed while
joining comes from the launcher's event history, so no event of the change is lost. One line is
printed per step (a replica started, serving, replaced, removed); the last line says where the
server is now. Exit codes: 0 done; 1 the change failed (its root cause is printed), no launcher
was found, it did not answer, or it stopped meanwhile; 2 refused (the reason is printed) or bad
options.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING

from launcher.commands.options import add_launcher_options

if TYPE_CHECKING:
    import zmq

    from launcher.supervisor.rundir import LauncherRecord
    from launchspec.events import Event

EXIT_CODES = (
    "exit codes: 0 done; 1 it failed (the root cause is printed), no launcher was found, it did "
    "not answer or it stopped meanwhile; 2 refused (the reason is printed) or bad options"
)
_POLL_MS = 500


def parser_of(kind: str, description: str) -> argparse.ArgumentParser:
    """The parser of ``sglang-launch <kind>`` (``reload``, ``scale``) with what both share:
    ``--pid``, ``--no-wait``, ``--json`` (the change's events as JSON lines) and ``--timeout``;
    each command adds its own options."""
    parser = argparse.ArgumentParser(
        prog=f"sglang-launch {kind}", description=description, epilog=EXIT_CODES
    )
    add_launcher_options(parser, json_help=f"print the {kind}'s events as JSON lines")
    parser.add_argument(
        "--no-wait", action="store_true", help=f"return once the launcher began the {kind}"
    )
    return parser


def run(
    prog: str,
    request: dict[str, object],
    pid: int | None,
    timeout: float,
    wait: bool = True,
    as_json: bool = False,
) -> int:
    """Send ``request`` to the launcher ``pid`` (the only one, when None) and, with ``wait``,
    follow the change to its end; the exit code."""
    import zmq

    from launcher.query import QueryError, QueryRefused, find_launcher, query
    from launcher.supervisor.rundir import NoLauncherError, RuntimeDirError
    from launchspec.events import EventError

    zctx = zmq.Context()
    sub = zctx.socket(zmq.SUB)
    sub.setsockopt(zmq.LINGER, 0)
    try:
        record = find_launcher(pid)
        for topic in (b"reload.", b"scale.", b"replica.", b"server.stop"):
            sub.setsockopt(zmq.SUBSCRIBE, topic)
        sub.connect(record["ops_endpoint"])
        reply = query(record["query_endpoint"], request, timeout, zctx)
        change_id, kind, after = reply["id"], reply["kind"], reply["after"]
        if not (isinstance(change_id, int) and isinstance(after, int)):
            raise QueryError(f"the launcher answered {reply!r}, not a change it began")
        if not wait:
            print(f"{prog}: {kind} {change_id} began; sglang-launch status shows it")
            return 0
        show = _json_line if as_json else _line
        return _follow(prog, sub, record, change_id, str(kind), after, timeout, zctx, show)
    except QueryRefused as exc:
        print(f"{prog}: refused: {exc}", file=sys.stderr)
        return 2
    except (NoLauncherError, QueryError, RuntimeDirError, EventError, ValueError) as exc:
        print(f"{prog}: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(
            f"{prog}: stopped following; the change goes on (sglang-launch status)", file=sys.stderr
        )
        return 1
    finally:
        sub.close()
        zctx.term()


def _follow(
    prog: str,
    sub: zmq.Socket[bytes],
    record: LauncherRecord,
    change_id: int,
    kind: str,
    after: int,
    timeout: float,
    zctx: zmq.Context[zmq.Socket[bytes]],
    show: Callable[[Event], str | None],
) -> int:
    """Print the change's events until it ends; its exit code."""
    from launcher.query import query
    from launcher.supervisor.rundir import launcher_alive
    from launchspec import events

    last = after
    ends = {"reload": (events.ReloadFinished, events.ReloadFailed)}.get(
        kind, (events.ScaleFinished, events.ScaleFailed)
    )

    def take(event: Event) -> int | None:
        """Print ``event`` when it is new; the exit code once the change ended."""
        nonlocal last
        if event.seq <= last:
            return None
        last = event.seq
        if isinstance(event, events.ServerStopping):
            print(f"{prog}: the server is stopping ({event.reason})", file=sys.stderr)
            return 1
        if isinstance(event, ends) and event.id == change_id:
            if isinstance(event, (events.ReloadFailed, events.ScaleFailed)):
                print(event.root_cause_text, file=sys.stderr)
            line = show(event)
            if line:
                print(line, flush=True)
            return 1 if isinstance(event, (events.ReloadFailed, events.ScaleFailed)) else 0
        if isinstance(event, events.ServerStopped):
            return 1
        line = show(event)
        if line:
            print(line, flush=True)
        return None

    def history() -> int | None:
        reply = query(record["query_endpoint"], {"query": "events", "after": last}, timeout, zctx)
        entries = reply["events"]
        for entry in entries if isinstance(entries, list) else []:
            code = take(events.from_dict(entry))
            if code is not None:
                return code
        return None

    code = history()  # what was published before the subscription took effect
    while code is None:
        if sub.poll(_POLL_MS):
            event = events.decode(sub.recv_multipart()[-1])
            if event.seq > last + 1:
                code = history()
            if code is None:
                code = take(event)
            continue
        if not launcher_alive(record):
            print(f"{prog}: launcher {record['pid']} is gone", file=sys.stderr)
            return 1
        code = history()
    return code


def _json_line(event: Event) -> str | None:
    from launchspec import events

    return json.dumps(events.to_dict(event))


def _line(event: Event) -> str | None:
    """One line of progress for ``event``; None for events not worth a line."""
    from launchspec import events

    match event:
        case events.ReloadStarted():
            line = (
                f"reload {event.id}: replacing {len(event.replicas)} replica(s) one at a time "
                f"({'beside the old one' if event.surge else 'in place'}): "
                f"{event.served_name} ({event.model_path})"
            )
            return line + (f"; also {', '.join(event.changes)}" if event.changes else "")
        case events.ScaleStarted():
            return f"scale {event.id}: {event.previous_dp_size} -> {event.dp_size} replica(s)"
        case events.ReplicaJoining():
            probe = "; probing it with one request" if event.probe else ""
            return f"  {event.replica} started in {event.startup_s:.1f}s{probe}"
        case events.ReplicaServing():
            took = f" (probe {event.probe_s * 1000:.0f} ms)" if event.probe_s is not None else ""
            return f"  {event.replica} serves{took}"
        case events.ReplicaDraining():
            return f"  {event.replica} drains"
        case events.ReplicaReplaced():
            return (
                f"  {event.replica} replaced by scheduler dp={event.by} in {event.seconds:.1f}s "
                f"(pids {_pids(event.previous_pids)} -> {_pids(event.pids)})"
            )
        case events.ReplicaRemoved():
            why = f": {event.cause}" if event.cause else ""
            return f"  {event.replica} removed{why}"
        case events.ReloadFinished():
            return (
                f"reload {event.id} done in {event.seconds:.1f}s: {event.served_name} "
                f"({event.model_path}) on {len(event.replicas)} replica(s)"
            )
        case events.ReloadFailed():
            back = f"; rolled back: dp={event.rolled_back}" if event.rolled_back else ""
            problems = f"; {'; '.join(event.rollback_failures)}" if event.rollback_failures else ""
            return (
                f"reload {event.id} failed{back}{problems}; serving {event.served_name} "
                f"({event.model_path}) on {len(event.replicas)} replica(s)"
            )
        case events.ScaleFinished():
            return (
                f"scale {event.id} done in {event.seconds:.1f}s: {event.dp_size} replica(s) "
                f"(dp={event.replicas}), restart policy {event.restart_policy}"
            )
        case events.ScaleFailed():
            return (
                f"scale {event.id} failed; {event.dp_size} replica(s) serve (dp={event.replicas})"
            )
    return None


def _pids(pids: list[int | None]) -> str:
    return ",".join(str(p) for p in pids)
