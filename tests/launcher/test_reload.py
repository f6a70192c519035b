"""Reloads and scales seen from the supervisor: real ``sglang-launch`` processes with the test
suite's workers (no model), the real ``reload`` and ``scale`` commands, real signals, the real
query socket and its event history.

- a reload replaces every scheduler replica one at a time with fresh processes (each new one
  serves before the old one stops), the HTTP child untouched; ``--reload-surge 0`` keeps the dp
  rank and stops the old one first;
- a new replica that fails stops the reload: what was replaced goes back, the old model serves
  on the same number of replicas, and the command exits 1 with the root cause;
- a reload re-reads the installed plugins (a general plugin installed meanwhile runs in the new
  replicas) but refuses a change of the platform distributions (exit 2, "restart");
- ``scale`` and SIGTTIN / SIGTTOU add and remove replicas; the default restart policy follows
  their number and covers the new ones;
- SIGHUP reloads; the hang-up of a terminal that went away still stops the launcher;
- the embedded ``Launcher.reload()`` / ``scale()``;
- a reload to a model of another kind (an embedding model to a causal LM) is refused before
  anything starts (exit 2, both kinds named, the old replicas serving on), by the command, the
  query socket and ``Launcher.reload()``, unless forced (``--allow-kind-change``): then the
  ``reload.*`` events say both kinds and the launcher logs a warning.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from support import REPO, make_dist, wait_for
from support.supervisor import FAST, READY_WAIT, TESTS, Run

pytestmark = pytest.mark.e2e  # every test here starts a launcher and its workers

FAILS = "support.workers.fail_when_model_says"
BASIC = [*FAST, "--scheduler-target", READY_WAIT, "--http-target", READY_WAIT]


def _schedulers(snapshot: dict) -> dict[str, int]:
    return {w["name"]: w["pid"] for w in snapshot["workers"] if w["role"] == "scheduler"}


def _seq(events: list[dict], topic: str) -> int:
    return next(e["seq"] for e in events if e["topic"] == topic)


def _model(folder: Path, architecture: str | None = None) -> str:
    """A folder that passes for a model directory (the test workers load nothing from it): an
    embedding model, or a model of ``architecture`` (``LlamaForCausalLM``: a generation one)."""
    folder.mkdir(parents=True, exist_ok=True)
    config = {"architectures": [architecture]} if architecture else {}
    (folder / "config.json").write_text(json.dumps(config))
    return str(folder)


def _ready_schedulers(run: Run, count: int) -> dict[str, int]:
    def settled():
        assert run.proc.poll() is None, run
        snap = run.snapshot()
        if not snap or snap["change"] is not None:
            return None
        workers = [w for w in snap["workers"] if w["role"] == "scheduler"]
        ok = len(workers) == count and all(w["ready"] for w in workers)
        return _schedulers(snap) if ok else None

    return wait_for(settled, 60, f"{count} ready scheduler(s)\n{run}")


def test_a_reload_replaces_every_replica_one_at_a_time_with_fresh_processes(tmp_path):
    with Run([*BASIC, "--dp-size", "2", "--model-path", _model(tmp_path / "a")]) as run:
        before = run.wait_ready()
        old = _schedulers(before)
        http = next(w["pid"] for w in before["workers"] if w["role"] == "http")
        done = run.cli("reload", "--model-path", _model(tmp_path / "b"))
        assert done.returncode == 0, done.stderr + done.stdout
        assert "reload 1 done" in done.stdout, done.stdout
        after = run.snapshot()
        new = _schedulers(after)
        assert len(new) == 2 and not set(new.values()) & set(old.values()), (old, new)
        assert next(w["pid"] for w in after["workers"] if w["role"] == "http") == http
        assert after["model_path"] == str(tmp_path / "b") and after["served_model_name"] == "b"
        assert after["change"] is None and len(after["replicas"]) == 2

        events = run.history()
        started = next(e for e in events if e["kind"] == "reload.started")
        assert started["previous_model_path"] == str(tmp_path / "a")
        assert started["model_path"] == str(tmp_path / "b") and started["replicas"] == [0, 1]
        replaced = [e for e in events if e["kind"] == "replica.replaced"]
        assert [e["dp_rank"] for e in replaced] == [0, 1], replaced
        for event in replaced:  # each new replica served before the old one was told to drain
            assert _seq(events, f"replica.{event['by']}.serving") < _seq(
                events, f"replica.{event['dp_rank']}.draining"
            )
            assert set(event["previous_pids"]) <= set(old.values())
            assert event["seconds"] >= event["startup_s"] > 0
        assert [e["kind"] for e in events].count("reload.finished") == 1
        status = run.cli("status").stdout
        assert "model b (" in status and "in progress" not in status, status
        os.kill(run.pid, signal.SIGTERM)
        assert run.wait(60) == 0, run
        run.assert_nothing_left()


def test_reload_surge_0_stops_the_old_replica_first_and_keeps_its_dp_rank():
    with Run([*BASIC, "--reload-surge", "0"]) as run:
        old = _schedulers(run.wait_ready())
        done = run.cli("reload")
        assert done.returncode == 0, done.stderr + done.stdout
        new = _schedulers(run.snapshot())
        assert list(new) == ["scheduler.0"] and new["scheduler.0"] != old["scheduler.0"]
        events = run.history()
        assert _seq(events, "worker.scheduler.0.exited") < _seq(events, "replica.0.joining")
        draining = next(e for e in events if e["kind"] == "replica.draining")
        assert draining["in_place"] is True
        os.kill(run.pid, signal.SIGTERM)
        assert run.wait(60) == 0, run


@pytest.mark.parametrize("starts_before_failing", [0, 1])
def test_a_replica_that_fails_stops_the_reload_and_what_was_replaced_goes_back(
    tmp_path, starts_before_failing
):
    """The new model's first replica fails (0), or its second, after the first replaced dp=0
    (1): the old model serves on two replicas again, the command exits 1 with the root cause."""
    good = _model(tmp_path / "good")
    bad = _model(tmp_path / "bad")
    (tmp_path / "bad" / "fail").write_text(str(starts_before_failing))
    args = [*FAST, "--dp-size", "2", "--scheduler-target", FAILS, "--http-target", READY_WAIT]
    with Run([*args, "--model-path", good]) as run:
        old = _schedulers(run.wait_ready())
        done = run.cli("reload", "--model-path", bad)
        assert done.returncode == 1, done.stderr + done.stdout
        assert f"worker failed on purpose: {bad} cannot be loaded" in done.stderr, done.stderr
        assert "reload 1 failed" in done.stdout, done.stdout
        after = run.snapshot()
        assert after["model_path"] == good and len(after["replicas"]) == 2
        now = _ready_schedulers(run, 2)
        failed = next(e for e in run.history() if e["kind"] == "reload.failed")
        assert failed["model_path"] == good and failed["rollback_failures"] == []
        if starts_before_failing == 0:  # nothing was replaced: the old processes serve on
            assert sorted(now.values()) == sorted(old.values()) and failed["rolled_back"] == []
        else:  # dp=0 was replaced by a replica of the new model, which was replaced back
            assert len(failed["rolled_back"]) == 1
            assert old["scheduler.1"] in now.values() and old["scheduler.0"] not in now.values()
        assert run.proc.poll() is None  # the launch goes on
        os.kill(run.pid, signal.SIGTERM)
        assert run.wait(60) == 0, run
        run.assert_nothing_left()


# A general plugin whose hook records, in each process that loads it, the plugin's version.
HOOKS = {
    "late_hooks/__init__.py": """
        import os

        def register():
            folder = os.environ.get("LATE_HOOKS_DIR")
            if folder and "RANK" in os.environ:
                open(os.path.join(folder, f"loaded.{os.getpid()}"), "w").close()
    """,
}


def test_a_reload_reads_the_installed_plugins_again_but_keeps_the_platform(tmp_path):
    site, seen = tmp_path / "site", tmp_path / "seen"
    site.mkdir()
    seen.mkdir()
    with Run(BASIC, sites=[site], env={"LATE_HOOKS_DIR": str(seen)}) as run:
        run.wait_ready()
        make_dist(
            site,
            "late-hooks",
            entry_points={"sglang.srt.plugins": {"late": "late_hooks:register"}},
            modules=HOOKS,
            version="1.2.0",
        )
        done = run.cli("reload")
        assert done.returncode == 0, done.stderr + done.stdout
        assert "also late-hooks 1.2.0 installed" in done.stdout, done.stdout
        (new,) = _schedulers(run.snapshot()).values()  # dp=1 now: it started beside dp=0
        assert (seen / f"loaded.{new}").exists()  # the new replica loaded the new plugin

        make_dist(
            site,
            "other-platform",
            entry_points={"sglang.srt.platforms": {"other": "other_platform:activate"}},
        )
        refused = run.cli("reload")
        assert refused.returncode == 2, refused.stderr + refused.stdout
        assert "the installed srt platform plugins changed since this launch started" in (
            refused.stderr
        )
        assert "other from other-platform was installed" in refused.stderr
        assert "restart the server" in refused.stderr
        assert list(_schedulers(run.snapshot()).values()) == [new]
        os.kill(run.pid, signal.SIGTERM)
        assert run.wait(60) == 0, run


def test_scale_and_sigttin_sigttou_add_and_remove_replicas_which_the_policy_covers():
    with Run([*BASIC, "--restart-backoff", "0.1"]) as run:
        first = _schedulers(run.wait_ready())["scheduler.0"]
        up = run.cli("scale", "--dp-size", "3")
        assert up.returncode == 0, up.stderr + up.stdout
        assert "restart policy on-failure" in up.stdout, up.stdout
        three = _ready_schedulers(run, 3)
        assert three["scheduler.0"] == first  # the replica that served stays

        os.kill(three["scheduler.2"], signal.SIGKILL)  # an added replica heals like the others

        def healed():
            restarted = [e for e in run.history() if e["kind"] == "replica.ready"]
            return restarted if restarted and restarted[0]["dp_rank"] == 2 else None

        wait_for(healed, 60, f"the added replica to be restarted\n{run}")
        _ready_schedulers(run, 3)

        os.kill(run.pid, signal.SIGTTOU)
        assert sorted(_ready_schedulers(run, 2)) == ["scheduler.0", "scheduler.1"]
        os.kill(run.pid, signal.SIGTTIN)
        _ready_schedulers(run, 3)
        down = run.cli("scale", "--dp-size", "1")
        assert down.returncode == 0, down.stderr + down.stdout
        assert _ready_schedulers(run, 1) == {"scheduler.0": first}
        assert "restart policy never" in down.stdout

        zero = run.cli("scale", "--dp-size", "0")
        assert zero.returncode == 2 and "must be at least 1" in zero.stderr, zero.stderr
        os.kill(run.pid, signal.SIGTERM)
        assert run.wait(60) == 0, run
        run.assert_nothing_left()


def test_a_scale_past_the_devices_the_schedulers_see_is_refused_with_exit_2():
    # The schedulers report 2 visible devices (a real one asks torch; this machine has no
    # accelerator, so the test workers claim them): a third tp=1 replica has no device.
    with Run(BASIC, env={"TESTWORKER_DEVICES": "2"}) as run:
        run.wait_ready()
        refused = run.cli("scale", "--dp-size", "3")
        assert refused.returncode == 2, refused.stderr + refused.stdout
        assert "--dp-size 3 needs devices 0-2 on this node" in refused.stderr, refused.stderr
        assert "its schedulers see 2; scale to at most 2" in refused.stderr, refused.stderr
        assert len(_ready_schedulers(run, 1)) == 1  # nothing was started
        up = run.cli("scale", "--dp-size", "2")
        assert up.returncode == 0, up.stderr + up.stdout
        _ready_schedulers(run, 2)
        os.kill(run.pid, signal.SIGTERM)
        assert run.wait(60) == 0, run
        run.assert_nothing_left()


def test_sighup_reloads_and_the_launcher_keeps_running():
    with Run(BASIC) as run:
        (old,) = _schedulers(run.wait_ready()).values()
        os.kill(run.pid, signal.SIGHUP)

        def reloaded():
            assert run.proc.poll() is None, run
            done = [e for e in run.history() if e["kind"] == "reload.finished"]
            return done or None

        wait_for(reloaded, 60, f"the reload SIGHUP asked for\n{run}")
        (new,) = _schedulers(run.snapshot()).values()
        assert new != old
        started = next(e for e in run.history() if e["kind"] == "reload.started")
        assert started["reason"] == "received SIGHUP"
        os.kill(run.pid, signal.SIGTERM)
        assert run.wait(60) == 0, run


def _lead_a_session_on_stdin() -> None:
    """In the child before it runs: a new session whose controlling terminal is fd 0."""
    import fcntl
    import termios

    os.setsid()
    fcntl.ioctl(0, termios.TIOCSCTTY, 0)


def test_the_hang_up_of_a_terminal_that_went_away_stops_the_launcher(tmp_path):
    """The launcher runs in a pseudo-terminal as its session leader. A SIGHUP sent while the
    terminal is there reloads; closing the terminal's master side hangs it up, and the kernel's
    SIGHUP stops the launcher instead of reloading."""
    import pty

    from support import clean_env
    from support.supervisor import TAG, short_runtime_dir

    master, slave = pty.openpty()
    runtime_dir = short_runtime_dir()
    env = clean_env()
    env.update(
        PYTHONPATH=os.pathsep.join([str(REPO), str(TESTS)]),
        XDG_RUNTIME_DIR=runtime_dir,
        **{TAG: "pty"},
    )
    log = tmp_path / "launcher.log"
    with open(log, "w") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "launcher", *BASIC],
            stdin=slave,
            stdout=slave,
            stderr=out,
            env=env,
            cwd=str(REPO),
            preexec_fn=_lead_a_session_on_stdin,
        )
    os.close(slave)
    try:
        wait_for(lambda: "ready at" in log.read_text(), 60, f"the launcher to be ready\n{log}")
        os.kill(proc.pid, signal.SIGHUP)  # kill -HUP from another shell: the terminal is there
        wait_for(lambda: "reload 1 done" in log.read_text(), 60, f"the reload\n{log}")
        os.close(master)  # the terminal window closes
        master = -1
        assert proc.wait(60) == 0, log.read_text()
        text = log.read_text()
        assert "received SIGHUP: the terminal went away; stopping" in text, text
        assert "reload 2" not in text, text
    finally:
        if master >= 0:
            os.close(master)
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)


def test_the_embedded_launcher_reloads_and_scales(tmp_path):
    from support import free_port

    from launcher import Launcher, LaunchError

    good = _model(tmp_path / "good")
    bad = _model(tmp_path / "bad")
    (tmp_path / "bad" / "fail").write_text("0")
    with Launcher(
        scheduler_target=FAILS,
        http_target=READY_WAIT,
        model_path=good,
        port=free_port(),
        stop_grace_period=5,
    ) as launcher:
        (old,) = _schedulers(launcher.status()).values()
        finished = launcher.reload(served_model_name="renamed")
        assert finished["kind"] == "reload.finished" and finished["served_name"] == "renamed"
        assert old not in _schedulers(launcher.status()).values()
        with pytest.raises(LaunchError) as failed:
            launcher.reload(model_path=bad)
        assert "cannot be loaded" in str(failed.value)
        assert launcher.status()["model_path"] == good
        scaled = launcher.scale(2)
        assert scaled["kind"] == "scale.finished" and len(scaled["replicas"]) == 2
        with pytest.raises(ValueError, match="must be at least 1"):
            launcher.scale(0)
        assert len(_schedulers(launcher.status())) == 2


def test_a_reload_to_a_model_of_another_kind_is_refused_unless_forced(tmp_path):
    from launcher.query import QueryError, QueryRefused

    embedder = _model(tmp_path / "minilm")
    llama = _model(tmp_path / "llama", "LlamaForCausalLM")
    with Run([*BASIC, "--dp-size", "2", "--model-path", embedder]) as run:
        old = _schedulers(run.wait_ready())
        refused = run.cli("reload", "--model-path", llama)
        assert refused.returncode == 2, refused.stderr + refused.stdout
        assert (
            f"sglang-launch reload: refused: the reload changes what the server serves, from "
            f"embedding ({embedder}) to generation ({llama})"
        ) in refused.stderr, refused.stderr
        assert "pass --allow-kind-change" in refused.stderr, refused.stderr
        with pytest.raises(QueryRefused, match="from embedding .* to generation"):
            run.ask({"query": "reload", "model_path": llama})
        with pytest.raises(QueryError, match='"allow_kind_change" must be true or false'):
            run.ask({"query": "reload", "model_path": llama, "allow_kind_change": "yes"})
        # Nothing started: the same processes serve the same model, no reload began.
        assert _ready_schedulers(run, 2) == old
        assert run.snapshot()["model_path"] == embedder
        assert not [e for e in run.history() if e["kind"].startswith("reload.")]

        forced = run.cli("reload", "--model-path", llama, "--allow-kind-change")
        assert forced.returncode == 0, forced.stderr + forced.stdout
        events = run.history()
        started = next(e for e in events if e["kind"] == "reload.started")
        assert (started["previous_model_kind"], started["model_kind"]) == (
            "embedding",
            "generation",
        )
        finished = next(e for e in events if e["kind"] == "reload.finished")
        assert finished["model_kind"] == "generation" and finished["model_path"] == llama
        new = _ready_schedulers(run, 2)
        assert not set(new.values()) & set(old.values())
        wait_for(
            lambda: "reload 1 changes what the server serves, from embedding" in run.stderr,
            30,
            f"the warning in the launcher's log\n{run}",
        )
        same = run.cli("reload")  # the same kind again: no flag needed, nothing logged
        assert same.returncode == 0, same.stderr + same.stdout
        os.kill(run.pid, signal.SIGTERM)
        assert run.wait(60) == 0, run
        assert "reload 2 changes" not in run.stderr  # refusals began no reload: ids 1 and 2
        run.assert_nothing_left()


def test_the_embedded_launcher_refuses_a_change_of_kind_unless_allowed(tmp_path):
    from support import free_port

    from launcher import Launcher

    embedder = _model(tmp_path / "minilm")
    llama = _model(tmp_path / "llama", "LlamaForCausalLM")
    with Launcher(
        scheduler_target=READY_WAIT,
        http_target=READY_WAIT,
        model_path=embedder,
        port=free_port(),
        stop_grace_period=5,
    ) as launcher:
        (old,) = _schedulers(launcher.status()).values()
        with pytest.raises(ValueError, match="allow_kind_change=True"):
            launcher.reload(model_path=llama)
        assert list(_schedulers(launcher.status()).values()) == [old]
        finished = launcher.reload(model_path=llama, allow_kind_change=True)
        assert finished["model_kind"] == "generation"
        assert launcher.status()["model_path"] == llama
