"""Where a running launcher keeps its IPC endpoints and how tools find it.

Every launcher owns a private runtime directory (mode 0700) holding its ZeroMQ ``ipc://``
endpoints, a state file next to it naming those endpoints, and a lock file that it holds
(``flock``) for as long as it runs, so ``sglang-launch status`` and ``sglang-launch events`` can
find a launcher knowing at most its pid. All three live in the state directory:

- ``$XDG_RUNTIME_DIR/sglang-launch`` when ``XDG_RUNTIME_DIR`` is set (it must be yours and
  private: an error names the fix otherwise);
- else ``<tmp>/sglang-launch-<uid>``, if it is a real directory owned by this user (its mode is
  tightened to 0700);
- else, when that path was taken by someone else (a directory of another user or a symlink in a
  shared, sticky tmp), ``~/.cache/sglang-launch-run``, with a warning naming the hostile path.

A directory is named ``<pid>-<random>``, so launchers that are all pid 1 in their own PID
namespaces never pick the same name. Whether its launcher still runs is decided by the lock,
never by the pid (a pid means nothing across namespaces): a launcher removes its entries on exit;
one that was SIGKILLed leaves them behind, unlocked, and the next launcher or reader removes them.
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import secrets
import shutil
import stat
import tempfile
import threading
from pathlib import Path
from typing import NotRequired, TypedDict

import msgspec

log = logging.getLogger("launcher")


class LauncherRecord(TypedDict):
    """A running launcher's state file: its pid, URL, node, runtime directory, endpoints and
    (redacted) command line; ``state_file`` is added by the readers of this module."""

    pid: int
    started_at: float
    url: str | None
    node_rank: int
    runtime_dir: str
    ops_endpoint: str
    query_endpoint: str
    argv: list[str]
    state_file: NotRequired[str]


# sockaddr_un holds 108 bytes; keep room for the longest endpoint name.
_MAX_IPC_PATH = 100
_LONGEST_ENDPOINT = "scheduler-000-000"
_FALLBACK = Path("~/.cache/sglang-launch-run")

_claimed: set[str] = set()  # runtime directory names held by launchers of this process
_claim_lock = threading.Lock()


class RuntimeDirError(RuntimeError):
    """The state directory is unusable (not ours, not private, read-only, full, path too long)."""


_FIX_UNWRITABLE = (
    "make {base} writable and free some space there, or set XDG_RUNTIME_DIR to another private "
    "directory of yours (mkdir -m 700 DIR)"
)


def _private_dir(base: Path) -> str | None:
    """Create ``base`` (0700) if missing; None when it is a directory of ours (mode fixed),
    else why it cannot be used."""
    try:
        base.mkdir(mode=0o700, parents=True, exist_ok=True)
    except FileExistsError:
        pass  # a symlink to nowhere or a file: described below
    except OSError as exc:
        return f"cannot create it ({exc.strerror or exc})"
    try:
        info = base.lstat()
    except OSError as exc:
        return f"cannot inspect it ({exc.strerror or exc})"
    if stat.S_ISLNK(info.st_mode):
        return "it is a symbolic link"
    if not stat.S_ISDIR(info.st_mode):
        return "it is not a directory"
    if info.st_uid != os.getuid():
        return f"it belongs to another user (uid {info.st_uid})"
    if info.st_mode & 0o077:
        try:
            os.chmod(base, 0o700)
        except OSError as exc:
            return f"it is open to others (mode {info.st_mode & 0o777:o}) and cannot be made private ({exc.strerror or exc})"
    return None


def state_dir() -> Path:
    """The per-user directory of state files, lock files and runtime directories (0700)."""
    xdg = os.environ.get("XDG_RUNTIME_DIR")
    if xdg:
        base = Path(xdg) / "sglang-launch"
        problem = _private_dir(base)
        if problem:
            raise RuntimeDirError(
                f"cannot use the launcher state directory {base}: {problem}; set XDG_RUNTIME_DIR "
                "to a private directory of yours (mkdir -m 700 DIR), or unset it"
            )
        return base
    base = Path(tempfile.gettempdir()) / f"sglang-launch-{os.getuid()}"
    problem = _private_dir(base)
    if problem is None:
        return base
    fallback = _FALLBACK.expanduser()
    other = _private_dir(fallback)
    if other:
        raise RuntimeDirError(
            f"cannot use the launcher state directory {base} ({problem}) nor {fallback} ({other}); "
            "set XDG_RUNTIME_DIR to a private directory of yours (mkdir -m 700 DIR)"
        )
    log.warning(
        "not using %s (%s): state kept in %s instead; set XDG_RUNTIME_DIR to choose",
        base,
        problem,
        fallback,
    )
    return fallback


def pid_alive(pid: int) -> bool:
    """Whether a process ``pid`` exists in this PID namespace (a hint only, see ``launcher_alive``)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _lock_is_held(lock_path: Path) -> bool:
    """Whether a live launcher holds ``lock_path`` (False when it is missing or free)."""
    try:
        fd = os.open(lock_path, os.O_RDONLY)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    except OSError:
        return False
    finally:
        os.close(fd)
    return False


def launcher_alive(state: LauncherRecord) -> bool:
    """Whether the launcher of a state (from ``running_launchers``) still runs: its lock is held."""
    return _lock_is_held(Path(state["state_file"]).with_suffix(".lock"))


