"""GGUF files (llama.cpp's single-file format) served as Hugging Face model directories.

A ``--model-path FILE.gguf`` is converted once into a model directory (config.json, safetensors
weights dequantised to float32, the tokenizer and chat template the file carries) in the model
cache, and every later start serves that directory, which loads in a fraction of the time.

The cache, and why it is not the state directory: the state directory
(``launcher.supervisor.rundir``, under ``XDG_RUNTIME_DIR``) is a runtime directory, emptied at
logout or reboot and often a small tmpfs; a converted model is a cache, worth keeping across
runs and rebuilt at will. It lives in ``$SGLANG_LAUNCH_CACHE_DIR`` when that is set, else
``$XDG_CACHE_HOME/sglang-launch``, else ``~/.cache/sglang-launch`` (``cache_root``), under
``models/gguf-<sha256>-f<format>``: keyed by the file's content, so a renamed or copied file
reuses its conversion and an edited one is converted again. Hashing a multi-GB file takes
seconds, so each file's digest is remembered (``digests.json``) by its path, size, mtime and
inode, and re-read only when one of them changes.

The conversion is not done here. ``prepare`` runs it in a short-lived child process (the module
named by ``CONVERTER``, with transformers and the ``gguf`` package), so the process that calls it
(the supervisor) never loads torch or transformers; it is started through
``bootstrap.early_guard``, so it ends with this process from its first import on. The child reads
the file's header first and refuses, before converting anything, a tensor type transformers cannot
dequantise or an architecture it cannot map (exit 2, each problem with its fix: ``GgufError``). It
writes into a partial directory that ``prepare`` renames into place once complete, under a lock file, so two
launches of the same file convert it once and a killed conversion never leaves a half cache.

Standard library only (``bootstrap.early_guard`` when converting).
"""

from __future__ import annotations

import contextlib
import contextvars
import fcntl
import hashlib
import json
import logging
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

log = logging.getLogger("sglang_launch.gguf")

# The child that converts one file (``python -m CONVERTER --gguf FILE --into DIR``).
CONVERTER = "serving.srt.gguf_convert"
# The layout of a converted directory; a change of it converts every file again.
FORMAT = 1
MAGIC = b"GGUF"
# Written last into a converted directory: what it was converted from (``read_origin``).
ORIGIN_FILE = "sglang_launch_gguf.json"
CACHE_ENV = "SGLANG_LAUNCH_CACHE_DIR"
# The converter's exit status for a file it refuses (the launcher's usage-error code).
REFUSED = 2


class GgufError(ValueError):
    """A GGUF file that cannot be served; ``problems`` each say what is wrong and what to do."""

    def __init__(self, problems: list[str]) -> None:
        self.problems = list(problems)
        super().__init__("; ".join(self.problems))


def cache_root() -> Path:
    """Where sglang-launch keeps what it can rebuild: ``$SGLANG_LAUNCH_CACHE_DIR``, else
    ``$XDG_CACHE_HOME/sglang-launch``, else ``~/.cache/sglang-launch``."""
    chosen = os.environ.get(CACHE_ENV)
    if chosen:
        return Path(chosen).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg).expanduser() if xdg and os.path.isabs(xdg) else Path.home() / ".cache"
    return base / "sglang-launch"


def is_gguf_file(path: Path) -> bool:
    """Whether ``path`` is a file that starts with GGUF's magic bytes."""
    try:
        with open(path, "rb") as f:
            return f.read(len(MAGIC)) == MAGIC
    except OSError:
        return False


@dataclass(frozen=True)
class GgufFile:
    """A GGUF file, its content's digest, and the model directory it converts to."""

    file: Path
    size: int
    sha256: str
    directory: Path

    @property
    def prepared(self) -> bool:
        """Whether the converted directory is in the cache (it appears only when complete)."""
        return (self.directory / ORIGIN_FILE).is_file()


