"""The embedded ``Launcher``, used the way an application uses it.

The application is a real script file run by a fresh interpreter, so ``spawn`` children re-run its
module scope (``from launcher import Launcher`` there must stay cheap and must not trigger the
early-import warning). One run checks the lazy facade, a failing start (``LaunchError`` with the
root cause, the application going on, no child left), ``start(wait=False)`` / ``wait_ready`` /
``status`` / ``events`` / ``stop``, the context manager, and that the application's
multiprocessing start method and process are untouched.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest
from support import REPO, clean_env, free_port
from support.supervisor import TESTS, short_runtime_dir

pytestmark = pytest.mark.e2e  # every test here starts the launcher, a server or worker processes

APP = """
import json, multiprocessing, os, sys
from launcher import Launcher, LaunchError  # module scope: spawn children re-run this line

READY = "support.workers.ready_then_wait"
LIGHT = ("torch", "numpy", "zmq", "psutil", "uvloop", "msgspec", "platforms", "hooks", "bootstrap")


def children():
    import psutil
    return [p.pid for p in psutil.Process().children(recursive=True)
            if "resource_tracker" not in " ".join(p.cmdline())]


def main():
    result = {"heavy_at_import": sorted({m.split(".")[0] for m in sys.modules if m.split(".")[0] in LIGHT})}

    try:
        Launcher(no_such_setting=1).start()
    except LaunchError as exc:
        result["bad_field"] = [exc.exit_code, exc.root_cause.message]

    try:
        Launcher(scheduler_target="support.workers.raise_error", http_target=READY,
                 startup_timeout=60, port=PORT).start()
    except LaunchError as exc:
        cause = exc.root_cause
        result["failed"] = {
            "worker": cause.worker, "phase": cause.phase, "error_type": cause.error_type,
            "message": cause.message, "traceback": "Traceback" in (cause.traceback or ""),
            "exit_code": exc.exit_code, "text": str(exc),
        }
    result["children_after_failure"] = children()

    launcher = Launcher(tp_size=2, scheduler_target=READY, http_target=READY, port=PORT, stop_grace_period=5)
    launcher.start(wait=False)
    launcher.wait_ready(60)
    status = launcher.status()
    result["status"] = {"phase": status["phase"], "url": status["url"],
                        "workers": {w["name"]: w["phase"] for w in status["workers"]}}
    stream = launcher.events()
    first = next(stream)
    launcher.stop()
    rest = [event["topic"] for event in stream]
    result["events"] = {"first": first["topic"], "first_phase": first["snapshot"]["phase"], "rest": rest}
    result["status_after_stop"] = launcher.status()["phase"]
    result["children_after_stop"] = children()

    from launchspec.server_args import ServerArgs

    with Launcher(ServerArgs(scheduler_target=READY, http_target=READY, port=PORT)) as running:
        result["context_manager"] = [running.url, running.status()["phase"]]
    result["children_after_with"] = children()
    result["start_method"] = multiprocessing.get_start_method(allow_none=True)
    print("RESULT:" + json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
"""


def test_an_application_embedding_launcher(tmp_path):
    port = free_port()
    app = tmp_path / "app.py"
    app.write_text(textwrap.dedent(APP).replace("PORT", str(port)))
    env = clean_env(
        PYTHONPATH=os.pathsep.join([str(REPO), str(TESTS)]), XDG_RUNTIME_DIR=short_runtime_dir()
    )
    proc = subprocess.run(
        [sys.executable, str(app)],
        env=env,
        cwd=str(tmp_path),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    line = [line for line in proc.stdout.splitlines() if line.startswith("RESULT:")]
    assert line, proc.stderr
    result = json.loads(line[0][len("RESULT:") :])

    # `from launcher import Launcher` is a lazy facade.
    assert result["heavy_at_import"] == []
    assert "already imported when this child started" not in proc.stderr

    # Bad input: a clear usage error, no process started.
    code, message = result["bad_field"]
    assert code == 2 and "no_such_setting" in message

    # A failing child: LaunchError with the root cause, and nothing left behind.
    failed = result["failed"]
    assert failed["worker"] == "scheduler.0" and failed["phase"] == "ready"
    assert (
        failed["error_type"] == "RuntimeError" and failed["message"] == "worker failed on purpose"
    )
    assert failed["traceback"] and failed["exit_code"] == 1
    assert "scheduler.0 failed while running the worker target" in failed["text"]
    assert result["children_after_failure"] == []

    # A good launch, watched and stopped.
    assert result["status"] == {
        "phase": "ready",
        "url": f"http://127.0.0.1:{port}",
        "workers": {"http.0": "ready", "scheduler.0": "ready", "scheduler.1": "ready"},
    }
    events = result["events"]
    assert events["first"] == "snapshot" and events["first_phase"] == "ready"
    assert events["rest"][0] == "server.stopping" and events["rest"][-1] == "server.stopped"
    assert result["status_after_stop"] == "stopped"
    assert result["children_after_stop"] == []

    assert result["context_manager"] == [f"http://127.0.0.1:{port}", "ready"]
    assert result["children_after_with"] == []
    # The application's own multiprocessing setting is untouched.
    assert result["start_method"] is None


CYCLES_APP = """
import gc, json, os, socket, sys
from launcher import Launcher


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main():
    gc.collect()
    gc.disable()  # what is released must be released without the garbage collector
    counts = []
    for _ in range(4):
        with Launcher(scheduler_target="support.workers.ready_then_wait",
                      http_target="support.workers.ready_then_wait", port=free_port(),
                      stop_grace_period=5):
            pass
        counts.append(len(os.listdir("/proc/self/fd")))
    print("RESULT:" + json.dumps(counts), flush=True)


if __name__ == "__main__":
    main()
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="counts /proc/self/fd")
def test_start_stop_cycles_leave_no_file_descriptor_behind(tmp_path):
    """Each launch's pipes and sockets are closed when it ends, not when the garbage collector
    happens to find them: an application that launches again and again holds no more files."""
    app = tmp_path / "cycles.py"
    app.write_text(CYCLES_APP)
    env = clean_env(
        PYTHONPATH=os.pathsep.join([str(REPO), str(TESTS)]), XDG_RUNTIME_DIR=short_runtime_dir()
    )
    proc = subprocess.run(
        [sys.executable, str(app)],
        env=env,
        cwd=str(tmp_path),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    line = [line for line in proc.stdout.splitlines() if line.startswith("RESULT:")]
    assert line, proc.stderr
    counts = json.loads(line[0][len("RESULT:") :])
    assert counts[1] == counts[2] == counts[3], counts
