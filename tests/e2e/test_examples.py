"""The embedding example works as its docstring says: a real script, a real server, nothing left."""

from __future__ import annotations

import subprocess
import sys

import pytest
from support import REPO, clean_env, descendants, free_port

pytestmark = pytest.mark.e2e  # every test here starts the launcher, a server or worker processes


def test_embedding_app_starts_uses_and_stops_a_server():
    port = free_port()
    env = clean_env(PYTHONPATH=str(REPO), HF_HUB_OFFLINE="1")
    proc = subprocess.Popen(
        [sys.executable, str(REPO / "examples" / "embed_app.py"), "--port", str(port)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        cwd=str(REPO),
    )
    try:
        out, err = proc.communicate(timeout=180)
    finally:
        if proc.poll() is None:
            for child in descendants(proc.pid):
                child.kill()
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, f"{out}\n{err}"
    assert f"ready at http://127.0.0.1:{port} with 2 workers" in out
    assert "384 numbers" in out
    assert "stopped; every worker is gone" in out
