"""The ``sglang-launch`` command line: serving by default, plus subcommands.

Each subcommand lives in a module of its own, named here by dotted path and imported only when it
is asked for, so ``sglang-launch plugins`` never pays for what serving imports. ``check-platform``
is the conformance package's command: the launcher names it and never imports it otherwise.
"""

from __future__ import annotations

import importlib
import os
import sys

# name -> (module with the command's ``main(argv)``, one-line help). Serving is the default.
COMMANDS = {
    "serve": (
        "launcher.commands.serve",
        "start the server (the default when no subcommand is given)",
    ),
    "plugins": (
        "launcher.commands.plugins",
        "list installed platform and general plugins, and what would activate",
    ),
    "status": ("launcher.commands.status", "print a running launcher's status snapshot"),
    "events": ("launcher.commands.events", "print a running launcher's events as JSON lines"),
    "reload": (
        "launcher.commands.reload",
        "replace a running launcher's replicas one at a time (new model, fresh plugins)",
    ),
    "scale": ("launcher.commands.scale", "add or remove a running launcher's replicas"),
    "check-platform": (
        "conformance.command",
        "run the platform contract on this machine's device",
    ),
}


def _usage() -> str:
    lines = ["usage: sglang-launch [COMMAND] [OPTIONS]", "", "commands:"]
    for name, (_, text) in COMMANDS.items():
        lines.append(f"  {name:<16}{text}")
    lines.append("")
    lines.append("With no command, the options are the server's: sglang-launch --model-path PATH.")
    lines.append("sglang-launch COMMAND --help shows a command's options.")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    try:
        return _main(argv)
    except BrokenPipeError:
        # The reader went away (``sglang-launch status --json | head``): not a failure. Point
        # stdout at /dev/null so the interpreter's final flush does not complain again.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 0


def _main(argv: list[str] | None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] in ("-h", "--help") and len(argv) == 1:
        # The server's own --help lists its options; the command list comes first.
        print(_usage())
        print()
    if argv and argv[0] in COMMANDS:
        name, rest = argv[0], argv[1:]
    else:
        name, rest = "serve", argv
    if name == "serve":
        from launcher.supervisor import signals as _signals

        _signals.install_early()
        try:
            module = importlib.import_module(COMMANDS["serve"][0])
            return int(module.main(rest) or 0)
        except _signals.StopRequested as stop:
            _signals.defer()  # a second signal now must not raise again
            from launcher.commands import streams

            streams.write(
                sys.stderr, f"sglang-launch: stopped before start-up (received {stop.signame})\n"
            )
            return 0
    module = importlib.import_module(COMMANDS[name][0])
    return int(module.main(rest) or 0)


if __name__ == "__main__":
    sys.exit(main())
