"""The diffusion runtime's start-up refusals, through the real CLI: each exits 2 before any worker
starts, names the problem and the fix, and leaves no process behind."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from support.serving import Server, cli_command, server_env

pytestmark = pytest.mark.e2e


def launch(
    *args: str, env: dict | None = None, prefix: list[str] | None = None
) -> subprocess.CompletedProcess:
    return subprocess.run(
        [*(prefix or cli_command()), *args, "--port", "1"],
        capture_output=True,
        text=True,
        env=env or server_env(),
        timeout=120,
    )


def test_a_folder_that_is_not_a_pipeline(tmp_path):
    result = launch("--runtime", "diffusion", "--model-path", str(tmp_path))
    assert result.returncode == 2, result
    assert (
        "not a diffusers pipeline directory" in result.stderr
        and "model_index.json" in result.stderr
    )
    assert "spawned" not in result.stderr + result.stdout  # no worker started


def test_no_model_path(tmp_path):
    result = launch("--runtime", "diffusion")
    assert result.returncode == 2, result
    assert "--runtime diffusion needs --model-path" in result.stderr


def test_a_pipeline_given_to_the_text_runtime(tiny_pipeline):
    result = launch("--runtime", "srt", "--model-path", str(tiny_pipeline))
    assert result.returncode == 2, result
    assert "is a diffusers pipeline" in result.stderr and "--runtime diffusion" in result.stderr


def test_a_transformers_model_given_to_the_diffusion_runtime(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "bert"}))
    result = launch("--runtime", "diffusion", "--model-path", str(tmp_path))
    assert result.returncode == 2, result
    assert "is a transformers model" in result.stderr and "--runtime srt" in result.stderr


def test_tensor_parallel_is_refused(tiny_pipeline):
    result = launch("--runtime", "diffusion", "--model-path", str(tiny_pipeline), "--tp-size", "2")
    assert result.returncode == 2, result
    assert "--tp-size 1" in result.stderr and "--dp-size" in result.stderr


def test_cfg_parallel_is_refused_where_there_is_no_guidance_to_split():
    result = launch("--runtime", "srt", "--enable-cfg-parallel")
    assert result.returncode == 2, result
    assert "--enable-cfg-parallel splits the classifier-free guidance of --runtime diffusion" in (
        result.stderr
    )
    assert "drop the flag" in result.stderr
    assert "spawned" not in result.stderr + result.stdout


def test_cfg_parallel_is_refused_for_a_pipeline_without_guidance(tmp_path):
    """A guidance-distilled UNet: the pipeline never batches an unconditional half, so the
    second rank would have nothing to compute. Both ranks refuse after loading, naming the fix;
    the launch stops and leaves nothing behind."""
    from support.diffusion import build_tiny_pipeline

    distilled = build_tiny_pipeline(tmp_path / "distilled", guidance_distilled=True)
    srv = Server(
        ["--runtime", "diffusion", "--model-path", str(distilled), "--enable-cfg-parallel"],
        tmp_path / "distilled.log",
        env=server_env(),
    )
    try:
        code = srv.wait_exit(timeout=240)
    finally:
        srv.stop()
    assert code != 0
    assert "--enable-cfg-parallel splits classifier-free guidance, but StableDiffusionPipeline" in (
        srv.log
    )
    assert "serve it without --enable-cfg-parallel" in srv.log


# diffusers is hidden from this one interpreter by a finder on sys.meta_path (the package is
# installed here; the test shows what a user without it sees).
_WITHOUT_DIFFUSERS = """
import sys
class Hide:
    def find_spec(self, name, path=None, target=None):
        if name == "diffusers" or name.startswith("diffusers."):
            raise ModuleNotFoundError("No module named 'diffusers'", name=name)
        return None
sys.meta_path.insert(0, Hide())
import importlib.util
_find = importlib.util.find_spec
importlib.util.find_spec = lambda name, *a: None if name == "diffusers" else _find(name, *a)
from launcher.cli import main
sys.exit(main())
"""


def test_diffusers_not_installed_names_the_extra(tiny_pipeline):
    result = launch(
        "--runtime",
        "diffusion",
        "--model-path",
        str(tiny_pipeline),
        prefix=[sys.executable, "-c", _WITHOUT_DIFFUSERS],
    )
    assert result.returncode == 2, result
    assert "'diffusers'" in result.stderr and "sglang-launch[diffusion]" in result.stderr
