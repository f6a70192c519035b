"""``run(spec)``: the spawn target that starts every child, in the order the spec requires.

Steps, each reported as the phase it reaches, with its duration:

1. ``spawned``: arm orphan protection (before anything else), apply ``spec.env``, connect the
   status reporter, warn about runtime modules already imported;
2. ``platform_initialized``: pin the supervisor's platform selection, ``initialize_current_platform()``
   (selection plus ``init_backend()``) of the spec's runtime;
3. ``plugins_loaded``: register the runtime's general plugins (no hook target is resolved yet);
4. ``hooks_applied``: apply the registered hooks (target imports are allowed from here on);
5. ``args_materialized``: look the ServerArgs class up (after hooks, so a REPLACE applies) and
   decode the payload into it;
6. ``worker_imported``: resolve the worker target by dotted path (after hooks);
7. call ``target(server_args, ctx)``; the worker reports ``ready`` through ``ctx``.

Any exception sends a ``failed`` message (phase, type, message, traceback), waits for it to be
delivered, and exits with ``EXIT_CODES[phase]``. SIGTERM sets ``ctx.stopping``; a worker that
returns after that makes the child exit 0. A SIGTERM that arrives before the worker runs ends the
start-up at once, also with 0. With a ``spec.stop_marker``, only the supervisor's ordered SIGTERM
counts (it creates the marker first); one sent to the whole process group or cgroup is ignored.
SIGINT is ignored, and SIGHUP, SIGQUIT, SIGUSR1 and SIGUSR2 are caught and ignored: on Ctrl-C or a
hangup the supervisor orders the shutdown.
The bootstrap ends the process itself (``os._exit``), so a stray non-daemon thread cannot keep a
finished child alive.
"""

from __future__ import annotations

import importlib
import logging
import os
import signal
import sys
import threading
import time
import traceback
from dataclasses import dataclass
from types import FrameType
from typing import TYPE_CHECKING

from bootstrap import orphan, phases
from bootstrap.context import StopEvent, WorkerContext
from bootstrap.early_imports import early_imports, warning_text
from bootstrap.spec import ProcessSpec
from bootstrap.targets import resolve

if TYPE_CHECKING:
    from collections.abc import Callable

    from bootstrap.manifest import Manifest
    from bootstrap.reporter import Heartbeat, Reporter
    from hooks import PluginRuntime

log = logging.getLogger("bootstrap")

# Seconds a worker's leftover descendants get between SIGTERM and SIGKILL when it exits.
_DESCENDANT_GRACE = 1.0
_SIGTERM_BYTE = bytes([signal.SIGTERM])  # what the signal wakeup fd receives for a SIGTERM


@dataclass(frozen=True)
class RuntimeSteps:
    """One runtime's platform module (its ``current_platform``) and plugin loading (its two
    phases), as a child runs them."""

    platforms: str
    plugins: PluginRuntime


def runtime_steps(runtime: str) -> RuntimeSteps:
    """One runtime's steps, read from the runtime table when a child needs them.

    ``import bootstrap`` stays standard-library only: the table and ``hooks`` are imported here,
    in the child.
    """
    import hooks
    from platforms.runtimes import runtime_spec

    return RuntimeSteps(runtime_spec(runtime).platform_module, hooks.runtime(runtime))


class _StopRequested(BaseException):
    """SIGTERM arrived before the worker target started: end the start-up cleanly."""


class WorkerReturned(RuntimeError):
    """The worker target returned although nobody asked it to stop."""


class PlatformMismatch(RuntimeError):
    """The child selected another platform than the supervisor handed it."""


