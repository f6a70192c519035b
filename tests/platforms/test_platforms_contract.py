"""The platform contract's types and defaults, and the built-in platforms' device operations.

The CPU platform runs for real here (memory figures, a gloo process group, inference mode,
seeding). For CUDA, ROCm, XPU, NPU, MUSA and MPS, which this machine lacks, the tests stand in
for the device by replacing the ``torch.<device>`` functions the platform reads, and check that
the platform reads the right ones and converts their answers correctly.
"""

from __future__ import annotations

import importlib
import os
import random
import types

import psutil
import pytest
import torch
from support import drivers_present, make_dist

import platforms
import platforms.diffusion
from platforms import CpuArchEnum, DeviceCapability, DeviceMixin, PlatformEnum, SRTPlatform
from platforms.builtin import cpu, cuda, mps, npu, rocm, xpu
from platforms.device_mixin import host_cpu_architecture
from platforms.diffusion import Platform
from platforms.entrypoints import allowlist, import_object


def test_device_capability_orders_and_converts():
    assert DeviceCapability(8, 9) < DeviceCapability(9, 0) and DeviceCapability(9, 0) >= (8, 0)
    assert (
        DeviceCapability(8, 9).as_version_str() == "8.9" and DeviceCapability(8, 9).to_int() == 89
    )


def test_enums_and_the_two_runtimes_identity_types():
    names = ["CUDA", "ROCM", "CPU", "XPU", "MUSA", "NPU", "TPU", "MPS", "OOT", "UNSPECIFIED"]
    assert [m.name for m in PlatformEnum] == names
    assert [m.name for m in platforms.diffusion.PlatformEnum] == names
    assert platforms.diffusion.PlatformEnum.OOT != PlatformEnum.OOT  # distinct types per runtime
    assert [m.name for m in CpuArchEnum] == ["X86", "ARM", "UNSPECIFIED"]
    assert host_cpu_architecture("x86_64") is CpuArchEnum.X86
    assert (
        host_cpu_architecture("aarch64") is CpuArchEnum.ARM
        and host_cpu_architecture("arm64") is CpuArchEnum.ARM
    )
    assert host_cpu_architecture("riscv64") is CpuArchEnum.UNSPECIFIED
    assert DeviceMixin().get_cpu_architecture() is host_cpu_architecture(os.uname().machine)


@pytest.mark.parametrize(
    "member, true_queries",
    [
        ("CUDA", {"is_cuda", "is_cuda_alike"}),
        ("ROCM", {"is_rocm", "is_cuda_alike"}),
        ("MUSA", {"is_musa", "is_cuda_alike"}),
        ("NPU", {"is_npu"}),
        ("CPU", {"is_cpu"}),
        ("XPU", {"is_xpu"}),
        ("MPS", {"is_mps"}),
        ("OOT", {"is_out_of_tree"}),
        ("UNSPECIFIED", set()),
    ],
)
@pytest.mark.parametrize(
    "base, enum", [(SRTPlatform, PlatformEnum), (Platform, platforms.diffusion.PlatformEnum)]
)
def test_identity_queries_follow_enum(member, true_queries, base, enum):
    platform = type("P", (base,), {"_enum": enum[member]})()
    queries = [
        "is_cuda",
        "is_rocm",
        "is_npu",
        "is_cpu",
        "is_xpu",
        "is_musa",
        "is_mps",
        "is_tpu",
        "is_cuda_alike",
        "is_out_of_tree",
    ]
    assert {q for q in queries if getattr(platform, q)()} == true_queries


@pytest.mark.parametrize(
    "runtime, group, selector, base, base_name",
    [
        ("srt", "sglang.srt.platforms", "SGLANG_PLATFORM", "platforms.interface", "SRTPlatform"),
        (
            "diffusion",
            "sglang.multimodal_gen.platforms",
            "SGLANG_DIFFUSION_PLATFORM_OVERRIDE",
            "platforms.diffusion",
            "Platform",
        ),
    ],
)
@pytest.mark.usefixtures("fresh_process")
def test_spec_quick_start_layout_reports_out_of_tree(
    site, monkeypatch, runtime, group, selector, base, base_name
):
    """The spec's quick start: the device mixin carries ``_enum``/``device_name``/``device_type``
    and the platform class lists the runtime's base first (``class P(SRTPlatform, MyDeviceMixin)``)."""
    enum_module = "platforms.device_mixin" if runtime == "srt" else "platforms.diffusion"
    make_dist(
        site,
        "my-platform-plugin",
        {group: {"my_device": "my_platform_plugin:activate"}},
        {
            "my_platform_plugin/__init__.py": "def activate():\n    return 'my_platform_plugin.platform.MyPlatform'\n",
            "my_platform_plugin/device.py": f"""
            from platforms.device_mixin import DeviceMixin
            from {enum_module} import PlatformEnum

            class MyDeviceMixin(DeviceMixin):
                _enum = PlatformEnum.OOT
                device_name = "my_device"
                device_type = "my_device"
        """,
            "my_platform_plugin/platform.py": f"""
            from {base} import {base_name}
            from my_platform_plugin.device import MyDeviceMixin

            class MyPlatform({base_name}, MyDeviceMixin):
                def get_default_attention_backend(self) -> str:
                    return "my_attn"
        """,
        },
    )
    monkeypatch.setenv(selector, "my_device")
    module = platforms if runtime == "srt" else platforms.diffusion
    p = module.current_platform
    my_platform = importlib.import_module("my_platform_plugin.platform").MyPlatform
    assert [
        p._enum is module.PlatformEnum.OOT,
        p.is_out_of_tree(),
        p.is_cuda(),
        p.device_name,
        p.device_type,
        isinstance(p, my_platform),
    ] == [True, True, False, "my_device", "my_device", True]


