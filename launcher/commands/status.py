"""``sglang-launch status [--pid PID] [--json]``: print a running launcher's status snapshot."""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import TYPE_CHECKING

from launcher.commands.options import add_launcher_options

if TYPE_CHECKING:
    from launcher.supervisor.state import LaunchState


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="sglang-launch status",
        description="Print the status of a running sglang-launch: the server's phase and every "
        "worker's role, rank, pid, phase, phase timings, platform and exit code.",
        epilog="exit codes: 0 printed; 1 no launcher found or it did not answer; 2 bad options",
    )
    add_launcher_options(parser, json_help="print the snapshot as JSON")
    return parser


def main(argv: list[str]) -> int:
    ns = _parser().parse_args(argv)
    from launcher.query import QueryError, find_launcher, query
    from launcher.supervisor.rundir import NoLauncherError, RuntimeDirError
    from launcher.supervisor.state import LaunchState

    try:
        found = find_launcher(ns.pid)
        snapshot = query(found["query_endpoint"], {"query": "snapshot"}, ns.timeout)["snapshot"]
        state = LaunchState.from_snapshot(snapshot)
    except (NoLauncherError, QueryError, RuntimeDirError, ValueError) as exc:
        print(f"sglang-launch status: {exc}", file=sys.stderr)
        return 1
    if ns.json:
        print(json.dumps(snapshot, indent=2))
    else:
        print(render(state))
    return 0


def render(state: LaunchState) -> str:
    """The launch's state as a short human-readable table."""
    up = time.time() - state.started_at
    where = f"  node {state.node_rank}/{state.nnodes}" if state.nnodes > 1 else ""
    lines = [
        f"sglang-launch pid {state.pid}: {state.phase}"
        f"{'  ' + state.url if state.url else ''}{where}  up {up:.0f}s",
        f"platform {state.platform} ({state.platform_reason})",
    ]
    if state.model_path or state.served_model_name:
        lines.append(
            f"model {state.served_model_name} ({state.model_path}) on {len(state.replicas)} "
            f"replica(s): dp={state.replicas}"
        )
    if state.change is not None:
        change = state.change
        lines.append(
            f"{change.kind} {change.id} in progress ({change.reason}, "
            f"{time.time() - change.started_at:.0f}s): {change.step or 'starting'}"
        )
    lines.append(f"  {'WORKER':<14} {'PID':>7}  {'PHASE':<20} {'START-UP':>9}  EXIT")
    for w in state.workers:
        took = f"{sum(w.phases.values()):.2f}s" if w.phases else "-"
        exit_text = w.signal or ("-" if w.exitcode is None else str(w.exitcode))
        again = f"  (restarted {w.restarts}x)" if w.restarts else ""
        lines.append(
            f"  {w.name:<14} {w.pid or '-':>7}  {w.phase:<20} {took:>9}  {exit_text}{again}"
        )
    for w in state.workers:
        if w.restart_cause:
            lines.append(
                f"{w.name} restarted {w.restarts}x, the last time after: {w.restart_cause}"
            )
    for w in state.workers:
        for difference in w.manifest_differs:
            lines.append(f"  {w.name} differs: {difference}")
    if state.root_cause is not None:
        lines.append(f"root cause: {state.root_cause.summary}")
    return "\n".join(lines)
