"""SGLang's operational surface in process, against a scheduler stand-in on a real ZeroMQ socket
(``support.fake_scheduler``): ``/health_generate`` (a one-token probe; skipped while the replica
is busy generating for others; never fooled by answers to pings; 503 when the probe fails or times
out), ``/ping``, ``/get_model_info``, and ``/metrics`` with SGLang's metric names, types and ``model_name`` label beside the
launcher's ``sglang_launch_*``."""

from __future__ import annotations

import asyncio
import json

from prometheus_client.parser import text_string_to_metric_families
from support.fake_scheduler import STATS, THROUGHPUT, serve_app

from serving import wire
from serving.http.chat_template import ChatTemplate

SGLANG_METRICS = {
    "sglang:num_running_reqs": "gauge",
    "sglang:num_queue_reqs": "gauge",
    "sglang:gen_throughput": "gauge",
    "sglang:num_used_tokens": "gauge",
    "sglang:token_usage": "gauge",
    "sglang:cache_hit_rate": "gauge",
    "sglang:time_to_first_token_seconds": "histogram",
    "sglang:inter_token_latency_seconds": "histogram",
    "sglang:e2e_request_latency_seconds": "histogram",
    "sglang:prompt_tokens": "counter",
    "sglang:generation_tokens": "counter",
}


def test_health_generate_runs_a_one_token_generation(tmp_path):
    async def scenario():
        async with serve_app(tmp_path) as s:
            r = await s.http.get("/health_generate")
            return r, s.scheduler.received

    r, received = asyncio.run(scenario())
    assert (r.status_code, r.json()) == (200, {"healthy": True})
    [probe] = received
    assert isinstance(probe, wire.GenerateRequest)
    assert (probe.params.max_new_tokens, probe.params.temperature) == (1, 0.0)


def test_health_generate_is_503_when_the_probe_fails_or_times_out(tmp_path):
    async def scenario():
        async with serve_app(tmp_path, health_timeout=0.3) as s:
            s.scheduler.fail = (500, "the model failed on this batch: boom")
            failed = await s.http.get("/health_generate")
            s.scheduler.fail, s.scheduler.hold = None, True
            silent = await s.http.get("/health_generate")
            s.app.state.pool.fail("the supervisor reported server.failed")
            gone = await s.http.get("/health_generate")
            return failed, silent, gone

    failed, silent, gone = asyncio.run(scenario())
    assert failed.status_code == 503 and failed.json() == {
        "healthy": False,
        "reason": "scheduler dp=0 failed a probe: the model failed on this batch: boom",
    }
    assert silent.status_code == 503
    assert silent.json()["reason"] == "scheduler dp=0 did not answer a probe within 0.3 s"
    assert gone.status_code == 503 and "server.failed" in gone.json()["reason"]


async def _until(condition, what: str, within: float = 10.0) -> None:
    """Wait until ``condition()`` holds (a deadline, not a fixed sleep)."""
    deadline = asyncio.get_running_loop().time() + within
    while not condition():
        assert asyncio.get_running_loop().time() < deadline, f"never: {what}"
        await asyncio.sleep(0.01)


def test_health_generate_skips_the_probe_while_the_replica_generates_for_others(tmp_path):
    async def scenario():
        async with serve_app(tmp_path, health_timeout=5.0) as s:
            s.scheduler.trickle = 0.05  # a long stream, one token every 50 ms
            body = {"text": "busy", "stream": True, "sampling_params": {"max_new_tokens": 400}}
            waiting = asyncio.ensure_future(s.http.post("/generate", json=body))
            [rep] = s.app.state.pool.replicas
            await _until(lambda: rep.last_progress > float("-inf"), "a token was streamed")
            r = await s.http.get("/health_generate")
            sent = list(s.scheduler.received)
            waiting.cancel()
            await asyncio.gather(waiting, return_exceptions=True)
            return r, sent

    r, sent = asyncio.run(scenario())
    assert r.status_code == 200 and r.json() == {"healthy": True}
    assert len(sent) == 1  # only the client's request: no probe


async def _poll_ready(s, polled: list[int]) -> None:
    """GET /ready back to back, as an orchestrator's readiness probe does, until cancelled."""
    while True:
        r = await s.http.get("/ready")
        polled.append(r.status_code)


