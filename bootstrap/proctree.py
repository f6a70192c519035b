"""Stopping process trees: SIGTERM, a grace period, then SIGKILL of whatever is left.

A worker may have children of its own (compile workers, data loaders, an HTTP server's
processes); once the worker is dead they are re-parented and nobody would find them, so the whole
tree is collected with psutil *before* anything is signalled, and each member is watched through
a pidfd (Linux; the wait wakes the moment a process exits, with no polling and no risk of a
recycled pid) or, elsewhere, by polling psutil. Only pids collected from the given roots are ever
signalled, never a process group, and never this process or one of its ancestors. Before the
SIGKILL a tree is frozen (SIGSTOP, round after round until no new descendant turns up), so a
worker that starts processes nonstop leaves none behind.
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
from collections.abc import Iterable

import psutil

# Set in every worker's starting environment to its launch's runtime directory, so every
# process of the launch carries it (``sweep_strays``).
TREE_VARIABLE = "SGLANG_LAUNCH_TREE"

_POLL = 0.005  # seconds between checks where pidfds are not available
_FREEZE_ROUNDS = 200  # a tree that keeps forking faster than it is frozen is cut off here
_STOP_WAIT = 0.2  # seconds a process that was sent SIGSTOP gets to stop
_HALTED = (
    psutil.STATUS_STOPPED,
    psutil.STATUS_TRACING_STOP,
    psutil.STATUS_ZOMBIE,
    psutil.STATUS_DEAD,
)


class Tree:
    """A set of processes, each pinned by a pidfd where the platform has them."""

    def __init__(self, roots: list[int]) -> None:
        self.members: dict[int, tuple[psutil.Process, int | None]] = {}
        self._protected = _protected()
        self.roots = [pid for pid in roots if pid]
        for pid in self.roots:
            self.add(pid)
            self.add_descendants(pid)

    def add(self, pid: int) -> None:
        if pid in self.members or pid in self._protected:
            return
        try:
            proc = psutil.Process(pid)
        except psutil.NoSuchProcess:
            return
        fd = None
        if hasattr(os, "pidfd_open"):
            try:
                fd = os.pidfd_open(pid)
            except ProcessLookupError:
                return
            except OSError:
                fd = None
        self.members[pid] = (proc, fd)

    def add_descendants(self, pid: int) -> None:
        try:
            children = psutil.Process(pid).children(recursive=True)
        except psutil.NoSuchProcess:
            return
        for child in children:
            self.add(child.pid)

    def alive(self) -> list[int]:
        return [pid for pid, (proc, fd) in self.members.items() if _running(proc, fd)]

    def freeze(self) -> None:
        """SIGSTOP every live member, take in their descendants, and again, until a round finds
        no new process: a stopped process cannot fork, so a frozen tree has nothing left that
        could start a process between the last look and the SIGKILL that follows."""
        stopped: set[int] = set()
        for _ in range(_FREEZE_ROUNDS):
            new = [pid for pid in self.alive() if pid not in stopped]
            if not new:
                return
            self.signal(new, signal.SIGSTOP)
            stopped.update(new)
            _settle(self.members[pid][0] for pid in new)
            for pid in new:
                self.add_descendants(pid)

    def kill(self) -> None:
        """SIGKILL the whole tree, frozen first (see ``freeze``)."""
        self.freeze()
        self.signal(self.alive(), signal.SIGKILL)

    def signal(self, pids: list[int], sig: int) -> None:
        for pid in pids:
            proc, fd = self.members[pid]
            try:
                if fd is not None and hasattr(signal, "pidfd_send_signal"):
                    signal.pidfd_send_signal(fd, sig)
                elif proc.is_running():
                    proc.send_signal(sig)
            except (ProcessLookupError, psutil.NoSuchProcess):
                pass
            except OSError:
                pass  # exited between the check and the signal

    async def wait(self, timeout: float) -> list[int]:
        """Wait until every member exited or ``timeout`` passed; return the pids still alive."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        alive = self.alive()
        fds: dict[int, int] = {}
        for pid in alive:
            fd = self.members[pid][1]
            if fd is not None:
                fds[fd] = pid
        if len(fds) == len(alive) and alive:
            changed = asyncio.Event()
            for fd in fds:
                loop.add_reader(fd, changed.set)
            try:
                while alive and loop.time() < deadline:
                    try:
                        await asyncio.wait_for(changed.wait(), deadline - loop.time())
                    except TimeoutError:
                        break
                    changed.clear()
                    alive = self.alive()
                    for fd, pid in list(fds.items()):
                        if pid not in alive:
                            loop.remove_reader(fd)
                            del fds[fd]
            finally:
                for fd in fds:
                    loop.remove_reader(fd)
            return self.alive()
        while alive and loop.time() < deadline:
            await asyncio.sleep(_POLL)
            alive = self.alive()
        return alive

    def close(self) -> None:
        for _, fd in self.members.values():
            if fd is not None:
                os.close(fd)
        self.members.clear()