def open_gguf(path: Path) -> GgufFile:
    """The ``GgufFile`` of ``path``, or ``GgufError`` when it is no GGUF file."""
    file = path.expanduser().resolve()
    if not is_gguf_file(file):
        with contextlib.suppress(OSError), open(file, "rb") as f:
            head = f.read(len(MAGIC))
            raise GgufError(
                [
                    f"{str(path)!r} is named like a GGUF file but is not one (it starts with "
                    f"{head!r}, not {MAGIC!r}); pass a GGUF file as llama.cpp writes it, or a "
                    f"Hugging Face model directory"
                ]
            )
        raise GgufError([f"{str(path)!r} cannot be read; pass a readable GGUF file"])
    size, sha256 = file_digest(file)
    directory = cache_root() / "models" / f"gguf-{sha256[:32]}-f{FORMAT}"
    return GgufFile(file, size, sha256, directory)


# -- the content digest, remembered by path, size, mtime and inode -------------------------------
def file_digest(file: Path) -> tuple[int, str]:
    """``(size, sha256)`` of ``file``'s content, hashed only when its path, size, mtime or inode
    differ from what ``digests.json`` remembers (a cache that cannot be written hashes again)."""
    st = file.stat()
    key = str(file)
    stamp = [st.st_size, st.st_mtime_ns, st.st_ino]
    memo_path = cache_root() / "digests.json"
    memo = _read_json(memo_path)
    entry = memo.get(key)
    if (
        isinstance(entry, dict)
        and entry.get("stamp") == stamp
        and isinstance(entry.get("sha256"), str)
    ):
        return st.st_size, entry["sha256"]
    with open(file, "rb") as f:
        sha256 = hashlib.file_digest(f, "sha256").hexdigest()
    memo[key] = {"stamp": stamp, "sha256": sha256}
    # Forget files that are gone, so the memo does not grow for ever.
    memo = {k: v for k, v in memo.items() if k == key or os.path.exists(k)}
    with contextlib.suppress(OSError):
        _write_json(memo_path, memo)
    return st.st_size, sha256


def _read_json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _write_json(path: Path, data: dict[str, Any]) -> None:
    """Write ``data`` to ``path`` atomically (a temporary file renamed over it)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    temporary.write_text(json.dumps(data, indent=1, sort_keys=True), encoding="utf-8")
    os.replace(temporary, path)


def read_origin(directory: Path) -> dict[str, Any] | None:
    """What the converted ``directory`` was made from (the file, its digest, its architecture and
    tensor types, when): None for a directory that is no conversion."""
    origin = _read_json(directory / ORIGIN_FILE)
    return origin or None


# -- preparing: the conversion in a child process ------------------------------------------------
_reported: set[Path] = set()
# Why ``prepare`` may not convert now (None: it may): ``conversions_refused``.
_refusal: contextvars.ContextVar[str | None] = contextvars.ContextVar("gguf_refusal", default=None)


@contextlib.contextmanager
def conversions_refused(why: str) -> Iterator[None]:
    """Within the block, ``prepare`` refuses a file that is not converted yet (``GgufError``
    saying ``why``) instead of converting it: for a caller that must not wait a minute, such as
    a running launcher checking a reload's arguments on its event loop."""
    token = _refusal.set(why)
    try:
        yield
    finally:
        _refusal.reset(token)


def prepare(gguf: GgufFile) -> dict[str, Any]:
    """Make sure ``gguf``'s converted directory is in the cache, converting the file in a child
    process when it is not; returns what ``read_origin`` reads from it. ``GgufError`` when the
    file is refused (its problems name the fix) or the conversion fails or cannot be stored."""
    if gguf.prepared:
        origin = read_origin(gguf.directory) or {}
        if gguf.directory not in _reported:
            _reported.add(gguf.directory)
            log.info(
                "%s: serving its converted copy in %s (converted %s; only the first start "
                "converts)",
                gguf.file,
                gguf.directory,
                origin.get("converted_at", "before"),
            )
        return origin
    why = _refusal.get()
    if why is not None:
        raise GgufError(
            [
                f"{gguf.file} is not converted yet, and {why}; convert it first (python -m "
                f"launchspec.gguf_cache {gguf.file}), then try again"
            ]
        )
    models = gguf.directory.parent
    try:
        models.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise GgufError([_unwritable(models, exc)]) from exc
    with _locked(models / f".{gguf.directory.name}.lock", gguf):
        if not gguf.prepared:  # another launch may have converted it while this one waited
            _convert(gguf)
    _reported.add(gguf.directory)
    return read_origin(gguf.directory) or {}


