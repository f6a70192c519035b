"""The final report: every check's row (from the child's journal, or from how the child died),
the terminal table, the JSON document and the one-line summary.

When the child did not finish, the failure is pinned on one row and every row after the point
it reached is skipped, saying so:

- a check that was running when the child died (or hung) fails with how the child ended;
- a failure before the checks started is placed by the bootstrap phase it happened in:
  selection and construction errors (``PlatformSelectionError``) on ``selection.source`` or
  ``selection.construct``, anything else in ``platform_initialized`` on
  ``lifecycle.init_backend`` (an ``os._exit`` there sends no report: the exit code and the phase
  still say where), plugin and hook failures on ``lifecycle.plugins``; anything else on the
  ``process`` row.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from typing import TYPE_CHECKING, NamedTuple, TextIO

from bootstrap import DOING, PHASES

from .catalog import WORKLOAD, Check, checks_for
from .rows import FAIL, MISSING, PASS, SKIPPED, Row, counts

if TYPE_CHECKING:
    from .parent import ChildResult

PROCESS_ROW = (
    "process.check",
    "the check process ran to the end",
    "the check process starts through the bootstrap, runs every check and stops when asked",
)


class Blame(NamedTuple):
    id: str
    detail: str


class Report(NamedTuple):
    runtime: str
    platform: dict | None
    rows: list[Row]
    # Where the selection rows come from a second check process (see parent.run_child).
    note: str | None = None

    @property
    def counts(self) -> dict[str, int]:
        return counts(self.rows)

    @property
    def ok(self) -> bool:
        """The platform conforms: no row failed and every workload row passed."""
        return not self.failed

    @property
    def failed(self) -> list[str]:
        """Rows that keep the platform from conforming: failed ones, and workload rows that did
        not pass (a launch is only known to work when they ran)."""
        return [
            row.id
            for row in self.rows
            if row.status == FAIL or (row.group == WORKLOAD and row.status != PASS)
        ]

    @property
    def missing_required(self) -> list[str]:
        """Required contract methods the platform does not implement, in row order."""
        return list(dict.fromkeys(row.missing for row in self.rows if row.missing))

    def summary(self) -> str:
        c = self.counts
        where = (self.platform or {}).get("key") or "an unreported platform"
        tally = ", ".join(f"{c[s]} {s}" for s in (PASS, FAIL, MISSING, SKIPPED))
        verdict = "conforms" if self.ok else "FAILED: " + ", ".join(self.failed)
        if self.missing_required:
            verdict += (
                " (a launch needs, and the platform lacks: "
                + ", ".join(f"{m}()" for m in self.missing_required)
                + ")"
            )
        return f"check-platform {self.runtime} on {where}: {len(self.rows)} checks, {tally} - {verdict}"

    def to_dict(self) -> dict:
        return {
            "runtime": self.runtime,
            "platform": self.platform,
            "ok": self.ok,
            "counts": self.counts,
            "missing_required": self.missing_required,
            "summary": self.summary(),
            "note": self.note,
            "rows": [row.to_dict() for row in self.rows],
        }

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2)


# -- building ----------------------------------------------------------------------------------
def _ended(result: ChildResult) -> str:
    if result.timed_out:
        return f"did not finish within {result.timeout:g}s and was stopped"
    code = result.exitcode
    if code is not None and code < 0:
        import signal

        try:
            return f"was killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"was killed by signal {-code}"
    return f"exited with code {code}"


def _phase_in_progress(reached: str) -> str:
    """The bootstrap phase a child was working towards, given the last one it reported."""
    if reached in PHASES[:-1]:
        return PHASES[PHASES.index(reached) + 1]
    return PHASES[0] if reached == "starting" else PHASES[-1]


def _selection_error_names() -> set[str]:
    """The class names of every platform selection error (the child reports a type by name)."""
    from platforms import PlatformSelectionError

    names, todo = set(), [PlatformSelectionError]
    while todo:
        cls = todo.pop()
        names.add(cls.__name__)
        todo.extend(cls.__subclasses__())
    return names


def _row_for_phase(phase: str, failure: dict | None) -> str:
    if phase == "platform_initialized":
        reported = failure["exc_type"].rpartition(".")[2] if failure else ""
        if failure and reported in _selection_error_names():
            # Construction errors are raised from platforms._selection.instantiate().
            return (
                "selection.construct"
                if " in instantiate\n" in failure["traceback"]
                else "selection.source"
            )
        return "lifecycle.init_backend"
    if phase in ("plugins_loaded", "hooks_applied"):
        return "lifecycle.plugins"
    return PROCESS_ROW[0]


def blame(result: ChildResult) -> Blame | None:
    """The row that carries the child's failure, or None when it finished."""
    if result.ready:
        return None
    failure = result.failure
    reported = f"{failure['exc_type']}: {failure['message']}" if failure else None
    running = result.journal.running
    if running is not None:
        detail = f"the check process {_ended(result)} while running this check"
        return Blame(running, f"{detail}: {reported}" if reported else detail)
    phase = failure["phase"] if failure else _phase_in_progress(result.reached)
    where = f"(bootstrap phase {phase}: {DOING.get(phase, phase)})"
    if reported:
        return Blame(_row_for_phase(phase, failure), f"{reported} {where}")
    return Blame(
        _row_for_phase(phase, None),
        f"the check process {_ended(result)} {where} and sent no error report",
    )