def test_srt_platform_defaults():
    p = SRTPlatform()
    assert (
        not p.support_cuda_graph() and not p.support_piecewise_cuda_graph() and not p.supports_fp8()
    )
    assert p.get_compile_backend() == "inductor" and p.get_dispatch_key_name() == "native"
    assert p.is_pin_memory_available() is False and p.get_communicator_class() is None
    assert p.apply_server_args_defaults(object()) is None and p.init_backend() is None
    p.empty_cache(), p.synchronize(), p.verify_quantization("fp8")
    for method, args in [
        ("get_default_attention_backend", ()),
        ("get_graph_runner_cls", ()),
        ("get_mha_kv_pool_cls", ()),
        ("get_mla_kv_pool_cls", ()),
        ("get_dsa_kv_pool_cls", ()),
        ("get_paged_allocator_cls", ()),
        ("get_quantization_config", ("fp8",)),
        ("get_piecewise_backend_cls", ()),
        ("get_device", (0,)),
        ("set_device", (0,)),
        ("get_device_name", ()),
        ("get_device_uuid", ()),
        ("get_device_capability", ()),
        ("get_device_total_memory", ()),
        ("get_available_memory", ()),
        ("get_current_memory_usage", ()),
    ]:
        with pytest.raises(NotImplementedError, match=f"SRTPlatform does not implement {method}"):
            getattr(p, method)(*args)


@pytest.mark.parametrize(
    "device_type, backend",
    [("cuda", "nccl"), ("xpu", "xccl"), ("hpu", "hccl"), ("cpu", "gloo"), ("npu", "hccl")]
    + [("musa", "mccl"), ("tt", "gloo"), ("unspecified", "gloo")],
)
def test_an_srt_platform_without_a_backend_gets_sglangs_default_for_its_device_type(
    device_type, backend
):
    # tt-sglang-plugin's shape: a device mixin that names its device and no backend.
    platform = type("Plat", (SRTPlatform,), {"device_type": device_type})()
    assert platform.get_torch_distributed_backend_str() == backend


def test_an_npu_platform_gets_zbal_while_its_local_memory_size_is_set(monkeypatch):
    platform = type("Plat", (SRTPlatform,), {"device_type": "npu"})()
    monkeypatch.setenv("SGLANG_ZBAL_LOCAL_MEM_SIZE", "1024")
    assert platform.get_torch_distributed_backend_str() == "zbal"
    monkeypatch.setenv("SGLANG_ZBAL_LOCAL_MEM_SIZE", "0")
    assert platform.get_torch_distributed_backend_str() == "hccl"


def test_a_diffusion_platform_gets_the_same_default():
    platform = type("Plat", (Platform,), {"device_type": "cuda"})()
    assert platform.get_torch_distributed_backend_str() == "nccl"


def test_diffusion_platform_defaults(monkeypatch):
    p = Platform()
    assert p.get_dispatch_key_name() == "native" and p.get_compile_backend() == "inductor"
    assert p.get_compile_options() == {} and not p.enable_dit_layerwise_offload_by_default()
    assert not p.supports_distributed_device_id() and p.get_all_to_all_communicator_cls() is None
    assert p.optimize_vae("vae") == "vae" and p.verify_model_arch("Flux") is None
    with pytest.raises(NotImplementedError, match="sets no dispatch_key; set the class attribute"):
        p.get_torch_library_dispatch_key()
    legacy = type("Legacy", (Platform,), {"get_device_communicator_cls": lambda self: "pkg.Comm"})()
    assert legacy.get_all_to_all_communicator_cls() == "pkg.Comm"
    cpu_platform = cpu.CpuPlatform()
    monkeypatch.setenv("LOCAL_RANK", "3")
    assert cpu_platform.get_local_torch_device() == torch.device("cpu")
    assert cpu_platform.get_torch_library_dispatch_key() == "CPU"


