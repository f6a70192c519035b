"""dp=2 healing through the real CLI. With the default policy (on-failure at dp=2) a replica
SIGKILLed under load heals: no client sees an error, ``/health`` stays 200, ``/ready`` names the
replica while it restarts, requests reach it again once it is back, and the restart is counted
in ``/metrics`` and in the events; one past ``--max-restarts`` leaves while the other serves, and
``scale`` brings a fresh one back. With ``--tp-size 2`` the tp group of a killed rank restarts as
a unit. The bounded load test, a kill under ``--restart-policy never`` and dp=2 over two nodes:
``test_serving_dp_nodes.py``."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import threading
import time

import httpx
import pytest
from support import wait_for
from support.serving import (
    build_tiny_llama,
    cli_command,
    embedding_body,
    report,
    run_load,
    server_env,
    start_server,
)

pytestmark = pytest.mark.e2e  # every test here starts the launcher, a server or worker processes


def _schedulers(url: str) -> list:
    return httpx.get(url + "/get_server_info", timeout=30).json()["schedulers"]


def _lines_until_snapshot(follow: subprocess.Popen, timeout_s: float) -> str:
    """What ``events --follow`` printed up to its snapshot line (it is subscribed by then)."""
    assert follow.stdout is not None
    stdout = follow.stdout
    lines: list[str] = []
    got = threading.Event()

    def read() -> None:
        for line in iter(stdout.readline, ""):
            lines.append(line)
            if line.startswith('{"topic": "snapshot"'):
                got.set()
                return

    threading.Thread(target=read, daemon=True).start()
    assert got.wait(timeout_s), f"events --follow printed no snapshot in {timeout_s:.0f} s: {lines}"
    return "".join(lines)


def test_dp2_heals_a_killed_replica_then_one_past_its_restarts_leaves_and_a_scale_brings_it_back(
    tmp_path, capsys
):
    """One dp=2 launch under the default policy (on-failure at dp=2) with ``--max-restarts 1``,
    under one load throughout: a replica SIGKILLed heals (no client error, ``/health`` 200,
    ``/ready`` names it while it restarts, requests reach it again, the restart counted in
    ``/metrics`` and in the events); SIGKILLed once more it is past its restarts and leaves while
    the other serves; ``scale`` brings a fresh one back. start_server returns once the launcher
    itself says ready (a kill before that is a start-up failure, which ends the launch)."""
    srv = start_server(["--dp-size", "2", "--max-restarts", "1"], tmp_path, "dp2-heal")
    follow = subprocess.Popen(
        [*cli_command(), "events", "--follow", "--pid", str(srv.proc.pid)],
        env=server_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    stop_load = threading.Event()
    result: dict = {}
    seen = ""  # what events --follow printed up to its snapshot
    load = threading.Thread(
        target=lambda: result.update(
            run_load(
                srv.url, embedding_body, clients=4, seconds=600, pause=0.1, stop_event=stop_load
            )
        ),
        daemon=True,
    )
    health: list[int] = []
    try:
        ready = httpx.get(srv.url + "/ready", timeout=30).json()
        assert ready["restarting"] == []
        victim = ready["schedulers"][1]["pid"]
        # The follower prints the snapshot once it is subscribed: from then on it hears every
        # event (a kill before that would go unheard).
        seen = _lines_until_snapshot(follow, 120)
        load.start()
        wait_for(
            lambda: all((s["batches"] or 0) > 2 for s in _schedulers(srv.url)),
            120,
            "the load to reach both replicas",
            interval=0.2,
        )
        os.kill(victim, signal.SIGKILL)
        killed = time.monotonic()
        named: list[list] = []

        def back_and_serving():
            health.append(httpx.get(srv.url + "/health", timeout=30).status_code)
            r = httpx.get(srv.url + "/ready", timeout=30)
            named.append(r.json().get("restarting") if r.status_code == 200 else [r.text])
            again = _schedulers(srv.url)[1]
            return again if again and again["pid"] != victim else None

        again = wait_for(back_and_serving, 240, "replica dp=1 to be back", interval=0.1)
        back_s = time.monotonic() - killed
        wait_for(
            lambda: (_schedulers(srv.url)[1]["batches"] or 0) > 2,
            60,
            "requests to reach the restarted replica",
            interval=0.2,
        )
        metrics = httpx.get(srv.url + "/metrics", timeout=30).text
        assert set(health) == {200}, health  # one replica served the whole time
        assert ["scheduler dp=1"] in named, named  # /ready named it while it restarted
        assert again["dp_rank"] == 1
        assert 'sglang_launch_replica_restarts_total{dp="1"} 1.0' in metrics, metrics
        assert "scheduler dp=1 restarts (attempt 1 of 1" in srv.log, srv.log

        # Once more: past its restarts, it leaves and the other replica serves on.
        os.kill(again["pid"], signal.SIGKILL)

        def one_left():
            health.append(httpx.get(srv.url + "/health", timeout=30).status_code)
            ready = httpx.get(srv.url + "/ready", timeout=30).json()
            # First it is dead (listed restarting), then gone (listed nowhere).
            gone = len(ready.get("schedulers") or ()) == 1 and ready.get("restarting") == []
            return ready if gone else None

        ready = wait_for(one_left, 120, "replica dp=1 to leave", interval=0.1)
        assert ready["schedulers"][0]["dp_rank"] == 0, ready
        assert "scheduler dp=1 was restarted 1 time(s) already (--max-restarts 1)" in srv.log
        assert "it is taken out of service and the other replicas serve on" in srv.log
        assert srv.proc.poll() is None  # the launch goes on
        scaled = subprocess.run(
            [*cli_command(), "scale", "--dp-size", "2", "--pid", str(srv.proc.pid)],
            env=server_env(),
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert scaled.returncode == 0, scaled.stdout + scaled.stderr
        back = httpx.get(srv.url + "/ready", timeout=30).json()["schedulers"]
        assert len(back) == 2, back
        assert not {victim, again["pid"]} & {s["pid"] for s in back}, back
    except BaseException:
        print(f"--- sglang-launch output ({srv.log_path}):\n{srv.log}")
        raise
    finally:
        stop_load.set()
        load.join(timeout=120)
        srv.stop()
        try:
            events_out = seen + follow.communicate(timeout=30)[0]
        except subprocess.TimeoutExpired:
            follow.kill()
            events_out = seen + follow.communicate()[0]
    stats = result
    assert stats["errors"] == [] and stats["requests"] > 0, stats["errors"][:5]
    assert set(health) == {200}, health  # one replica served through both kills
    assert srv.proc.returncode == 0, srv.log
    events = [json.loads(line) for line in events_out.splitlines() if line.startswith("{")]
    # The first kill is the one restart; the second is past --max-restarts: no restart.
    restarts = [e for e in events if e["topic"].endswith(".restarting")]
    assert [(e["topic"], e["attempt"]) for e in restarts] == [("replica.1.restarting", 1)]
    assert "scheduler.1 was killed by SIGKILL" in restarts[0]["cause"]
    ready_again = [e for e in events if e["topic"] == "replica.1.ready"]
    assert len(ready_again) == 1, [e["topic"] for e in events]
    report(
        capsys,
        f"heal dp=2: replica dp=1 back {back_s:.1f} s after SIGKILL (supervisor: "
        f"{ready_again[0]['down_s']:.1f} s from the failure to ready), then set aside and scaled "
        f"back; {stats['requests']} requests from 4 clients, {len(stats['errors'])} client "
        f"errors, /health 200 on {len(health)} of {len(health)} polls",
    )


def _status(srv) -> dict[str, dict]:
    """The launch's workers, from ``sglang-launch status --json``."""
    out = subprocess.run(
        [*cli_command(), "status", "--json", "--pid", str(srv.proc.pid)],
        env=server_env(),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    return {w["name"]: w for w in json.loads(out.stdout)["workers"]}


def test_tp2_dp2_restarts_the_tp_group_of_a_killed_rank_as_a_unit(tmp_path, capsys):
    """Killing tensor-parallel rank 1 of replica dp=1 (a rank the HTTP child never talks to)
    restarts both of that replica's ranks; generation under load sees no error."""
    from launchspec.model_source import embedding_model_dir

    tiny = build_tiny_llama(tmp_path / "tiny-llama", embedding_model_dir())
    srv = start_server(
        ["--model-path", str(tiny), "--tp-size", "2", "--dp-size", "2"], tmp_path, "tp2dp2-heal"
    )
    stop_load = threading.Event()
    result: dict = {}

    def body(i: int) -> dict:
        return {"text": f"count to {i}", "sampling_params": {"max_new_tokens": 4}}

    load = threading.Thread(
        target=lambda: result.update(
            run_load(
                srv.url,
                body,
                clients=2,
                seconds=600,
                pause=0.1,
                path="/generate",
                stop_event=stop_load,
            )
        ),
        daemon=True,
    )
    try:
        before = _status(srv)
        load.start()
        wait_for(
            lambda: all((s["batches"] or 0) > 1 for s in _schedulers(srv.url)),
            120,
            "the load to reach both replicas",
            interval=0.2,
        )
        os.kill(before["scheduler.3"]["pid"], signal.SIGKILL)
        killed = time.monotonic()

        def regrouped():
            workers = _status(srv)
            group = [workers["scheduler.2"], workers["scheduler.3"]]
            return workers if all(w["restarts"] == 1 and w["ready"] for w in group) else None

        after = wait_for(regrouped, 240, "replica dp=1 (both ranks) to be restarted", interval=0.2)
        wait_for(
            lambda: (s := _schedulers(srv.url)[1]) and (s["batches"] or 0) > 1,
            120,
            "requests to reach the restarted replica",
            interval=0.2,
        )
        back_s = time.monotonic() - killed
        assert _schedulers(srv.url)[1]["pid"] == after["scheduler.2"]["pid"]
    finally:
        stop_load.set()
        load.join(timeout=120)
        srv.stop()
    for name in ("scheduler.2", "scheduler.3"):
        assert after[name]["pid"] != before[name]["pid"], name
    for name in ("http.0", "scheduler.0", "scheduler.1"):
        assert after[name]["pid"] == before[name]["pid"] and after[name]["restarts"] == 0, name
    assert result["errors"] == [] and result["requests"] > 0, result["errors"][:5]
    assert srv.proc.returncode == 0, srv.log
    report(
        capsys,
        f"heal tp=2 dp=2: tp group dp=1 back and serving {back_s:.1f} s after SIGKILL of its "
        f"rank 1, {result['requests']} generations from 2 clients, "
        f"{len(result['errors'])} client errors",
    )
