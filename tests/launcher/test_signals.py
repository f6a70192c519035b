"""Signals reach a real ``sglang-launch`` process: which stop it, which it shrugs off, and how the
workers behave when the whole process group is signalled.

Real launchers (``python -m launcher``), real spawned workers, real signals. The process-group
test runs the real serving runtime (a tiny causal LM built at test time) in its own session and
sends SIGTERM to the whole group while requests are in flight.
"""

from __future__ import annotations

import os
import signal
import threading
from pathlib import Path

import httpx
import pytest
from support import free_port, make_dist, wait_for
from support.serving import build_tiny_llama, post, start_server
from support.supervisor import FAST, READY_WAIT, Run

pytestmark = pytest.mark.e2e

W = "support.workers."
BASIC = [*FAST, "--scheduler-target", READY_WAIT, "--http-target", READY_WAIT]


def _stopped_cleanly(run: Run, signame: str) -> None:
    assert run.wait(60) == 0, run
    assert f"stopping (received {signame})" in run.stderr, run
    assert "Traceback" not in run.stderr, run
    run.assert_nothing_left()
    assert not list(Path(run.runtime_dir, "sglang-launch").iterdir()), (
        "state file and runtime dir removed"
    )


@pytest.mark.parametrize("sig", [signal.SIGQUIT])
def test_sigquit_drains_and_exits_0(sig):
    with Run([*BASIC, "--port", str(free_port())]) as run:
        run.wait_ready()
        os.kill(run.pid, sig)
        _stopped_cleanly(run, sig.name)
        assert "every worker process is gone" in run.stderr


def test_other_fatal_signals_are_logged_and_the_server_keeps_serving():
    with Run([*BASIC, "--port", str(free_port())]) as run:
        run.wait_ready()
        for sig in (
            signal.SIGUSR1,
            signal.SIGUSR2,
            signal.SIGPIPE,
            signal.SIGALRM,
            signal.SIGRTMIN,
        ):
            os.kill(run.pid, sig)
        wait_for(
            lambda: all(
                f"ignored {name}" in run.stderr
                for name in ("SIGUSR1", "SIGUSR2", "SIGPIPE", "SIGALRM", "SIGRTMIN")
            ),
            30,
            f"a warning for every signal\n{run}",
        )
        assert run.proc.poll() is None and run.snapshot()["phase"] == "ready"
        os.kill(run.pid, signal.SIGTERM)
        _stopped_cleanly(run, "SIGTERM")


def test_a_second_signal_ends_the_grace_period():
    # The worker ignores SIGTERM and the grace period is 10 minutes: only the second signal ends it.
    args = [
        "--startup-timeout",
        "60",
        "--stop-grace-period",
        "600",
        "--port",
        str(free_port()),
        "--scheduler-target",
        W + "ignore_stop",
        "--http-target",
        READY_WAIT,
    ]
    with Run(args) as run:
        run.wait_ready()
        os.kill(run.pid, signal.SIGTERM)
        wait_for(
            lambda: "stopping (received SIGTERM)" in run.stderr, 30, f"the stop to begin\n{run}"
        )
        os.kill(run.pid, signal.SIGINT)
        assert run.wait(120) == 0, run
        assert "received SIGINT while stopping: the grace period is over" in run.stderr
        assert "scheduler.0" in run.stderr and "exited SIGKILL" in run.stderr, run
        run.assert_nothing_left()


# A general plugin that blocks the launcher's own plugin loading (not the workers') once it has
# written a marker file: the launcher is then busy preparing, before any supervisor exists.
SLOW_PLUGIN = {
    "slow_plugin/__init__.py": """
        import os, time

        def register():
            marker = os.environ.get("SLOW_PLUGIN_MARKER")
            if marker and "RANK" not in os.environ:
                open(marker, "w").close()
                time.sleep(120)
    """,
}


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
@pytest.mark.parametrize("moment", ["loading plugins", "workers starting"])
def test_a_stop_during_start_up_exits_0_without_a_traceback(tmp_path, sig, moment):
    site = tmp_path / "site"
    make_dist(
        site,
        "slow-plugin",
        entry_points={"sglang.srt.plugins": {"slow": "slow_plugin:register"}},
        modules=SLOW_PLUGIN,
    )
    marker = tmp_path / "marker"
    env = {"TESTWORKER_MARKER": str(marker)}
    if moment == "loading plugins":
        env = {"SLOW_PLUGIN_MARKER": str(marker)}
    args = [
        *FAST,
        "--port",
        str(free_port()),
        "--scheduler-target",
        W + "never_ready",
        "--http-target",
        READY_WAIT,
    ]
    with Run(args, sites=[site], env=env) as run:
        wait_for(marker.exists, 60, f"the launcher to reach {moment}\n{run}")
        os.kill(run.pid, sig)
        assert run.wait(60) == 0, run
        assert "Traceback" not in run.stderr and "KeyboardInterrupt" not in run.stderr, run
        if moment == "loading plugins":
            assert f"stopped before start-up (received {sig.name})" in run.stderr, run
        run.assert_nothing_left()


@pytest.fixture(scope="module")
def tiny_path(tmp_path_factory):
    from launchspec.model_source import embedding_model_dir

    return build_tiny_llama(tmp_path_factory.mktemp("tiny") / "tiny-llama", embedding_model_dir())


def _in_flight(url: str) -> int:
    text = httpx.get(url + "/metrics", timeout=30).text
    return sum(
        int(float(line.split()[-1]))
        for line in text.splitlines()
        if line.startswith("sglang_launch_queue_depth{")
    )


def test_sigterm_to_the_whole_process_group_still_answers_every_request_in_flight(
    tiny_path, tmp_path
):
    """systemd's KillMode=control-group (or kill -TERM -PGID) signals every process at once: the
    workers leave the stop to the supervisor, which drains HTTP first, so nothing in flight is lost."""
    server = start_server(
        ["--model-path", str(tiny_path), "--stop-grace-period", "120"], tmp_path, "group"
    )
    try:
        body = {
            "text": "once upon a time",
            "sampling_params": {"max_new_tokens": 256, "temperature": 0, "ignore_eos": True},
        }
        results: list = []
        threads = [
            threading.Thread(
                target=lambda: results.append(post(server.url + "/generate", body, timeout=120))
            )
            for _ in range(8)
        ]
        for t in threads:
            t.start()

        def all_sent_some_in_flight() -> bool:
            # Every request reached the server (answered or still in flight) and some are still
            # in flight: on a fast machine the first ones may finish before the last is sent.
            in_flight = _in_flight(server.url)
            return in_flight > 0 and in_flight + len(results) == 8

        wait_for(all_sent_some_in_flight, 60, "all 8 requests sent, some still in flight")
        os.killpg(server.proc.pid, signal.SIGTERM)  # the server runs in its own session
        for t in threads:
            t.join(180)
        assert [r.status_code for r in results] == [200] * 8, (
            [r.text for r in results],
            server.log,
        )
        assert all(r.json()["meta_info"]["completion_tokens"] == 256 for r in results)
        assert server.wait_exit(120) == 0, server.log
        assert "stopping (received SIGTERM)" in server.log
    finally:
        server.stop()
