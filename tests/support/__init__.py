"""Test support: real distributions on ``sys.path``, fresh interpreters, process-tree cleanup.

Nothing here mocks the product. ``make_dist`` writes a real ``*.dist-info`` folder (METADATA and
``entry_points.txt``) plus the plugin's modules into a site folder, so ``importlib.metadata`` finds
its entry points exactly as it finds a pip-installed package. Tests of the process-level
singletons (``current_platform``, the hook registries, activation phases) run in the test process
with the ``fresh_process`` fixture (``support.process``); ``run_python`` runs code in a fresh
interpreter with that site folder on ``PYTHONPATH``, for tests whose subject is a fresh process.
"""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

REPO = Path(__file__).resolve().parents[2]

T = TypeVar("T")

# Variables the product reads; a test starts from none of them unless it sets them.
PRODUCT_ENV = (
    "SGLANG_PLATFORM",
    "SGLANG_PLUGINS",
    "SGLANG_USE_CPU_ENGINE",
    "SGLANG_DIFFUSION_PLATFORM_OVERRIDE",
    "SGLANG_API_KEY",
)


def _normalise(name: str) -> str:
    return name.replace("-", "_")


def make_dist(
    site: Path,
    name: str,
    entry_points: dict[str, dict[str, str]] | None = None,
    modules: dict[str, str] | None = None,
    version: str = "0.1.0",
) -> Path:
    """Write an installed distribution ``name`` into ``site``.

    ``entry_points`` maps a group to ``{entry-point name: "module:attr"}``; ``modules`` maps a
    path relative to ``site`` (``"pkg/__init__.py"``) to its source, dedented.
    """
    site.mkdir(parents=True, exist_ok=True)
    info = site / f"{_normalise(name)}-{version}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
    lines = []
    for group, eps in (entry_points or {}).items():
        lines.append(f"[{group}]")
        lines.extend(f"{ep} = {value}" for ep, value in eps.items())
        lines.append("")
    (info / "entry_points.txt").write_text("\n".join(lines))
    (info / "RECORD").write_text("")
    for rel, source in (modules or {}).items():
        path = site / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(source))
    importlib.invalidate_caches()  # a running process finds the new files at its next lookup
    return info


def pip_install_into(source: Path, target: Path) -> subprocess.CompletedProcess:
    """``pip install`` a project folder into ``target`` (no dependencies, no build isolation)."""
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "--no-deps",
            "--no-build-isolation",
            "--disable-pip-version-check",
            "--no-input",
            "-q",
            "--target",
            str(target),
            str(source),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )


def clean_env(**overrides: str | None) -> dict[str, str]:
    """The current environment without the product's variables, plus ``overrides``."""
    env = {k: v for k, v in os.environ.items() if k not in PRODUCT_ENV}
    for key, value in overrides.items():
        if value is None:
            env.pop(key, None)
        else:
            env[key] = value
    return env


@dataclass
class Result:
    returncode: int
    stdout: str
    stderr: str
    data: object = field(default=None)

    def __str__(self) -> str:  # shown by pytest when an assertion on it fails
        return f"rc={self.returncode}\n--- stdout\n{self.stdout}\n--- stderr\n{self.stderr}"


def run_python(
    code: str,
    *,
    sites: list[Path] | tuple[Path, ...] = (),
    env: dict[str, str] | None = None,
    timeout: float = 60,
    args: list[str] | None = None,
) -> Result:
    """Run ``code`` in a fresh interpreter with the repo and ``sites`` on ``PYTHONPATH``.

    If the code prints a line ``RESULT:<json>``, the decoded JSON is in ``Result.data``.
    """
    environ = clean_env() if env is None else dict(env)
    paths = [str(p) for p in sites] + [str(REPO)]
    environ["PYTHONPATH"] = os.pathsep.join(paths)
    environ.setdefault("PYTHONDONTWRITEBYTECODE", "1")
    proc = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code), *(args or [])],
        capture_output=True,
        text=True,
        env=environ,
        timeout=timeout,
        cwd=str(REPO),
    )
    data = None
    for line in proc.stdout.splitlines():
        if line.startswith("RESULT:"):
            data = json.loads(line[len("RESULT:") :])
    return Result(proc.returncode, proc.stdout, proc.stderr, data)


def descendants(pid: int | None = None) -> list:
    """Every live descendant process of ``pid`` (default: this process), via psutil."""
    import psutil

    try:
        proc = psutil.Process(pid or os.getpid())
        return [p for p in proc.children(recursive=True) if p.is_running()]
    except psutil.NoSuchProcess:
        return []


def kill_tree(procs) -> None:
    """SIGKILL the given psutil processes and reap them."""
    import psutil

    for p in procs:
        try:
            p.kill()
        except psutil.NoSuchProcess:
            pass
    psutil.wait_procs(procs, timeout=5)


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for(predicate: Callable[[], T], timeout: float, what: str, interval: float = 0.02) -> T:
    """Poll ``predicate`` until it returns a true value, and return that value; fail the test,
    naming ``what``, when ``timeout`` seconds pass first. Tests wait for conditions this way,
    never for a fixed time."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(interval)


def drivers_present(monkeypatch) -> None:
    """Stand-in for device drivers this machine lacks (no NVIDIA, AMD or Intel GPU here): the
    built-in probes' driver checks pass, so torch's own (stood-in) queries decide."""
    from platforms.builtin import cuda, rocm, xpu

    monkeypatch.setattr(cuda, "driver_loadable", lambda *names: True)
    monkeypatch.setattr(rocm, "linux_device_nodes", lambda *paths: True)
    monkeypatch.setattr(xpu, "linux_device_nodes", lambda *paths: True)
