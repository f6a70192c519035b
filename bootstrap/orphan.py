"""Orphan protection: no process of a child's tree may outlive its supervisor, even a SIGKILLed one.

A worker's own children (a compile pool, a tokenizer process, ``subprocess.Popen``) and their
double-forked, ``setsid`` descendants are code the launcher never sees. ``arm(parent_pid)`` makes
the worker answer for all of them:

1. Linux: the worker becomes a *child subreaper* (``PR_SET_CHILD_SUBREAPER``), so a descendant
   whose own parent exits is re-parented to the worker instead of to pid 1: the worker's
   descendants stay findable under it for as long as it lives, ``setsid`` or not.
2. Linux: a *guard* process is forked from the worker before it starts any thread (so before any
   runtime code runs). The guard ignores every catchable signal, dies with the worker
   (``PR_SET_PDEATHSIG``), and waits on a pidfd of the supervisor. When the supervisor exits, the
   guard freezes the worker's whole tree (SIGSTOP of the worker, then of its descendants, round
   after round until no new process turns up: a stopped process cannot fork), then SIGKILLs all
   of it. It needs nothing from the worker's interpreter, so a worker whose main thread is stuck
   holding the GIL, or one stopped with SIGSTOP, is ended all the same, and a worker that starts
   processes as fast as it can leaves none behind.
3. Everywhere: a daemon thread in the worker watches the supervisor (pidfd on Linux, a kqueue
   process-exit event on macOS and BSD, ``os.getppid()`` polling elsewhere) and, where no guard
   is alive to do it, does the same from inside: SIGKILL of the worker's descendants (frozen
   first), then of the worker.

The worker itself gets no ``PR_SET_PDEATHSIG`` while a guard is armed: the kernel would kill it
the instant the supervisor dies and hand its children to pid 1 before anyone could end them (the
one ``bootstrap.early_guard`` arms before this module's code can run is lifted once the guard
stands).
Without a guard (no ``fork``, or the fork failed) the worker falls back to
``PR_SET_PDEATHSIG(SIGKILL)`` and the watch thread, as before.

``end_descendants(grace)`` is the last step of a worker that exits on its own or on request:
whatever is still running under it gets SIGTERM, then SIGKILL after ``grace`` seconds, and is
reaped. ``become_subreaper()`` and ``adopted_children()`` let a supervisor take care of what a
worker that died abruptly leaves behind; ``strays()`` finds it wherever it went, for a
supervisor that is no subreaper (one embedded in an application), by a variable of the
environment every process of the launch starts with.

Standard library only; the process tree is read from ``/proc``.
"""

from __future__ import annotations

import ctypes
import os
import select
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterable

from bootstrap.phases import EXIT_PARENT_GONE

_PR_SET_PDEATHSIG = 1
_PR_SET_NAME = 15
_PR_SET_CHILD_SUBREAPER = 36
_POLL_SECONDS = 0.5
_KILL_ROUNDS = 200  # a tree that keeps forking faster than it is frozen is cut off here
_STOP_WAIT = 0.2  # seconds a process that was sent SIGSTOP gets to stop
_HALTED = ("T", "t", "Z", "X")  # /proc states of a process that runs no more code
_GUARD_WAIT = 10.0  # seconds the watch thread leaves a live guard to end the tree
_GUARD_NAME = b"sglang-guard"

_guard_pid: int | None = None  # the guard forked by arm() in this process, if any


def _prctl(option: int, arg: int) -> bool:
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return int(libc.prctl(option, arg, 0, 0, 0)) == 0
    except (OSError, AttributeError):
        return False


def _die() -> None:
    # SIGKILL, the same end the guard gives, so every line looks alike to anyone watching.
    os.kill(os.getpid(), getattr(signal, "SIGKILL", signal.SIGTERM))


def set_parent_death_signal() -> bool:
    """Ask the kernel to SIGKILL this process when its parent dies; False where unsupported."""
    return _prctl(_PR_SET_PDEATHSIG, int(getattr(signal, "SIGKILL", 9)))


def become_subreaper() -> bool:
    """Make this process the reaper of its orphaned descendants (Linux); False where unsupported.

    A subreaper must reap what it adopts: see ``adopted_children`` and ``reap``.
    """
    return _prctl(_PR_SET_CHILD_SUBREAPER, 1)


