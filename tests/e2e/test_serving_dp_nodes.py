"""dp=2 through the real CLI: a bounded load test (16 clients, 3 s, loopback), then a scheduler
killed mid-load with ``--restart-policy never``. The supervisor is paused (SIGSTOP) for the kill,
so what turns ``/health`` false is the HTTP child's own liveness signal; resumed, the supervisor
tears everything down and reports the root cause. Then dp=2 over two nodes (two supervisors on
loopback): replica 1 lives on node 1 and is reached over TCP through the address it announced;
with node 1 never started, ``/ready`` names the missing replica and the launch never says ready.
The healing of dp=2 replicas: ``test_serving_dp.py``."""

from __future__ import annotations

import os
import signal
import threading
import time

import httpx
import psutil
import pytest
from support import wait_for
from support.serving import (
    embedding_body,
    load_line,
    report,
    run_load,
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
    report(capsys, load_line("load dp=2", stats))
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