def build(runtime: str, result: ChildResult, checks: list[Check] | None = None) -> Report:
    """Every check's row for ``runtime``, from the child's journal and how it ended."""
    checks = checks_for(runtime) if checks is None else checks
    finished = dict(result.journal.rows)
    culprit = blame(result)
    platform, note = result.journal.platform, None
    if result.selection is not None and culprit is not None:
        # The first process selected its platform and stopped before the checks ran: the
        # selection rows are a second process's, which loaded no general plugin.
        platform = platform or result.selection.platform
        rerun = {
            row_id: row
            for row_id, row in result.selection.rows.items()
            if row_id.partition(".")[0] == "selection"
        }
        finished = {**rerun, **finished}
        note = (
            f"the check process stopped at {culprit.id} after it selected the platform; the "
            f"selection checks ran again in a process that loads no general plugin"
        )
    rows: list[Row] = []
    if culprit is not None and culprit.id == PROCESS_ROW[0]:
        rows.append(
            Row(PROCESS_ROW[0], "process", PROCESS_ROW[1], FAIL, culprit.detail, PROCESS_ROW[2])
        )
    for check in checks:
        if check.id in finished:
            rows.append(finished[check.id])
        elif culprit is not None and check.id == culprit.id:
            rows.append(
                Row(check.id, check.group, check.title, FAIL, culprit.detail, check.contract)
            )
        else:
            why = (
                f"not run: the check process ended at {culprit.id}"
                if culprit
                else "not reported by the check process"
            )
            rows.append(Row(check.id, check.group, check.title, SKIPPED, why))
    return Report(runtime, platform, rows, note)


# -- the terminal table ------------------------------------------------------------------------
_COLOURS = {PASS: "32", FAIL: "1;31", MISSING: "33", SKIPPED: "2"}


def use_colour(stream: TextIO, environ: Mapping[str, str] | None = None) -> bool:
    """Colour only on a terminal, and never when ``NO_COLOR`` is set to anything non-empty."""
    environ = os.environ if environ is None else environ
    if environ.get("NO_COLOR"):
        return False
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False


def _paint(text: str, code: str | None, colour: bool) -> str:
    return f"\x1b[{code}m{text}\x1b[0m" if colour and code else text


def render_table(report: Report, colour: bool = False) -> str:
    """The report as the terminal shows it: a heading, one line per row, the summary line."""
    lines = []
    platform = report.platform
    if platform:
        source = platform.get("distribution") or "built in"
        lines.append(
            f"check-platform: {report.runtime} runtime, platform {platform['key']} "
            f"({platform['qualname']}, {source})"
        )
        lines.append(f"  selected by {platform['reason']}")
        if report.note:
            lines.append(f"  ({report.note})")
    else:
        lines.append(
            f"check-platform: {report.runtime} runtime, platform not reported by the check process"
        )
    width = max(len(row.id) for row in report.rows)
    group = None
    for row in report.rows:
        if row.group != group:
            lines.append("")
            group = row.group
        status = _paint(f"{row.status:<7}", _COLOURS.get(row.status), colour)
        lines.append(f"  {status}  {row.id:<{width}}  {row.detail}")
        if row.status == FAIL and row.expected:
            lines.append(f"  {'':<7}  {'':<{width}}  expected: {row.expected}")
    lines.append("")
    lines.append(_paint(report.summary(), _COLOURS[PASS] if report.ok else _COLOURS[FAIL], colour))
    return "\n".join(lines) + "\n"
