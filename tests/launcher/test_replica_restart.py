"""Replicas that heal, seen from the supervisor: real ``sglang-launch`` processes with the test
suite's workers (no model), real SIGKILLs, the real status query socket and ``events`` command.

- the restart unit is the tp group: killing one rank of replica dp=1 (tp=2, dp=2) respawns both of
  its ranks, and only those, through the same spawn path;
- past ``--max-restarts`` a replica is taken out of service while another serves; the last one
  stops the launch with the root cause (exit 4), which says so;
- a replica the watchdog finds hung (SIGSTOP) is restarted too, and its successor is watched;
- a stop during a restart's backoff ends everything with exit 0;
- ``--restart-policy never``, a death before ready and the HTTP worker's death stop the launch as
  they always did;
- the bookkeeping itself (policy, count, backoff) in ``launcher.supervisor.restarts``.
"""

from __future__ import annotations

import json
import os
import signal

import psutil
import pytest
from support.supervisor import FAST, READY_WAIT, Run, wait_for

from launcher.supervisor.restarts import BACKOFF_CAP, Restarts
from launchspec.server_args import ServerArgs, ServerArgsError

W = "support.workers."
TP2_DP2 = [
    *FAST,
    "--tp-size",
    "2",
    "--dp-size",
    "2",
    "--scheduler-target",
    READY_WAIT,
    "--http-target",
    READY_WAIT,
    "--restart-backoff",
    "0.1",
]


def _workers(snapshot: dict) -> dict[str, dict]:
    return {w["name"]: w for w in snapshot["workers"]}


# -- the bookkeeping ---------------------------------------------------------------------------
def test_on_failure_counts_each_replica_and_doubles_the_backoff_up_to_the_cap():
    restarts = Restarts("on-failure", max_restarts=3, backoff=0.5)
    first, second = restarts.decide(1), restarts.decide(1)
    assert (first.restart, first.attempt, first.delay) == (True, 1, 0.5)
    assert (second.attempt, second.delay) == (2, 1.0)
    assert restarts.decide(0).attempt == 1  # each replica has a count of its own
    assert restarts.decide(1).delay == 2.0
    refused = restarts.decide(1)
    assert not refused.restart and refused.exhausted
    assert refused.reason == "scheduler dp=1 was restarted 3 time(s) already (--max-restarts 3)"
    assert restarts.count(1) == 3 and restarts.total == 4
    assert Restarts("on-failure", 20, 1.0).delay(12) == BACKOFF_CAP


def test_never_restarts_nothing():
    decision = Restarts("never", max_restarts=5, backoff=0.5).decide(0)
    assert not decision.restart and not decision.exhausted
    assert "never" in decision.reason


def test_the_default_policy_heals_several_replicas_on_one_node_only():
    assert ServerArgs(dp_size=2).restart_policy_in_effect() == "on-failure"
    assert ServerArgs(dp_size=1).restart_policy_in_effect() == "never"
    assert ServerArgs(dp_size=2, restart_policy="never").restart_policy_in_effect() == "never"
    two_nodes = ServerArgs(dp_size=2, nnodes=2, dist_init_addr="127.0.0.1:5000")
    assert two_nodes.restart_policy_in_effect() == "never"


def test_bad_restart_settings_are_named_with_the_fix():
    args = ServerArgs(
        dp_size=2,
        nnodes=2,
        dist_init_addr="127.0.0.1:5000",
        restart_policy="on-failure",
        max_restarts=-1,
        restart_backoff=-2.0,
    )
    with pytest.raises(ServerArgsError) as caught:
        args.check_server_args()
    text = str(caught.value)
    assert "--restart-policy on-failure restarts replicas on one node only" in text
    assert "use --restart-policy never" in text
    assert "--max-restarts -1 must be 0 or more" in text
    assert "--restart-backoff -2.0 must be 0 or more seconds" in text
    with pytest.raises(ServerArgsError, match="--restart-policy 'always' is not one of never"):
        ServerArgs(restart_policy="always").check_server_args()


