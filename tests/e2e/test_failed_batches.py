"""A batch that fails, through the real CLI: the one failure policy of both runtimes' scheduler.

A real plugin (a dist-info distribution on the servers' ``PYTHONPATH``, group
``sglang.multimodal_gen.plugins``) wraps ``DiffusionModelRunner.generate`` so that a batch holding a
request whose prompt says "fail this batch" raises. In a replica of one rank its request gets a
500 naming the error and the same worker serves the next request. In a CFG-parallel replica (two
ranks, like a tensor-parallel group) the failed batch ends the replica: under
``--restart-policy on-failure`` the supervisor restarts both ranks, and the replica serves again.
"""

from __future__ import annotations

import json
import subprocess

import httpx
import pytest
from support import wait_for
from support.diffusion import SIZE
from support.serving import cli_command, plugin_env, server_env, start_server

pytestmark = pytest.mark.e2e  # every test here starts a diffusion server through the CLI

ROUTE = "/v1/images/generations"
MARK = "fail this batch"

PLUGIN = f"""
def register():
    from hooks.diffusion import HookType, plugin_hook

    def fail_marked(original_fn, worker, shape, jobs, *args, **kwargs):
        if any({MARK!r} in job.prompt for job in jobs):
            raise RuntimeError("the pipeline broke on purpose")
        return original_fn(worker, shape, jobs, *args, **kwargs)

    plugin_hook("serving.diffusion.model_runner.DiffusionModelRunner.generate", type=HookType.AROUND)(
        fail_marked
    )
"""


@pytest.fixture
def env(tmp_path) -> dict[str, str]:
    return plugin_env(
        tmp_path / "site",
        "failing-batches",
        {"sglang.multimodal_gen.plugins": {"failing": "failing_batches:register"}},
        {"failing_batches.py": PLUGIN},
    )


def generate(url: str, prompt: str) -> httpx.Response:
    body = {"prompt": prompt, "size": f"{SIZE}x{SIZE}", "num_inference_steps": 2}
    return httpx.post(url + ROUTE, json=body, timeout=120)


def scheduler_pid(url: str) -> int:
    return httpx.get(url + "/get_server_info", timeout=30).json()["schedulers"][0]["pid"]


def workers(pid: int) -> dict[str, dict]:
    """The launch's workers, from ``sglang-launch status --json``."""
    out = subprocess.run(
        [*cli_command(), "status", "--json", "--pid", str(pid)],
        env=server_env(),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    return {w["name"]: w for w in json.loads(out.stdout)["workers"]}


def test_one_rank_answers_the_failed_batch_with_a_500_and_goes_on(tiny_pipeline, tmp_path, env):
    srv = start_server(
        ["--runtime", "diffusion", "--model-path", str(tiny_pipeline)], tmp_path, "one", env=env
    )
    try:
        worker = scheduler_pid(srv.url)
        failed = generate(srv.url, f"a cat; {MARK}")
        assert failed.status_code == 500, failed.text
        message = failed.json()["error"]["message"]
        assert "RuntimeError: the pipeline broke on purpose" in message, message
        # The hook raised in the pipeline's thread: the plugin is named all the same.
        named = "the plugin 'failing' (AROUND hook on DiffusionModelRunner.generate) raised"
        assert named in message, message
        assert generate(srv.url, "a cat").status_code == 200
        assert scheduler_pid(srv.url) == worker  # the same process served on
    finally:
        srv.stop()
    assert "the pipeline broke on purpose" in srv.log


def test_a_cfg_parallel_replica_ends_on_a_failed_batch_and_is_restarted(
    tiny_pipeline, tmp_path, env
):
    srv = start_server(
        [
            *("--runtime", "diffusion", "--model-path", str(tiny_pipeline)),
            *("--enable-cfg-parallel", "--restart-policy", "on-failure"),
        ],
        tmp_path,
        "cfg",
        env=env,
    )
    try:
        before = workers(srv.proc.pid)
        ranks = sorted(name for name in before if name.startswith("scheduler."))
        assert len(ranks) == 2, before
        failed = generate(srv.url, f"a cat; {MARK}")  # guidance 7.5: both ranks run it
        assert failed.status_code == 503, failed.text  # the replica is gone, not a 500
        assert "scheduler dp=0" in failed.json()["error"]["message"], failed.text

        def restarted() -> dict[str, dict] | None:
            now = workers(srv.proc.pid)
            group = [now[name] for name in ranks]
            return now if all(w["restarts"] == 1 and w["ready"] for w in group) else None

        after = wait_for(restarted, 240, "both ranks of the replica restarted", interval=0.2)
        served = wait_for(
            lambda: (r := generate(srv.url, "a cat")).status_code == 200 and r,
            120,
            "the restarted replica to serve",
            interval=0.2,
        )
        assert len(served.json()["data"]) == 1
    finally:
        srv.stop()
    for name in ranks:
        assert after[name]["pid"] != before[name]["pid"], name
    assert "the pipeline broke on purpose" in srv.log
    assert "scheduler dp=0 restarts (attempt 1 of 3" in srv.log
    assert srv.proc.returncode == 0, srv.log