def test_cpu_platform_works_fully(tmp_path):
    p = cpu.CpuSRTPlatform()
    assert p.is_cpu() and not p.is_out_of_tree() and p.device_type == "cpu"
    assert torch.ones(2, device=p.get_device(0)).device.type == "cpu"
    p.set_device(p.get_device(0))
    assert p.get_device_name() and p.get_device_uuid().startswith("cpu-")
    assert p.get_device_capability() is None
    total = p.get_device_total_memory()
    free, total2 = p.get_available_memory()
    assert total == total2 == psutil.virtual_memory().total and 0 < free <= total
    assert p.get_current_memory_usage() >= psutil.Process().memory_info().rss * 0.5
    assert p.is_pin_memory_available() is False
    assert p.get_cpu_architecture() is host_cpu_architecture()
    with p.inference_mode():
        assert torch.is_inference_mode_enabled()
    p.seed_everything(1234)
    first = (random.random(), torch.rand(3).tolist())
    p.seed_everything(1234)
    assert (random.random(), torch.rand(3).tolist()) == first
    # The backend name is one torch.distributed really accepts for this device.
    import torch.distributed as dist

    dist.init_process_group(
        p.get_torch_distributed_backend_str(),
        init_method=f"file://{tmp_path}/store",
        rank=0,
        world_size=1,
    )
    try:
        t = torch.tensor([2.0])
        dist.all_reduce(t)
        assert t.item() == 2.0
        d = cpu.CpuPlatform()
        assert d.get_available_gpu_memory(distributed=True) == pytest.approx(
            psutil.virtual_memory().available / 2**30, rel=0.2
        )
    finally:
        dist.destroy_process_group()


class FakeProps:
    total_memory = 80 * 2**30
    uuid = "GPU-1234"


def stand_in(monkeypatch, api, capability=(9, 0)):
    """Stand-in for an accelerator this machine lacks: torch.<device>'s functions answer as a
    device would; the returned list records the calls the platform made."""
    calls = []
    answers = {
        "get_device_name": lambda i=0: f"Fake device {i}",
        "get_device_properties": lambda i=0: FakeProps,
        "get_device_capability": lambda i=0: capability,
        "mem_get_info": lambda i=0: (10 * 2**30, 80 * 2**30),
        "max_memory_allocated": lambda d=None: 12345,
        "set_device": lambda d: calls.append(("set_device", d)),
        "empty_cache": lambda: calls.append("empty_cache"),
        "synchronize": lambda: calls.append("synchronize"),
        "is_available": lambda: True,
    }
    for name, fn in answers.items():
        monkeypatch.setattr(api, name, fn, raising=False)
    drivers_present(monkeypatch)
    return calls


@pytest.mark.parametrize(
    "cls, device_type, backend, dispatch",
    [
        (cuda.CudaSRTPlatform, "cuda", "nccl", "cuda"),
        (cuda.CudaPlatform, "cuda", "nccl", "cuda"),
        (rocm.RocmSRTPlatform, "cuda", "nccl", "hip"),
        (rocm.RocmPlatform, "cuda", "nccl", "hip"),
    ],
)
def test_cuda_family_reads_torch_cuda(monkeypatch, cls, device_type, backend, dispatch):
    calls = stand_in(monkeypatch, torch.cuda)
    p = cls()
    assert p.get_device(1) == torch.device(device_type, 1)
    assert p.get_device_name(0) == "Fake device 0" and p.get_device_uuid() == "GPU-1234"
    assert p.get_device_capability() == DeviceCapability(9, 0)
    assert p.get_device_total_memory() == 80 * 2**30 and p.get_available_memory() == (
        10 * 2**30,
        80 * 2**30,
    )
    assert p.get_current_memory_usage() == 12345.0 and p.is_pin_memory_available()
    assert (
        p.get_torch_distributed_backend_str() == backend and p.get_dispatch_key_name() == dispatch
    )
    p.set_device(1), p.empty_cache(), p.synchronize()
    assert calls == [("set_device", 1), "empty_cache", "synchronize"]
    assert p.is_cuda_alike()


def test_cuda_capability_decides_fp8_and_probes_tell_cuda_from_rocm(monkeypatch):
    stand_in(monkeypatch, torch.cuda, capability=(8, 0))
    assert not cuda.CudaSRTPlatform().supports_fp8()
    stand_in(monkeypatch, torch.cuda, capability=(8, 9))
    assert cuda.CudaSRTPlatform().supports_fp8() and cuda.CudaSRTPlatform().support_cuda_graph()
    monkeypatch.setattr(torch.version, "hip", None)
    assert cuda.available() and not rocm.available()
    monkeypatch.setattr(torch.version, "hip", "6.2")
    assert rocm.available() and not cuda.available()
    assert cuda.CudaPlatform().supports_distributed_device_id()


