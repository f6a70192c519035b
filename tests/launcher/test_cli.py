"""``sglang-launch`` serving, ``status`` and ``events`` at the edges: help, bad input, nothing running,
import weight, and how the terminal display renders a launch."""

from __future__ import annotations

import io
import os
import signal
import subprocess
import sys

import pytest
from support import REPO, clean_env, free_port, run_python
from support.supervisor import FAST, READY_WAIT, TESTS, Run, short_runtime_dir


def _cli(*args: str, **env: str) -> subprocess.CompletedProcess:
    environ = clean_env(PYTHONPATH=os.pathsep.join([str(REPO), str(TESTS)]), **env)
    environ.setdefault("XDG_RUNTIME_DIR", short_runtime_dir())
    return subprocess.run(
        [sys.executable, "-m", "launcher", *args],
        env=environ,
        cwd=str(REPO),
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.mark.e2e
def test_help_lists_the_server_options_and_the_exit_codes():
    proc = _cli("--help")
    assert proc.returncode == 0, proc.stderr
    for text in (
        "--model-path",
        "--startup-timeout",
        "--stop-grace-period",
        "--nnodes",
        "exit codes:",
        "0  stopped on request",
        "3  not every worker was ready within --startup-timeout",
        "4  a worker exited after the server was ready",
    ):
        assert text in proc.stdout, text


@pytest.mark.e2e
def test_bad_input_is_a_clear_usage_error_and_starts_nothing():
    bad = _cli("--tp-size", "0", "--port", "70000")
    assert bad.returncode == 2, bad.stderr
    assert (
        "--tp-size 0 must be at least 1" in bad.stderr
        and "--port 70000 is out of range" in bad.stderr
    )
    assert "starting" not in bad.stderr
    runtime = _cli("--runtime", "tpu")
    assert runtime.returncode == 2 and "tpu" in runtime.stderr and "srt" in runtime.stderr


@pytest.mark.e2e
def test_status_and_events_without_a_running_launcher_say_how_to_start_one():
    for command in ("status", "events"):
        proc = _cli(command)
        assert proc.returncode == 1, proc.stderr
        assert (
            "no running sglang-launch found" in proc.stderr
            and "sglang-launch --model-path" in proc.stderr
        )
    proc = _cli("status", "--pid", "999999999")
    assert proc.returncode == 1 and "no running sglang-launch with pid 999999999" in proc.stderr


def test_launcher_modules_import_nothing_heavy():
    result = run_python(
        """
        import json, sys
        import launcher
        from launcher import Launcher, LaunchError
        facade = sorted(m for m in sys.modules if m.startswith(("zmq", "psutil", "uvloop", "msgspec")))
        import launcher.supervisor.supervisor, launcher.commands.serve, launcher.commands.status, launcher.commands.events
        heavy = sorted({m.split(".")[0] for m in sys.modules} & {"torch", "numpy", "transformers", "starlette", "uvicorn"})
        print("RESULT:" + json.dumps({"facade": facade, "heavy": heavy}))
        """
    )
    assert result.returncode == 0, result
    assert result.data == {"facade": [], "heavy": []}


def _render(live: bool) -> str:
    from launcher.commands.display import TerminalDisplay
    from launchspec import events

    out = io.StringIO()
    show = TerminalDisplay(out, live=live)
    show(
        events.ServerStarting(
            platform="builtin:cpu",
            platform_reason="SGLANG_USE_CPU_ENGINE=1",
            cpu_fallback=True,
            runtime="srt",
            url="http://127.0.0.1:30000",
            node_rank=0,
            nnodes=1,
            workers=["http.0", "scheduler.0"],
        )
    )
    for (role, rank), pid in ((("http", 0), 11), (("scheduler", 0), 12)):
        who = {"worker": f"{role}.{rank}", "role": role, "rank": rank, "pid": pid}
        counts = {"ready_count": 0, "worker_count": 2}
        for phase in ("spawned", "hooks_applied"):
            show(events.WorkerPhase(**who, **counts, phase=phase, duration=0.5))
        show(events.WorkerReady(**who, **counts, duration=0.5))
    show(
        events.ServerReady(url="http://127.0.0.1:30000", node_rank=0, worker_count=2, startup_s=1.5)
    )
    return out.getvalue()


def test_terminal_display_live_on_a_tty_plain_lines_otherwise():
    live, plain = _render(True), _render(False)
    for text in (live, plain):
        assert text.count("serving on the CPU platform") == 1
        assert text.rstrip().endswith(
            "sglang-launch: ready at http://127.0.0.1:30000 (2 workers in 1.5s)"
        )
    assert "\x1b[" in live and "\x1b[" not in plain
    assert "sglang-launch: scheduler.0 (pid 12) hooks_applied 0.50s" in plain
    # The live table's header, as docs/operating.md shows it; plain lines need none.
    doc = (REPO / "docs" / "operating.md").read_text()
    header = next(line for line in doc.splitlines() if line.startswith("  WORKER "))
    assert header in live and "WORKER" not in plain


@pytest.mark.e2e
def test_diffusion_runtime_launches_with_its_own_platform_selection():
    args = [
        *FAST,
        "--runtime",
        "diffusion",
        "--port",
        str(free_port()),
        "--scheduler-target",
        READY_WAIT,
        "--http-target",
        READY_WAIT,
    ]
    with Run(args, env={"SGLANG_DIFFUSION_PLATFORM_OVERRIDE": "cpu"}) as run:
        snap = run.wait_ready()
        assert snap["runtime"] == "diffusion" and snap["platform"] == "builtin:cpu"
        assert all(w["platform"] == "builtin:cpu" for w in snap["workers"])
        os.kill(run.pid, signal.SIGTERM)
        assert run.wait(60) == 0, run
        run.assert_nothing_left()


@pytest.mark.e2e
def test_an_empty_http_target_launches_the_schedulers_alone():
    args = [
        *FAST,
        "--tp-size",
        "2",
        "--port",
        str(free_port()),
        "--scheduler-target",
        READY_WAIT,
        "--http-target",
        "",
    ]
    with Run(args, env={"SGLANG_USE_CPU_ENGINE": "1"}) as run:
        snap = run.wait_ready()
        assert [w["role"] for w in snap["workers"]] == ["scheduler", "scheduler"]
        assert snap["url"] is None
        os.kill(run.pid, signal.SIGTERM)
        assert run.wait(60) == 0, run
        assert "sglang-launch: node 0 ready (2 workers" in run.stderr, run
        run.assert_nothing_left()


@pytest.mark.e2e
def test_the_cpu_chosen_with_sglang_use_cpu_engine_is_not_called_a_fallback():
    """``SGLANG_USE_CPU_ENGINE=1`` chooses the CPU: the launcher names that choice, and does not
    tell the operator to set what is already set."""
    args = [*FAST, "--port", str(free_port()), "--scheduler-target", READY_WAIT]
    with Run([*args, "--http-target", READY_WAIT], env={"SGLANG_USE_CPU_ENGINE": "1"}) as run:
        run.wait_ready()
        os.kill(run.pid, signal.SIGTERM)
        assert run.wait(60) == 0, run
        assert "sglang-launch: platform builtin:cpu (" in run.stderr, run
        assert "SGLANG_USE_CPU_ENGINE is set" in run.stderr, run
        assert "no accelerator and no platform plugin found" not in run.stderr, run
        assert "choose explicitly" not in run.stderr, run
        run.assert_nothing_left()


COMMANDS_THAT_ASK = {  # command -> the options it needs besides the shared ones
    "status": [],
    "events": [],
    "reload": [],
    "scale": ["--dp-size", "2"],
}


@pytest.mark.parametrize("command", sorted(COMMANDS_THAT_ASK))
def test_the_commands_that_ask_a_launcher_share_pid_and_timeout_and_refuse_a_bad_timeout(
    command, capsys
):
    import importlib

    main = importlib.import_module(f"launcher.commands.{command}").main
    with pytest.raises(SystemExit) as shown:
        main(["--help"])
    assert shown.value.code == 0
    text = capsys.readouterr().out
    assert "--pid PID" in text and "the launcher's pid (needed only when several run)" in text
    assert "--timeout SECONDS" in text and "(default: 5)" in text
    if command != "events":  # its output is JSON lines always
        assert "--json" in text
    for bad in ("-1", "0", "nan", "soon"):
        with pytest.raises(SystemExit) as refused:
            main([*COMMANDS_THAT_ASK[command], "--timeout", bad])
        assert refused.value.code == 2
        assert f"argument --timeout: {bad}" in capsys.readouterr().err.replace("'", "")
