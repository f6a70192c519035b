"""The options every command that talks to a running launcher shares: ``--pid``, ``--timeout``
and ``--json``, written once (``status``, ``events``, ``reload``, ``scale``, ``plugins
--running``)."""

from __future__ import annotations

import argparse
import math

# Seconds a command waits for the launcher's answer to one query.
QUERY_TIMEOUT = 5.0
PID_HELP = "the launcher's pid (needed only when several run)"


def seconds(text: str) -> float:
    """A positive, finite number of seconds (an argparse ``type``: a bad one exits 2 naming it)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not (math.isfinite(value) and value > 0):
        raise argparse.ArgumentTypeError(f"{text} must be a finite number of seconds above 0")
    return value


def add_launcher_options(
    parser: argparse.ArgumentParser,
    *,
    json_help: str | None = None,
    timeout: bool = True,
    pid_help: str = PID_HELP,
) -> None:
    """Add ``--pid`` (``pid_help``), ``--json`` when ``json_help`` says what it prints, and
    ``--timeout`` (seconds to wait for the launcher's answer) unless ``timeout`` is False (a
    command whose own ``--timeout`` means something else)."""
    parser.add_argument("--pid", type=int, help=pid_help)
    if json_help is not None:
        parser.add_argument("--json", action="store_true", help=json_help)
    if timeout:
        parser.add_argument(
            "--timeout",
            type=seconds,
            default=QUERY_TIMEOUT,
            metavar="SECONDS",
            help=f"seconds to wait for the launcher's answer (default: {QUERY_TIMEOUT:g})",
        )