def test_xpu_reads_torch_xpu(monkeypatch):
    fake = types.SimpleNamespace()
    monkeypatch.setattr(torch, "xpu", fake, raising=False)
    stand_in(monkeypatch, fake)
    p = xpu.XpuSRTPlatform()
    assert xpu.available() and p.get_device(0) == torch.device("xpu", 0)
    assert p.get_device_capability() is None and p.get_torch_distributed_backend_str() == "xccl"
    assert p.get_available_memory() == (10 * 2**30, 80 * 2**30) and xpu.XpuPlatform().is_xpu()


def test_vendor_extension_platforms_without_their_extension():
    # torch_npu / torch_musa are not installed here: the probes say no, and use says what to install.
    assert not npu.available()
    with pytest.raises(RuntimeError, match="needs torch.npu; install torch_npu"):
        npu.NpuPlatform().get_device_name()
    assert npu.NpuPlatform().get_torch_distributed_backend_str() == "hccl"


def test_mps_reads_torch_mps(monkeypatch):
    fake = types.SimpleNamespace(
        recommended_max_memory=lambda: 16 * 2**30,
        driver_allocated_memory=lambda: 4 * 2**30,
        empty_cache=lambda: None,
        synchronize=lambda: None,
    )
    monkeypatch.setattr(torch, "mps", fake)
    p = mps.MpsPlatform()
    assert p.get_device_total_memory() == 16 * 2**30 and p.get_available_memory() == (
        12 * 2**30,
        16 * 2**30,
    )
    assert p.get_available_gpu_memory() == pytest.approx(12.0) and p.get_device_capability() is None
    assert p.get_torch_distributed_backend_str() == "gloo" and p.is_mps()


def test_allowlist_and_import_object():
    assert allowlist(environ={}) is None and allowlist(environ={"SGLANG_PLUGINS": " "}) is None
    assert allowlist(environ={"SGLANG_PLUGINS": "a, b,,c "}) == {"a", "b", "c"}
    assert import_object("platforms.interface.SRTPlatform") is SRTPlatform
    assert import_object("platforms.interface:SRTPlatform.init_backend") is SRTPlatform.init_backend
    with pytest.raises(ModuleNotFoundError):
        import_object("no_such_package_xyz.mod.Cls")


def test_custom_op_registration_is_validated():
    from platforms.custom_op import CustomOp

    class Op(CustomOp):
        pass

    with pytest.raises(TypeError, match="fn must be callable"):
        CustomOp.register_oot_forward(Op, "not callable", "demo")
    with pytest.raises(
        ValueError, match="platform_key must be the platform's get_dispatch_key_name"
    ):
        CustomOp.register_oot_forward(Op, lambda op: None, " ")


# -- where plugin code ported from SGLang would notice -------------------------------------------
@pytest.mark.parametrize(
    "cls", [cuda.CudaSRTPlatform, cuda.CudaPlatform, rocm.RocmSRTPlatform, xpu.XpuSRTPlatform]
)
def test_accelerators_answer_pin_memory_for_the_target_device(cls):
    # No accelerator is touched: the answer depends on the target alone.
    p = cls()
    assert p.is_pin_memory_available() is True  # None: this platform's own device
    assert p.is_pin_memory_available(torch.device(p.device_type, 0)) is True
    assert p.is_pin_memory_available("cuda:1") is True
    assert p.is_pin_memory_available(torch.device("cpu")) is False
    assert p.is_pin_memory_available("cpu") is False and p.is_pin_memory_available("cpu:0") is False


def test_the_cpu_platforms_never_offer_pinned_memory():
    for p in (cpu.CpuSRTPlatform(), cpu.CpuPlatform()):
        assert p.is_pin_memory_available() is False
        assert p.is_pin_memory_available(torch.device("cpu")) is False


@pytest.mark.parametrize(
    "cls", [DeviceMixin, SRTPlatform, Platform, cpu.CpuSRTPlatform, cuda.CudaSRTPlatform]
)
def test_seed_everything_and_get_cpu_architecture_work_on_the_class(cls):
    assert isinstance(inspect_attr(cls, "seed_everything"), classmethod)
    assert isinstance(inspect_attr(cls, "get_cpu_architecture"), classmethod)
    assert cls.get_cpu_architecture() is host_cpu_architecture()
    cls.seed_everything(123)
    first = (random.random(), torch.rand(3).tolist())
    cls.seed_everything(123)
    assert (random.random(), torch.rand(3).tolist()) == first
    cls.seed_everything(None)  # leaves the generators alone
    assert (random.random(), torch.rand(3).tolist()) != first


def inspect_attr(cls, name):
    """The attribute as the class stores it (a classmethod object stays one)."""
    import inspect

    return inspect.getattr_static(cls, name)
