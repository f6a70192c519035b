"""What a scheduler does about its failed steps: who is to blame, when to try again, what to log,
and when to give up. One policy for both runtimes (``serving.scheduler.BatchingScheduler``).

The rules (``docs/operating.md``, "A step that fails"):

- **Blame.** A failure whose traceback runs through a plugin's hook is that plugin's
  (``hooks.blame``): the requests it fails are told ``the plugin 'myplug' (AROUND hook on
  Scheduler.get_next_batch_to_run) raised RuntimeError: policy bug``; a seam that returned
  something unusable (``StepResultError``) is blamed on the hook that decides what it returns; any
  other failure is the model's (``the model failed on this batch: ...``).
- **Backoff.** After a failed step the next one waits ``BACKOFF_FIRST_S``, doubling with each
  consecutive failure up to ``BACKOFF_MAX_S``; the scheduler keeps receiving meanwhile (pings,
  cancellations, new requests). A step that succeeds ends the run of failures.
- **Bounded logs.** A failure is logged with its traceback the first time; the same failure again
  (same culprit, type, message and place) within ``LOG_WINDOW_S`` is only counted, and the count
  is logged in one line when the window has passed and it comes back, or when another failure
  comes.
- **Giving up.** ``FAILED_STEPS_LIMIT`` consecutive failed steps make the scheduler unhealthy
  (``exhausted``): it answers every request it holds, refuses new ones with a 503 naming the
  failure, and reports to the supervisor, which restarts the replica or stops the launch.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

import hooks
from hooks import Culprit

# Consecutive failed steps after which a scheduler is unhealthy.
FAILED_STEPS_LIMIT = 5
# The wait before the step after a failed one, doubling per consecutive failure, at most the max.
BACKOFF_FIRST_S = 0.1
BACKOFF_MAX_S = 2.0
# The same failure is logged with its traceback at most once per window (repeats are counted).
LOG_WINDOW_S = 60.0


class StepResultError(TypeError):
    """A seam of the step returned something the scheduler cannot use; ``culprit`` is the hook
    that decided the value (None: the runtime's own code)."""

    def __init__(self, message: str, culprit: Culprit | None) -> None:
        super().__init__(message)
        self.culprit = culprit


def check_batch(batch: object, cls: type) -> None:
    """``StepResultError`` unless ``batch`` (what ``cls.get_next_batch_to_run`` returned) is None
    or has ``reqs``, a list or tuple of the step's requests."""
    if batch is None or isinstance(getattr(batch, "reqs", None), (list, tuple)):
        return
    culprit = hooks.result_culprit(cls, "get_next_batch_to_run")
    who = culprit.describe() if culprit else f"{cls.__name__}.get_next_batch_to_run"
    raise StepResultError(
        f"{who} returned {type(batch).__name__} {_short(batch)}, not a batch: it must return None "
        "(nothing runs this turn) or an object whose reqs is a list of the step's requests",
        culprit,
    )


def _short(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


@dataclass(frozen=True)
class StepFailure:
    """One failed step: ``message`` (what its requests are told), ``culprit`` (the hook to
    blame, None for the model) and ``key`` (equal for the same failure again)."""

    message: str
    culprit: Culprit | None
    key: tuple[object, ...]


def describe(exc: BaseException) -> StepFailure:
    """Who failed the step with ``exc``, and what its requests are told."""
    culprit = exc.culprit if isinstance(exc, StepResultError) else hooks.blame(exc)
    error = f"{type(exc).__name__}: {exc}"
    if isinstance(exc, StepResultError):
        message = str(exc)
    elif culprit is not None:
        message = f"{culprit.describe()} raised {error}"
    else:
        message = f"the model failed on this batch: {error}"
    tb = exc.__traceback__
    while tb is not None and tb.tb_next is not None:
        tb = tb.tb_next
    where = (tb.tb_frame.f_code.co_filename, tb.tb_lineno) if tb is not None else None
    return StepFailure(message, culprit, (culprit, type(exc), str(exc), where))


class StepFailures:
    """The failed-step policy of one scheduler (the module docstring): ``failed(exc)`` after a
    failed step, ``succeeded()`` after a good one; ``due()`` says whether a step may run now,
    ``wait_s()`` how long until it may, ``exhausted`` whether the scheduler gives up."""

    def __init__(self, log: logging.Logger, limit: int = FAILED_STEPS_LIMIT) -> None:
        self.log = log
        self.limit = limit
        self.consecutive = 0
        self.total = 0
        self.retry_at = 0.0  # monotonic time before which no step runs
        self.last: StepFailure | None = None
        self._logged_key: tuple[object, ...] | None = None
        self._logged_at = 0.0
        self._repeats = 0  # of the logged failure, since it was logged

    @property
    def exhausted(self) -> bool:
        return self.consecutive >= self.limit

    def due(self) -> bool:
        return self.retry_at == 0.0 or time.monotonic() >= self.retry_at

    def wait_s(self) -> float:
        return max(0.0, self.retry_at - time.monotonic()) if self.retry_at else 0.0

    def succeeded(self) -> None:
        if self.consecutive:
            self.consecutive = 0
            self.retry_at = 0.0

    def failed(self, exc: BaseException, requests: int) -> StepFailure:
        """Count the failed step (``requests``: how many it fails), log it under the rules above
        and set the backoff; returns what its requests are told."""
        failure = describe(exc)
        self.last = failure
        self.consecutive += 1
        self.total += 1
        delay = min(BACKOFF_MAX_S, BACKOFF_FIRST_S * 2 ** (self.consecutive - 1))
        now = time.monotonic()
        self.retry_at = now + delay
        self._log(failure, exc, requests, now)
        return failure

    @property
    def reason(self) -> str:
        """Why the scheduler gave up (once ``exhausted``)."""
        last = self.last.message if self.last else "no failure recorded"
        return f"{self.consecutive} steps in a row failed; the last: {last}"

    def _log(self, failure: StepFailure, exc: BaseException, requests: int, now: float) -> None:
        if failure.key == self._logged_key and now - self._logged_at < LOG_WINDOW_S:
            self._repeats += 1
            return
        self._flush_repeats(now)
        if failure.key == self._logged_key:  # the window passed: one line, no traceback
            self.log.error(
                "a step of %d request(s) failed again: %s (%d steps failed in a row)",
                requests,
                failure.message,
                self.consecutive,
            )
        else:
            self.log.error(
                "a step of %d request(s) failed: %s (the same failure is logged once per %g s "
                "and counted)",
                requests,
                failure.message,
                LOG_WINDOW_S,
                exc_info=exc,
            )
        self._logged_key, self._logged_at, self._repeats = failure.key, now, 0

    def _flush_repeats(self, now: float) -> None:
        if self._repeats and self.last is not None:
            self.log.error(
                "the failure logged %.0f s ago happened %d more time(s) since",
                now - self._logged_at,
                self._repeats,
            )
        self._repeats = 0

    def close(self) -> None:
        """Log the repeats not logged yet (the scheduler gives up or stops)."""
        self._flush_repeats(time.monotonic())
