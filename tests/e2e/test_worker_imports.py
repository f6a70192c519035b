"""A worker process never loads the supervisor: it reads the shared floor (``launchspec``).

One real plugin (a dist-info distribution on the server's ``PYTHONPATH``) runs in every process
of a launch, the launcher's and each worker's; its callback starts a thread that keeps writing the
process's loaded ``launcher`` modules to a file named by its pid. A real server (the embedded
embedding model) serves requests on every route family; afterwards no worker has loaded any of the
launcher beyond the console script's module, which ``spawn`` re-runs in every child, while the
launcher's own process shows the probe works (it has ``launcher.supervisor``).
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from support import make_dist, wait_for
from support.serving import post, server_env, start_server

pytestmark = pytest.mark.e2e

PROBE = """
import json
import os
import sys
import threading
import time


def _loaded():
    return sorted(m for m in list(sys.modules) if m == "launcher" or m.startswith("launcher."))


def _watch(folder):
    while True:
        path = os.path.join(folder, str(os.getpid()))
        with open(path + ".tmp", "w", encoding="utf-8") as out:
            json.dump({"at": time.time(), "modules": _loaded()}, out)
        os.replace(path + ".tmp", path)
        time.sleep(0.1)


def register():
    folder = os.environ["MODULES_DIR"]
    threading.Thread(target=_watch, args=(folder,), daemon=True).start()
"""


def test_no_worker_process_imports_the_supervisor(tmp_path: Path) -> None:
    site = tmp_path / "site"
    make_dist(
        site,
        "module-probe",
        {"sglang.srt.plugins": {"module_probe": "module_probe:register"}},
        {"module_probe.py": PROBE},
    )
    folder = tmp_path / "modules"
    folder.mkdir()
    env = server_env(PYTHONPATH=str(site), MODULES_DIR=str(folder))
    server = start_server([], tmp_path, "embed", env=env)
    try:
        import httpx

        assert post(server.url + "/v1/embeddings", {"input": "a cat"}).status_code == 200
        for route in ("/health", "/ready", "/metrics", "/get_server_info", "/v1/models"):
            assert httpx.get(server.url + route, timeout=30).status_code == 200, route
        served = time.time()

        def reports() -> dict[int, dict]:
            found = {}
            for path in folder.iterdir():
                if path.name.isdigit():
                    found[int(path.name)] = json.loads(path.read_text(encoding="utf-8"))
            return found

        launcher = server.proc.pid
        # Every process wrote again after the requests were answered (scheduler, HTTP, launcher).
        wait_for(
            lambda: len(reports()) >= 3 and all(r["at"] > served for r in reports().values()),
            60,
            "every process of the launch to report its modules after the requests",
            interval=0.1,
        )
        found = reports()
        assert "launcher.supervisor" in found[launcher]["modules"], found[launcher]
        workers = {pid: r["modules"] for pid, r in found.items() if pid != launcher}
        assert len(workers) >= 2, found
        # spawn re-runs the parent's main module in each child: the console script's two lines
        # (``from launcher.cli import main``), whose module scope imports nothing more.
        spawn_main = {"launcher", "launcher.cli", "launcher.__main__"}
        assert all(set(mods) <= spawn_main for mods in workers.values()), workers
    finally:
        server.stop()
