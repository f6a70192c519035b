"""dp=2 through the real CLI: a bounded load test (16 clients, 20 s, loopback), then a scheduler
killed mid-load. The supervisor is paused (SIGSTOP) for the kill, so the test sees the HTTP
child's own liveness signal turn ``/health`` false within a second; resumed, the supervisor tears
everything down and reports the root cause."""

from __future__ import annotations

import os
import signal
import threading
import time

import httpx
import psutil
import pytest

from test_serving_support import embedding_body, report, run_load, start_server


@pytest.fixture
def server(tmp_path):
    srv = start_server(["--dp-size", "2"], tmp_path, "dp2")
    yield srv
    srv.stop()


def test_dp2_load_then_a_scheduler_dies_mid_load(server, capsys):
    stats = run_load(server.url, embedding_body, clients=16, seconds=20)
    report(capsys, f"load dp=2: {stats['requests']} requests, {len(stats['errors'])} errors, "
                   f"{stats['throughput_rps']:.1f} req/s, p50 {stats['p50_ms']:.1f} ms, "
                   f"p99 {stats['p99_ms']:.1f} ms")
    assert stats["errors"] == [] and stats["requests"] > 0
    info = httpx.get(server.url + "/get_server_info", timeout=30).json()
    batches = [s["batches"] for s in info["schedulers"]]
    assert all(b > 10 for b in batches), batches  # least-loaded routing used both replicas

    ready = httpx.get(server.url + "/ready", timeout=30).json()
    victim = ready["schedulers"][1]["pid"]
    stop_load = threading.Event()
    result: dict = {}
    load = threading.Thread(target=lambda: result.update(run_load(
        server.url, embedding_body, clients=16, seconds=60, stop_event=stop_load)), daemon=True)
    load.start()
    try:
        time.sleep(1.0)  # let the load get going; nothing below depends on this duration
        os.kill(server.proc.pid, signal.SIGSTOP)
        os.kill(victim, signal.SIGKILL)
        killed = time.monotonic()
        while True:
            r = httpx.get(server.url + "/health", timeout=5)
            if r.status_code != 200:
                seen = time.monotonic() - killed
                break
            assert time.monotonic() - killed < 5, "health stayed true"
        body = r.json()
        assert r.status_code == 503 and body["healthy"] is False and "dp=1" in body["reason"]
        assert seen < 1.0, seen
        report(capsys, f"/health false {seen * 1000:.0f} ms after the scheduler was killed")
    finally:
        stop_load.set()
        os.kill(server.proc.pid, signal.SIGCONT)
        load.join(timeout=120)
    code = server.wait_exit(timeout=60)
    log = server.log
    assert code == 4, log  # a worker exited after the server was ready
    assert "scheduler.1 was killed by SIGKILL" in log and "every worker process is gone" in log
    assert not [p for p in psutil.process_iter(["cmdline"]) if str(server.port) in " ".join(p.info["cmdline"] or [])]
