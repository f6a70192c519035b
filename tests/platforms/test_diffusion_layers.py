"""The diffusion runtime's norms as ``CustomOp``s (``platforms.diffusion.layers``): the same outputs as
the modules they replace, and resolution once at construction in the spec's order. Each case runs
in a fresh interpreter whose diffusion platform is selected the documented way (a real dist-info
entry point for the out-of-tree key), so no selection leaks between tests."""

from __future__ import annotations

import pytest
from support import clean_env, make_dist, run_python

# Each test runs a fresh interpreter that imports torch and diffusers: end-to-end by the suite's rule.
pytestmark = pytest.mark.e2e

EQUALITY = """
import json, torch
from diffusers.models.normalization import RMSNorm as DiffusersRMSNorm
from platforms.diffusion.layers import GroupNorm, LayerNorm, RMSNorm, adopt_custom_ops, custom_op_report

torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.GroupNorm(4, 8), torch.nn.Sequential(torch.nn.LayerNorm(8)),
                            DiffusersRMSNorm(8, eps=1e-6))
for m in model.modules():
    for p in m.parameters(recurse=False):
        torch.nn.init.normal_(p)
x = torch.randn(2, 8, 8)
want = [model[0](x), model[1](x), model[2](x)]
count = adopt_custom_ops(model)
got = [model[0](x), model[1](x), model[2](x)]
print("RESULT:" + json.dumps({
    "count": count,
    "types": [type(model[0]).__name__, type(model[1][0]).__name__, type(model[2]).__name__],
    "equal": [bool(torch.equal(a, b)) for a, b in zip(want, got)],
    "report": custom_op_report(model),
}))
"""


def test_custom_ops_compute_what_the_modules_they_replace_compute():
    result = run_python(
        EQUALITY, env=clean_env(SGLANG_DIFFUSION_PLATFORM_OVERRIDE="cpu"), timeout=180
    )
    assert result.returncode == 0, result
    assert result.data["count"] == 3
    assert result.data["types"] == ["GroupNorm", "LayerNorm", "RMSNorm"]
    assert result.data["equal"] == [True, True, True]
    # The CPU platform's key is "native": forward_<key> is forward_native.
    assert result.data["report"]["RMSNorm"] == {"count": 1, "forward": {"forward_native": 1}}


KEYED = """
from platforms.diffusion import Platform, PlatformEnum
from platforms.builtin.cpu import CpuDevice

def activate():
    return "keyed.Keyed"

class Keyed(Platform, CpuDevice):
    _enum = PlatformEnum.OOT
    dispatch_key = "CPU"

    def get_dispatch_key_name(self):
        return "keyed"

    def init_backend(self):
        from platforms.custom_op import CustomOp
        from platforms.diffusion.layers import RMSNorm
        CustomOp.register_oot_forward(RMSNorm, fn=rms_keyed, platform_key="keyed")

def rms_keyed(op, x):
    return op.forward_native(x) * 0 + 7
"""

ORDER = """
import json, torch
from platforms.diffusion import initialize_current_platform
from platforms.custom_op import CustomOp
from platforms.diffusion import layers

class WithOwn(layers.LayerNorm):
    def forward_keyed(self, x):
        return x * 0 + 3

made_before = layers.GroupNorm(1, 4)  # constructed before init_backend: resolution is kept
initialize_current_platform()
ops = {"registered": layers.RMSNorm(4), "own": WithOwn((4,)), "oot": layers.GroupNorm(1, 4)}
x = torch.ones(1, 4, 4)
out = {name: float(op(x).flatten()[0]) for name, op in ops.items()}
CustomOp.register_oot_forward(layers.GroupNorm, fn=lambda op, x: x * 0 + 5, platform_key="keyed")
late = float(ops["oot"](x).flatten()[0])  # registered after construction: not picked up
print("RESULT:" + json.dumps({"out": out, "late": late,
      "how": {n: layers.resolved_forward(o) for n, o in {**ops, "before": made_before}.items()}}))
"""


def test_resolution_order_registered_then_forward_key_then_oot(site):
    make_dist(
        site,
        "keyed-platform",
        entry_points={"sglang.multimodal_gen.platforms": {"keyed": "keyed:activate"}},
        modules={"keyed.py": KEYED},
    )
    result = run_python(
        ORDER, sites=[site], env=clean_env(SGLANG_DIFFUSION_PLATFORM_OVERRIDE="keyed"), timeout=180
    )
    assert result.returncode == 0, result
    how = result.data["how"]
    assert (
        how["registered"] == "registered keyed.rms_keyed" and result.data["out"]["registered"] == 7
    )
    assert how["own"] == "forward_keyed" and result.data["out"]["own"] == 3
    assert how["oot"] == "forward_oot" and result.data["late"] != 5
    assert how["before"] == "forward_oot"


@pytest.mark.parametrize("name", ["LayerNorm", "GroupNorm", "RMSNorm"])
def test_layers_are_custom_ops(name):
    result = run_python(f"""
        from platforms.custom_op import CustomOp
        from platforms.diffusion import layers
        print("RESULT:" + str(int(issubclass(layers.{name}, CustomOp))))
    """)
    assert result.data == 1, result
