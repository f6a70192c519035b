"""``sglang-launch scale [--pid PID] --dp-size N``: add scheduler replicas to a running launcher
(each takes requests once it answered one) or remove the newest ones (drained first).

Refused (exit 2) where it cannot work: several nodes, fewer than one replica, a change already in
progress. A replica that fails to start stops the scale (those added before it stay) and the
command exits 1 with its root cause (``launcher.commands.change``).
"""

from __future__ import annotations

import argparse

from launcher.commands.change import parser_of, run


def _parser() -> argparse.ArgumentParser:
    parser = parser_of(
        "scale",
        "Change the number of a running sglang-launch's scheduler replicas: new ones "
        "take requests once they answered one; removed ones (the newest first) finish what they "
        "hold first. SIGTTIN and SIGTTOU to the launcher add and remove one.",
    )
    parser.add_argument("--dp-size", type=int, required=True, metavar="N", help="replicas wanted")
    return parser


def main(argv: list[str]) -> int:
    ns = _parser().parse_args(argv)
    request: dict[str, object] = {"query": "scale", "dp_size": ns.dp_size}
    return run("sglang-launch scale", request, ns.pid, ns.timeout, not ns.no_wait, ns.json)