def test_health_generate_is_not_fooled_by_ready_probes_while_nothing_is_generated(tmp_path):
    """A scheduler that answers pings but generates nothing (its steps hang or fail) is
    unhealthy, however often /ready is polled meanwhile: with no request in flight (the probe
    gets no token) and with a client's request stuck after earlier tokens (no token since)."""

    async def scenario():
        async with serve_app(tmp_path, loopback=True, health_timeout=0.5) as s:
            polled: list[int] = []
            poller = asyncio.ensure_future(_poll_ready(s, polled))
            try:
                await _until(lambda: len(polled) >= 2, "/ready answered")
                ok = await s.http.get("/health_generate")  # generating: healthy
                s.scheduler.hold = True  # from now on, pings only
                idle = await s.http.get("/health_generate")
                stuck_request = asyncio.ensure_future(
                    s.http.post("/generate", json={"text": "stuck"}, timeout=30)
                )
                await _until(
                    lambda: any(g.text == "stuck" for g in s.scheduler.generations),
                    "the request was sent",
                )
                stuck = await s.http.get("/health_generate")
                before = len(polled)
                await _until(lambda: len(polled) > before, "/ready answered meanwhile")
                stuck_request.cancel()
                await asyncio.gather(stuck_request, return_exceptions=True)
            finally:
                poller.cancel()
                await asyncio.gather(poller, return_exceptions=True)
            return ok, idle, stuck, set(polled)

    ok, idle, stuck, polled = asyncio.run(scenario())
    assert polled == {200}  # the replica answered every /ready probe
    assert ok.status_code == 200
    # Which of its reasons a 503 gives (no answer to the probe, or nothing produced while it held
    # the probe) depends on where the deadline falls: both name the replica and the timeout.
    for unhealthy in (idle, stuck):
        assert unhealthy.status_code == 503
        reason = unhealthy.json()["reason"]
        assert reason.startswith("scheduler dp=0 ") and "within 0.5 s" in reason, reason
    assert stuck.status_code == 503
    assert stuck.json()["reason"].startswith("scheduler dp=0 ")
    assert "within 0.5 s" in stuck.json()["reason"]


def test_the_probe_of_an_embedding_model_embeds_one_text(tmp_path):
    async def scenario():
        async with serve_app(tmp_path, kind="embedding") as s:
            return await s.http.get("/health_generate"), s.scheduler.received

    r, received = asyncio.run(scenario())
    assert r.status_code == 200
    assert [type(m) for m in received] == [wire.EmbedRequest]


def test_ping_and_health_generate_need_no_key_and_model_info_reads_the_directory(tmp_path):
    folder = tmp_path / "model"
    folder.mkdir()
    (folder / "config.json").write_text(
        json.dumps({"model_type": "llama", "architectures": ["LlamaForCausalLM"]})
    )
    chat = ChatTemplate(None, "{{ messages }}", "--chat-template t.jinja")

    async def scenario():
        async with serve_app(tmp_path, api_key="k", model_path=str(folder), chat=chat) as s:
            ping = await s.http.get("/ping")
            probe = await s.http.get("/health_generate")
            locked = await s.http.get("/get_model_info")
            info = await s.http.get("/get_model_info", headers={"Authorization": "Bearer k"})
            return ping, probe, locked, info

    ping, probe, locked, info = asyncio.run(scenario())
    assert (ping.status_code, ping.json()) == (200, {"healthy": True})
    assert probe.status_code == 200 and locked.status_code == 401
    assert info.json() == {
        "model_path": str(folder),
        "tokenizer_path": str(folder),
        "is_generation": True,
        "preferred_sampling_params": None,
        "model_type": "llama",
        "architectures": ["LlamaForCausalLM"],
        "served_model_name": "tiny",
        "kind": "generation",
        "chat_template": "--chat-template t.jinja",
        "weights": {"format": "directory"},
    }


def samples(page: str) -> tuple[dict, dict]:
    """The page's families' types by name, and every sample's value by (name, labels)."""
    families = list(text_string_to_metric_families(page))
    types = {f.name: f.type for f in families}
    values = {
        (s.name, tuple(sorted(s.labels.items()))): s.value for f in families for s in f.samples
    }
    return types, values


def test_metrics_carry_sglangs_names_types_and_model_name_label(tmp_path):
    async def scenario():
        async with serve_app(tmp_path) as s:
            before = (await s.http.get("/metrics")).text
            await s.http.post(
                "/v1/completions", json={"prompt": "abcd", "max_tokens": 3, "stream": True}
            )
            await s.http.post(
                "/generate", json={"text": "ab", "sampling_params": {"max_new_tokens": 2}}
            )
            after = (await s.http.get("/metrics")).text
            return before, after

    before, after = asyncio.run(scenario())
    types, values = samples(before)
    assert {name: types.get(name) for name in SGLANG_METRICS} == SGLANG_METRICS
    model = (("model_name", "tiny"),)
    assert values[("sglang:num_running_reqs", model)] == STATS["running"]
    assert values[("sglang:num_queue_reqs", model)] == STATS["queued"]
    assert values[("sglang:num_used_tokens", model)] == STATS["kv_tokens_used"]
    assert values[("sglang:token_usage", model)] == 0.25
    assert values[("sglang:gen_throughput", model)] == THROUGHPUT
    assert values[("sglang:cache_hit_rate", model)] == 0  # nothing admitted yet
    assert values[("sglang:time_to_first_token_seconds_count", model)] == 0  # there at zero
    assert values[("sglang:prompt_tokens_total", model)] == 0
    _, values = samples(after)
    assert values[("sglang:time_to_first_token_seconds_count", model)] == 1  # the stream only
    assert values[("sglang:inter_token_latency_seconds_count", model)] == 2  # its later tokens
    assert values[("sglang:e2e_request_latency_seconds_count", model)] == 2
    assert values[("sglang:prompt_tokens_total", model)] == len("abcd") + len("ab")
    assert values[("sglang:generation_tokens_total", model)] == 5
    completions = (("route", "/v1/completions"), ("status", "200"))
    assert values[("sglang_launch_requests_total", completions)] == 1
    names = {name for name, _ in values}
    assert all(n.startswith(("sglang:", "sglang_launch_")) for n in names), names
