"""check-platform catches what a platform class's definition hides.

A real platform plugin (a dist-info distribution on the path) whose SRT class has a misspelt
method, a method of the diffusion contract, SGLang's newer name for a KV-pool factory, and two
overrides whose parameters cannot take what the runtime passes. Its calls all work, so no other
row catches them; ``selection.contract_names`` names each stray name with the contract name it
most resembles, and ``selection.signatures`` names both signatures of each bad override.
"""

from __future__ import annotations

import pytest
from support.plugins import platform_plugin
from test_check_platform import check_platform, row

pytestmark = pytest.mark.e2e

CLASS_BODY = """
def get_devcie_name(self, device_id=0):
    return "typo"

def get_attn_backend_cls_str(self, selected_backend, head_size, dtype):
    return "torch.nn.functional.scaled_dot_product_attention"

def get_kv_pool_cls(self):
    return None

def get_device_total_memory(self, index=0):
    return 1 << 30

def set_device(self, device, strict):
    pass

def _private_helper(self):
    return "fine"

@property
def vendor_name(self):  # sglang-plugin-FL's: a helper of its own, no misspelt contract name
    return "tile"
"""


def test_stray_names_and_bad_overrides_fail_naming_the_fix(site):
    platform_plugin(site, "sloppy", class_body=CLASS_BODY, tag="surface")
    # The spec's own signature, get_device(local_rank), as sglang-plugin-FL writes it: every
    # runtime call passes the rank, so an override without a default is no mistake.
    tidy_body = (
        "def get_device(self, local_rank: int):\n    import torch\n    return torch.device('cpu')"
    )
    platform_plugin(site, "tidy", tag="tidy", class_body=tidy_body)
    (sloppy, tidy), result = check_platform(
        [(["--json"], {"SGLANG_PLATFORM": "sloppy"}), (["--json"], {"SGLANG_PLATFORM": "tidy"})],
        sites=[site],
    )
    names = row(sloppy["report"], "selection.contract_names")
    assert names["status"] == "fail", result
    detail = names["detail"]
    assert (
        "Plat.get_devcie_name is not part of the contract (nearest contract name: get_device_name)"
        in detail
    )
    assert "make it private (_get_devcie_name)" in detail
    assert "Plat.get_attn_backend_cls_str belongs to the other runtime's contract" in detail
    assert (
        "Plat.get_kv_pool_cls is not part of the contract (nearest contract name: get_m" in detail
    )
    assert "_private_helper" not in detail
    assert (
        "Plat.vendor_name is not part of the contract and resembles no contract name: the "
        "runtime never uses it; make it private (_vendor_name) if it is a helper" in detail
    ), detail

    sigs = row(sloppy["report"], "selection.signatures")
    assert sigs["status"] == "fail", result
    assert (
        "Plat.get_device_total_memory(index=0) cannot accept what the runtime passes to "
        "get_device_total_memory(device_id: 'int' = 0)"
    ) in sigs["detail"]
    assert "Plat.set_device(device, strict) cannot accept" in sigs["detail"]
    assert "missing a required argument: 'strict'" in sigs["detail"]
    assert sloppy["rc"] == 1 and sloppy["report"]["ok"] is False

    # A plugin without such mistakes passes both rows.
    for check in ("selection.contract_names", "selection.signatures"):
        assert row(tidy["report"], check)["status"] == "pass", result