class _ChildState:
    """This child process's own record while ``run`` drives it: its spec, the phase it works
    towards, its reporter and heartbeat, and the stop request."""

    def __init__(self, spec: ProcessSpec) -> None:
        self.spec = spec
        self.started = time.monotonic()
        self.mark = self.started
        self.working_on = phases.SPAWNED
        self.reached = "started"
        self.reporter: Reporter | None = None
        self.heartbeat: Heartbeat | None = None
        self.stopping = StopEvent()
        self.stop_requested = False  # set by the handler itself; ``stopping`` follows it
        self._relay: int | None = None  # the write end of the stop relay's pipe
        self._relay_pid = 0  # the process whose thread reads it
        self.worker_running = False
        self.exiting = False
        self.platform_key = spec.platform_key or ""
        self.ctx: WorkerContext | None = None

    # -- signals -------------------------------------------------------------------------------
    def stop_ordered(self) -> bool:
        """False for a SIGTERM the supervisor did not order: with a stop marker that does not
        exist yet while the supervisor is still the parent, it came from a signal sent to the
        whole process group or cgroup (systemd's KillMode=control-group, ``kill -TERM -PGID``).
        The supervisor got it too and stops this child in its turn; if it died instead, the
        orphan guard acts."""
        marker = self.spec.stop_marker
        return not (marker and not os.path.exists(marker) and os.getppid() == self.spec.parent_pid)

    def on_sigterm(self, signum: int, frame: FrameType | None) -> None:
        if not self.stop_ordered():
            log.info("%s: ignored a SIGTERM that the supervisor did not order", self.spec.worker_id)
            return
        # The handler never takes ``stopping``'s lock: it runs on the main thread between two
        # bytecodes, perhaps while that thread holds it (inside ``stopping.wait()``), and
        # ``set()`` would then wait for it forever. ``request()`` takes no lock; a thread sets it.
        self.stop_requested = True
        self.stopping.request()
        if self._relay is not None and os.getpid() == self._relay_pid:
            try:
                os.write(self._relay, b"s")
            except OSError:  # the relay is gone, or its pipe full: it has the stop already
                pass
        else:  # no relay, or a process forked from this child, which has no relay thread
            self.stopping.set()
        if not self.worker_running and not self.exiting:
            raise _StopRequested()

    def start_stop_relay(self) -> None:
        """Start the thread that sets ``stopping`` on an ordered SIGTERM, whether or not this
        handler ever runs.

        The thread reads the interpreter's signal wakeup fd, where CPython's C-level handler
        writes the signal's number as it lands, in whichever thread the kernel chose. The Python
        handler runs later, on the main thread, when that thread next checks for pending work;
        CPython 3.11 can lose that check for good: a signal noted while another thread takes
        the GIL leaves it pending with nothing telling the main thread to look, and a main
        thread that runs Python code without ever waiting for the GIL (a worker polling
        ``stopping`` in a tight loop) then never runs the handler. The handler also writes to
        the pipe, for a worker that has put a wakeup fd of its own in place of this one."""
        read_end, self._relay = os.pipe()
        self._relay_pid = os.getpid()
        os.set_blocking(self._relay, False)  # as set_wakeup_fd requires
        relay_fd = self._relay
        signal.set_wakeup_fd(relay_fd, warn_on_full_buffer=False)

        def forget_in_fork() -> None:
            # A process forked from this child shares the pipe: its signals are its own.
            try:
                previous = signal.set_wakeup_fd(-1)
                if previous != relay_fd:  # the worker's own: leave it in place
                    signal.set_wakeup_fd(previous)
            except ValueError:  # forked from a thread Python does not count as the main one
                pass

        os.register_at_fork(after_in_child=forget_in_fork)

        def relay() -> None:
            while True:
                got = os.read(read_end, 64)
                if self.stop_requested or (_SIGTERM_BYTE in got and self.stop_ordered()):
                    break
            self.stop_requested = True
            self.stopping.request()
            self.stopping.set()

        threading.Thread(target=relay, name="sglang-launch-stop-relay", daemon=True).start()

    # -- reporting -----------------------------------------------------------------------------
    def reached_phase(self, name: str, **extra: object) -> None:
        now = time.monotonic()
        duration, self.mark = now - self.mark, now
        self.reached = name
        log.debug("%s reached %s in %.3fs", self.spec.worker_id, name, duration)
        if self.reporter is not None:
            self.reporter.send(
                "Phase", phase=name, duration=duration, elapsed=now - self.started, **extra
            )

    def report_from_worker(
        self, kind: str, name: str, duration: float, info: dict[str, object] | None
    ) -> None:
        self.reached = name
        elapsed = time.monotonic() - self.started
        if self.reporter is None:  # set_up() connects it before any worker code runs
            return
        if kind == "ready":  # delivered before ctx.ready() returns: the worker may die next
            self.reporter.deliver(
                "Ready",
                platform=self.platform_key,
                duration=duration,
                elapsed=elapsed,
                info=info,
                manifest=self.manifest(),
            )
        else:
            self.reporter.send("Phase", phase=name, duration=duration, elapsed=elapsed)

    def manifest(self) -> Manifest | None:
        """What this process has of platform and plugins (None, logged, if it cannot be read:
        the report must still go out)."""
        from bootstrap.manifest import collect

        try:
            return collect(self.spec.runtime)
        except Exception:  # noqa: BLE001 - informative; readiness does not depend on it
            log.warning(
                "%s: could not collect its plugin manifest", self.spec.worker_id, exc_info=True
            )
            return None

    # -- steps ---------------------------------------------------------------------------------
    def set_up(self) -> None:
        os.environ.update({str(k): str(v) for k, v in self.spec.env.items()})
        if self.spec.aliases:  # before a platform's activate() or a plugin imports SGLang's names
            from hooks import compat

            compat.install(self.spec.aliases)
        from bootstrap.reporter import Reporter

        self.reporter = Reporter(self.spec.status_endpoint, self.spec.worker_id)

    def start_heartbeat(self) -> None:
        """Beat from now on (after ``spawned``: a child's first message is its ``spawned``
        phase, whatever the interval and however loaded the machine)."""
        from bootstrap.reporter import Heartbeat

        assert self.reporter is not None
        if self.spec.heartbeat_interval > 0:
            self.heartbeat = Heartbeat(
                self.reporter,
                self.spec.heartbeat_interval,
                lambda: self.reached,
                self.started,
                self.busy_s,
            )

    def busy_s(self) -> float:
        """How long the worker's current unit of work has run (``ctx.busy_since``), 0 when none."""
        since = self.ctx.busy_since if self.ctx is not None else None
        return time.monotonic() - since if since is not None else 0.0

    def initialize_platform(self, steps: RuntimeSteps) -> None:
        if self.spec.entry_points is not None:
            importlib.import_module("platforms.entrypoints").seed(self.spec.entry_points)
        platforms = importlib.import_module(steps.platforms)
        if self.spec.platform_key:
            platforms.pin_selection(self.spec.platform_key)
        elif self.spec.serving_fallback:
            platforms.use_serving_fallback()
        platforms.initialize_current_platform()
        selection = platforms.current_selection()
        if self.spec.platform_key and selection.key != self.spec.platform_key:
            raise PlatformMismatch(
                f"the supervisor selected platform {self.spec.platform_key!r} but this child "
                f"selected {selection.key!r}; set the same SGLANG_PLATFORM / "
                "SGLANG_DIFFUSION_PLATFORM_OVERRIDE for both"
            )
        self.platform_key = selection.key

    # -- the whole run -------------------------------------------------------------------------
    def run(self) -> None:
        spec = self.spec
        try:
            # First of all (``early_guard`` covered what ran before): no work of this child may
            # outlive a SIGKILLed supervisor. Inside the try: a SIGTERM meanwhile is a stop too.
            orphan.arm(spec.parent_pid)
            found_early = early_imports(spec.target)
            steps = runtime_steps(spec.runtime)
            self.set_up()
            # Only now: the orphan guard was forked from a process without threads.
            self.start_stop_relay()
            if found_early:
                log.warning(warning_text(spec.worker_id, found_early))
            self.reached_phase(phases.SPAWNED, early_imports=found_early)
            self.start_heartbeat()

            self.working_on = phases.PLATFORM_INITIALIZED
            self.initialize_platform(steps)
            self.reached_phase(phases.PLATFORM_INITIALIZED)

            self.working_on = phases.PLUGINS_LOADED
            steps.plugins.register_plugins()
            self.reached_phase(phases.PLUGINS_LOADED)

            self.working_on = phases.HOOKS_APPLIED
            steps.plugins.apply_plugin_hooks()
            self.reached_phase(phases.HOOKS_APPLIED)

            self.working_on = phases.ARGS_MATERIALIZED
            from bootstrap.payload import decode_payload

            server_args = decode_payload(spec.payload, resolve(spec.args_class))
            self.reached_phase(phases.ARGS_MATERIALIZED)

            self.working_on = phases.WORKER_IMPORTED
            target = resolve(spec.target)
            if not callable(target):
                raise TypeError(
                    f"worker target {spec.target!r} is a {type(target).__name__}, not a function; "
                    "point it at a callable taking (server_args, ctx)"
                )
            self.reached_phase(phases.WORKER_IMPORTED)

            self.working_on = phases.READY
            self.ctx = WorkerContext(
                role=spec.role,
                rank=spec.rank,
                local_rank=spec.local_rank,
                world_size=spec.world_size,
                tp_size=spec.tp_size,
                dp_size=spec.dp_size,
                runtime_dir=spec.runtime_dir,
                ops_endpoint=spec.ops_endpoint,
                query_endpoint=spec.query_endpoint,
                platform=self.platform_key,
                stopping=self.stopping,
                _report=self.report_from_worker,
                _report_failure=self.report_failure,
                _mark=self.mark,
            )
            self.worker_running = True
            if self.stop_requested:  # a SIGTERM raced the last step
                raise _StopRequested()
            target(server_args, self.ctx)
            self.worker_running = False
            if not self.stop_requested:
                raise WorkerReturned(
                    f"worker target {spec.target} returned before the supervisor asked it to "
                    "stop; a worker must run until ctx.stopping is set"
                )
        except _StopRequested:
            self.finish_stopped()
        except SystemExit as exc:
            if exc.code in (None, 0) and self.stop_requested:
                self.finish_stopped()
            self.fail(exc)
        except BaseException as exc:  # noqa: BLE001 - every failure is reported, then we exit
            self.fail(exc)
        self.finish_stopped()

    def failing_phase(self) -> str:
        if self.working_on != phases.READY:
            return self.working_on
        if self.stop_requested:
            return phases.STOPPING
        if self.ctx is not None and self.ctx.is_ready:
            return phases.SERVING
        return phases.READY

    def failure_report(self, exc: BaseException, phase: str) -> dict[str, object]:
        """The fields of a ``Failed`` report of ``exc`` in ``phase``."""
        exc_type = type(exc)
        type_name = exc_type.__qualname__
        if exc_type.__module__ not in ("builtins", "__main__"):
            type_name = f"{exc_type.__module__}.{type_name}"
        message = str(exc)
        if isinstance(exc, SystemExit):
            message = f"the worker called sys.exit({exc.code!r})"
        return {
            "phase": phase,
            "exc_type": type_name,
            "message": message,
            "traceback": "".join(traceback.format_exception(exc_type, exc, exc.__traceback__)),
            "exit_code": phases.EXIT_CODES[phase],
            "elapsed": time.monotonic() - self.started,
            "exc_types": _qualified_names(exc_type),
        }

    def report_failure(self, exc: BaseException) -> None:
        """``ctx.report_failure``: a ``Failed`` report of ``exc`` (``alive``), delivered while
        the worker goes on running; also one line on stderr."""
        report = self.failure_report(exc, self.failing_phase())
        sys.stderr.write(
            f"{self.spec.worker_id} failed while {phases.DOING[str(report['phase'])]}: "
            f"{report['exc_type']}: {report['message']} (reported to the supervisor)\n"
        )
        if self.reporter is not None:
            self.reporter.deliver("Failed", 5.0, alive=True, **report)

    def fail(self, exc: BaseException) -> None:
        self.exiting = True
        phase = self.failing_phase()
        code = phases.EXIT_CODES[phase]
        report = self.failure_report(exc, phase)
        type_name, message, tb = report["exc_type"], report["message"], report["traceback"]
        reported = False
        if self.reporter is not None:
            try:
                self.reporter.send("Failed", **report)
                reported = True
            except Exception:  # noqa: BLE001 - the exit code still tells the supervisor
                traceback.print_exc()
        # The traceback is printed once: by the supervisor, from the report. This process's
        # stderr gets it only when no report could be sent; otherwise one line, and none for a
        # failure after a stop request (the supervisor decides whether that is worth a word).
        headline = (
            f"{self.spec.worker_id} failed while {phases.DOING[phase]} (phase {phase}, exit {code})"
        )
        if not reported:
            sys.stderr.write(f"{headline}:\n{tb}")
        elif phase != phases.STOPPING:
            sys.stderr.write(f"{headline}: {type_name}: {message} (reported to the supervisor)\n")
        self.exit(code)

    def finish_stopped(self) -> None:
        self.exiting = True
        if self.reporter is not None:
            try:
                info = self.ctx.stop_info if self.ctx is not None else {}
                self.reporter.send("Stopped", elapsed=time.monotonic() - self.started, info=info)
            except Exception:  # noqa: BLE001
                traceback.print_exc()
        self.exit(0)

    def exit(self, code: int) -> None:
        try:  # what the worker started and did not stop (adopted orphans included) goes too
            orphan.end_descendants(_DESCENDANT_GRACE)
        except Exception:  # noqa: BLE001 - the exit code must still reach the supervisor
            traceback.print_exc()
        if self.heartbeat is not None:
            self.heartbeat.stop()
        if self.reporter is not None:
            try:
                self.reporter.close()
            except Exception:  # noqa: BLE001
                traceback.print_exc()
        logging.shutdown()
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except Exception:  # noqa: BLE001 - a closed stream must not change the exit code
                pass
        os._exit(code)