# ------------------------------------------------------------------------------ the process tree
def _process_table() -> dict[int, tuple[int, str]]:
    """``{pid: (ppid, state)}`` of every process this one can see in ``/proc`` (Linux)."""
    table: dict[int, tuple[int, str]] = {}
    try:
        if os.readlink("/proc/self") != str(os.getpid()):
            return table  # a /proc of another PID namespace: its pids are not ours to act on
        names = os.listdir("/proc")
    except OSError:
        return table
    for name in names:
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as fh:
                data = fh.read()
        except OSError:
            continue  # exited meanwhile
        # "pid (comm) state ppid ...": comm may hold spaces and parentheses; the last ")" ends it.
        fields = data[data.rfind(b")") + 2 :].split()
        if len(fields) >= 2:
            table[int(name)] = (int(fields[1]), fields[0].decode())
    return table


def children_of(pid: int, *, zombies: bool = False) -> list[int]:
    """The direct children of ``pid`` (Linux; [] elsewhere), zombies only when asked."""
    return [
        child
        for child, (ppid, state) in _process_table().items()
        if ppid == pid and (zombies or state != "Z")
    ]


def descendants(root: int) -> list[int]:
    """Every live (non-zombie) descendant of ``root``, parents before their children."""
    table = _process_table()
    kids: dict[int, list[int]] = {}
    for pid, (ppid, state) in table.items():
        if state != "Z":
            kids.setdefault(ppid, []).append(pid)
    found, queue = [], list(kids.get(root, ()))
    while queue:
        pid = queue.pop(0)
        found.append(pid)
        queue.extend(kids.get(pid, ()))
    return found


def _signal_all(pids: Iterable[int], sig: int) -> None:
    for pid in pids:
        try:
            os.kill(pid, sig)
        except (ProcessLookupError, PermissionError):
            pass


def _settled(pids: Iterable[int], timeout: float = _STOP_WAIT) -> None:
    """Wait until every one of ``pids`` is stopped, a zombie or gone (``timeout`` s at most: a
    process in uninterruptible sleep, such as a ``vfork`` parent whose child is stopped before
    its ``exec``, stops only later, and cannot fork meanwhile)."""
    waiting = set(pids)
    deadline = time.monotonic() + timeout
    while waiting and time.monotonic() < deadline:
        table = _process_table()
        waiting = {pid for pid in waiting if pid in table and table[pid][1] not in _HALTED}
        if waiting:
            time.sleep(0.001)


def freeze_tree(root: int, *, include_root: bool, spare: tuple[int, ...] = ()) -> set[int]:
    """SIGSTOP ``root`` (if asked) and every descendant of it, round after round, until a round
    finds no process it has not stopped; return the pids stopped.

    A stopped process cannot fork: once it has stopped, a fork it was making has either
    finished (the child is found by the next round) or is abandoned, so a tree frozen this way
    has nothing left that could start a process between the last look and a SIGKILL. ``spare``
    pids are left running (the caller itself)."""
    stopped: set[int] = set()
    if include_root:
        _signal_all([root], signal.SIGSTOP)
        stopped.add(root)
        _settled([root])
    for _ in range(_KILL_ROUNDS):
        new = [pid for pid in descendants(root) if pid not in stopped and pid not in spare]
        if not new:
            break
        _signal_all(new, signal.SIGSTOP)
        stopped.update(new)
        _settled(new)
    return stopped


def kill_tree(root: int, *, include_root: bool, spare: tuple[int, ...] = ()) -> None:
    """SIGKILL every descendant of ``root``, then ``root`` if asked: the tree is frozen first
    (``freeze_tree``), so no process it starts meanwhile escapes.

    Meant for a ``root`` that is a subreaper: what a killed process leaves behind is re-parented
    to ``root`` and found by the next round. ``spare`` pids are left alone (the caller itself).
    A ``root`` that is the caller cannot be frozen; its own other threads are the caller's care.
    """
    frozen = freeze_tree(root, include_root=include_root, spare=spare)
    _signal_all([pid for pid in frozen if pid != root], signal.SIGKILL)
    if include_root:
        _signal_all([root], signal.SIGKILL)
    for _ in range(_KILL_ROUNDS):
        left = [pid for pid in descendants(root) if pid not in spare]
        if not left:
            break
        _signal_all(left, signal.SIGKILL)
        time.sleep(0.001)


def reap(pids: Iterable[int] | None = None) -> None:
    """Collect the exit status of exited children (``pids``, or any), without blocking."""
    if pids is None:
        while True:
            try:
                pid, _ = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
    for pid in pids:
        try:
            os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:
            pass


