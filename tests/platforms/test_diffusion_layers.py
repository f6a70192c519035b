"""The diffusion runtime's norms as ``CustomOp``s (``platforms.diffusion.layers``): the same outputs as
the modules they replace, and resolution once at construction in the spec's order. Each test runs
in ``fresh_process`` (``platforms.testing``), its diffusion platform selected the documented way
(a real dist-info entry point for the out-of-tree key), and everything it selected, initialized
and registered with ``CustomOp`` is undone when it ends."""

from __future__ import annotations

import pytest
import torch
from support import make_dist

from platforms.custom_op import CustomOp
from platforms.diffusion import initialize_current_platform, layers

pytestmark = pytest.mark.usefixtures("fresh_process")


@pytest.mark.e2e  # imports diffusers
def test_custom_ops_compute_what_the_modules_they_replace_compute(monkeypatch):
    from diffusers.models.normalization import RMSNorm as DiffusersRMSNorm

    monkeypatch.setenv("SGLANG_DIFFUSION_PLATFORM_OVERRIDE", "cpu")
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.GroupNorm(4, 8),
        torch.nn.Sequential(torch.nn.LayerNorm(8)),
        DiffusersRMSNorm(8, eps=1e-6),
    )
    for m in model.modules():
        for p in m.parameters(recurse=False):
            torch.nn.init.normal_(p)
    x = torch.randn(2, 8, 8)
    want = [model[0](x), model[1](x), model[2](x)]
    count = layers.adopt_custom_ops(model)
    got = [model[0](x), model[1](x), model[2](x)]
    assert count == 3
    assert [type(model[0]).__name__, type(model[1][0]).__name__, type(model[2]).__name__] == [
        "GroupNorm",
        "LayerNorm",
        "RMSNorm",
    ]
    assert [bool(torch.equal(a, b)) for a, b in zip(want, got, strict=True)] == [True, True, True]
    # The CPU platform's key is "native": forward_<key> is forward_native.
    report = layers.custom_op_report(model)
    assert report["RMSNorm"] == {"count": 1, "forward": {"forward_native": 1}}


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


def test_resolution_order_registered_then_forward_key_then_oot(site, monkeypatch):
    make_dist(
        site,
        "keyed-platform",
        entry_points={"sglang.multimodal_gen.platforms": {"keyed": "keyed:activate"}},
        modules={"keyed.py": KEYED},
    )
    monkeypatch.setenv("SGLANG_DIFFUSION_PLATFORM_OVERRIDE", "keyed")

    class WithOwn(layers.LayerNorm):
        def forward_keyed(self, x):
            return x * 0 + 3

    made_before = layers.GroupNorm(1, 4)  # constructed before init_backend: resolution is kept
    initialize_current_platform()
    ops = {"registered": layers.RMSNorm(4), "own": WithOwn((4,)), "oot": layers.GroupNorm(1, 4)}
    x = torch.ones(1, 4, 4)
    out = {name: float(op(x).flatten()[0]) for name, op in ops.items()}
    CustomOp.register_oot_forward(
        layers.GroupNorm, fn=lambda op, x: x * 0 + 5, platform_key="keyed"
    )
    late = float(ops["oot"](x).flatten()[0])  # registered after construction: not picked up
    how = {n: layers.resolved_forward(o) for n, o in {**ops, "before": made_before}.items()}
    assert how["registered"] == "registered keyed.rms_keyed" and out["registered"] == 7
    assert how["own"] == "forward_keyed" and out["own"] == 3
    assert how["oot"] == "forward_oot" and late != 5
    assert how["before"] == "forward_oot"


@pytest.mark.parametrize("name", ["LayerNorm", "GroupNorm", "RMSNorm"])
def test_layers_are_custom_ops(name):
    assert issubclass(getattr(layers, name), CustomOp)
