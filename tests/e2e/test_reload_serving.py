"""Reload and scale a real server under load, through the real CLI: the all-MiniLM-L6-v2
embedding model and a tiny Llama built at test time, on the CPU platform, four clients on
loopback throughout.

- a reload to another model directory under an embedding load: no client error, every scheduler
  process is new, ``/v1/models`` names the new model; a reload to a directory that is not a
  model exits non-zero naming it, with no client error and the same replicas serving;
- under a load of streamed generations, one launch: SIGHUP with ``--dp-size 1`` (the launcher
  goes on, its scheduler is a new process), then a scale to 2, a reload, a scale to 3 and back
  to 1: no stream fails or is cut, and the schedulers are 2 (all new), 3, then 1.

Where cases need the same configuration one launch serves them in turn, inside one test. The
in-place reload, the change of kind, the diffusion server: ``test_reload_serving_kinds.py``.
"""

from __future__ import annotations

import shutil
import signal
from pathlib import Path

import httpx
import pytest
from support import wait_for
from support.reloading import (
    LOAD_PAUSE,
    Load,
    cli,
    reload_env,
    schedulers,
    served,
    until_served,
)
from support.serving import (
    build_tiny_llama,
    embedding_body,
    report,
    run_load,
    run_stream_load,
    start_server,
    stream_body,
)

pytestmark = pytest.mark.e2e


def test_a_reload_under_an_embedding_load_serves_the_new_model_with_no_client_error(
    tmp_path, capsys
):
    from launchspec.model_source import embedding_model_dir

    copy = Path(shutil.copytree(embedding_model_dir(), tmp_path / "minilm-copy"))
    env = reload_env()
    server = start_server(["--dp-size", "2"], tmp_path, "embed-reload", env=env)
    try:
        before = schedulers(server, env)
        load = Load(run_load, server.url, embedding_body, pause=LOAD_PAUSE)
        until_served(server, "/v1/embeddings")
        done = cli(server, env, "reload", "--model-path", str(copy))
        not_a_model = cli(server, env, "reload", "--model-path", str(tmp_path))
        stats = load.finish()
        report(
            capsys,
            f"reload under an embedding load: {stats['requests']} requests, "
            f"{len(stats['errors'])} errors\n{done.stdout}",
        )
        assert done.returncode == 0, done.stderr + done.stdout
        assert stats["errors"] == [] and stats["requests"] > 0, stats["errors"][:5]
        after = schedulers(server, env)
        assert len(after) == 2 and not set(after) & set(before), (before, after)
        assert served(server) == ["minilm-copy"]
        info = httpx.get(server.url + "/get_server_info", timeout=30).json()
        assert info["server_args"]["model_path"] == str(copy)

        assert not_a_model.returncode != 0, not_a_model.stdout
        assert str(tmp_path) in not_a_model.stderr and "config.json" in not_a_model.stderr
        assert schedulers(server, env) == after  # the same replicas serve the same model
        assert served(server) == ["minilm-copy"]
    finally:
        server.stop()


@pytest.fixture(scope="module")
def llamas(tmp_path_factory) -> tuple[Path, Path]:
    from launchspec.model_source import embedding_model_dir

    root = tmp_path_factory.mktemp("llamas")
    return (
        build_tiny_llama(root / "llama-a", embedding_model_dir()),
        build_tiny_llama(root / "llama-b", embedding_model_dir()),
    )


def test_sighup_then_a_scale_to_2_a_reload_a_scale_to_3_and_back_to_1_under_streams(
    tmp_path, llamas, capsys
):
    first, second = llamas
    env = reload_env()
    server = start_server(["--model-path", str(first)], tmp_path, "stream-reload", env=env)
    try:
        (single,) = schedulers(server, env)
        load = Load(run_stream_load, server.url, stream_body, pause=LOAD_PAUSE)
        until_served(server, "/generate")

        # SIGHUP with --dp-size 1: the launcher goes on and its scheduler is a new process.
        server.proc.send_signal(signal.SIGHUP)

        def reloaded():
            assert server.proc.poll() is None, server.log
            pids = schedulers(server, env)
            return pids if len(pids) == 1 and single not in pids else None

        wait_for(reloaded, 300, f"a new scheduler\n{server.log_path}", interval=0.5)
        wait_for(lambda: "reload 1 done" in server.log, 60, "the reload to end", interval=0.2)
        assert server.proc.poll() is None

        two = cli(server, env, "scale", "--dp-size", "2")
        assert two.returncode == 0, two.stderr + two.stdout
        before = schedulers(server, env)
        reloaded_b = cli(server, env, "reload", "--model-path", str(second))
        assert reloaded_b.returncode == 0, reloaded_b.stderr + reloaded_b.stdout
        replaced = schedulers(server, env)
        up = cli(server, env, "scale", "--dp-size", "3")
        three = schedulers(server, env)
        down = cli(server, env, "scale", "--dp-size", "1")
        one = schedulers(server, env)
        stats = load.finish()
        report(
            capsys,
            f"SIGHUP + scale 2 + reload + scale 3 + scale 1 under a streaming load: "
            f"{stats['requests']} streams, {len(stats['errors'])} errors",
        )
        assert stats["errors"] == [] and stats["requests"] > 0, stats["errors"][:5]
        assert len(before) == 2
        assert not set(replaced) & set(before) and len(replaced) == 2
        assert served(server) == ["llama-b"]
        assert up.returncode == 0 and len(three) == 3, up.stderr + up.stdout
        assert down.returncode == 0 and len(one) == 1, down.stderr + down.stdout
        assert server.proc.poll() is None
    finally:
        server.stop()
