"""Reload and scale a real server under load, through the real CLI: the all-MiniLM-L6-v2
embedding model and a tiny Llama built at test time, on the CPU platform, four clients on
loopback throughout.

- a reload to another model directory under an embedding load: no client error, every scheduler
  process is new, ``/v1/models`` names the new model; a reload to a directory that is not a
  model exits non-zero naming it, with no client error and the same replicas serving;
- under a load of streamed generations, one launch: SIGHUP with ``--dp-size 1`` (the launcher
  goes on, its scheduler is a new process), then a scale to 2, a reload, a scale to 3 and back
  to 1: no stream fails or is cut, and the schedulers are 2 (all new), 3, then 1;
- ``--reload-surge 0`` with one replica: requests that arrive while no replica serves wait for
  the new one (the launch of the kind-change case below);
- a diffusion server reloads and scales the same way;
- an embedding server asked to reload to a causal LM refuses (exit 2, both kinds named) with no
  client error and the same replica serving; ``--allow-kind-change`` does it, says so in its
  ``reload.started`` event and in the launcher's log, and the server then generates.

Where cases need the same configuration one launch serves them in turn, inside one test.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import threading
from pathlib import Path

import httpx
import pytest
from support import wait_for
from support.serving import (
    build_tiny_llama,
    cli_command,
    embedding_body,
    report,
    run_load,
    run_stream_load,
    server_env,
    start_server,
    stream_body,
)
from support.supervisor import short_runtime_dir

pytestmark = pytest.mark.e2e


# Each of the four clients waits this long after every answer: a request is under way or arrives
# every few tens of milliseconds through every change, while the cores stay free enough for the
# replicas being started.
LOAD_PAUSE = 0.1


class Load:
    """``run(url, body, stop_event=...)`` in a thread until ``finish()``: its result."""

    def __init__(self, run, url: str, body, **kwargs) -> None:
        self.stop = threading.Event()
        self.result: dict = {}
        self.thread = threading.Thread(
            target=lambda: self.result.update(
                run(url, body, clients=4, seconds=600, stop_event=self.stop, **kwargs)
            ),
            daemon=True,
        )
        self.thread.start()

    def finish(self) -> dict:
        self.stop.set()
        self.thread.join(timeout=240)
        assert not self.thread.is_alive(), "the load did not end"
        return self.result


def _env(**extra: str | None) -> dict[str, str]:
    return server_env(XDG_RUNTIME_DIR=short_runtime_dir(), **extra)


def _cli(
    server, env: dict[str, str], *args: str, timeout: float = 600
) -> subprocess.CompletedProcess:
    return subprocess.run(
        [*cli_command(), *args, "--pid", str(server.proc.pid)],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def _schedulers(server, env) -> list[int]:
    status = _cli(server, env, "status", "--json")
    assert status.returncode == 0, status.stderr
    workers = json.loads(status.stdout)["workers"]
    return sorted(w["pid"] for w in workers if w["role"] == "scheduler" and w["ready"])


def _served(server) -> list[str]:
    return [m["id"] for m in httpx.get(server.url + "/v1/models", timeout=30).json()["data"]]


def _until_served(server, route: str) -> None:
    """Until the load has had answers on ``route`` (it is running)."""
    wait_for(
        lambda: (
            f'route="{route}",status="200"' in httpx.get(server.url + "/metrics", timeout=30).text
        ),
        120,
        "the load to run",
        interval=0.2,
    )


def test_a_reload_under_an_embedding_load_serves_the_new_model_with_no_client_error(
    tmp_path, capsys
):
    from launchspec.model_source import embedding_model_dir

    copy = Path(shutil.copytree(embedding_model_dir(), tmp_path / "minilm-copy"))
    env = _env()
    server = start_server(["--dp-size", "2"], tmp_path, "embed-reload", env=env)
    try:
        before = _schedulers(server, env)
        load = Load(run_load, server.url, embedding_body, pause=LOAD_PAUSE)
        _until_served(server, "/v1/embeddings")
        done = _cli(server, env, "reload", "--model-path", str(copy))
        not_a_model = _cli(server, env, "reload", "--model-path", str(tmp_path))
        stats = load.finish()
        report(
            capsys,
            f"reload under an embedding load: {stats['requests']} requests, "
            f"{len(stats['errors'])} errors\n{done.stdout}",
        )
        assert done.returncode == 0, done.stderr + done.stdout
        assert stats["errors"] == [] and stats["requests"] > 0, stats["errors"][:5]
        after = _schedulers(server, env)
        assert len(after) == 2 and not set(after) & set(before), (before, after)
        assert _served(server) == ["minilm-copy"]
        info = httpx.get(server.url + "/get_server_info", timeout=30).json()
        assert info["server_args"]["model_path"] == str(copy)

        assert not_a_model.returncode != 0, not_a_model.stdout
        assert str(tmp_path) in not_a_model.stderr and "config.json" in not_a_model.stderr
        assert _schedulers(server, env) == after  # the same replicas serve the same model
        assert _served(server) == ["minilm-copy"]
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
    env = _env()
    server = start_server(["--model-path", str(first)], tmp_path, "stream-reload", env=env)
    try:
        (single,) = _schedulers(server, env)
        load = Load(run_stream_load, server.url, stream_body, pause=LOAD_PAUSE)
        _until_served(server, "/generate")

        # SIGHUP with --dp-size 1: the launcher goes on and its scheduler is a new process.
        server.proc.send_signal(signal.SIGHUP)

        def reloaded():
            assert server.proc.poll() is None, server.log
            pids = _schedulers(server, env)
            return pids if len(pids) == 1 and single not in pids else None

        wait_for(reloaded, 300, f"a new scheduler\n{server.log_path}", interval=0.5)
        wait_for(lambda: "reload 1 done" in server.log, 60, "the reload to end", interval=0.2)
        assert server.proc.poll() is None

        two = _cli(server, env, "scale", "--dp-size", "2")
        assert two.returncode == 0, two.stderr + two.stdout
        before = _schedulers(server, env)
        reloaded_b = _cli(server, env, "reload", "--model-path", str(second))
        assert reloaded_b.returncode == 0, reloaded_b.stderr + reloaded_b.stdout
        replaced = _schedulers(server, env)
        up = _cli(server, env, "scale", "--dp-size", "3")
        three = _schedulers(server, env)
        down = _cli(server, env, "scale", "--dp-size", "1")
        one = _schedulers(server, env)
        stats = load.finish()
        report(
            capsys,
            f"SIGHUP + scale 2 + reload + scale 3 + scale 1 under a streaming load: "
            f"{stats['requests']} streams, {len(stats['errors'])} errors",
        )
        assert stats["errors"] == [] and stats["requests"] > 0, stats["errors"][:5]
        assert len(before) == 2
        assert not set(replaced) & set(before) and len(replaced) == 2
        assert _served(server) == ["llama-b"]
        assert up.returncode == 0 and len(three) == 3, up.stderr + up.stdout
        assert down.returncode == 0 and len(one) == 1, down.stderr + down.stdout
        assert server.proc.poll() is None
    finally:
        server.stop()


def test_a_diffusion_server_reloads_and_scales(tmp_path, tiny_pipeline):
    env = _env(OMP_WAIT_POLICY=None)
    server = start_server(
        ["--runtime", "diffusion", "--model-path", str(tiny_pipeline)], tmp_path, "diff", env=env
    )
    body = {"prompt": "a cat", "size": "32x32", "num_inference_steps": 2}
    try:
        (before,) = _schedulers(server, env)
        done = _cli(server, env, "reload")
        assert done.returncode == 0, done.stderr + done.stdout
        assert "probing it with one request" in done.stdout
        (after,) = _schedulers(server, env)
        assert after != before
        scaled = _cli(server, env, "scale", "--dp-size", "2")
        assert scaled.returncode == 0, scaled.stderr + scaled.stdout
        assert len(_schedulers(server, env)) == 2
        for _ in range(3):
            reply = httpx.post(server.url + "/v1/images/generations", json=body, timeout=120)
            assert reply.status_code == 200, reply.text
    finally:
        server.stop()


def test_an_in_place_reload_waits_and_one_to_a_causal_lm_is_refused_unless_forced(
    tmp_path, llamas, capsys
):
    """One ``--reload-surge 0`` launch of the embedded MiniLM under an embedding load: a reload
    to a causal LM is refused with nothing started or stopped; an in-place reload makes the
    requests that arrive meanwhile wait, not fail; then ``--allow-kind-change`` does it."""
    llama = llamas[0]
    env = _env()
    server = start_server(["--reload-surge", "0"], tmp_path, "kind-change", env=env)
    try:
        before = _schedulers(server, env)
        load = Load(run_load, server.url, embedding_body, pause=LOAD_PAUSE)
        _until_served(server, "/v1/embeddings")
        refused = _cli(server, env, "reload", "--model-path", str(llama))
        unchanged = _schedulers(server, env)
        in_place = _cli(server, env, "reload")
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
        (after,) = _schedulers(server, env)
        assert [after] != before
        assert stats["errors"] == [] and stats["requests"] > 0, stats["errors"][:5]
        assert _served(server) == ["all-MiniLM-L6-v2"]

        forced = _cli(
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
        wait_for(lambda: _served(server) == ["llama-a"], 60, "/v1/models to name the new model")
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
