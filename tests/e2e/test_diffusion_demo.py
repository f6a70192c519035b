"""The demo plugin (pip-installed) shows the diffusion contract end to end: served through the CLI
on the demo platform, a tiny DiT runs the RMSNorm forward the demo's ``init_backend()`` registered,
and the demo's diffusion general plugin ran its BEFORE hook on the worker's device-and-model
set-up, in the worker process, before the pipeline was loaded."""

from __future__ import annotations

import base64
import io

import httpx
import pytest
from PIL import Image
from support.diffusion import SIZE
from support.serving import server_env, start_server

pytestmark = pytest.mark.e2e


def test_demo_platform_serves_with_its_op_and_its_hook(demo_site, tiny_dit_pipeline, tmp_path):
    log = tmp_path / "demo-hooks.log"
    env = server_env(
        DEMO_PLATFORM_ENABLE="1",
        SGLANG_DIFFUSION_PLATFORM_OVERRIDE="demo",
        DEMO_PLATFORM_HOOK_LOG=str(log),
    )
    env["PYTHONPATH"] = f"{demo_site}:{env['PYTHONPATH']}"
    srv = start_server(
        ["--runtime", "diffusion", "--model-path", str(tiny_dit_pipeline)],
        tmp_path,
        "demo",
        env=env,
    )
    try:
        reply = httpx.post(
            srv.url + "/v1/images/generations",
            timeout=300,
            json={"prompt": "a cat", "size": f"{SIZE}x{SIZE}", "num_inference_steps": 2, "seed": 3},
        )
        assert reply.status_code == 200, reply.text
        with Image.open(io.BytesIO(base64.b64decode(reply.json()["data"][0]["b64_json"]))) as img:
            assert img.size == (SIZE, SIZE)
        info = httpx.get(srv.url + "/get_server_info", timeout=30).json()
    finally:
        srv.stop()
    worker = info["schedulers"][0]["pid"]
    assert (
        info["platform"]["platform_class"]
        == "demo_platform_plugin.diffusion_platform.DemoDiffusionPlatform"
    )
    model = info["model"]
    assert (
        model["pipeline_class"] == "StableDiffusion3Pipeline" and model["denoiser"] == "transformer"
    )
    rms = model["custom_ops"]["RMSNorm"]
    assert rms["forward"] == {
        "registered demo_platform_plugin.ops.diffusion_rms_norm_demo": rms["count"]
    }
    lines = log.read_text().splitlines()
    assert f"init_device_and_model {worker} 0" in lines  # the demo's BEFORE hook, in the worker
    assert f"rms_norm {worker}" in lines  # the demo's RMSNorm forward ran while serving
