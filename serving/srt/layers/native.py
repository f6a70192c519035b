"""C kernels of the CPU decode, built on the serving machine at first use.

A kernel is one C file beside the Python module that calls it. ``NativeKernel.library()`` builds
it with the system's C compiler the first time a process asks (about a second) into
``<sglang-launch's cache>/kernels/`` (``launchspec.gguf_cache.cache_root``), keyed by the
source, the flags and the compiler, and loads it with ctypes; later starts load the built file.
It is None, and the caller keeps PyTorch's kernels, where the CPU lacks an instruction set the
kernel needs (``/proc/cpuinfo``), no C compiler is found (``cc``, ``gcc`` or ``$CC``), the build
or the kernel's own set-up fails, or ``SGLANG_LAUNCH_NATIVE_KERNELS=0`` is set; ``reason()``
says which, and the first process to find out logs it.
"""

from __future__ import annotations

import ctypes
import hashlib
import logging
import os
import shutil
import subprocess
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

ENV = "SGLANG_LAUNCH_NATIVE_KERNELS"


class NativeKernel:
    """The C file ``source``, built with ``flags`` for a CPU with every flag of ``cpu_flags``;
    ``setup(lib)`` prepares a loaded library (None: ready; else why it cannot be used)."""

    def __init__(
        self,
        source: Path,
        flags: tuple[str, ...],
        cpu_flags: tuple[str, ...],
        setup: Callable[[Any], str | None],
    ) -> None:
        self.source = source
        self.flags = flags
        self.cpu_flags = cpu_flags
        self.setup = setup
        self._decided = False
        self._lib: Any = None
        self._why: str | None = None

    def library(self) -> Any:
        """The loaded library, or None (the module docstring); decided once per process."""
        if not self._decided:
            self._lib, self._why = self._load()
            self._decided = True
            if self._lib is None:
                log.info("the C kernel %s is not used: %s", self.source.name, self._why)
        return self._lib

    def reason(self) -> str | None:
        """Why ``library()`` is None (None when it is not)."""
        self.library()
        return self._why

    def _load(self) -> tuple[Any, str | None]:
        if os.environ.get(ENV, "1").strip().lower() in ("0", "false", "no", "off"):
            return None, f"{ENV}=0 is set"
        missing = [flag for flag in self.cpu_flags if flag not in cpu_flags()]
        if missing:
            return None, f"this CPU lacks {', '.join(missing)}"
        compiler = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
        if not compiler:
            return None, "no C compiler (cc or gcc, or $CC) to build it with"
        try:
            path = self._built(compiler)
        except (OSError, subprocess.SubprocessError) as exc:
            return None, f"building {self.source.name} with {compiler} failed: {exc}"
        try:
            lib = ctypes.CDLL(str(path))
        except OSError as exc:
            return None, f"loading {path} failed: {exc}"
        why = self.setup(lib)
        return (None, why) if why else (lib, None)

    def _built(self, compiler: str) -> Path:
        from launchspec.gguf_cache import cache_root

        source = self.source.read_bytes()
        key = hashlib.sha256(source + repr((self.flags, compiler)).encode()).hexdigest()[:16]
        folder = cache_root() / "kernels"
        path = folder / f"{self.source.stem}-{key}.so"
        if path.exists():
            return path
        folder.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=folder) as tmp:
            built = Path(tmp) / path.name
            subprocess.run(
                [compiler, *self.flags, "-shared", "-fPIC", str(self.source), "-o", str(built)],
                check=True,
                capture_output=True,
                timeout=120,
            )
            os.replace(built, path)  # atomic: a process beside this one loads all of it or none
        return path


def cpu_flags() -> set[str]:
    """The CPU's flags as ``/proc/cpuinfo`` lists them (empty where there is no such file)."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return set()
    for line in text.splitlines():
        if line.startswith("flags"):
            return set(line.split(":", 1)[1].split())
    return set()
