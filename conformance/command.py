"""``sglang-launch check-platform [--runtime srt|diffusion] [--json] [--timeout S]``.

Runs the platform contract against the platform a launch would select (same environment
variables), on this machine's device, in a child started through the same bootstrap as workers:
one row per check (pass / fail / missing / skipped), the workload row last, then a one-line
summary. A plugin that crashes the child (``os._exit`` in ``init_backend``, a signal, a hang) yields failed rows, not a
dead command. This process imports no torch.
"""

from __future__ import annotations

import argparse
import sys

from platforms.runtimes import RUNTIMES

DESCRIPTION = (
    "Check the selected platform against the platform contract on this machine's device. The "
    "platform is selected as a launch would select it (SGLANG_PLATFORM, SGLANG_USE_CPU_ENGINE, "
    "SGLANG_PLUGINS; SGLANG_DIFFUSION_PLATFORM_OVERRIDE with --runtime diffusion), and every check "
    "runs in a child process started through the workers' bootstrap."
)
EPILOG = """\
statuses:
  pass     the platform did what the contract says
  fail     it did not (or a method a launch needs is not implemented); the row says what
           the contract expects
  missing  an optional method whose contract default raises NotImplementedError is not
           implemented (never a failure)
  skipped  the check could not run here; the row says why

The last row (workload) loads a tiny model through the serving runtime on the platform and runs
a forward; "conforms" is printed only when no check failed and that row passed.

exit codes:
  0  the platform conforms
  1  it does not: a check failed or the workload did not pass (the child's crash or hang counts
     as a failed check)
  2  invalid command line
  3  the check process could not be set up (the message says what to change)"""

EXIT_OK, EXIT_FAILED, EXIT_SETUP = 0, 1, 3


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="sglang-launch check-platform",
        description=DESCRIPTION,
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--runtime",
        choices=RUNTIMES,
        default="srt",
        help="which runtime's platform to check (default: srt)",
    )
    parser.add_argument("--json", action="store_true", help="print the report as JSON for tools")
    parser.add_argument(
        "--timeout",
        type=float,
        default=120.0,
        metavar="SECONDS",
        help="seconds the whole check may take before it is stopped (default: 120)",
    )
    return parser


def main(argv: list[str]) -> int:
    parser = build_parser()
    ns = parser.parse_args(argv)
    if not ns.timeout > 0:
        parser.error(f"--timeout {ns.timeout:g} must be more than 0 seconds")

    from conformance import parent, report

    try:
        result = parent.run_child(ns.runtime, ns.timeout)
    except parent.SetupError as exc:
        print(f"sglang-launch check-platform: {exc}", file=sys.stderr)
        return EXIT_SETUP
    outcome = report.build(ns.runtime, result)
    if ns.json:
        print(outcome.to_json())
    else:
        sys.stdout.write(report.render_table(outcome, colour=report.use_colour(sys.stdout)))
    sys.stdout.flush()
    return EXIT_OK if outcome.ok else EXIT_FAILED
