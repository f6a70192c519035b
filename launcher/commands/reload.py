"""``sglang-launch reload [--pid PID] [--model-path PATH] [--served-model-name NAME]
[--allow-kind-change]``: replace a running launcher's replicas one at a time, with fresh
processes (and, when given, another model).

Each new replica is ready and has answered one request before the one it replaces stops taking
requests; a replica that fails on the way stops the reload, the replicas already replaced go back,
and the command exits 1 with the root cause (``launcher.commands.change``; the launcher's side is
``launcher.supervisor.rollout``). A model that serves another kind than the current one is
refused before anything starts (exit 2, naming both kinds) unless ``--allow-kind-change``. Paths
are made absolute here, where they were typed.
"""

from __future__ import annotations

import argparse
import os

from launcher.commands.change import parser_of, run


def _parser() -> argparse.ArgumentParser:
    parser = parser_of(
        "reload",
        "Replace a running sglang-launch's scheduler replicas one at a time, with "
        "fresh processes: each new one starts, loads the model, answers one request and takes "
        "requests before the one it replaces is drained and stopped (--reload-surge 0: the old "
        "one stops first). Fresh processes read the installed plugins again. A failure rolls back "
        "what was replaced; no client request fails. Options left out keep their values. A model "
        "that serves another kind (embedding, generation, image) is refused unless "
        "--allow-kind-change.",
    )
    parser.add_argument(
        "--model-path",
        metavar="PATH",
        help="serve this model directory from now on ('' for the embedded default model)",
    )
    parser.add_argument(
        "--served-model-name",
        metavar="NAME",
        help="the model's name in the API from now on ('' for the directory's name)",
    )
    parser.add_argument(
        "--allow-kind-change",
        action="store_true",
        help="reload even when the new model serves another kind than the current one (an "
        "embedding model for a causal LM, say): the API changes with it, and clients of the old "
        "kind get errors",
    )
    return parser


def main(argv: list[str]) -> int:
    ns = _parser().parse_args(argv)
    request: dict[str, object] = {"query": "reload"}
    if ns.model_path is not None:
        request["model_path"] = (
            os.path.abspath(os.path.expanduser(ns.model_path)) if ns.model_path else ""
        )
    if ns.served_model_name is not None:
        request["served_model_name"] = ns.served_model_name
    if ns.allow_kind_change:
        request["allow_kind_change"] = True
    return run("sglang-launch reload", request, ns.pid, ns.timeout, not ns.no_wait, ns.json)
