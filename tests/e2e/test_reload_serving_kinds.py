"""Reload and scale a real server, through the real CLI, where what it serves differs: a diffusion
pipeline, and an embedding model asked to become a causal LM (the all-MiniLM-L6-v2 embedding
model and a tiny Llama built at test time, on the CPU platform).

- ``--reload-surge 0`` with one replica: requests that arrive while no replica serves wait for
  the new one (the launch of the kind-change case below);
- a diffusion server reloads and scales the same way as a text one;
- an embedding server asked to reload to a causal LM refuses (exit 2, both kinds named) with no
  client error and the same replica serving; ``--allow-kind-change`` does it, says so in its
  ``reload.started`` event and in the launcher's log, and the server then generates;
- without a running launcher, ``reload`` and ``scale`` exit 1 saying so.

The reloads and scales under load of one kind: ``test_reload_serving.py``.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
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
    cli_command,
    embedding_body,
    report,
    run_load,
    start_server,
)
from support.supervisor import short_runtime_dir

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def llama(tmp_path_factory) -> Path:
    from launchspec.model_source import embedding_model_dir

    return build_tiny_llama(tmp_path_factory.mktemp("llama") / "llama-a", embedding_model_dir())


def test_a_diffusion_server_reloads_and_scales(tmp_path, tiny_pipeline):
    env = reload_env(OMP_WAIT_POLICY=None)
    server = start_server(
        ["--runtime", "diffusion", "--model-path", str(tiny_pipeline)], tmp_path, "diff", env=env
    )
    body = {"prompt": "a cat", "size": "32x32", "num_inference_steps": 2}
    try:
        (before,) = schedulers(server, env)
        done = cli(server, env, "reload")
        assert done.returncode == 0, done.stderr + done.stdout
        assert "probing it with one request" in done.stdout
        (after,) = schedulers(server, env)
        assert after != before
        scaled = cli(server, env, "scale", "--dp-size", "2")
        assert scaled.returncode == 0, scaled.stderr + scaled.stdout
        assert len(schedulers(server, env)) == 2
        for _ in range(3):
            reply = httpx.post(server.url + "/v1/images/generations", json=body, timeout=120)
            assert reply.status_code == 200, reply.text
    finally:
        server.stop()


def test_an_in_place_reload_waits_and_one_to_a_causal_lm_is_refused_unless_forced(
    tmp_path, llama, capsys
):
    """One ``--reload-surge 0`` launch of the embedded MiniLM under an embedding load: a reload
    to a causal LM is refused with nothing started or stopped; an in-place reload makes the
    requests that arrive meanwhile wait, not fail; then ``--allow-kind-change`` does it."""
    env = reload_env()
    server = start_server(["--reload-surge", "0"], tmp_path, "kind-change", env=env)
    try:
        before = schedulers(server, env)
        load = Load(run_load, server.url, embedding_body, pause=LOAD_PAUSE)
        until_served(server, "/v1/embeddings")
        refused = cli(server, env, "reload", "--model-path", str(llama))
        unchanged = schedulers(server, env)
        in_place = cli(server, env, "reload")
        stats = load.finish()
        report(
            capsys,
            f"a refused reload to another kind, then an in-place reload, under an embedding "
            f"load: {stats['requests']} requests, {len(stats['errors'])} errors",
        )
        assert refused.returncode == 2, refused.stderr + refused.stdout
        assert "the reload changes what the server serves, from embedding (" in refused.stderr
        assert f"to generation ({llama})" in refused.stderr, refused.stderr
        assert "--allow-kind-change" in refused.stderr, refused.stderr
        assert unchanged == before  # nothing was started or stopped
        assert in_place.returncode == 0, in_place.stderr + in_place.stdout
        assert "(in place)" in in_place.stdout and "scheduler dp=0 drains" in in_place.stdout
        (after,) = schedulers(server, env)
        assert [after] != before
        assert stats["errors"] == [] and stats["requests"] > 0, stats["errors"][:5]
        assert served(server) == ["all-MiniLM-L6-v2"]

        forced = cli(
            server, env, "reload", "--model-path", str(llama), "--allow-kind-change", "--json"
        )
        assert forced.returncode == 0, forced.stderr + forced.stdout
        events = [json.loads(line) for line in forced.stdout.splitlines()]
        started = next(e for e in events if e["kind"] == "reload.started")
        assert (started["previous_model_kind"], started["model_kind"]) == (
            "embedding",
            "generation",
        )
        assert re.search(r"reload \d+ changes what the server serves, from embedding", server.log)
        # The HTTP child swaps its model in as it sees reload.finished (read ahead since
        # reload.started), the moment the CLI does too.
        wait_for(lambda: served(server) == ["llama-a"], 60, "/v1/models to name the new model")
        reply = httpx.post(
            server.url + "/generate",
            json={"text": "a cat", "sampling_params": {"max_new_tokens": 2}},
            timeout=120,
        )
        assert reply.status_code == 200, reply.text
    finally:
        server.stop()


def test_the_cli_needs_a_running_launcher(tmp_path):
    env = {**os.environ, "XDG_RUNTIME_DIR": short_runtime_dir()}
    for args in (["reload"], ["scale", "--dp-size", "2"]):
        done = subprocess.run(
            [*cli_command(), *args], env=env, capture_output=True, text=True, timeout=60
        )
        assert done.returncode == 1 and "no running sglang-launch found" in done.stderr
