"""Plugins written to SGLang's plugin documentation run here unchanged.

The platform plugin and the general plugin below are the plugin system document's own quick-start
code blocks (``my_platform_plugin``: ``__init__.py``, ``device.py``, ``platform.py``;
``my_general_plugin``), their import lines unchanged (``sglang.srt.platforms.device_mixin``,
``sglang.srt.platforms.interface``, ``sglang.srt.plugins.hook_registry``) and their method bodies
filled in for the CPU. No ``sglang`` distribution is installed: those names resolve to this
project's own modules (``hooks.compat`` with the launcher's table). Installed with real pip:

- ``sglang-launch check-platform`` says the platform conforms;
- a launch selects it, serves a real embeddings request on it, and the plugin's hooks on
  ``sglang.srt.server_args.ServerArgs.__post_init__`` and
  ``sglang.srt.managers.scheduler.Scheduler.__init__`` run, in the launcher and in the scheduler;
- the classes are this project's (``issubclass`` holds).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import textwrap

import httpx
import pytest
from support import clean_env, pip_install_into, run_python, wait_for
from support.serving import REPO, cli_command, post, server_env, start_server

pytestmark = pytest.mark.e2e

PLATFORM_PLUGIN = {
    "pyproject.toml": """
        [build-system]
        requires = ["setuptools"]
        build-backend = "setuptools.build_meta"

        [project]
        name = "my-platform-plugin"
        version = "0.1.0"

        [project.entry-points."sglang.srt.platforms"]
        my_device = "my_platform_plugin:activate"
    """,
    "my_platform_plugin/__init__.py": '''
        import os


        def _my_device_is_available():
            return os.environ.get("MY_DEVICE_PRESENT") == "1"


        def activate():
            """Return fully-qualified class name to activate, or None to skip."""
            if _my_device_is_available():
                return "my_platform_plugin.platform.MySRTPlatform"
            return None
    ''',
    "my_platform_plugin/device.py": """
        from sglang.srt.platforms.device_mixin import DeviceMixin, PlatformEnum

        class MyDeviceMixin(DeviceMixin):
            _enum = PlatformEnum.OOT
            device_name = "my_device"
            device_type = "cpu"   # torch device type

            def get_device(self, local_rank=0):
                import torch
                return torch.device("cpu")
            def set_device(self, device) -> None:
                pass
            def get_device_name(self, device_id=0) -> str:
                return "my_device (the host CPU)"
            def get_device_total_memory(self, device_id=0) -> int:
                return 8 << 30
            def get_current_memory_usage(self, device=None) -> float:
                import resource
                return float(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024)
            def get_device_capability(self, device_id=0):
                return None
            def get_torch_distributed_backend_str(self) -> str:
                return "gloo"
    """,
    "my_platform_plugin/platform.py": """
        from sglang.srt.platforms.interface import SRTPlatform
        from my_platform_plugin.device import MyDeviceMixin

        class MySRTPlatform(SRTPlatform, MyDeviceMixin):
            def get_default_attention_backend(self) -> str:
                return "torch_native"
            def support_cuda_graph(self) -> bool:
                return False
    """,
}

GENERAL_PLUGIN = {
    "pyproject.toml": """
        [build-system]
        requires = ["setuptools"]
        build-backend = "setuptools.build_meta"

        [project]
        name = "my-general-plugin"
        version = "0.1.0"

        [project.entry-points."sglang.srt.plugins"]
        my_plugin = "my_general_plugin:register"
    """,
    "my_general_plugin/__init__.py": """
        import os

        from sglang.srt.plugins.hook_registry import HookRegistry, HookType

        def register():
            \"\"\"Entry point called by load_plugins().\"\"\"
            HookRegistry.register(
                "sglang.srt.managers.scheduler.Scheduler.__init__",
                my_hook,
                HookType.AROUND,
            )
            HookRegistry.register(
                "sglang.srt.server_args.ServerArgs.__post_init__",
                after_post_init,
                HookType.AFTER,
            )

        def my_hook(original_fn, self, *args, **kwargs):
            result = original_fn(self, *args, **kwargs)
            print(f"Scheduler initialized! pid={os.getpid()}", flush=True)
            return result

        def after_post_init(result, self):
            with open(os.environ["MY_PLUGIN_LOG"], "a") as log:
                log.write(f"post_init {os.getpid()}\\n")
    """,
}


def _write(root, files):
    for rel, code in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(code).lstrip(), encoding="utf-8")


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    root = tmp_path_factory.mktemp("sglang-doc")
    target = root / "site"
    for name, files in (("platform", PLATFORM_PLUGIN), ("general", GENERAL_PLUGIN)):
        _write(root / name, files)
        proc = pip_install_into(root / name, target)
        assert proc.returncode == 0, proc.stderr
    return target


def test_the_documented_classes_are_this_projects(site):
    result = run_python(
        """
        import json
        from launcher.prepare import install_aliases
        assert install_aliases()
        from sglang.srt.platforms.interface import SRTPlatform
        from sglang.srt.platforms.device_mixin import DeviceMixin, PlatformEnum
        from sglang.srt.plugins.hook_registry import HookRegistry, HookType
        from sglang.multimodal_gen.runtime.platforms import Platform
        from sglang.multimodal_gen.runtime.layers.custom_op import CustomOp
        from sglang.multimodal_gen.runtime.layers.layernorm import RMSNorm
        import platforms, platforms.interface, platforms.custom_op, hooks.hook_registry
        import platforms.diffusion.layers
        from my_platform_plugin.platform import MySRTPlatform
        import sglang.srt.platforms.interface as aliased
        print("RESULT:" + json.dumps({
            "same": [SRTPlatform is platforms.interface.SRTPlatform,
                     DeviceMixin is platforms.DeviceMixin, PlatformEnum is platforms.PlatformEnum,
                     HookRegistry is hooks.hook_registry.HookRegistry,
                     Platform is platforms.diffusion.Platform,
                     CustomOp is platforms.custom_op.CustomOp,
                     RMSNorm is platforms.diffusion.layers.RMSNorm,
                     aliased is platforms.interface,
                     aliased.__spec__.name == "platforms.interface",
                     issubclass(MySRTPlatform, platforms.SRTPlatform)],
        }))
        """,
        sites=[site],
    )
    assert result.data == {"same": [True] * 10}, result


def test_check_platform_conforms_and_a_launch_serves_with_the_hooks(site, tmp_path):
    env = clean_env(
        MY_DEVICE_PRESENT="1",
        MY_PLUGIN_LOG=str(tmp_path / "check-hooks.log"),
        PYTHONPATH=f"{site}:{REPO}",
        HF_HUB_OFFLINE="1",
    )
    check = subprocess.run(
        [*cli_command(), "check-platform", "--json"],
        capture_output=True,
        text=True,
        env=env,
        timeout=240,
    )
    report = json.loads(check.stdout)
    failed = [r["id"] for r in report["rows"] if r["status"] == "fail"]
    assert check.returncode == 0 and report["ok"], (failed, check.stderr)
    assert report["platform"]["key"] == "plugin:my_device"

    log = tmp_path / "hooks.log"
    server_environ = server_env(
        SGLANG_USE_CPU_ENGINE=None, MY_DEVICE_PRESENT="1", MY_PLUGIN_LOG=str(log)
    )
    server_environ["PYTHONPATH"] = f"{site}:{server_environ['PYTHONPATH']}"
    server = start_server([], tmp_path, "sglang-doc", env=server_environ)
    try:
        reply = post(f"{server.url}/v1/embeddings", {"input": "a cat sits on the mat"})
        assert reply.status_code == 200, reply.text
        info = httpx.get(f"{server.url}/get_server_info", timeout=30).json()
        assert info["platform"]["key"] == "plugin:my_device", info["platform"]
        wait_for(
            lambda: "Scheduler initialized!" in server.log_path.read_text(),
            30,
            "the Scheduler.__init__ hook's line in the log",
        )
        pids = {line.split()[1] for line in log.read_text().splitlines()}
        assert str(server.proc.pid) in pids, pids  # the launcher built ServerArgs with it
    finally:
        server.stop()


# A platform package shaped as tt-sglang-plugin and sglang-plugin-FL ship: written against
# SGLang's names, its device mixin with no get_device() and no distributed backend (SGLang gives
# the latter by device type and never calls the former), its identity set in __init__ (FL),
# apply_server_args_defaults reading the model path as a path (tt), and a general plugin of the
# same name in the same distribution whose register() imports an SGLang internal (both).
VENDOR_PLUGIN = {
    "pyproject.toml": """
        [build-system]
        requires = ["setuptools"]
        build-backend = "setuptools.build_meta"

        [project]
        name = "tile-vendor-plugin"
        version = "0.1.0"
        dependencies = ["sglang>=0.5.11"]

        [project.entry-points."sglang.srt.platforms"]
        tile = "tile_vendor:activate"

        [project.entry-points."sglang.srt.plugins"]
        tile = "tile_vendor:register"
    """,
    "tile_vendor/__init__.py": """
        import os


        def activate():
            if os.getenv("TILE_PRESENT") != "1":
                return None
            return "tile_vendor.platform.TilePlatform"


        def register():
            from sglang.srt.models.registry import ModelRegistry

            ModelRegistry.register("tile_vendor.models", overwrite=True)
            if os.getenv("TILE_KERNELS") != "0":
                from sglang.srt.layers.quantization import QUANTIZATION_METHODS  # noqa: F401
    """,
    "tile_vendor/models/__init__.py": "",
    "tile_vendor/platform.py": """
        import os

        from sglang.srt.platforms.device_mixin import PlatformEnum
        from sglang.srt.platforms.interface import SRTPlatform


        class TilePlatform(SRTPlatform):
            _enum = PlatformEnum.OOT

            def __init__(self):
                super().__init__()
                detected = "cpu"  # what the vendor's device detector reports here
                self.device_name = "tile"
                self.device_type = detected

            def apply_server_args_defaults(self, server_args):
                with open(os.environ["TILE_SEEN"], "a") as seen:
                    seen.write(os.path.abspath(server_args.model_path) + "\\n")

            def get_default_attention_backend(self):
                return "torch_native"

            def get_device_total_memory(self, device_id=0):
                return 8 << 30

            def get_current_memory_usage(self, device=None):
                return 0.0
    """,
}


@pytest.fixture(scope="module")
def vendor_site(tmp_path_factory):
    root = tmp_path_factory.mktemp("tile-vendor")
    _write(root / "source", VENDOR_PLUGIN)
    proc = pip_install_into(root / "source", root / "site")
    assert proc.returncode == 0, proc.stderr
    return root / "site"


def test_a_vendor_platform_written_for_sglang_stops_honestly_then_serves_without_its_plugin(
    vendor_site, tmp_path
):
    seen = tmp_path / "seen"
    server_environ = server_env(SGLANG_USE_CPU_ENGINE=None, TILE_PRESENT="1", TILE_SEEN=str(seen))
    server_environ["PYTHONPATH"] = f"{vendor_site}:{server_environ['PYTHONPATH']}"
    stopped = subprocess.run(
        [*cli_command(), "--port", "1"],
        capture_output=True,
        text=True,
        env=server_environ,
        timeout=120,
    )
    assert stopped.returncode == 5, stopped.stderr
    assert "No module named 'sglang.srt.layers'" in stopped.stderr
    assert "sglang-launch provides SGLang 0.5.23's plugin surface only" in stopped.stderr
    hint = stopped.stderr.partition("start without this plugin: ")[2].split()
    assert hint[:2] == ["SGLANG_PLATFORM=tile", "SGLANG_PLUGINS=,"], stopped.stderr
    assert (
        "what to do: fix or reinstall tile-vendor-plugin, or start without the plugin on the "
        "same platform: SGLANG_PLATFORM=tile SGLANG_PLUGINS=," in stopped.stderr
    ), stopped.stderr

    for word in hint[:2]:  # follow the hint: the same platform, without the plugin
        name, _, value = word.partition("=")
        server_environ[name] = value
    server = start_server([], tmp_path, "tile-vendor", env=server_environ)
    try:
        reply = post(f"{server.url}/v1/embeddings", {"input": "a cat sits on the mat"})
        assert reply.status_code == 200, reply.text
        info = httpx.get(f"{server.url}/get_server_info", timeout=30).json()
        assert info["platform"]["key"] == "plugin:tile", info["platform"]
    finally:
        server.stop()
    from launchspec.model_source import embedding_model_dir

    assert str(embedding_model_dir()) in seen.read_text().splitlines(), seen.read_text()


def test_a_plugin_registering_a_model_package_it_does_not_ship_stops_at_start_up(
    vendor_site, tmp_path
):
    """ModelRegistry.register of a package that is not there fails in the plugin's callback, as
    in SGLang: a set-up error naming the plugin, before any worker loads a model."""
    broken = tmp_path / "broken-site"
    shutil.copytree(vendor_site, broken)
    shutil.rmtree(broken / "tile_vendor" / "models")
    environ = server_env(SGLANG_USE_CPU_ENGINE=None, TILE_PRESENT="1", TILE_KERNELS="0")
    environ["TILE_SEEN"] = str(tmp_path / "seen")
    environ["PYTHONPATH"] = f"{broken}:{environ['PYTHONPATH']}"
    stopped = subprocess.run(
        [*cli_command(), "--port", "1"], capture_output=True, text=True, env=environ, timeout=120
    )
    assert stopped.returncode == 5, stopped.stderr
    assert "ModelRegistry.register('tile_vendor.models')" in stopped.stderr, stopped.stderr
    assert "a required plugin failed to load in the launcher process" in stopped.stderr
    assert "fix or reinstall tile-vendor-plugin" in stopped.stderr, stopped.stderr
    assert "scheduler.0" not in stopped.stderr  # no worker was started
