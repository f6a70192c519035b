"""Every device and execution decision of the diffusion worker is a call of the diffusion platform
contract, shown on a real launch: a recording platform, installed as a real dist-info with
``sglang.multimodal_gen.platforms`` and ``sglang.multimodal_gen.plugins`` entry points, logs each
call of its methods with the calling process; the launch serves an image through the CLI with
``--enable-torch-compile`` and ``--enable-cfg-parallel`` (two ranks per replica, which form a
process group), and the log, ``/get_server_info`` and the hook's own log are read.

The same platform, told to refuse the pipeline's architecture, makes the launch fail clearly."""

from __future__ import annotations

import json

import httpx
import pytest
from support import make_dist
from support.diffusion import SIZE
from support.serving import Server, server_env, start_server

from platforms.device_mixin import host_cpu_architecture

pytestmark = pytest.mark.e2e

RECORDER = """
import json, os

from platforms.builtin.cpu import CpuDevice
from platforms.diffusion import Platform, PlatformEnum

def record(call, detail=None):
    with open(os.environ["RECORD_LOG"], "a") as f:
        f.write(json.dumps({"pid": os.getpid(), "call": call, "detail": detail}) + "\\n")

def activate():
    return "recording_platform.RecordingPlatform"

def group_norm_forward(op, x):
    return op.forward_native(x)

class RecordingPlatform(Platform, CpuDevice):
    _enum = PlatformEnum.OOT
    dispatch_key = "CPU"

    def get_dispatch_key_name(self):
        return "recorder"

    def init_backend(self):
        record("init_backend")
        from platforms.custom_op import CustomOp
        from platforms.diffusion.layers import GroupNorm
        CustomOp.register_oot_forward(GroupNorm, fn=group_norm_forward, platform_key="recorder")

    def apply_server_args_defaults(self, server_args):
        record("apply_server_args_defaults")

    def verify_model_arch(self, model_arch):
        record("verify_model_arch", model_arch)
        if os.environ.get("RECORD_REFUSE") == "1":
            raise ValueError(f"{model_arch} is not supported by the recorder device")

    def get_device(self, local_rank=0):
        record("get_device", local_rank)
        return super().get_device(local_rank)

    def set_device(self, device):
        record("set_device", str(device))

    def get_local_torch_device(self):
        record("get_local_torch_device")
        return super().get_local_torch_device()

    def get_attn_backend_cls_str(self, selected_backend=None, head_size=0, dtype=None):
        record("get_attn_backend_cls_str", head_size)
        return "diffusers.models.attention_processor.AttnProcessor"

    def optimize_vae(self, vae):
        record("optimize_vae", type(vae).__name__)
        return vae

    def inference_mode(self):
        record("inference_mode")
        return super().inference_mode()

    @classmethod
    def seed_everything(cls, seed=None):
        record("seed_everything", seed)
        super().seed_everything(seed)

    def get_compile_backend(self):
        record("get_compile_backend")
        return "eager"

    def get_compile_options(self):
        record("get_compile_options")
        return {}

    def enable_dit_layerwise_offload_by_default(self):
        record("enable_dit_layerwise_offload_by_default")
        return True

    def get_device_total_memory(self, device_id=0):
        record("get_device_total_memory")
        return super().get_device_total_memory(device_id)

    def get_available_gpu_memory(self, device_id=0, distributed=False, empty_cache=True, cpu_group=None):
        record("get_available_gpu_memory")
        return super().get_available_gpu_memory(device_id, distributed, empty_cache, cpu_group)

    def get_torch_distributed_backend_str(self):
        record("get_torch_distributed_backend_str")
        return "gloo"

    def supports_distributed_device_id(self):
        record("supports_distributed_device_id")
        return False  # gloo on the CPU takes no device_id

    def get_all_to_all_communicator_cls(self):
        record("get_all_to_all_communicator_cls")
        return "recording_platform.RecordingAllToAll"

    @classmethod
    def get_cpu_architecture(cls):
        record("get_cpu_architecture")
        return super().get_cpu_architecture()

class RecordingAllToAll:
    pass  # named by get_all_to_all_communicator_cls(); only all_to_all_4D() would use it
"""

HOOKS = """
import os

from recording_platform import record

def register():
    from hooks.diffusion import HookRegistry, HookType

    def before(worker, *args, **kwargs):
        record("hook:init_device_and_model", worker.local_rank)

    HookRegistry.register("serving.diffusion.model_runner.DiffusionModelRunner.init_device_and_model",
                          before, HookType.BEFORE)
"""

WORKER_CALLS = {
    "init_backend",
    "verify_model_arch",
    "get_device",
    "set_device",
    "get_local_torch_device",
    "get_attn_backend_cls_str",
    "optimize_vae",
    "inference_mode",
    "seed_everything",
    "get_compile_backend",
    "get_compile_options",
    "enable_dit_layerwise_offload_by_default",
    "get_device_total_memory",
    "get_available_gpu_memory",
    "hook:init_device_and_model",
    "get_cpu_architecture",
    "get_all_to_all_communicator_cls",
}
# Forming the CFG-parallel replica's process group, on each of its two ranks.
GROUP_CALLS = {"get_torch_distributed_backend_str", "supports_distributed_device_id"}


