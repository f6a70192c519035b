"""The platform chooses the KV memory classes, in real launches: platform plugins with real
entry points (``support.memory_plugins``) select themselves with ``SGLANG_PLATFORM``.

- a subclass of SGLang's stock pool is the pool a launch writes keys and values into (its
  ``set_kv_buffer`` runs for a /generate);
- SGLang's stock classes by SGLang's module names serve;
- a class that is not a subclass of SGLang's base stops start-up with exit 5, the root cause
  naming the platform's class, the method and what it returned.
"""

from __future__ import annotations

import pytest
from support.memory_plugins import memory_plugins
from support.serving import Server, build_tiny_llama, post, server_env, start_server

from launchspec.model_source import embedding_model_dir


@pytest.fixture(scope="module")
def plugin_site(tmp_path_factory):
    site = tmp_path_factory.mktemp("memory-plugins")
    memory_plugins(site)
    return site


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return build_tiny_llama(tmp_path_factory.mktemp("tiny") / "tiny-llama", embedding_model_dir())


def _env(site, platform: str, **extra: str):
    return server_env(
        SGLANG_USE_CPU_ENGINE=None, SGLANG_PLATFORM=platform, PYTHONPATH=str(site), **extra
    )


def _generate(server: Server) -> dict:
    body = {"text": "Once upon a time", "sampling_params": {"max_new_tokens": 4, "temperature": 0}}
    response = post(f"{server.url}/generate", body)
    assert response.status_code == 200, (response.text, server.log)
    return response.json()


def test_a_vendor_subclass_of_the_stock_pool_is_the_pool_a_launch_writes(
    plugin_site, tiny, tmp_path
):
    marks = tmp_path / "kv-writes.txt"
    server = start_server(
        ["--model-path", str(tiny), "--max-total-tokens", "512"],
        tmp_path,
        "subpool",
        env=_env(plugin_site, "subpool", MARK_KV_WRITES=str(marks)),
    )
    try:
        before = marks.read_text() if marks.exists() else ""
        answer = _generate(server)
        assert answer["meta_info"]["completion_tokens"] == 4, answer
        after = marks.read_text()
        written = after[len(before) :].split()
        assert written, f"MarkingPool.set_kv_buffer never ran\n{server.log}"
        layers = {int(line) for line in written[::2]}
        assert layers == {0, 1}, written  # both layers of the tiny model
    finally:
        server.stop()


def test_sglangs_stock_classes_by_name_serve(plugin_site, tiny, tmp_path):
    server = start_server(
        ["--model-path", str(tiny), "--max-total-tokens", "512"],
        tmp_path,
        "stockpool",
        env=_env(plugin_site, "stockpool"),
    )
    try:
        assert _generate(server)["meta_info"]["completion_tokens"] == 4
    finally:
        server.stop()


def test_a_class_that_is_not_sglangs_stops_start_up_with_exit_5_naming_it(
    plugin_site, tiny, tmp_path
):
    server = Server(
        ["--model-path", str(tiny), "--max-total-tokens", "512"],
        tmp_path / "badpool.log",
        env=_env(plugin_site, "badpool"),
    )
    try:
        code = server.wait_exit(timeout=180)
    finally:
        server.stop()
    log = server.log
    assert code == 5, log
    assert "scheduler.0 cannot use what the platform provides" in log, log
    assert (
        "error:      serving.srt.mem_cache.platform_classes.PlatformClassUnusable: plg_badpool_mem"
        ".platform.Plat.get_mha_kv_pool_cls() returned builtins.dict, which is not a subclass of "
        "serving.srt.mem_cache.memory_pool.MHATokenToKVPool" in log
    ), log
    assert "PlatformClassUnusable" in log and "what to do:" in log, log
