"""``Launcher``: the supervisor embedded in an application.

``Launcher(server_args=None, **fields)`` runs the same ``launcher.supervisor.Supervisor`` the CLI
runs, on a uvloop loop in a background thread of its own: the application keeps its main thread,
its signal handlers and its multiprocessing start method. A failed start raises ``LaunchError``
(with the root cause) in the application, after every child is gone; nothing ever signals the
application's own process.

Module scope is standard library only, because ``spawn`` children re-run the application's module
scope: ``from launcher import Launcher`` must stay cheap there. The supervisor's imports (zmq,
psutil, uvloop, bootstrap) happen in ``start()``.
"""

from __future__ import annotations

import atexit
import concurrent.futures
import dataclasses
import queue
import re
import threading
import weakref
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any, TypeVar

from launchspec.causes import ExitCode, LaunchError, RootCause

if TYPE_CHECKING:
    from launcher.supervisor.supervisor import LaunchOutcome, Supervisor
    from launchspec.events import Event
    from launchspec.server_args import ServerArgs

_T = TypeVar("_T")

_live: weakref.WeakSet[Launcher] = (
    weakref.WeakSet()
)  # started and not yet stopped, for the exit hook


class Launcher:
    """Start, watch and stop one launch from Python.

    - ``start()`` returns once every worker is ready; ``start(wait=False)`` returns at once and
      ``wait_ready(timeout)`` waits later. Both raise ``LaunchError`` if the launch fails.
    - ``status()`` is the ops snapshot (what ``sglang-launch status --json`` prints);
      ``events()`` yields it first and then every event until the launch ends, each as the JSON
      object the ops socket publishes (``launchspec.events.from_dict`` makes it its struct).
    - ``reload(model_path=None, served_model_name=None)`` replaces the replicas one at a time
      (fresh processes; another model when given) and ``scale(dp_size)`` adds or removes
      replicas, both while the server serves; each returns the change's last event once it is
      done, raises ``LaunchError`` with the root cause when it failed (a failed reload is rolled
      back first) and ``ValueError`` (``launcher.supervisor.revision.ChangeRefused``) when it
      cannot be made, a reload to a model of another kind included (embedding, generation,
      image) unless ``allow_kind_change=True``.
    - ``stop()`` stops gracefully (HTTP child first, then schedulers) and returns when every
      child process is gone. ``with Launcher(...) as launcher:`` starts, waits and stops.
    """

    def __init__(self, server_args: ServerArgs | None = None, **fields: Any) -> None:
        if server_args is not None and fields:
            raise TypeError("pass either a ServerArgs instance or its field values, not both")
        self._given = server_args
        self._fields = fields
        self.server_args: ServerArgs | None = None
        self._supervisor: Supervisor | None = None
        self._thread: threading.Thread | None = None
        self._settled = threading.Event()  # set when ready, or when the launch ended
        self._outcome: LaunchOutcome | None = None
        self._subscribers: list[queue.Queue[dict[str, object]]] = []
        self._lock = threading.Lock()

    # ------------------------------------------------------------------ lifecycle
    def start(self, wait: bool = True, timeout: float | None = None) -> Launcher:
        if self._thread is not None:
            raise RuntimeError(
                "this Launcher was already started; create a new Launcher to launch again"
            )
        from launcher import prepare as _prepare
        from launcher.supervisor.supervisor import Supervisor

        try:
            args = self._build_args()
            selection, payload = _prepare.finish(args)
        except LaunchError as exc:
            raise LaunchError(in_python_spelling(exc.root_cause)) from exc
        self.server_args = args
        self._supervisor = Supervisor(args, selection, payload=payload, listeners=(self._on_event,))
        self._thread = threading.Thread(
            target=self._run, name="sglang-launch-supervisor", daemon=True
        )
        _live.add(self)
        self._thread.start()
        if wait:
            self.wait_ready(timeout)
        return self

    def wait_ready(self, timeout: float | None = None) -> None:
        """Return once every worker is ready; ``LaunchError`` if the launch failed or stopped."""
        if self._thread is None:
            raise RuntimeError("call start() before wait_ready()")
        if not self._settled.wait(timeout):
            raise TimeoutError(
                f"not every worker was ready within {timeout}s; the launch goes on until its own "
                "startup_timeout: call wait_ready() again, or stop() to give up"
            )
        outcome = self._outcome
        if outcome is None:
            return
        if outcome.root_cause is not None:
            raise LaunchError(outcome.root_cause)
        raise LaunchError(
            RootCause(
                summary="the launch was stopped before every worker was ready",
                exit_code=ExitCode.OK,
            )
        )

    def stop(self, timeout: float | None = None) -> None:
        """Stop gracefully and return when every child is gone (a no-op if not running)."""
        if self._thread is None:
            return
        self._started().request_stop("Launcher.stop() called")
        self._thread.join(timeout)
        if self._thread.is_alive():
            raise TimeoutError(
                f"the launch did not stop within {timeout}s; call stop() again to keep waiting"
            )
        _live.discard(self)

    def reload(
        self,
        model_path: str | None = None,
        served_model_name: str | None = None,
        timeout: float | None = None,
        *,
        allow_kind_change: bool = False,
    ) -> dict[str, object]:
        """Replace every replica, one at a time, with a fresh one serving ``model_path`` as
        ``served_model_name`` (None keeps each; ``""`` goes back to the default); returns the
        ``reload.finished`` event. A failure is rolled back, then raised as ``LaunchError``. A
        model that serves another kind than the current one (an embedding model for a causal
        LM, say) is refused with ``ValueError`` unless ``allow_kind_change``."""
        import os

        path = os.path.abspath(os.path.expanduser(model_path)) if model_path else model_path
        return self._change(
            lambda rollouts: rollouts.start_reload(
                path,
                served_model_name,
                "Launcher.reload()",
                allow_kind_change=allow_kind_change,
            ),
            timeout,
        )

    def scale(self, dp_size: int, timeout: float | None = None) -> dict[str, object]:
        """Run ``dp_size`` replicas: new ones take requests once they answered one, removed ones
        (the newest) finish what they hold first; returns the ``scale.finished`` event, raises
        ``LaunchError`` when a new replica failed (those added before it stay)."""
        return self._change(
            lambda rollouts: rollouts.start_scale(dp_size, "Launcher.scale()"), timeout
        )

    def _change(self, start: Callable[[Any], Any], timeout: float | None) -> dict[str, object]:
        import concurrent.futures

        from launchspec import events

        if self._thread is None or self._outcome is not None:
            raise RuntimeError("the launch is not running; start() it first")
        supervisor = self._started()
        supervisor.opened.wait()
        done = supervisor.request_change(start)
        try:
            event = done.result(timeout)
        except concurrent.futures.TimeoutError:
            raise TimeoutError(
                f"the change did not end within {timeout}s; it goes on (status() shows it)"
            ) from None
        except concurrent.futures.CancelledError:
            raise LaunchError(
                RootCause(summary="the launch stopped during the change", exit_code=ExitCode.OK)
            ) from None
        if isinstance(event, (events.ReloadFailed, events.ScaleFailed)):
            raise LaunchError(in_python_spelling(event.root_cause))
        return events.to_dict(event)

    def __enter__(self) -> Launcher:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # ------------------------------------------------------------------ state
    @property
    def url(self) -> str | None:
        url = self.status().get("url")
        return url if isinstance(url, str) else None

    @property
    def outcome(self) -> LaunchOutcome | None:
        """The ``LaunchOutcome`` once the launch ended (exit code, root cause, final snapshot), else None."""
        return self._outcome

    def status(self) -> dict[str, object]:
        """The current ops snapshot: server phase, URL, platform, and every worker's record."""
        if self._thread is None:
            raise RuntimeError("call start() before status()")
        supervisor = self._started()
        snapshot = self._in_loop(lambda: _snapshot(supervisor))
        return snapshot if snapshot is not None else self._final_snapshot()

    def events(
        self, follow: bool = True, timeout: float | None = None
    ) -> Iterator[dict[str, object]]:
        """Yield ``{"topic": "snapshot", ...}`` (the current state), then each event as it happens.

        Ends after ``server.stopped``, at once when ``follow`` is false, or when no event came
        for ``timeout`` seconds.
        """
        if self._thread is None:
            raise RuntimeError("call start() before events()")
        inbox: queue.Queue[dict[str, object]] = queue.Queue()

        supervisor = self._started()

        # In the loop thread: no event falls between the snapshot and the subscription.
        def subscribe() -> dict[str, object]:
            snapshot = _snapshot(supervisor)
            with self._lock:
                self._subscribers.append(inbox)
            return snapshot

        snapshot = self._in_loop(subscribe)
        if snapshot is None:
            yield _snapshot_event(self._final_snapshot())
            return
        try:
            yield _snapshot_event(snapshot)
            while follow:
                try:
                    event = inbox.get(timeout=timeout)
                except queue.Empty:
                    return
                yield event
                if event["topic"] == "server.stopped":
                    return
        finally:
            with self._lock:
                if inbox in self._subscribers:
                    self._subscribers.remove(inbox)

    # ------------------------------------------------------------------ internals
    def _started(self) -> Supervisor:
        """The supervisor, which ``start()`` made."""
        if self._supervisor is None:
            raise RuntimeError("call start() first")
        return self._supervisor

    def _build_args(self) -> ServerArgs:
        from launcher import prepare as _prepare

        args = self._given
        runtime = args.runtime if args is not None else self._fields.get("runtime")
        _prepare.load_plugins(runtime or "srt")  # before the ServerArgs class is looked up
        if args is None:
            args = _prepare.build_args(
                lambda: _prepare.server_args_class()(**self._fields), self._fields
            )
        return args

    def _run(self) -> None:
        from launcher.supervisor.supervisor import LaunchOutcome, run_supervisor

        try:
            outcome = run_supervisor(self._started())
        except LaunchError as exc:  # set-up failed before any worker was started
            outcome = LaunchOutcome(exc.exit_code, in_python_spelling(exc.root_cause), {})
        except BaseException as exc:  # noqa: BLE001 - delivered to the application as LaunchError
            import traceback

            cause = RootCause(
                summary="the supervisor itself failed",
                exit_code=ExitCode.SETUP_FAILED,
                error_type=type(exc).__name__,
                message=str(exc),
                traceback="".join(traceback.format_exception(exc)),
            )
            state = self._started().state
            outcome = LaunchOutcome(int(cause.exit_code), cause, state.snapshot() if state else {})
        self._outcome = outcome
        self._settled.set()

    def _on_event(self, event: Event) -> None:
        from launchspec import events

        if isinstance(event, events.ServerReady):
            self._settled.set()
        with self._lock:
            subscribers = list(self._subscribers)
        if subscribers:
            data = events.to_dict(event)
            for inbox in subscribers:
                inbox.put(data)

    def _in_loop(self, fn: Callable[[], _T]) -> _T | None:
        """Run ``fn`` on the supervisor's loop and return its result; None once the loop is gone."""
        supervisor = self._started()
        supervisor.opened.wait()
        loop = supervisor.loop
        if loop is None or self._outcome is not None:
            return None
        future: concurrent.futures.Future[_T] = concurrent.futures.Future()

        def call() -> None:
            try:
                future.set_result(fn())
            except BaseException as exc:  # noqa: BLE001
                future.set_exception(exc)

        try:
            loop.call_soon_threadsafe(call)
        except RuntimeError:  # closed meanwhile
            return None
        while not future.done():
            try:
                return future.result(timeout=0.1)
            except concurrent.futures.TimeoutError:
                if self._outcome is not None:
                    return None
        return future.result()

    def _final_snapshot(self) -> dict[str, object]:
        self._settled.wait()
        if self._thread is not None:
            self._thread.join()
        return self._outcome.snapshot if self._outcome is not None else {}