@pytest.fixture
def recorder(site, tmp_path):
    make_dist(
        site,
        "recording-diffusion-platform",
        entry_points={
            "sglang.multimodal_gen.platforms": {"recorder": "recording_platform:activate"},
            "sglang.multimodal_gen.plugins": {"recorder": "recording_hooks:register"},
        },
        modules={"recording_platform.py": RECORDER, "recording_hooks.py": HOOKS},
    )
    log = tmp_path / "calls.jsonl"
    env = server_env(RECORD_LOG=str(log))
    env["PYTHONPATH"] = f"{site}:{env['PYTHONPATH']}"
    return env, log


def calls(log) -> list[dict]:
    return [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []


def test_each_contract_call_happens_on_a_real_launch(recorder, tiny_pipeline, tmp_path):
    """A CFG-parallel launch (two ranks per replica, so a process group is formed), with
    torch.compile: every call happens in the serving rank, the group calls in both."""
    env, log = recorder
    srv = start_server(
        [
            "--runtime",
            "diffusion",
            "--model-path",
            str(tiny_pipeline),
            "--enable-torch-compile",
            "--enable-cfg-parallel",
        ],
        tmp_path,
        "recorder",
        env=env,
    )
    try:
        reply = httpx.post(
            srv.url + "/v1/images/generations",
            timeout=300,
            json={"prompt": "a cat", "size": f"{SIZE}x{SIZE}", "num_inference_steps": 2, "seed": 1},
        )
        assert reply.status_code == 200, reply.text
        info = httpx.get(srv.url + "/get_server_info", timeout=30).json()
        worker_pid = info["schedulers"][0]["pid"]
    finally:
        srv.stop()
    seen = calls(log)
    in_worker = {c["call"] for c in seen if c["pid"] == worker_pid}
    assert WORKER_CALLS | GROUP_CALLS <= in_worker, sorted(WORKER_CALLS | GROUP_CALLS - in_worker)
    followers = {c["pid"] for c in seen if c["call"] in GROUP_CALLS} - {worker_pid}
    assert len(followers) == 1, seen  # rank 1: its own process, in the same group
    in_follower = {c["call"] for c in seen if c["pid"] in followers}
    # Rank 1 sets up the same way, forms the group, and denoises its half of the request.
    assert GROUP_CALLS | {"get_device", "verify_model_arch", "inference_mode"} <= in_follower
    hooked = sorted(c["detail"] for c in seen if c["call"] == "hook:init_device_and_model")
    assert hooked == [0, 1]  # the BEFORE hook ran on each rank, with its local rank
    for pid in (worker_pid, *followers):  # the backend is asked for before the group exists
        order = [c["call"] for c in seen if c["pid"] == pid]
        assert order.index("get_local_torch_device") < order.index(
            "get_torch_distributed_backend_str"
        )
    assert "apply_server_args_defaults" in {c["call"] for c in seen}  # the launcher's ServerArgs
    order = [c["call"] for c in seen if c["pid"] == worker_pid]
    assert (
        order.index("init_backend")
        < order.index("hook:init_device_and_model")
        < order.index("get_device")
    )
    assert order.index("verify_model_arch") < order.index("optimize_vae")
    assert [c["detail"] for c in seen if c["call"] == "verify_model_arch"] == [
        "StableDiffusionPipeline"
    ] * 2

    model = info["model"]
    assert info["platform"]["platform_class"] == "recording_platform.RecordingPlatform"
    # GroupNorm: the forward init_backend registered; LayerNorm: no forward_recorder, so forward_oot.
    ops = model["custom_ops"]
    assert ops["GroupNorm"]["forward"] == {
        "registered recording_platform.group_norm_forward": ops["GroupNorm"]["count"]
    }
    assert ops["LayerNorm"]["forward"] == {"forward_oot": ops["LayerNorm"]["count"]}
    assert model["attention"] == {
        "backend": "diffusers.models.attention_processor.AttnProcessor",
        "processors": ["AttnProcessor"],
        "requested": None,
    }
    assert model["layerwise_offload"] is True
    assert model["torch_compile"] == {"backend": "eager", "options": {}}
    assert model["parallel"] == {
        "ranks": 2,
        "cfg_parallel": True,
        "backend": "gloo",
        "device_id": None,
        "cpu_architecture": host_cpu_architecture().name.lower(),
        "all_to_all_communicator": "recording_platform.RecordingAllToAll",
        "split_steps": 2,  # both steps of the request were split, compiled denoiser and all
    }


def test_a_refused_architecture_stops_the_launch_naming_it(recorder, tiny_pipeline, tmp_path):
    env, log = recorder
    env["RECORD_REFUSE"] = "1"
    srv = Server(
        ["--runtime", "diffusion", "--model-path", str(tiny_pipeline)],
        tmp_path / "refused.log",
        env=env,
    )
    try:
        code = srv.wait_exit(timeout=240)
    finally:
        srv.stop()
    assert code != 0
    assert "refuses the pipeline StableDiffusionPipeline" in srv.log
    assert "not supported by the recorder device" in srv.log