@contextlib.contextmanager
def _locked(path: Path, gguf: GgufFile) -> Iterator[None]:
    """Hold an exclusive lock on ``path`` (waiting, and saying so, while another launch holds it)."""
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as exc:
        raise GgufError([_unwritable(path.parent, exc)]) from exc
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            log.info("%s: another launch is converting it; waiting for it to finish", gguf.file)
            fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # releases the lock


def _convert(gguf: GgufFile) -> None:
    """Run the converter into a partial directory, then rename it into place."""
    partial = gguf.directory.with_name(f".partial-{gguf.directory.name}")
    shutil.rmtree(partial, ignore_errors=True)  # left by a killed conversion (we hold the lock)
    # Armed against outliving this process from its first import on (``early_guard``); imported
    # here: importing the server arguments loads nothing of bootstrap.
    from bootstrap import early_guard

    command = early_guard.command(
        CONVERTER, ["--gguf", str(gguf.file), "--into", str(partial), "--sha256", gguf.sha256]
    )
    started = time.monotonic()
    try:
        # stderr is this process's: the child's progress shows where the launcher's output goes.
        done = subprocess.run(
            command, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, check=False
        )
        result = _result(done.stdout)
        if done.returncode == REFUSED and result.get("problems"):
            raise GgufError([str(p) for p in result["problems"]])
        if done.returncode != 0 or not result.get("ok"):
            raise GgufError(
                [
                    f"converting {gguf.file} into a model directory failed (the converter exited "
                    f"with {done.returncode}: {result.get('error') or 'see its output above'}); "
                    f"fix what it names, or pass the model's Hugging Face directory instead"
                ]
            )
        try:
            os.rename(partial, gguf.directory)
        except OSError as exc:
            raise GgufError([_unwritable(gguf.directory.parent, exc)]) from exc
    finally:
        shutil.rmtree(partial, ignore_errors=True)
    log.info(
        "%s: converted in %.1fs into %s; later starts load that directory",
        gguf.file,
        time.monotonic() - started,
        gguf.directory,
    )


def _result(stdout: bytes) -> dict[str, Any]:
    """The converter's result: the JSON object on the last line of its standard output."""
    lines = stdout.decode("utf-8", "replace").strip().splitlines()
    try:
        result = json.loads(lines[-1]) if lines else {}
    except ValueError:
        return {}
    return result if isinstance(result, dict) else {}


def _unwritable(where: Path, exc: OSError) -> str:
    return (
        f"the model cache {where} cannot be written ({exc.strerror or exc}); make it writable, or "
        f"point {CACHE_ENV} (or XDG_CACHE_HOME) at a writable directory"
    )


def main(argv: list[str] | None = None) -> int:
    """``python -m launchspec.gguf_cache [FILE.gguf ...]``: convert each file into the cache now
    (none: the embedded chat model, as the install does). Exit 2 for a refused file."""
    logging.basicConfig(level=logging.INFO, format="sglang-launch: %(message)s")
    from launchspec.embedded_models import CHAT_MODEL, ModelSourceError, embedded_file

    args = list(sys.argv[1:] if argv is None else argv)
    try:
        files = [Path(a) for a in args] or [embedded_file(CHAT_MODEL)]
        for file in files:
            gguf = open_gguf(file)
            prepare(gguf)
            print(gguf.directory)
    except (GgufError, ModelSourceError) as exc:
        print(f"sglang-launch: {exc}", file=sys.stderr)
        return REFUSED
    return 0


if __name__ == "__main__":
    sys.exit(main())