# -- real launches -----------------------------------------------------------------------------
@pytest.mark.e2e
def test_a_killed_rank_restarts_its_whole_tp_group_past_max_restarts_it_leaves_then_the_last_ends_the_launch(
    tmp_path,
):
    with Run([*TP2_DP2, "--max-restarts", "1"]) as run:
        before = _workers(run.wait_ready())
        os.kill(before["scheduler.3"]["pid"], signal.SIGKILL)  # tp rank 1 of replica dp=1

        def healed():
            assert run.proc.poll() is None, run
            snap = run.snapshot()
            workers = _workers(snap) if snap else {}
            back = workers and all(
                workers[n]["restarts"] == 1 and workers[n]["ready"]
                for n in ("scheduler.2", "scheduler.3")
            )
            return workers if back else None

        after = wait_for(healed, 60, f"replica dp=1 to be restarted and ready\n{run}")
        for name in ("scheduler.2", "scheduler.3"):  # the whole group is new
            assert after[name]["pid"] != before[name]["pid"]
        for name in ("http.0", "scheduler.0", "scheduler.1"):  # nothing else was touched
            assert after[name]["pid"] == before[name]["pid"] and after[name]["restarts"] == 0
        events = run.history()
        restarting = [e for e in events if e["topic"] == "replica.1.restarting"]
        assert len(restarting) == 1, restarting
        assert restarting[0]["attempt"] == 1 and restarting[0]["workers"] == [
            "scheduler.2",
            "scheduler.3",
        ]
        assert (
            "scheduler.3 was killed by SIGKILL after the server was ready"
            in (restarting[0]["cause"])
        )
        back = [e for e in events if e["topic"] == "replica.1.ready"]
        assert len(back) == 1 and back[0]["down_s"] > 0
        assert not [e for e in events if e["topic"] == "server.failed"]
        status = run.cli("status").stdout  # the operator's table says which workers restarted
        rows = [line for line in status.splitlines() if line.startswith("  ")]  # the table's
        assert [line for line in rows if "(restarted 1x)" in line] == [
            line for line in rows if "scheduler.2" in line or "scheduler.3" in line
        ], status

        # The replica's second death is one more than --max-restarts 1 allows: while dp=0
        # serves, dp=1 is taken out of service and the launch goes on without it.
        os.kill(after["scheduler.2"]["pid"], signal.SIGKILL)

        def set_aside():
            assert run.proc.poll() is None, run
            removed = [e for e in run.history() if e["topic"] == "replica.1.removed"]
            snap = run.snapshot()
            return removed if removed and snap and "scheduler.2" not in _workers(snap) else None

        removed = wait_for(set_aside, 60, f"replica dp=1 to be taken out of service\n{run}")
        assert (
            "scheduler dp=1 was restarted 1 time(s) already (--max-restarts 1)"
            in (removed[0]["cause"])
        ), removed
        assert removed[0]["change"] == "restarts used"
        left = _workers(run.snapshot())
        assert sorted(left) == ["http.0", "scheduler.0", "scheduler.1"], left
        assert all(p["pid"] == before[n]["pid"] for n, p in left.items())  # untouched
        for name in ("scheduler.2", "scheduler.3"):
            assert (
                not psutil.pid_exists(after[name]["pid"])
                or psutil.Process(after[name]["pid"]).status() == psutil.STATUS_ZOMBIE
            )

        # The last replica: one restart, then its next death ends the launch (exit 4).
        os.kill(left["scheduler.1"]["pid"], signal.SIGKILL)

        def healed_again():
            assert run.proc.poll() is None, run
            workers = _workers(run.snapshot() or {"workers": []})
            ranks = [workers.get(n) for n in ("scheduler.0", "scheduler.1")]
            return ranks if all(r and r["restarts"] == 1 and r["ready"] for r in ranks) else None

        again = wait_for(healed_again, 60, f"replica dp=0 to be restarted and ready\n{run}")
        os.kill(again[0]["pid"], signal.SIGKILL)
        assert run.wait(60) == 4, run
        out = run.stderr + run.stdout
        assert "sglang-launch: scheduler.0 was killed by SIGKILL after the server was ready" in out
        assert "scheduler dp=0 was restarted 1 time(s) already (--max-restarts 1)" in out
        run.assert_nothing_left()


@pytest.mark.e2e
def test_restart_policy_never_stops_the_launch_as_before(tmp_path):
    with Run([*TP2_DP2, "--restart-policy", "never"]) as run:
        before = _workers(run.wait_ready())
        os.kill(before["scheduler.2"]["pid"], signal.SIGKILL)
        assert run.wait(60) == 4, run
        out = run.stderr + run.stdout
        assert "scheduler.2 was killed by SIGKILL after the server was ready" in out
        assert "restart" not in out.lower(), out
        run.assert_nothing_left()


@pytest.mark.e2e
def test_the_http_worker_and_a_death_before_ready_are_never_restarted(tmp_path):
    args = [*FAST, "--dp-size", "2", "--scheduler-target", READY_WAIT]
    with Run([*args, "--http-target", READY_WAIT]) as run:
        os.kill(_workers(run.wait_ready())["http.0"]["pid"], signal.SIGKILL)
        assert run.wait(60) == 4, run
        assert "http.0 was killed by SIGKILL after the server was ready" in run.stderr + run.stdout
        assert "restarts (attempt" not in run.stderr + run.stdout
        run.assert_nothing_left()
    with Run([*FAST, "--dp-size", "2", "--scheduler-target", W + "fail_on_last_rank"]) as run:
        assert run.wait(60) == 1, run  # scheduler.1 failed during start-up: no restart
        assert "restarts (attempt" not in run.stderr + run.stdout
        run.assert_nothing_left()


