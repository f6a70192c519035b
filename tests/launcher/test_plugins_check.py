"""``sglang-launch plugins --check``: a dry run that imports no plugin code.

Real distributions (dist-info folders with entry points, ``Requires-Dist``, a ``RECORD`` and
modules) on ``sys.path``; the command's own ``main`` in this process, so that a plugin module
imported by mistake would show in ``sys.modules`` and in the file its import writes.
"""

from __future__ import annotations

import importlib
import json
import sys

import pytest
from support import make_dist

from launcher.commands import plugins
from platforms import entrypoints

SIDE_EFFECT = """
import os
open(os.environ["IMPORTED_MARKER"], "a").write("imported\\n")
"""


@pytest.fixture
def installed(site, monkeypatch, tmp_path):
    """``installed(name, entry_points, modules, requires=(), pth=None)`` writes a distribution."""
    monkeypatch.syspath_prepend(str(site))
    monkeypatch.setenv("IMPORTED_MARKER", str(tmp_path / "imported"))
    tops: list[str] = []

    def make(name, entry_points, modules, requires=(), pth=None):
        info = make_dist(site, name, entry_points, modules)
        with open(info / "METADATA", "a") as meta:
            meta.writelines(f"Requires-Dist: {r}\n" for r in requires)
        record = [f"{path},," for path in modules]
        if pth is not None:
            (site / f"{name}.pth").write_text(pth)
            record.append(f"{name}.pth,,")
        (info / "RECORD").write_text("\n".join(record) + "\n")
        tops.extend(path.split("/")[0].removesuffix(".py") for path in modules)
        entrypoints.reset()
        importlib.invalidate_caches()

    yield make
    entrypoints.reset()
    for module in [m for m in sys.modules if m.split(".")[0] in tops]:
        del sys.modules[module]


def run_check(capsys, *argv):
    code = plugins.main(["--check", *argv])
    out = capsys.readouterr().out
    return code, (json.loads(out) if "--json" in argv else out)


def finding(report, runtime, name):
    block = next(r for r in report["runtimes"] if r["runtime"] == runtime)
    return next(f for f in block["findings"] if f["name"] == name)


def test_a_plugin_that_acts_when_imported_is_not_imported(installed, capsys, tmp_path, monkeypatch):
    installed(
        "noisy-platform",
        {"sglang.srt.platforms": {"noisy": "noisy_platform:activate"}},
        {
            "noisy_platform/__init__.py": SIDE_EFFECT + "def activate():\n    return None\n",
            "noisy_platform/hooks.py": SIDE_EFFECT + "def register():\n    pass\n",
        },
    )
    installed(
        "noisy-hooks",
        {"sglang.srt.plugins": {"noisy_hooks": "noisy_hooks:register"}},
        {"noisy_hooks.py": SIDE_EFFECT + "def register():\n    pass\n"},
    )
    monkeypatch.setenv("SGLANG_PLATFORM", "noisy")
    code, report = run_check(capsys, "--json")
    assert not (tmp_path / "imported").exists(), "--check imported plugin code"
    assert "noisy_platform" not in sys.modules and "noisy_hooks" not in sys.modules
    assert code == 0 and report["ok"] is True, report
    platform = finding(report, "srt", "noisy")
    assert platform["verdict"] == "selected" and "SGLANG_PLATFORM=noisy" in platform["why"]
    assert finding(report, "srt", "noisy_hooks")["verdict"] == "loaded"
    assert report["sglang"]["aliased"] is True