class RuntimeDir:
    """One launcher's private directory, state file and held lock; ``remove()`` deletes them."""

    def __init__(self) -> None:
        base = state_dir()
        sweep_stale(base)
        try:
            self._claim(base)
        except OSError as exc:
            raise RuntimeDirError(
                f"cannot create a runtime directory in the launcher state directory {base}: "
                f"{exc.strerror or exc}; {_FIX_UNWRITABLE.format(base=base)}"
            ) from exc
        if len(str(self.path / _LONGEST_ENDPOINT)) > _MAX_IPC_PATH:
            self.remove()
            raise RuntimeDirError(
                f"the runtime directory {self.path} is too long for a unix socket path; "
                "set XDG_RUNTIME_DIR to a shorter directory"
            )

    def _claim(self, base: Path) -> None:
        """Create and lock a fresh lock file, then the runtime directory it stands for."""
        pid = os.getpid()
        with _claim_lock:
            while True:
                name = f"{pid}-{secrets.token_hex(4)}"
                if name in _claimed:
                    continue
                lock_path = base / f"{name}.lock"
                try:
                    fd = os.open(lock_path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
                except FileExistsError:
                    continue
                fcntl.flock(fd, fcntl.LOCK_EX)
                try:
                    same = os.fstat(fd).st_ino == os.stat(lock_path).st_ino
                except FileNotFoundError:
                    same = False  # a sweeper took it for stale in between: pick another name
                if not same:
                    os.close(fd)
                    continue
                path = base / name
                try:
                    path.mkdir(mode=0o700)
                except OSError:
                    _unlink(lock_path)
                    os.close(fd)
                    raise
                _claimed.add(name)
                break
        self._lock_fd: int | None = fd
        self.name = name
        self.path = path
        self.state_file = base / f"{name}.json"
        self.lock_file = lock_path

    def endpoint(self, name: str) -> str:
        return f"ipc://{self.path / name}"

    def write_state(self, state: LauncherRecord) -> None:
        """Write the state file atomically (readers never see half of it); ``RuntimeDirError``
        when the state directory takes no file (read-only, full)."""
        tmp = self.state_file.with_suffix(".tmp")
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            with os.fdopen(fd, "w") as f:
                json.dump(state, f, indent=1)
            os.replace(tmp, self.state_file)
        except OSError as exc:
            _unlink(tmp)
            base = self.state_file.parent
            raise RuntimeDirError(
                f"cannot write the state file {self.state_file}: {exc.strerror or exc}; "
                f"{_FIX_UNWRITABLE.format(base=base)}"
            ) from exc

    def remove(self) -> None:
        """Delete the directory and the state file, then release and delete the lock."""
        _remove(self.path, self.state_file)
        _unlink(self.lock_file)
        if self._lock_fd is not None:
            os.close(self._lock_fd)
            self._lock_fd = None
        with _claim_lock:
            _claimed.discard(self.name)


def _unlink(path: Path) -> None:
    """Remove ``path`` if it is there and can be removed (a read-only directory keeps it)."""
    try:
        path.unlink()
    except OSError:
        pass


def _remove(path: Path, state_file: Path) -> None:
    for leftover in (state_file, state_file.with_suffix(".tmp")):
        _unlink(leftover)
    shutil.rmtree(path, ignore_errors=True)


def sweep_stale(base: Path) -> None:
    """Remove the entries of launchers that are gone: a lock file nobody holds, and a runtime
    directory or state file with no lock file at all (a live launcher creates its lock first)."""
    names = set()
    for entry in base.iterdir():
        stem = entry.name.split(".", 1)[0]
        if stem and stem[0].isdigit():
            names.add(stem)
    for name in names:
        lock_path = base / f"{name}.lock"
        try:
            fd = os.open(lock_path, os.O_RDWR)
        except FileNotFoundError:
            _remove(base / name, base / f"{name}.json")
            continue
        except OSError:
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            continue  # held: its launcher runs
        try:
            _remove(base / name, base / f"{name}.json")
            _unlink(lock_path)
        finally:
            os.close(fd)


class NoLauncherError(RuntimeError):
    """No running launcher matches, or several do and the caller must choose."""


def running_launchers() -> list[LauncherRecord]:
    """The state of every running launcher of this user (stale entries are swept first)."""
    base = state_dir()
    sweep_stale(base)
    found: list[LauncherRecord] = []
    for path in sorted(base.glob("*.json")):
        try:
            data = msgspec.json.decode(path.read_bytes(), type=LauncherRecord)
        except (OSError, msgspec.DecodeError):
            continue  # being written or removed right now (or not a launcher's state file)
        if _lock_is_held(path.with_suffix(".lock")):
            data["state_file"] = str(path)
            found.append(data)
    return found


def find_launcher(pid: int | None = None) -> LauncherRecord:
    """The state of the launcher with ``pid``, or of the only one running when ``pid`` is None."""
    found = running_launchers()
    if pid is not None:
        found = [s for s in found if s.get("pid") == pid]
        if not found:
            raise NoLauncherError(
                f"no running sglang-launch with pid {pid} (looked in {state_dir()}); "
                "`sglang-launch status` without --pid lists what is running"
            )
    if not found:
        raise NoLauncherError(
            f"no running sglang-launch found (looked in {state_dir()}); start one with "
            "`sglang-launch --model-path PATH`, or set XDG_RUNTIME_DIR as the launcher had it"
        )
    if len(found) > 1:
        pids = ", ".join(f"{s['pid']} ({s.get('url') or s['state_file']})" for s in found)
        raise NoLauncherError(
            f"{len(found)} launchers are running: {pids}; choose one with --pid PID"
        )
    return found[0]