@pytest.mark.e2e
def test_the_events_command_streams_the_restart(tmp_path):
    """``sglang-launch events --follow`` shows the restart as it happens."""
    import subprocess
    import sys

    from support import REPO

    with Run([*TP2_DP2[:-2], "--restart-backoff", "0"]) as run:
        before = _workers(run.wait_ready())
        follow = subprocess.Popen(
            [sys.executable, "-m", "launcher", "events", "--follow", "--pid", str(run.pid)],
            env=run.env,
            cwd=str(REPO),
            stdout=subprocess.PIPE,
            text=True,
        )
        try:
            assert json.loads(follow.stdout.readline())["topic"] == "snapshot"
            os.kill(before["scheduler.0"]["pid"], signal.SIGKILL)
            topics = []
            for line in follow.stdout:
                topics.append(json.loads(line)["topic"])
                if topics[-1] == "replica.0.ready":
                    break
            assert "replica.0.restarting" in topics and "worker.scheduler.1.stopped" in topics
            run.proc.send_signal(signal.SIGTERM)
            assert run.wait(60) == 0, run
        finally:
            follow.kill()
            follow.wait(10)
        run.assert_nothing_left()


@pytest.mark.e2e
def test_a_stop_during_a_restart_ends_everything_with_exit_0(tmp_path):
    """SIGTERM while replica dp=1 waits out a long backoff: the restart is abandoned, the launch
    stops as usual (exit 0) and nothing of it is left, respawned or not."""
    with Run([*TP2_DP2[:-2], "--restart-backoff", "600"]) as run:
        before = _workers(run.wait_ready())
        os.kill(before["scheduler.2"]["pid"], signal.SIGKILL)
        wait_for(
            lambda: any(e["topic"] == "replica.1.restarting" for e in run.history()),
            30,
            f"the restart to begin\n{run}",
        )
        run.proc.send_signal(signal.SIGTERM)
        assert run.wait(60) == 0, run
        assert "stopping (received SIGTERM)" in run.stderr + run.stdout
        run.assert_nothing_left()


@pytest.mark.e2e
def test_a_replica_that_dies_as_a_stop_arrives_is_no_failure(tmp_path):
    """The supervisor is paused (SIGSTOP) while a rank of replica dp=1 is SIGKILLed and SIGTERM
    is sent, so that it finds both at once when resumed: a replica its policy would restart is
    not the launch's failure when a stop was asked for, whichever it handles first. Exit 0,
    nothing restarted, nothing left."""
    import psutil

    with Run(TP2_DP2) as run:
        before = _workers(run.wait_ready())
        os.kill(run.pid, signal.SIGSTOP)
        try:
            os.kill(before["scheduler.2"]["pid"], signal.SIGKILL)
            victim = psutil.Process(before["scheduler.2"]["pid"])
            wait_for(
                lambda: not victim.is_running() or victim.status() == psutil.STATUS_ZOMBIE,
                30,
                "scheduler.2 to die",
            )
            run.proc.send_signal(signal.SIGTERM)
        finally:
            os.kill(run.pid, signal.SIGCONT)
        assert run.wait(60) == 0, run
        out = run.stderr + run.stdout
        assert "stopping (received SIGTERM)" in out and "restarts (attempt" not in out, out
        run.assert_nothing_left()


@pytest.mark.e2e
def test_a_hung_replica_is_restarted_and_watched_again(tmp_path):
    """SIGSTOP scheduler.1 (dp=2): the watchdog calls it hung, its replica is restarted (SIGKILL
    ends even a stopped process), and the new process is watched like the old one: stopped in
    turn, it is restarted once more."""
    args = [*FAST, "--dp-size", "2", "--scheduler-target", READY_WAIT, "--http-target", READY_WAIT]
    with Run([*args, "--watchdog-timeout", "2", "--restart-backoff", "0"]) as run:
        pid = _workers(run.wait_ready())["scheduler.1"]["pid"]
        for attempt in (1, 2):
            os.kill(pid, signal.SIGSTOP)

            def restarted(attempt=attempt):
                assert run.proc.poll() is None, run
                w = _workers(run.snapshot() or {"workers": []}).get("scheduler.1")
                return w if w and w["restarts"] == attempt and w["ready"] else None

            pid = wait_for(restarted, 60, f"restart {attempt} of the hung replica\n{run}")["pid"]
        causes = [e["cause"] for e in run.history() if e["topic"] == "replica.1.restarting"]
        assert len(causes) == 2 and all("scheduler.1 stopped answering" in c for c in causes)
        run.proc.send_signal(signal.SIGTERM)
        assert run.wait(60) == 0, run
        run.assert_nothing_left()
