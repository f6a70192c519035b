"""dp=2 through the real CLI: a bounded load test (16 clients, 3 s, loopback), then a scheduler
killed mid-load with ``--restart-policy never``. The supervisor is paused (SIGSTOP) for the kill,
so what turns ``/health`` false is the HTTP child's own liveness signal; resumed, the supervisor
tears everything down and reports the root cause. With the default policy (on-failure at dp=2) a
replica SIGKILLed under load heals: no client sees an error, ``/health`` stays 200, ``/ready``
names the replica while it restarts, requests reach it again once it is back, and the restart is
counted in ``/metrics`` and in the events; one past ``--max-restarts`` leaves while the other
serves, and ``scale`` brings a fresh one back. Then dp=2 over two nodes (two supervisors on
loopback): replica 1 lives on node 1 and is reached over TCP through the address it announced."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import threading
import time

import httpx
import psutil
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
    start_two_nodes,
    stop_all,
)

pytestmark = pytest.mark.e2e  # every test here starts the launcher, a server or worker processes


@pytest.fixture
def server(tmp_path):
    srv = start_server(["--dp-size", "2", "--restart-policy", "never"], tmp_path, "dp2")
    yield srv
    srv.stop()


def test_dp2_load_then_a_scheduler_dies_mid_load(server, capsys):
    stats = run_load(server.url, embedding_body, clients=16, seconds=3)
    report(
        capsys,
        f"load dp=2: {stats['requests']} requests, {len(stats['errors'])} errors, "
        f"{stats['throughput_rps']:.1f} req/s, p50 {stats['p50_ms']:.1f} ms, "
        f"p99 {stats['p99_ms']:.1f} ms",
    )
    assert stats["errors"] == [] and stats["requests"] > 0
    info = httpx.get(server.url + "/get_server_info", timeout=30).json()
    batches = [s["batches"] for s in info["schedulers"]]
    assert all(b > 10 for b in batches), batches  # least-loaded routing used both replicas

    ready = httpx.get(server.url + "/ready", timeout=30).json()
    victim = ready["schedulers"][1]["pid"]
    stop_load = threading.Event()
    result: dict = {}
    load = threading.Thread(
        target=lambda: result.update(
            run_load(server.url, embedding_body, clients=16, seconds=60, stop_event=stop_load)
        ),
        daemon=True,
    )
    load.start()
    try:
        served = sum(batches)  # the second load is going once the schedulers run more batches
        wait_for(
            lambda: (
                sum(
                    s["batches"]
                    for s in httpx.get(server.url + "/get_server_info", timeout=30).json()[
                        "schedulers"
                    ]
                )
                > served + 2
            ),
            120,
            "the second load to reach the schedulers",
            interval=0.2,
        )
        os.kill(server.proc.pid, signal.SIGSTOP)
        os.kill(victim, signal.SIGKILL)
        killed = time.monotonic()
        r = wait_for(
            lambda: (h := httpx.get(server.url + "/health", timeout=30)).status_code != 200 and h,
            60,
            "/health to report the killed scheduler",
        )
        body = r.json()
        assert r.status_code == 503 and body["healthy"] is False and "dp=1" in body["reason"]
        report(
            capsys,
            f"/health false {(time.monotonic() - killed) * 1000:.0f} ms after the scheduler was killed",
        )
    finally:
        stop_load.set()
        os.kill(server.proc.pid, signal.SIGCONT)
        load.join(timeout=120)
    code = server.wait_exit(timeout=120)
    log = server.log
    assert code == 4, log  # a worker exited after the server was ready
    assert "scheduler.1 was killed by SIGKILL" in log and "every worker process is gone" in log
    assert not [
        p
        for p in psutil.process_iter(["cmdline"])
        if str(server.port) in " ".join(p.info["cmdline"] or [])
    ]


def test_dp2_over_two_nodes_serves_from_both(tmp_path):
    nodes = start_two_nodes(["--dp-size", "2"], tmp_path, "dp2-2nodes")
    try:
        node0, node1 = nodes
        ready = httpx.get(node0.url + "/ready", timeout=30).json()
        assert [s["dp_rank"] for s in ready["schedulers"]] == [0, 1]
        on_node1 = {p.pid for p in psutil.Process(node1.proc.pid).children(recursive=True)}
        assert (
            ready["schedulers"][1]["pid"] in on_node1
            and ready["schedulers"][0]["pid"] not in on_node1
        )
        stats = run_load(node0.url, embedding_body, clients=8, seconds=3)
        assert stats["errors"] == [] and stats["requests"] > 0
        info = httpx.get(node0.url + "/get_server_info", timeout=30).json()
        batches = [s["batches"] for s in info["schedulers"]]
        assert all(b > 0 for b in batches), batches  # both replicas answered
        assert "scheduler dp=1 at tcp://127.0.0.1:" in node0.log
        assert "node 1 ready" in node1.log
    finally:
        stop_all(nodes)
    assert [n.proc.returncode for n in nodes] == [0, 0], "\n".join(n.log for n in nodes)


def test_a_replica_node_0_cannot_reach_keeps_the_launch_from_claiming_ready(tmp_path):
    """Node 1 never starts: node 0's scheduler is up, but /ready names the missing replica and the
    supervisor never says ready. (That a start-up timeout then ends a launch is the faults suite's
    case; here a stop ends it, so the test does not sit out the timeout.)"""
    from support import free_port
    from support.serving import Server

    node0 = Server(
        [
            "--dp-size",
            "2",
            "--nnodes",
            "2",
            "--node-rank",
            "0",
            "--startup-timeout",
            "600",
            "--dist-init-addr",
            f"127.0.0.1:{free_port()}",
        ],
        tmp_path / "lonely-node0.log",
    )
    try:

        def ready_names_only_the_missing_replica():
            assert node0.proc.poll() is None, node0.log
            try:
                r = httpx.get(node0.url + "/ready", timeout=30)
            except httpx.TransportError:
                return None  # the HTTP child is not listening yet
            return r if r.status_code == 503 and "dp=[1]" in r.json().get("reason", "") else None

        r = wait_for(
            ready_names_only_the_missing_replica,
            180,
            f"/ready to name replica dp=1 alone (dp=0 answering)\n{node0.log}",
        )
        assert "not announced" in r.json()["reason"], r.text
        node0.proc.send_signal(signal.SIGTERM)
        assert node0.wait_exit(timeout=60) == 0, node0.log  # a stop during start-up
        assert "sglang-launch: ready at" not in node0.log, node0.log
    finally:
        node0.stop()


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
