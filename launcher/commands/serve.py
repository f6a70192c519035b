"""``sglang-launch [serve] --model-path PATH ...``: start the server and supervise it until stopped.

The order is the spec's: this process's plugins are loaded (for ``--runtime``'s hook group)
before the ``ServerArgs`` class is looked up and its options are added to the parser, so plugins
can add options, change defaults and relax checks. Then the platform is resolved once and the
supervisor runs in this (main) thread, where SIGINT, SIGTERM, SIGHUP and SIGQUIT stop it gracefully
(see ``launcher.supervisor.signals``).
"""

from __future__ import annotations

import argparse
import logging
import sys
from typing import TYPE_CHECKING

from bootstrap.logformat import LineFormatter
from launcher.commands import streams
from launchspec.causes import EXIT_CODES_HELP, LaunchError

if TYPE_CHECKING:
    from launcher.commands.display import TerminalDisplay
    from launchspec.server_args import ServerArgs

DESCRIPTION = (
    "Start a model server: one scheduler process per rank and an HTTP process, each started "
    "through the import-neutral bootstrap, supervised until SIGINT/SIGTERM. On a terminal the "
    "workers' start-up phases are shown live, then one ready line with the URL."
)


def build_parser(server_args_class: type[ServerArgs]) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="sglang-launch",
        description=DESCRIPTION,
        epilog=EXIT_CODES_HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    server_args_class.add_cli_args(parser)
    return parser


def main(argv: list[str]) -> int:
    """Serve until stopped; the exit code is an ``ExitCode``. The caller has installed
    ``launcher.supervisor.signals.install_early()``: a stop signal before the supervisor runs raises
    ``StopRequested`` (``launcher.cli`` turns it into exit 0)."""
    from launcher import prepare as _prepare
    from launcher.supervisor import signals as _signals

    try:
        runtime = _prepare.peek_runtime(argv)
        _prepare.load_plugins(runtime, select=False)
        server_args_class = _prepare.server_args_class()
        # --help (and a command-line error) ends here: no platform is selected, no torch imported.
        ns = build_parser(server_args_class).parse_args(argv)
        # Selected before ServerArgs is built: its __post_init__ applies the platform's defaults.
        _prepare.select_platform(runtime)
        _configure_logging(ns.log_level)
        from launcher.supervisor.secrets import warn_if_on_command_line

        warn_if_on_command_line(argv)
        args = _prepare.build_args(lambda: server_args_class.from_cli_args(ns), vars(ns))
        selection, payload = _prepare.finish(args)
    except LaunchError as exc:
        streams.write(sys.stderr, exc.root_cause.format() + "\n")
        return exc.exit_code

    from launcher.commands.display import TerminalDisplay
    from launcher.supervisor.supervisor import Supervisor, run_supervisor

    # On a terminal (stderr) the live table: the workers' stderr, and their stdout when it is
    # the terminal too, go through the display, above the table, and so do this process's log
    # records. A worker's stdout redirected with the launcher's stays a plain stream.
    display = TerminalDisplay()
    if display.live:
        _log_through(display)
    supervisor = Supervisor(
        args,
        selection,
        payload=payload,
        listeners=(display,),
        worker_output=display.worker_output if display.live else None,
        output_streams=(1, 2) if _isatty(sys.stdout) else (2,),
    )
    _signals.defer()  # from here a stop signal is the supervisor's to act on
    try:
        outcome = run_supervisor(supervisor, handle_signals=True)
    except LaunchError as exc:  # set-up failed before any worker was started
        streams.write(sys.stderr, exc.root_cause.format() + "\n")
        return exc.exit_code
    return outcome.exit_code


def _configure_logging(level: str) -> None:
    """Log records to stderr, quietly dropped once stderr's reader is gone (``streams``)."""
    root = logging.getLogger()
    if not root.handlers:
        handler = streams.QuietStreamHandler(sys.stderr)
        handler.setFormatter(LineFormatter())  # the workers' format, less a worker's name
        root.addHandler(handler)
        root.setLevel(getattr(logging, str(level).upper(), logging.INFO))


def _isatty(stream: object) -> bool:
    try:
        return bool(stream.isatty())  # type: ignore[attr-defined]
    except (AttributeError, ValueError):
        return False


class _LogLines(logging.Handler):
    """Hands each formatted log record to the display, which prints it above its live table."""

    def __init__(self, display: TerminalDisplay, formatter: logging.Formatter | None) -> None:
        super().__init__()
        self._display = display
        if formatter is not None:
            self.setFormatter(formatter)

    def emit(self, record: logging.LogRecord) -> None:
        try:
            for line in self.format(record).splitlines():
                self._display.worker_output(line)
        except Exception:  # noqa: BLE001 - logging must never break the launch
            self.handleError(record)


def _log_through(display: TerminalDisplay) -> None:
    """Point the root logger's stderr handlers at ``display`` (same format and level)."""
    root = logging.getLogger()
    for handler in list(root.handlers):
        if isinstance(handler, logging.StreamHandler) and handler.stream is sys.stderr:
            replacement = _LogLines(display, handler.formatter)
            replacement.setLevel(handler.level)
            root.removeHandler(handler)
            root.addHandler(replacement)
