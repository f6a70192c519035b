"""benchmarks/cuda_graphs.py, the device script a GPU machine runs (graph runner on, off,
compiled): it parses, prints its usage, and refuses a bad side before loading anything."""

from __future__ import annotations

import subprocess
import sys

from support import REPO

SCRIPT = REPO / "benchmarks" / "cuda_graphs.py"


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=120
    )


def test_the_device_script_prints_its_usage_and_refuses_a_bad_side():
    usage = _run("--help")
    assert usage.returncode == 0, usage.stderr
    for option in ("--sides", "--batch-sizes", "--tokens", "--model-path", "--dtype"):
        assert option in usage.stdout
    bad = _run("--sides", "sideways")
    assert bad.returncode == 2 and "--sides takes off, on, compile" in bad.stderr, bad.stderr
