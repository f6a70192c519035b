"""The examples work as their docstrings say: the embedding app (a real script, a real server,
nothing left), and the example plugins of examples/plugins, installed with real pip and served
with: the toy model serves with its own class, the scheduling policy changes the order in which
waiting requests finish, the metrics plugin's counters are on /metrics, the profiler prints its
lines. And a model class written for SGLang's own model runner is refused at load, saying so."""

from __future__ import annotations

import subprocess
import sys
import threading

import httpx
import pytest
from support import REPO, clean_env, descendants, free_port, make_dist, pip_install_into, wait_for
from support.serving import post, server_env, start_server

pytestmark = pytest.mark.e2e  # every test here starts the launcher, a server or worker processes


def test_embedding_app_starts_uses_and_stops_a_server():
    port = free_port()
    env = clean_env(PYTHONPATH=str(REPO), HF_HUB_OFFLINE="1")
    proc = subprocess.Popen(
        [sys.executable, str(REPO / "examples" / "embed_app.py"), "--port", str(port)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        cwd=str(REPO),
    )
    try:
        out, err = proc.communicate(timeout=180)
    finally:
        if proc.poll() is None:
            for child in descendants(proc.pid):
                child.kill()
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, f"{out}\n{err}"
    assert f"ready at http://127.0.0.1:{port} with 2 workers" in out
    assert "384 numbers" in out
    assert "stopped; every worker is gone" in out


# ---- the example plugins (examples/plugins), installed with pip and served with --------------

PLUGINS = REPO / "examples" / "plugins"
EXAMPLES = ("shortest-prompt-first", "step-profiler", "request-metrics", "toy-model")
PROFILE_EVERY = 20


@pytest.fixture(scope="module")
def plugin_site(tmp_path_factory):
    """Every example plugin installed with real pip into one folder."""
    site = tmp_path_factory.mktemp("example-plugins") / "site"
    for name in EXAMPLES:
        proc = pip_install_into(PLUGINS / name, site)
        assert proc.returncode == 0, (
            f"pip could not install examples/plugins/{name}:\n{proc.stderr}"
        )
    return site


@pytest.fixture(scope="module")
def toy_server(plugin_site, tmp_path_factory):
    """A server of a toy model (the toy-model example's build command, as its docstring says),
    with all four example plugins, one running request at a time."""
    from launchspec.model_source import embedding_model_dir

    tmp = tmp_path_factory.mktemp("toy")
    model = tmp / "toy"
    env = server_env(PYTHONPATH=str(plugin_site), STEP_PROFILER_EVERY=str(PROFILE_EVERY))
    built = subprocess.run(
        [
            sys.executable,
            "-m",
            "toy_model.build",
            str(model),
            "--tokenizer-from",
            str(embedding_model_dir()),
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert built.returncode == 0, built.stderr
    srv = start_server(
        ["--model-path", str(model), "--max-running-requests", "1"], tmp, "toy", env=env
    )
    yield srv
    srv.stop()


def _generate(server, text: str, n: int) -> dict:
    body = {
        "text": text,
        "sampling_params": {"max_new_tokens": n, "temperature": 0, "ignore_eos": True},
    }
    r = post(server.url + "/generate", body, timeout=120)
    assert r.status_code == 200, r.text
    return r.json()


def test_the_toy_model_serves_with_its_own_class(toy_server):
    out = _generate(toy_server, "hello there", 5)
    assert out["meta_info"]["completion_tokens"] == 5
    info = httpx.get(toy_server.url + "/get_server_info", timeout=30).json()
    model = info["model"]
    assert model["architecture"] == "ToyForCausalLM" and model["kind"] == "generation", model
    assert model["model_class"] == "toy_model.models.toy.ToyForCausalLM", model


def _queue_depth(server) -> int:
    return httpx.get(server.url + "/ready", timeout=10).json()["schedulers"][0]["queue_depth"]


def test_the_policy_admits_the_shortest_prompt_first(toy_server):
    """With one running request at a time, three requests wait behind a long one, queued
    longest prompt first; once the long one is cancelled (its client leaves) they run, and
    finish, shortest prompt first.

    The order is read by the clients' threads, so the later a request runs the more tokens it
    makes: each finishes a whole run of the next one's steps before it, and a thread woken late
    on a busy machine does not swap two answers that were a few steps apart."""
    prompts = {"long": " ".join(["word"] * 40), "medium": " ".join(["word"] * 15), "short": "hi"}
    tokens = {"short": 24, "medium": 160, "long": 320}
    order: list[str] = []
    lock = threading.Lock()

    def one(name: str) -> None:
        _generate(toy_server, prompts[name], tokens[name])
        with lock:
            order.append(name)

    threads = []
    with httpx.Client(timeout=120) as client:
        body = {
            "text": "once upon a time",
            "stream": True,
            "sampling_params": {"max_new_tokens": 1500, "temperature": 0, "ignore_eos": True},
        }
        with client.stream("POST", toy_server.url + "/generate", json=body) as blocker:
            lines = blocker.iter_lines()
            assert any(line.startswith("data: {") for line in lines)  # it runs
            for depth, name in enumerate(("long", "medium", "short"), start=1):
                thread = threading.Thread(target=one, args=(name,), daemon=True)
                thread.start()
                threads.append(thread)
                wait_for(lambda d=depth: _queue_depth(toy_server) >= d, 60, f"{name} to wait")
            assert not order  # all three still wait behind the running one
        # Leaving the stream cancels the blocker; the three then run one at a time.
    for thread in threads:
        thread.join(timeout=180)
    assert order == ["short", "medium", "long"], order


def test_the_metrics_plugin_counts_finished_requests_on_metrics(toy_server):
    from prometheus_client.parser import text_string_to_metric_families

    def finished() -> float:
        page = httpx.get(toy_server.url + "/metrics", timeout=30).text
        for family in text_string_to_metric_families(page):
            if family.name == "request_metrics_finished_requests":
                return sum(
                    s.value
                    for s in family.samples
                    if s.labels == {"dp_rank": "0", "kind": "generation"}
                )
        return 0.0

    before = finished()
    _generate(toy_server, "count me", 7)
    wait_for(lambda: finished() >= before + 1, 30, "the finished request on /metrics")
    page = httpx.get(toy_server.url + "/metrics", timeout=30).text
    assert 'request_metrics_output_length_bucket{dp_rank="0",le="16.0"}' in page, page


def test_the_profiler_prints_a_line_every_n_steps(toy_server):
    _generate(toy_server, "profile me", PROFILE_EVERY + 5)
    wait_for(
        lambda: f"step-profiler: {PROFILE_EVERY} steps," in toy_server.log,
        30,
        "the profiler's line in the launcher's output",
    )
    line = next(x for x in toy_server.log.splitlines() if x.startswith("step-profiler:"))
    assert "ms per step" in line and "forward" in line and "requests per step" in line, line


# ---- a model class written for SGLang's model runner is refused at load ----------------------

SGLANG_STYLE = {
    "sglang_style_models/__init__.py": "",
    "sglang_style_models/models/__init__.py": "",
    "sglang_style_models/models/sgl_llama.py": '''
        import torch


        class SglStyleForCausalLM(torch.nn.Module):
            """A model as SGLang's own model runner drives it."""

            def forward(self, input_ids, positions, forward_batch):
                raise AssertionError("never called here")


        EntryClass = SglStyleForCausalLM
    ''',
    "sglang_style_plugin.py": """
        def register():
            from sglang.srt.models.registry import ModelRegistry

            ModelRegistry.register("sglang_style_models.models", overwrite=True)
    """,
}


def test_a_model_class_written_for_sglangs_model_runner_is_refused_at_load(tmp_path):
    import json

    from support.serving import build_tiny_llama, cli_command

    from launchspec.model_source import embedding_model_dir

    model = build_tiny_llama(tmp_path / "sgl-style", embedding_model_dir())
    config = json.loads((model / "config.json").read_text())
    config["architectures"] = ["SglStyleForCausalLM"]
    (model / "config.json").write_text(json.dumps(config))
    site = tmp_path / "site"
    make_dist(
        site,
        "sglang-style-plugin",
        {"sglang.srt.plugins": {"sgl_style": "sglang_style_plugin:register"}},
        SGLANG_STYLE,
    )
    env = server_env(PYTHONPATH=str(site))
    proc = subprocess.run(
        [*cli_command(), "--model-path", str(model), "--port", str(free_port())],
        capture_output=True,
        text=True,
        env=env,
        cwd=str(REPO),
        timeout=300,
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0, out
    assert "is written for SGLang's model runner" in out, out
    assert "sglang_style_models.models.sgl_llama.SglStyleForCausalLM" in out, out
    assert "forward_batch" in out, out