def _settle(procs: Iterable[psutil.Process], timeout: float = _STOP_WAIT) -> None:
    """Wait until each of ``procs`` is stopped or gone (``timeout`` s at most: a process in
    uninterruptible sleep stops later, and cannot fork meanwhile)."""
    waiting = list(procs)
    deadline = time.monotonic() + timeout
    while waiting and time.monotonic() < deadline:
        still = []
        for proc in waiting:
            try:
                if proc.status() not in _HALTED:
                    still.append(proc)
            except psutil.NoSuchProcess:
                pass
        waiting = still
        if waiting:
            time.sleep(0.001)


def _running(proc: psutil.Process, fd: int | None) -> bool:
    if fd is not None:
        import select

        readable, _, _ = select.select([fd], [], [], 0)
        return not readable
    try:
        return proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _protected() -> set[int]:
    """This process and its ancestors: never signalled, whatever a caller passes."""
    pids = {os.getpid()}
    try:
        pids.update(p.pid for p in psutil.Process().parents())
    except psutil.Error:
        pass
    return pids


async def stop_trees(
    roots: list[int], grace: float, kill_wait: float = 5.0, hurry: asyncio.Event | None = None
) -> float:
    """SIGTERM ``roots``, wait up to ``grace`` for their whole trees, SIGKILL the rest.

    Returns the seconds it took. Descendants get SIGTERM only through their root (a worker
    stops its own children); whatever is still alive after the grace period, descendants that
    appeared meanwhile included, gets SIGKILL. Once ``hurry`` is set the grace period is over.
    """
    started = time.monotonic()
    tree = Tree(roots)
    try:
        tree.signal([pid for pid in tree.roots if pid in tree.members], signal.SIGTERM)
        left = await _wait_unless_hurried(tree, grace, hurry)
        if left:
            tree.kill()
            await tree.wait(kill_wait)
    finally:
        tree.close()
    return time.monotonic() - started


async def kill_trees(roots: list[int], kill_wait: float = 5.0) -> float:
    """SIGKILL ``roots`` and every descendant at once, with no grace period (for processes that
    hold nothing to drain, such as workers still starting); wait up to ``kill_wait`` for them to
    be gone. Returns the seconds it took."""
    started = time.monotonic()
    tree = Tree(roots)
    try:
        tree.kill()
        await tree.wait(kill_wait)
    finally:
        tree.close()
    return time.monotonic() - started


async def _wait_unless_hurried(tree: Tree, grace: float, hurry: asyncio.Event | None) -> list[int]:
    """``tree.wait(grace)``, cut short the moment ``hurry`` is set; the pids still alive."""
    if hurry is None:
        return await tree.wait(grace)
    if hurry.is_set():
        return tree.alive()
    waiting = asyncio.ensure_future(tree.wait(grace))
    hurried = asyncio.ensure_future(hurry.wait())
    try:
        await asyncio.wait({waiting, hurried}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in (waiting, hurried):
            task.cancel()
        await asyncio.gather(waiting, hurried, return_exceptions=True)
    return tree.alive()


def _multiprocessing_helpers() -> set[int]:
    """Pids of the multiprocessing helpers this process started (resource tracker, forkserver)."""
    import sys

    pids = set()
    for module_name, attr in (
        ("multiprocessing.resource_tracker", "_resource_tracker"),
        ("multiprocessing.forkserver", "_forkserver"),
    ):
        module = sys.modules.get(module_name)
        helper = getattr(module, attr, None) if module is not None else None
        pid = getattr(helper, "_pid", None) or getattr(helper, "_forkserver_pid", None)
        if pid:
            pids.add(pid)
    return pids


async def sweep_adopted(workers: set[int], timeout: float = 2.0) -> list[int]:
    """End and reap what this process adopted as a subreaper: the orphans of workers that died.

    ``workers`` are the pids of the children this process started itself; those and the
    multiprocessing helpers are left alone. Every other child, with its whole tree, gets SIGKILL
    and is reaped (within ``timeout``). Returns the pids that were swept.
    """
    from bootstrap import orphan

    spare = set(workers) | _multiprocessing_helpers()
    swept: list[int] = []
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while loop.time() < deadline:
        adopted = orphan.adopted_children(spare)
        if not adopted:
            break
        for pid in adopted:
            if pid not in swept:
                swept.append(pid)
            orphan.kill_tree(pid, include_root=True)
        orphan.reap(adopted)
        if orphan.adopted_children(spare):
            await asyncio.sleep(_POLL)
    return swept


def sweep_strays(tag: str) -> list[int]:
    """End what dead workers left outside this process's tree: every process that started with
    ``TREE_VARIABLE=tag`` in its environment (the launch's workers and everything they start
    inherit it) and is neither this process nor under it, frozen and SIGKILLed with whatever it
    started. A supervisor that is no subreaper (the embedded ``Launcher``) finds a SIGKILLed
    worker's children and ``setsid`` grandchildren this way, wherever they were re-parented.
    Returns the pids that were swept."""
    from bootstrap import orphan

    found = orphan.strays(os.getpid(), TREE_VARIABLE, tag)
    for pid in found:
        orphan.kill_tree(pid, include_root=True)
    return found
