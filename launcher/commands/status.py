"""``sglang-launch status [--pid PID] [--json]``: print a running launcher's status snapshot."""

from __future__ import annotations

import argparse
import json
import sys
import time


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="sglang-launch status",
        description="Print the status of a running sglang-launch: the server's phase and every "
        "worker's role, rank, pid, phase, phase timings, platform and exit code.",
        epilog="exit codes: 0 printed; 1 no launcher found or it did not answer; 2 bad options",
    )
    parser.add_argument("--pid", type=int, help="the launcher's pid (needed only when several run)")
    parser.add_argument("--json", action="store_true", help="print the snapshot as JSON")
    parser.add_argument("--timeout", type=float, default=5.0, help="seconds to wait for an answer")
    return parser


def main(argv: list[str]) -> int:
    ns = _parser().parse_args(argv)
    from launcher.query import QueryError, find_launcher, query
    from launcher.supervisor.rundir import NoLauncherError, RuntimeDirError

    try:
        state = find_launcher(ns.pid)
        snapshot = query(state["query_endpoint"], {"query": "snapshot"}, ns.timeout)["snapshot"]
    except (NoLauncherError, QueryError, RuntimeDirError) as exc:
        print(f"sglang-launch status: {exc}", file=sys.stderr)
        return 1
    if ns.json:
        print(json.dumps(snapshot, indent=2))
    else:
        print(render(snapshot))
    return 0


def render(snapshot: dict) -> str:
    """The snapshot as a short human-readable table."""
    up = time.time() - snapshot["started_at"]
    where = f"  node {snapshot['node_rank']}/{snapshot['nnodes']}" if snapshot["nnodes"] > 1 else ""
    lines = [
        f"sglang-launch pid {snapshot['pid']}: {snapshot['phase']}"
        f"{'  ' + snapshot['url'] if snapshot.get('url') else ''}{where}  up {up:.0f}s",
        f"platform {snapshot['platform']} ({snapshot['platform_reason']})",
        f"  {'WORKER':<14} {'PID':>7}  {'PHASE':<20} {'START-UP':>9}  EXIT",
    ]
    for w in snapshot["workers"]:
        took = f"{sum(w['phases'].values()):.2f}s" if w["phases"] else "-"
        exit_text = w["signal"] or ("-" if w["exitcode"] is None else str(w["exitcode"]))
        restarts = w.get("restarts") or 0
        again = f"  (restarted {restarts}x)" if restarts else ""
        lines.append(
            f"  {w['name']:<14} {w['pid'] or '-':>7}  {w['phase']:<20} {took:>9}  {exit_text}{again}"
        )
    cause = snapshot.get("root_cause")
    if cause:
        lines.append(f"root cause: {cause['summary']}")
    return "\n".join(lines)