def end_descendants(grace: float) -> None:
    """End whatever still runs under this process: SIGTERM, up to ``grace`` s, SIGKILL, reap.

    The last step of a worker on its way out; the guard is left to die with the worker.
    """
    if not sys.platform.startswith("linux"):
        return
    me, spare = os.getpid(), (_guard_pid,) if _guard_pid else ()
    left = [pid for pid in descendants(me) if pid not in spare]
    if not left:
        return
    _signal_all(left, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline:
        if not [pid for pid in descendants(me) if pid not in spare]:
            break
        time.sleep(0.02)
    kill_tree(me, include_root=False, spare=spare)
    deadline = time.monotonic() + 1.0
    while time.monotonic() < deadline:
        zombies = [pid for pid in children_of(me, zombies=True) if pid not in spare]
        if not zombies:
            break
        reap(zombies)
        time.sleep(0.002)


def strays(root: int, variable: str, value: str) -> list[int]:
    """The processes whose environment, as they started, holds ``variable=value`` and that are
    neither ``root`` nor under it (Linux; [] elsewhere): what a launch's dead worker left behind
    wherever it was re-parented, when every process of the launch carries that variable. Only
    processes this one may read are found."""
    needle = f"{variable}={value}".encode()
    carrying = []
    try:
        if os.readlink("/proc/self") != str(os.getpid()):
            return []  # a /proc of another PID namespace: its pids are not ours to act on
        names = os.listdir("/proc")
    except OSError:
        return []
    for name in names:
        if not name.isdigit() or int(name) == root:
            continue
        try:
            with open(f"/proc/{name}/environ", "rb") as fh:
                if needle in fh.read().split(b"\0"):
                    carrying.append(int(name))
        except OSError:
            continue  # exited meanwhile, or not ours to read
    # Read after the scan: a process started since is no candidate, and one started between the
    # scan and this read is placed in the tree as it is now.
    table = _process_table()
    return [pid for pid in carrying if pid in table and not _under(pid, root, table)]


def _under(pid: int, root: int, table: dict[int, tuple[int, str]]) -> bool:
    """Whether ``root`` is an ancestor of ``pid`` in ``table``."""
    seen: set[int] = set()
    while pid in table and pid not in seen:
        seen.add(pid)
        pid = table[pid][0]
        if pid == root:
            return True
    return False


def adopted_children(known: Iterable[int]) -> list[int]:
    """This process's children that it did not start itself (``known`` pids aside): processes
    re-parented to it as a subreaper, zombies included."""
    return [pid for pid in children_of(os.getpid(), zombies=True) if pid not in set(known)]


# ------------------------------------------------------------------------------ waiting
def _wait_pidfd(parent_pid: int, still_parent: Callable[[], bool]) -> bool:
    """Block until ``parent_pid`` exits; False if a pidfd cannot be had."""
    if not hasattr(os, "pidfd_open"):
        return False
    try:
        fd = os.pidfd_open(parent_pid)
    except OSError:
        return False
    try:
        if not still_parent():  # died (and maybe reused) before the pidfd was opened
            return True
        poller = select.poll()
        poller.register(fd, select.POLLIN)
        while not poller.poll():
            pass
        return True
    finally:
        os.close(fd)


def _wait_kqueue(parent_pid: int, still_parent: Callable[[], bool]) -> bool:
    """Block until ``parent_pid`` exits (macOS, BSD); False if kqueue cannot watch it."""
    if sys.platform == "linux" or not hasattr(select, "kqueue"):
        return False
    try:
        kq = select.kqueue()
        event = select.kevent(
            parent_pid,
            filter=select.KQ_FILTER_PROC,
            flags=select.KQ_EV_ADD | select.KQ_EV_ONESHOT,
            fflags=select.KQ_NOTE_EXIT,
        )
        kq.control([event], 0, 0)
    except OSError:
        return False
    try:
        if not still_parent():
            return True
        while not kq.control(None, 1, None):
            pass
        return True
    finally:
        kq.close()


def _wait_polling(parent_pid: int, still_parent: Callable[[], bool]) -> bool:
    while still_parent():
        time.sleep(_POLL_SECONDS)
    return True


def _wait_for_exit(parent_pid: int, still_parent: Callable[[], bool]) -> None:
    for wait in (_wait_pidfd, _wait_kqueue, _wait_polling):
        if wait(parent_pid, still_parent):
            return


def _watch(parent_pid: int, subreaper: bool) -> None:
    _wait_for_exit(parent_pid, lambda: os.getppid() == parent_pid)
    # A live guard ends this process and its tree from outside, frozen first. Doing it from in
    # here as well could end this process before the guard froze what it started, and the guard
    # with it: this line acts only when the guard does not.
    deadline = time.monotonic() + _GUARD_WAIT
    while _guard_pid is not None and _running(_guard_pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    if subreaper:
        kill_tree(os.getpid(), include_root=False, spare=(_guard_pid,) if _guard_pid else ())
    _die()


def _running(pid: int) -> bool:
    """Whether ``pid`` exists and is no zombie (Linux; False elsewhere)."""
    entry = _process_table().get(pid)
    return entry is not None and entry[1] not in ("Z", "X")


def watch_parent(parent_pid: int, *, subreaper: bool = False) -> threading.Thread:
    """Start the daemon thread that ends this process (and its tree, for a subreaper) when
    ``parent_pid`` exits."""
    thread = threading.Thread(
        target=_watch, args=(parent_pid, subreaper), name="bootstrap-parent-watch", daemon=True
    )
    thread.start()
    return thread


# ------------------------------------------------------------------------------ the guard
def _parent_of(pid: int) -> int | None:
    entry = _process_table().get(pid)
    return entry[0] if entry else None


def _guard(worker: int, parent_pid: int) -> None:
    """The guard's whole life (in the forked process): wait for the supervisor, end the tree."""
    _prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL))
    if os.getppid() != worker:
        return
    try:  # "sglang-guard" in ps -o comm and top; the command line stays the worker's
        ctypes.CDLL(None).prctl(_PR_SET_NAME, ctypes.c_char_p(_GUARD_NAME), 0, 0, 0)
    except (OSError, AttributeError):
        pass
    for sig in signal.valid_signals():
        if sig in (signal.SIGKILL, signal.SIGSTOP, signal.SIGCHLD):
            continue
        try:
            signal.signal(sig, signal.SIG_IGN)
        except (OSError, ValueError):
            pass
    # Hold nothing of the worker's: its multiprocessing sentinel pipe, sockets, files.
    devnull = os.open(os.devnull, os.O_RDWR)
    os.dup2(devnull, 0)
    os.dup2(devnull, 1)
    os.close(devnull)
    os.closerange(3, 1 << 20)
    _wait_for_exit(parent_pid, lambda: _parent_of(worker) == parent_pid)
    kill_tree(worker, include_root=True, spare=(os.getpid(),))


