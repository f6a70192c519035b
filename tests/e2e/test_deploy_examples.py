"""The shipped systemd unit and Kubernetes probes (examples/deploy) work as documented: the unit
passes ``systemd-analyze verify`` and its ExecStart command line, run for real with a
``NOTIFY_SOCKET``, says READY=1, answers the probes of the Kubernetes example, reloads on its
ExecReload's SIGHUP (RELOADING=1, then READY=1 with a new scheduler), and stops on the unit's
KillSignal with exit 0 within TimeoutStopSec."""

from __future__ import annotations

import shlex
import shutil
import signal
import socket
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
import yaml
from support import REPO, free_port, kill_tree, wait_for
from support.serving import EMBEDDING_MODEL, cli_command, server_env
from support.supervisor import short_runtime_dir

pytestmark = pytest.mark.e2e

DEPLOY = REPO / "examples" / "deploy"


def _unit() -> dict[str, str]:
    entries = {}
    for line in (DEPLOY / "sglang-launch.service").read_text().splitlines():
        if "=" in line and not line.startswith(("#", "[")):
            key, value = line.split("=", 1)
            entries[key.strip()] = value.strip()
    return entries


@pytest.mark.skipif(not shutil.which("systemd-analyze"), reason="systemd-analyze is not installed")
def test_the_unit_passes_systemd_analyze_verify(tmp_path):
    # The unit names its own install paths; point ExecStart at this checkout's real command.
    installed = shutil.which("sglang-launch", path=str(Path(sys.executable).parent))
    if not installed:
        pytest.skip("no installed sglang-launch console script to point ExecStart at")
    program = shlex.split(_unit()["ExecStart"])[0]
    text = (DEPLOY / "sglang-launch.service").read_text().replace(program, installed, 1)
    unit = tmp_path / "sglang-launch.service"
    unit.write_text(text)
    result = subprocess.run(
        ["systemd-analyze", "verify", "--man=no", str(unit)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    entries = _unit()
    assert entries["Type"] == "notify" and entries["KillMode"] == "mixed"
    grace = float(
        shlex.split(entries["ExecStart"])[
            shlex.split(entries["ExecStart"]).index("--stop-grace-period") + 1
        ]
    )
    assert float(entries["TimeoutStopSec"]) > 2 * grace


def test_the_units_command_line_notifies_answers_the_probes_and_stops_on_its_kill_signal(tmp_path):
    entries = _unit()
    argv = shlex.split(entries["ExecStart"])[1:]
    key_file = tmp_path / "api-key"
    key_file.write_text("deploy-key\n")
    swap = {
        "--model-path": EMBEDDING_MODEL,  # the cheapest real model to start (twice: the reload)
        "--port": str(free_port()),
        "--host": "127.0.0.1",
        "--api-key-file": str(key_file),
    }
    args, skip = [], False
    for token in argv:
        if skip:
            skip = False
            continue
        if token in swap:
            skip = True
            args += [token, swap[token]]
            continue
        args.append(token)
    port = int(args[args.index("--port") + 1])
    notify_path = str(tmp_path / "notify.sock")
    notify = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    notify.bind(notify_path)
    notify.settimeout(0.2)
    runtime_dir = short_runtime_dir()
    env = server_env(NOTIFY_SOCKET=notify_path, XDG_RUNTIME_DIR=runtime_dir)
    proc = subprocess.Popen(
        [*cli_command(), *args],
        env=env,
        cwd=str(REPO),
        stdout=subprocess.DEVNULL,
        stderr=open(tmp_path / "log", "w"),
    )
    messages: list[str] = []

    def heard(text: str):
        def check():
            try:
                messages.append(notify.recv(4096).decode())
            except TimeoutError:
                pass
            assert proc.poll() is None or text == "STOPPING=1", (tmp_path / "log").read_text()
            return any(text in m for m in messages)

        return check

    try:
        wait_for(heard("READY=1"), float(entries["TimeoutStartSec"]), "READY=1 on NOTIFY_SOCKET")
        pod = yaml.safe_load((DEPLOY / "kubernetes-probes.yaml").read_text())
        container = pod["containers"][0]
        for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
            get = container[probe]["httpGet"]
            assert get["port"] == 30000
            r = httpx.get(f"http://127.0.0.1:{port}{get['path']}", timeout=30)
            assert r.status_code == 200, (probe, r.text)
        assert entries["ExecReload"] == "/bin/kill -HUP $MAINPID"
        before = httpx.get(f"http://127.0.0.1:{port}/ready", timeout=30).json()["schedulers"]
        messages.clear()
        proc.send_signal(signal.SIGHUP)  # what ExecReload sends
        wait_for(heard("RELOADING=1"), 60, "RELOADING=1 on NOTIFY_SOCKET")
        wait_for(heard("READY=1"), float(entries["TimeoutStartSec"]), "READY=1 after the reload")
        after = httpx.get(f"http://127.0.0.1:{port}/ready", timeout=30).json()["schedulers"]
        assert [s["pid"] for s in after] != [s["pid"] for s in before]
        proc.send_signal(getattr(signal, entries["KillSignal"]))
        assert proc.wait(float(entries["TimeoutStopSec"])) == 0, (tmp_path / "log").read_text()
        wait_for(heard("STOPPING=1"), 10, "STOPPING=1 on NOTIFY_SOCKET")
        assert pod["terminationGracePeriodSeconds"] >= float(entries["TimeoutStopSec"])
    finally:
        if proc.poll() is None:
            import psutil

            kill_tree(
                [psutil.Process(proc.pid), *psutil.Process(proc.pid).children(recursive=True)]
            )
            proc.wait(10)
        notify.close()
        shutil.rmtree(runtime_dir, ignore_errors=True)