def _qualified_names(exc_type: type[BaseException]) -> list[str]:
    """``module.QualName`` of ``exc_type`` and of every class above it, up to ``BaseException``."""
    return [
        f"{cls.__module__}.{cls.__qualname__}"
        for cls in exc_type.__mro__
        if issubclass(cls, BaseException) and cls is not BaseException
    ]


def _configure_logging(spec: ProcessSpec) -> None:
    """This child's records, its libraries' and Python's warnings in the launch's one format
    (``sglang-launch: WORKER LEVEL LOGGER: MESSAGE``, ``bootstrap.logformat``)."""
    from bootstrap.logformat import configure_child_logging

    configure_child_logging(spec.worker_id, spec.log_level)


# Signals a whole process group gets (a terminal hangup, Ctrl-\\, kill -USR1 -PGID) that would end
# a child by default: caught and ignored (caught, not SIG_IGN, so the worker's own children start
# with the default again).
_GROUP_SIGNALS = ("SIGHUP", "SIGQUIT", "SIGUSR1", "SIGUSR2")


def _quiet_stop_requests(
    previous: Callable[[sys.UnraisableHookArgs], object],
) -> Callable[[sys.UnraisableHookArgs], None]:
    """An unraisable-exception hook that drops the stop request a SIGTERM raised where Python
    cannot propagate it (a ``__del__``, an at-fork callback): ``stop_requested`` holds it, and
    the start-up ends at its next step. Anything else goes to ``previous``."""

    def hook(unraisable: sys.UnraisableHookArgs) -> None:
        if not isinstance(unraisable.exc_value, _StopRequested):
            previous(unraisable)

    return hook


def _ignore_group_signal(signum: int, frame: FrameType | None) -> None:
    log.debug("ignored signal %d: the supervisor decides when this child stops", signum)


def run(spec: ProcessSpec) -> None:
    """Start one child as ``spec`` says; never returns (the process ends with the child's code)."""
    child = _ChildState(spec)
    _configure_logging(spec)
    if hasattr(signal, "SIGINT"):
        signal.signal(signal.SIGINT, signal.SIG_IGN)
    for name in _GROUP_SIGNALS:  # a terminal's hangup or Ctrl-\ is for the supervisor to handle
        if hasattr(signal, name):
            signal.signal(getattr(signal, name), _ignore_group_signal)
    sys.unraisablehook = _quiet_stop_requests(sys.unraisablehook)
    try:
        signal.signal(signal.SIGTERM, child.on_sigterm)
        child.run()
    except _StopRequested:  # a stop that landed outside run()'s own try
        child.finish_stopped()
