"""SGLang's module paths and hook targets resolve to this project's, and never over the real one.

Aliasing is installed once per process, so each case runs in a fresh interpreter (that is the
point: what ``import sglang`` does in a process).
"""

from __future__ import annotations

import pytest
from support import make_dist, run_python

pytestmark = pytest.mark.e2e  # fresh interpreters

TRANSLATE = """
import json
from launcher.prepare import install_aliases
from hooks import HookRegistry, HookType
from hooks.compat import NoEquivalentError, translate_target

active = install_aliases()
out = {"active": active, "targets": {}, "errors": {}}
for target in (
    "sglang.srt.server_args.ServerArgs.__post_init__",
    "sglang.srt.server_args:ServerArgs.check_server_args",
    "sglang.srt.managers.scheduler.Scheduler.get_next_batch_to_run",
    "sglang.srt.managers.scheduler.Scheduler.process_batch_result",
    "sglang.srt.managers.tp_worker.TpModelWorker.forward_batch_generation",
    "sglang.multimodal_gen.runtime.managers.gpu_worker.GPUWorker.init_device_and_model",
    "sglang.multimodal_gen.runtime.managers.scheduler.Scheduler.run_batch",
    "launchspec.server_args.ServerArgs.__post_init__",
):
    out["targets"][target] = translate_target(target)
for target in (
    "sglang.srt.managers.schedule_batch.ScheduleBatch.prepare_for_decode",
):
    try:
        HookRegistry.register(target, lambda result, *a: None, HookType.AFTER)
    except NoEquivalentError as exc:
        out["errors"][target] = str(exc)

# Two hooks on one attribute, one by each name, share one patch of the real method.
calls = []
HookRegistry.register("sglang.srt.server_args.ServerArgs.check_server_args",
                      lambda result, self: calls.append("sglang name"), HookType.AFTER)
HookRegistry.register("launchspec.server_args.ServerArgs.check_server_args",
                      lambda result, self: calls.append("own name"), HookType.AFTER)
HookRegistry.apply_hooks()
from sglang.srt.managers.tp_worker import TpModelWorker
from serving.srt.model_runner import ModelRunner
import platforms
platforms.pin_selection("builtin:cpu")
from launchspec.server_args import ServerArgs
ServerArgs().check_server_args()
out["calls"] = calls
out["renamed_class"] = TpModelWorker is ModelRunner
print("RESULT:" + json.dumps(out))
"""


def test_targets_translate_to_this_projects_and_unmatched_ones_name_the_nearest():
    result = run_python(TRANSLATE, timeout=120)
    data = result.data
    assert data is not None and data["active"] is True, result
    assert data["targets"] == {
        "sglang.srt.server_args.ServerArgs.__post_init__": "launchspec.server_args.ServerArgs.__post_init__",
        "sglang.srt.server_args:ServerArgs.check_server_args": "launchspec.server_args.ServerArgs.check_server_args",
        "sglang.srt.managers.scheduler.Scheduler.get_next_batch_to_run": "serving.srt.scheduler.Scheduler.get_next_batch_to_run",
        "sglang.srt.managers.scheduler.Scheduler.process_batch_result": "serving.srt.scheduler.Scheduler.process_batch_result",
        "sglang.srt.managers.tp_worker.TpModelWorker.forward_batch_generation": "serving.srt.model_runner.ModelRunner.generate",
        "sglang.multimodal_gen.runtime.managers.gpu_worker.GPUWorker.init_device_and_model": "serving.diffusion.model_runner.DiffusionModelRunner.init_device_and_model",
        "sglang.multimodal_gen.runtime.managers.scheduler.Scheduler.run_batch": "serving.diffusion.scheduler.DiffusionScheduler.run_batch",
        "launchspec.server_args.ServerArgs.__post_init__": "launchspec.server_args.ServerArgs.__post_init__",
    }
    errors = data["errors"]
    internal = errors["sglang.srt.managers.schedule_batch.ScheduleBatch.prepare_for_decode"]
    assert "names SGLang internals that sglang-launch does not have" in internal
    assert "the nearest target here is 'serving.srt.scheduler." in internal
    assert data["calls"] == ["sglang name", "own name"]
    assert data["renamed_class"] is True


STAND_IN = """
import json
from launcher.prepare import install_aliases
from hooks.compat import installed, translate_target
active = install_aliases()
import sglang
out = {"active": active, "installed": installed() is not None, "real": getattr(sglang, "REAL", None),
       "target": translate_target("sglang.srt.server_args.ServerArgs.__post_init__")}
try:
    import sglang.srt.platforms.interface as interface
    out["interface"] = interface.__name__
except ImportError as exc:
    out["interface"] = f"ImportError: {exc}"
print("RESULT:" + json.dumps(out))
"""


def test_a_real_sglang_on_the_path_is_left_alone(site):
    make_dist(
        site,
        "sglang",
        modules={
            "sglang/__init__.py": "REAL = 'stand-in'\n",
            "sglang/srt/__init__.py": "",
            "sglang/srt/platforms/__init__.py": "",
            "sglang/srt/platforms/interface.py": "class SRTPlatform: pass\n",
        },
        version="0.5.23",
    )
    result = run_python(STAND_IN, sites=[site], timeout=120)
    assert result.data == {
        "active": False,
        "installed": False,
        "real": "stand-in",
        "target": "sglang.srt.server_args.ServerArgs.__post_init__",
        "interface": "sglang.srt.platforms.interface",
    }, result


SURFACE = """
import importlib.util, json
from launcher.prepare import install_aliases
install_aliases()
import sglang
out = {"version": sglang.__version__, "found": importlib.util.find_spec("sglang") is not None}
try:
    from sglang.srt.configs.qwen3_5 import Qwen3_5MoeTextConfig
except ImportError as exc:
    out["import"] = [type(exc).__name__, exc.name, str(exc)]
try:
    importlib.util.find_spec("sglang.srt.layers.logits_processor")
except ImportError as exc:
    out["find_spec"] = [type(exc).__name__, exc.name]
import voicing_like
out["registered"] = voicing_like.register()
print("RESULT:" + json.dumps(out))
"""

# vtext-editor's shape: a plugin that takes its SGLang branch when find_spec("sglang") finds it,
# guarding the internals it needs.
VOICING_LIKE = """
import importlib.util


def register():
    if importlib.util.find_spec("sglang") is None:
        return "no sglang"
    from sglang.srt.models.registry import ModelRegistry  # provided: its models register

    try:
        from sglang.srt.layers.quantization import QUANTIZATION_METHODS
    except ImportError as exc:  # not provided: the plugin takes its own fallback
        return f"registered; quantization fallback: {exc.name}"
    return "registered; quantization registered"
"""


def test_the_aliases_name_the_sglang_version_they_provide_and_refuse_its_internals_by_name(site):
    from launchspec.compat import MODULES, SGLANG_VERSION

    make_dist(site, "voicing-like", modules={"voicing_like.py": VOICING_LIKE})
    result = run_python(SURFACE, sites=[site], timeout=120)
    data = result.data
    assert data is not None, result
    assert data["version"] == SGLANG_VERSION == "0.5.23" and data["found"] is True
    kind, name, message = data["import"]
    assert (kind, name) == ("NotProvidedError", "sglang.srt.configs"), data
    assert "sglang-launch provides SGLang 0.5.23's plugin surface only" in message
    assert all(module in message for module in MODULES), message
    assert "a plugin that imports sglang.srt.configs needs SGLang itself" in message
    assert data["find_spec"] == ["NotProvidedError", "sglang.srt.layers"]
    assert data["registered"] == "registered; quantization fallback: sglang.srt.layers"