def test_a_plugin_pinning_sglang_and_importing_its_internals_is_incompatible(installed, capsys):
    installed(
        "vendor-platform",
        {
            "sglang.srt.platforms": {"vendor": "vendor_platform:activate"},
            "sglang.srt.plugins": {"vendor": "vendor_platform.hooks:register"},
        },
        {
            "vendor_platform/__init__.py": (
                "from sglang.srt.platforms.interface import SRTPlatform\n"  # aliased: fine
                "try:\n    import vendor_runtime_that_is_absent\n"  # guarded: its own fallback
                "except ImportError:\n    vendor_runtime_that_is_absent = None\n"
                "def activate():\n    return 'vendor_platform.platform.Plat'\n"
            ),
            "vendor_platform/hooks.py": (
                "from sglang.srt.managers.schedule_batch import ScheduleBatch\n"
                "def register():\n    pass\n"
            ),
        },
        requires=["sglang==0.5.22", "torch>=2.0", "pytest; extra == 'test'"],
        pth="import vendor_platform_startup\n",
    )
    code, text = run_check(capsys)
    assert code == 1, text
    assert "INCOMPATIBLE" in text
    assert (
        "it requires sglang==0.5.22, and sglang-launch provides SGLang 0.5.23's plugin surface, "
        "not SGLang itself" in text
    )
    assert (
        "plugin vendor: incompatible: vendor_platform/hooks.py:1 imports "
        "sglang.srt.managers.schedule_batch, which sglang-launch does not provide" in text
    )
    assert "it installs vendor-platform.pth, which runs code at every interpreter start" in text
    assert "vendor_runtime_that_is_absent" not in text and "torch" not in text.split("WHY")[1]
    assert "the selected platform's platform vendor (vendor-platform)" in text

    code, report = run_check(capsys, "--json", "--runtime", "srt")
    assert code == 1 and report["ok"] is False
    platform = next(f for f in report["runtimes"][0]["findings"] if f["kind"] == "platform")[
        "problems"
    ]
    plugin = next(f for f in report["runtimes"][0]["findings"] if f["kind"] == "plugin")["problems"]
    # The distribution's requirement and .pth count for both; hooks.py's import for the plugin
    # alone, whose entry point runs it.
    assert len(platform) == 2 and not any("hooks.py" in p for p in platform), platform
    assert len(plugin) == 3 and any("hooks.py:1" in p for p in plugin), plugin


def test_each_entry_point_is_blamed_only_for_the_imports_its_own_code_reaches(
    installed, capsys, monkeypatch
):
    # kern-llm's shape: one distribution, an SGLang plugin package and a vLLM one beside it.
    installed(
        "twin-engines",
        {
            "sglang.srt.plugins": {"twin": "twin_sglang:register"},
            "vllm.general_plugins": {"twin": "twin_vllm:register"},
        },
        {
            "twin_sglang/__init__.py": "import os\n\ndef register():\n    import twin_sglang.model\n",
            "twin_sglang/model.py": "import json\n",
            "twin_vllm/__init__.py": "import vllm_engine_that_is_absent\n\ndef register():\n    pass\n",
        },
    )
    code, report = run_check(capsys, "--json", "--runtime", "srt")
    plugin = finding(report, "srt", "twin")
    assert plugin["problems"] == [] and plugin["verdict"] == "loaded", plugin
    assert code == 0 and report["ok"] is True