# ``--flag`` and the value or placeholder written after it: a quoted text, a number, or an
# upper-case placeholder such as PATH, N or HOST:PORT.
_FLAG = re.compile(
    r"--(?P<flag>[a-z][a-z0-9]*(?:-[a-z0-9]+)*)"
    r"(?: (?P<value>'[^']*'|\"[^\"]*\"|-?\d+(?:\.\d+)?(?:e-?\d+)?\b|[A-Z][A-Z0-9_:]*\b))?"
)


def in_python_spelling(cause: RootCause) -> RootCause:
    """``cause`` as the embedding API spells it: ``--model-path '/x'`` becomes
    ``model_path='/x'``, ``--port N`` becomes ``port=N`` and a bare ``--host`` becomes ``host``,
    for every flag that names a ``ServerArgs`` field (what the CLI checks say in the CLI's
    spelling, an application passes as keyword arguments)."""
    from launcher import prepare as _prepare

    try:
        names = {f.name for f in dataclasses.fields(_prepare.server_args_class())}
    except Exception:  # noqa: BLE001 - no class, no translation: the CLI spelling still says it
        return cause

    def respell(match: re.Match[str]) -> str:
        name = match["flag"].replace("-", "_")
        if name not in names:
            return str(match[0])
        return f"{name}={match['value']}" if match["value"] is not None else name

    def text(value: str | None) -> str | None:
        return _FLAG.sub(respell, value) if value else value

    return dataclasses.replace(
        cause,
        summary=text(cause.summary) or cause.summary,
        message=text(cause.message),
        hint=text(cause.hint),
    )


def _snapshot(supervisor: Supervisor) -> dict[str, object]:
    """The running supervisor's snapshot (called once it has opened, in its loop's thread)."""
    state = supervisor.state
    if state is None:
        raise RuntimeError("the supervisor has no state yet")
    return state.snapshot()


def _snapshot_event(snapshot: dict[str, object]) -> dict[str, object]:
    return {"topic": "snapshot", "seq": snapshot.get("seq", 0), "snapshot": snapshot}


@atexit.register
def _stop_on_exit() -> None:
    """An application that exits without ``stop()`` still takes its workers down with it."""
    for launcher in list(_live):
        try:
            launcher.stop(timeout=60)
        except Exception:  # noqa: BLE001 - exiting anyway
            pass
