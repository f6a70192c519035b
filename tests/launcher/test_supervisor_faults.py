"""The fault-injection matrix: a child that fails in each phase, or dies, or hangs.

Each case runs a real ``sglang-launch`` supervisor process with real spawned children. Every case
must end with the documented non-zero exit code, one root-cause block naming the right worker, the
right phase, how the process ended and the worker's own traceback, and no process of the launch
left anywhere (found by the tag every process of the launch inherits).
"""

from __future__ import annotations

import pytest
from support import free_port
from support.supervisor import FAST, READY_WAIT, Run, fault_site

pytestmark = pytest.mark.e2e  # every test here starts the launcher, a server or worker processes

W = "support.workers."

# id: (extra args, env, fault plugin?, exit code, worker, phase, texts the block must contain)
CASES = {
    "init_backend raises": (
        ["--tp-size", "2"],
        {"FAULT": "init_backend", "FAULT_RANK": "1"},
        True,
        1,
        "scheduler.1",
        "platform_initialized",
        ["init_backend failed on purpose", "exited with code 81", "Traceback"],
    ),
    "plugin fails to load": (
        ["--tp-size", "2"],
        {"FAULT": "plugin_import", "FAULT_RANK": "1"},
        True,
        1,
        "scheduler.1",
        "plugins_loaded",
        ["cannot be imported (on purpose)", "exited with code 82", "Traceback"],
    ),
    "child cannot select the supervisor's platform": (
        ["--tp-size", "2"],
        {"FAULT": "not_in_child", "FAULT_RANK": "1"},
        True,
        1,
        "scheduler.1",
        "platform_initialized",
        ["plugin:fault", "exited with code 81", "Traceback"],
    ),
    "hook cannot apply": (
        ["--tp-size", "2"],
        {"FAULT": "hook_apply", "FAULT_RANK": "1"},
        True,
        1,
        "scheduler.1",
        "hooks_applied",
        ["NoSuchClass", "exited with code 83", "Traceback"],
    ),
    "payload the child cannot decode": (
        [],
        {"FAULT": "args_class", "FAULT_RANK": "launcher"},
        True,
        1,
        None,
        "args_materialized",
        ["fault_extra", "exited with code 84", "Traceback"],
    ),
    "worker target cannot be imported": (
        ["--scheduler-target", "no_such_package.workers.run"],
        {},
        False,
        1,
        "scheduler.0",
        "worker_imported",
        ["no_such_package", "exited with code 85", "Traceback"],
    ),
    "worker raises": (
        ["--scheduler-target", W + "raise_error"],
        {},
        False,
        1,
        "scheduler.0",
        "ready",
        ["RuntimeError: worker failed on purpose", "exited with code 86", "Traceback"],
    ),
    "worker killed by a signal": (
        ["--scheduler-target", "support.supervisor.kill_self_once_seen"],
        {},
        False,
        1,
        "scheduler.0",
        "ready",
        ["killed by SIGKILL", "OOM"],
    ),
    "worker hangs past the start-up deadline": (
        # The deadline outlasts the (light, READY_WAIT) HTTP child's start on a busy machine many
        # times over, so the hung scheduler is the one worker it catches.
        ["--scheduler-target", W + "hang", "--startup-timeout", "10", "--stop-grace-period", "0.5"],
        {},
        False,
        3,
        "scheduler.0",
        "ready",
        ["did not finish within 10s", "StartupTimeout", "scheduler.0 in ready"],
    ),
    "worker dies after ready": (
        ["--scheduler-target", "support.supervisor.exit_once_seen_ready"],
        {},
        False,
        4,
        "scheduler.0",
        "serving",
        ["after the server was ready", "exited with code 3"],
    ),
}


@pytest.mark.parametrize("case", list(CASES))
def test_fault_is_reported_once_and_everything_stops(case, tmp_path):
    extra, env, needs_plugin, code, worker, phase, texts = CASES[case]
    sites = [fault_site(tmp_path)] if needs_plugin else []
    args = [*FAST, "--scheduler-target", READY_WAIT, "--http-target", READY_WAIT, *extra]
    with Run(args, sites=sites, env=env) as run:
        assert run.wait(120) == code, run
        err = run.stderr
        assert err.count("=" * 72) == 2, f"exactly one root-cause block\n{run}"
        block = err.split("=" * 72)[1]
        traceback = "Traceback (most recent call last)"
        assert err.count(traceback) == block.count(traceback), (
            f"the traceback only under the root cause\n{run}"
        )
        assert f"phase:      {phase}" in block, run
        if worker:
            assert f"worker:     {worker} (pid" in block, run
        for text in texts:
            assert text in block, f"{text!r} missing from the root cause\n{run}"
        run.assert_nothing_left()


def test_launcher_plugin_failure_stops_before_any_worker_starts(tmp_path):
    """A required plugin failing in the supervisor itself: exit 5 and nothing is spawned."""
    env = {"FAULT": "plugin_import", "FAULT_RANK": "launcher"}
    with Run(
        [*FAST, "--scheduler-target", READY_WAIT], sites=[fault_site(tmp_path)], env=env
    ) as run:
        assert run.wait(60) == 5, run
        assert "a required plugin failed to load in the launcher process" in run.stderr, run
        assert "cannot be imported (on purpose)" in run.stderr, run
        assert "spawned" not in run.stderr, run
        run.assert_nothing_left()


def test_a_worker_dying_the_instant_after_it_reported_ready_died_after_ready():
    """Its ready report leaves the process before ``ctx.ready()`` returns: the server was ready
    (every worker reported it), so this is a worker that died after ready, exit 4."""
    for _ in range(3):
        args = [*FAST, "--http-target", READY_WAIT, "--port", str(free_port())]
        args += ["--scheduler-target", "support.supervisor.exit_right_after_ready"]
        with Run(args) as run:
            assert run.wait(120) == 4, run
            assert "scheduler.0 exited with code 3 after the server was ready" in run.stderr, run
            assert "before it reported ready" not in run.stderr, run
            run.assert_nothing_left()
