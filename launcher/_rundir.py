"""Where a running launcher keeps its IPC endpoints and how tools find it.

Every launcher owns a private runtime directory (mode 0700) holding its ZeroMQ ``ipc://``
endpoints, and a state file next to it naming those endpoints, so ``sglang-launch status`` and
``sglang-launch events`` can find a launcher knowing at most its pid. Both live in the state
directory: ``$XDG_RUNTIME_DIR/sglang-launch`` when ``XDG_RUNTIME_DIR`` is set, else
``<tmp>/sglang-launch-<uid>``. A launcher removes both on exit; one that was SIGKILLed leaves
them behind, and the next reader removes them once it sees that their pid is gone.
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import tempfile
import threading
from pathlib import Path

# sockaddr_un holds 108 bytes; keep room for the longest endpoint name.
_MAX_IPC_PATH = 100
_LONGEST_ENDPOINT = "scheduler-000-000"

_claimed: set[str] = set()  # runtime directory names held by launchers of this process
_claim_lock = threading.Lock()


class RuntimeDirError(RuntimeError):
    """The state directory is unusable (not ours, not private, path too long)."""


def state_dir() -> Path:
    """The per-user directory of state files and runtime directories (created 0700)."""
    xdg = os.environ.get("XDG_RUNTIME_DIR")
    base = Path(xdg) / "sglang-launch" if xdg else Path(tempfile.gettempdir()) / f"sglang-launch-{os.getuid()}"
    try:
        base.mkdir(mode=0o700, parents=True, exist_ok=True)
    except OSError as exc:
        raise RuntimeDirError(
            f"cannot create the launcher state directory {base}: {exc}; "
            "set XDG_RUNTIME_DIR to a writable directory of yours"
        ) from exc
    info = base.lstat()
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.getuid():
        raise RuntimeDirError(
            f"{base} is not a directory owned by you; remove it, or set XDG_RUNTIME_DIR "
            "to a private directory"
        )
    if info.st_mode & 0o077:
        os.chmod(base, 0o700)
    return base


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class RuntimeDir:
    """One launcher's private directory and its state file; ``remove()`` deletes both."""

    def __init__(self) -> None:
        base = state_dir()
        sweep_stale(base)
        pid = os.getpid()
        with _claim_lock:
            k = 0
            while True:
                name = str(pid) if k == 0 else f"{pid}-{k}"
                path = base / name
                if name not in _claimed:
                    if path.exists():  # left by an earlier process that had our pid
                        _remove(path, base / f"{name}.json")
                    path.mkdir(mode=0o700)
                    _claimed.add(name)
                    break
                k += 1
        os.chmod(path, 0o700)
        self.name = name
        self.path = path
        self.state_file = base / f"{name}.json"
        if len(str(path / _LONGEST_ENDPOINT)) > _MAX_IPC_PATH:
            self.remove()
            raise RuntimeDirError(
                f"the runtime directory {path} is too long for a unix socket path; "
                "set XDG_RUNTIME_DIR to a shorter directory"
            )

    def endpoint(self, name: str) -> str:
        return f"ipc://{self.path / name}"

    def write_state(self, state: dict) -> None:
        """Write the state file atomically (readers never see half of it)."""
        tmp = self.state_file.with_suffix(".tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            json.dump(state, f, indent=1)
        os.replace(tmp, self.state_file)

    def remove(self) -> None:
        _remove(self.path, self.state_file)
        with _claim_lock:
            _claimed.discard(self.name)


def _remove(path: Path, state_file: Path) -> None:
    try:
        state_file.unlink()
    except FileNotFoundError:
        pass
    shutil.rmtree(path, ignore_errors=True)


def sweep_stale(base: Path) -> None:
    """Remove state files and runtime directories whose launcher process is gone."""
    for entry in base.iterdir():
        name = entry.name.removesuffix(".json")
        pid_text = name.split("-")[0]
        if not pid_text.isdigit() or entry.suffix not in ("", ".json"):
            continue
        if not pid_alive(int(pid_text)):
            _remove(base / name, base / f"{name}.json")


class NoLauncherError(RuntimeError):
    """No running launcher matches, or several do and the caller must choose."""


def running_launchers() -> list[dict]:
    """The state of every running launcher of this user (stale entries are swept first)."""
    base = state_dir()
    sweep_stale(base)
    found = []
    for path in sorted(base.glob("*.json")):
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError):
            continue  # being written or removed right now
        if isinstance(data, dict) and pid_alive(int(data.get("pid", 0))):
            data["state_file"] = str(path)
            found.append(data)
    return found


def find_launcher(pid: int | None = None) -> dict:
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
        raise NoLauncherError(f"{len(found)} launchers are running: {pids}; choose one with --pid PID")
    return found[0]