def test_imports_are_followed_from_the_entry_point_and_named_by_their_path_in_the_distribution(
    installed, capsys, monkeypatch
):
    # tt-sglang-plugin's shape: the platform entry point's module imports nothing of SGLang's
    # internals; its class does not either; the general plugin's register() does, through a
    # module of a subpackage; a module of the same name elsewhere in the package is not reached.
    installed(
        "tile-vendor",
        {
            "sglang.srt.platforms": {"tile": "tile_vendor:activate"},
            "sglang.srt.plugins": {"tile": "tile_vendor:register"},
        },
        {
            "tile_vendor/__init__.py": (
                "import os\n\n"
                "def activate():\n    return 'tile_vendor.platform.TilePlatform'\n\n"
                "def register():\n"
                "    from sglang.srt.plugins.hook_registry import HookRegistry\n"
                "    _helper()\n\n"
                "def _helper():\n    from tile_vendor.models import mock\n"
            ),
            "tile_vendor/platform.py": (
                "from sglang.srt.platforms.interface import SRTPlatform\n\n"
                "class TilePlatform(SRTPlatform):\n"
                "    def get_mha_kv_pool_cls(self):\n"
                "        from sglang.srt.mem_cache.memory_pool import Pool\n"  # never called here
                "        return Pool\n"
            ),
            "tile_vendor/mock.py": "from sglang.srt.layers.sampler import Sampler\n",
            "tile_vendor/models/__init__.py": "",
            "tile_vendor/models/mock.py": (
                "import os\n\n\nfrom sglang.srt.layers.logits_processor import LogitsProcessorOutput\n"
            ),
        },
    )
    monkeypatch.setenv("SGLANG_PLATFORM", "tile")
    code, text = run_check(capsys)
    assert code == 1, text  # the platform's own plugin would fail: start-up stops
    assert (
        "plugin tile: incompatible: tile_vendor/models/mock.py:4 imports "
        "sglang.srt.layers.logits_processor" in text
    ), text
    assert "platform tile: incompatible" not in text, text
    assert "sampler" not in text and "mem_cache" not in text, text

    # The platform without its plugin: nothing of the plugin's is held against it.
    monkeypatch.setenv("SGLANG_PLUGINS", "some_other_plugin")
    code, report = run_check(capsys, "--json", "--runtime", "srt")
    assert finding(report, "srt", "tile")["problems"] == []  # the platform finding comes first
    assert code == 0 and report["ok"] is True, report


def test_a_fallback_import_counts_only_where_the_import_it_replaces_is_missing(
    installed, capsys, monkeypatch
):
    # sglang-plugin-FL's shape: the detector moved between two releases of its library.
    installed(
        "moved-detector",
        {"sglang.srt.plugins": {"moved": "moved_detector:register"}},
        {
            "moved_detector/__init__.py": (
                "def register():\n"
                "    try:\n        import json.decoder as detector\n"
                "    except ImportError:\n        import json.detector_that_moved as detector\n"
                "    try:\n        import absent_sdk_release_one\n"
                "    except ImportError:\n        import absent_sdk_release_two\n"
            ),
        },
    )
    code, report = run_check(capsys, "--json", "--runtime", "srt")
    problems = finding(report, "srt", "moved")["problems"]
    assert problems == [
        "moved_detector/__init__.py:9 imports absent_sdk_release_two, which is not installed"
    ], problems


def test_an_incompatible_plugin_of_another_platform_does_not_fail_the_check(
    installed, capsys, monkeypatch
):
    installed(
        "chosen-platform",
        {"sglang.multimodal_gen.platforms": {"chosen": "chosen_platform:activate"}},
        {"chosen_platform.py": "def activate():\n    return None\n"},
    )
    installed(
        "other-platform",
        {
            "sglang.multimodal_gen.platforms": {"other": "other_platform:activate"},
            "sglang.multimodal_gen.plugins": {"other": "other_platform:register"},
        },
        {"other_platform.py": "import some_missing_vendor_sdk\ndef activate():\n    pass\n"},
    )
    monkeypatch.setenv("SGLANG_DIFFUSION_PLATFORM_OVERRIDE", "chosen")
    code, report = run_check(capsys, "--json", "--runtime", "diffusion")
    assert code == 0, report
    other = finding(report, "diffusion", "other")
    assert other["incompatible"] is True
    assert "imports some_missing_vendor_sdk, which is not installed" in other["problems"][0]
    block = report["runtimes"][0]
    plugin = next(f for f in block["findings"] if f["kind"] == "plugin")
    assert plugin["verdict"] == "skipped" and "not the selected one" in plugin["why"]


def test_with_a_real_sglang_importable_nothing_is_aliased_and_it_says_so(installed, capsys):
    installed("sglang", {}, {"sglang/__init__.py": "", "sglang/srt/__init__.py": ""})
    code, text = run_check(capsys)
    assert "a real sglang 0.1.0 is importable: nothing is aliased" in text
    assert code == 0