def _start_guard(parent_pid: int) -> int | None:
    """Fork the guard of this process; its pid, or None when it cannot be had."""
    if not hasattr(os, "fork") or not sys.platform.startswith("linux"):
        return None
    if threading.active_count() > 1:
        return None  # forking a threaded process is unsafe; the other lines still hold
    worker = os.getpid()
    try:
        pid = os.fork()
    except OSError:
        return None
    if pid == 0:
        try:
            _guard(worker, parent_pid)
        finally:
            os._exit(0)
    return pid


def arm(
    parent_pid: int | None = None, *, death_signal: bool = True, guard: bool = True
) -> dict[str, bool]:
    """Arm orphan protection for a process whose parent is ``parent_pid``.

    Exits the process at once with ``EXIT_PARENT_GONE`` when the parent is no longer
    ``parent_pid``. Once a guard stands, a parent-death signal armed earlier (``early_guard``)
    is lifted. ``guard=False`` forks no guard and ``death_signal=False`` leaves out
    PR_SET_PDEATHSIG (tests of the other lines). Returns which lines are armed:
    ``{"subreaper", "guard", "death_signal", "watch_thread"}``.
    """
    global _guard_pid
    expected = os.getppid() if parent_pid is None else parent_pid
    armed = {"subreaper": become_subreaper(), "guard": False, "death_signal": False}
    if os.getppid() != expected:
        os._exit(EXIT_PARENT_GONE)
    if guard and armed["subreaper"]:
        _guard_pid = _start_guard(expected)
        armed["guard"] = _guard_pid is not None
    if armed["guard"]:
        # The guard ends this process and its tree: a death signal armed before (``early_guard``)
        # would end this process alone, first, and leave what it started to pid 1.
        _prctl(_PR_SET_PDEATHSIG, 0)
    elif death_signal:
        armed["death_signal"] = set_parent_death_signal()
        if os.getppid() != expected:
            os._exit(EXIT_PARENT_GONE)
    watch_parent(expected, subreaper=armed["subreaper"])
    armed["watch_thread"] = True
    return armed
