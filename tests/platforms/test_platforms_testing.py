"""``platforms.testing.fresh_platforms``: the block selects as a fresh process does, and the
process's own state is back when it ends. Each test runs inside ``fresh_process`` as well, so what
a failing test leaves behind does not reach the next."""

from __future__ import annotations

import sys

import pytest
import torch
from support import make_dist
from support.plugins import platform_plugin

import platforms
import platforms.diffusion
from platforms import PlatformSelectionError
from platforms.custom_op import CustomOp
from platforms.testing import fresh_platforms

pytestmark = pytest.mark.usefixtures("fresh_process")


def test_a_block_selects_afresh_and_the_outer_selection_comes_back(site, monkeypatch):
    platform_plugin(site, "inner")
    platforms.pin_selection("builtin:cpu")
    outer = platforms.current_selection()
    platforms.current_platform.marked_by_this_test = "outer"  # set on the instance
    monkeypatch.setenv("SGLANG_PLATFORM", "inner")
    with fresh_platforms():
        assert platforms.current_selection().key == "plugin:inner"  # from the environment
        assert platforms.current_platform.device_name == "inner"
        platforms.use_serving_fallback()
    assert platforms.current_selection() is outer
    assert platforms.current_platform.marked_by_this_test == "outer"  # the same instance
    with pytest.raises(PlatformSelectionError, match="already resolved builtin:cpu"):
        platforms.pin_selection("plugin:inner")  # still resolved, as before the block


def test_keys_pin_each_runtime_and_a_bad_key_changes_nothing(monkeypatch):
    monkeypatch.setenv("SGLANG_PLATFORM", "nosuch")  # a pin wins over the environment
    with fresh_platforms(srt="builtin:cpu", diffusion="builtin:cpu"):
        assert "pinned builtin:cpu" in str(platforms.current_platform)
        assert platforms.diffusion.current_selection().key == "builtin:cpu"
        inside = platforms.current_selection()
        with pytest.raises(PlatformSelectionError, match="not a diffusion platform key"):
            with fresh_platforms(diffusion="gpu"):
                pytest.fail("the block ran with a malformed key")
        with pytest.raises(ValueError, match="pass a selection key for a runtime"):
            with fresh_platforms(tpu="builtin:cpu"):
                pytest.fail("the block ran for an unknown runtime")
        assert platforms.current_selection() is inside
    with pytest.raises(PlatformSelectionError, match="SGLANG_PLATFORM=nosuch"):
        platforms.current_selection()  # nothing pinned after the block: the environment rules


def test_entry_points_are_read_from_the_sys_path_of_the_block(site, tmp_path, monkeypatch):
    platform_plugin(site, "first")
    monkeypatch.setenv("SGLANG_PLATFORM", "second")
    with pytest.raises(PlatformSelectionError, match="found: first"):
        platforms.current_selection()
    later = tmp_path / "later"
    platform_plugin(later, "second")
    monkeypatch.syspath_prepend(str(later))
    with fresh_platforms():
        assert platforms.current_selection().key == "plugin:second"


def test_a_raising_block_still_restores_and_backend_state_is_the_blocks_own(site, monkeypatch):
    package = platform_plugin(
        site,
        "counted",
        runtime="diffusion",
        class_body=(
            "def init_backend(self):\n"
            "    import sys\n"
            "    from platforms.custom_op import CustomOp\n"
            "    CustomOp.register_oot_forward(Op, lambda op, x: 'registered', 'counted')\n"
            "    sys.modules[__name__].INITS.append(1)\n"
            "def get_dispatch_key_name(self):\n"
            "    return 'counted'\n"
        ),
    )
    module = site / package / "platform.py"
    module.write_text(
        "from platforms.custom_op import CustomOp\n"
        "INITS = []\n"
        "class Op(CustomOp):\n"
        "    def forward_native(self, x):\n"
        "        return 'native'\n" + module.read_text()
    )
    monkeypatch.setenv("SGLANG_DIFFUSION_PLATFORM_OVERRIDE", "counted")
    for _ in range(2):
        with pytest.raises(RuntimeError, match="the test's own failure"):
            with fresh_platforms():
                platforms.diffusion.initialize_current_platform()
                platforms.diffusion.initialize_current_platform()
                op_class = sys.modules[f"{package}.platform"].Op
                assert op_class()(torch.ones(1)) == "registered"
                raise RuntimeError("the test's own failure")
    assert sys.modules[f"{package}.platform"].INITS == [1, 1]  # once per block
    op_class = sys.modules[f"{package}.platform"].Op
    assert CustomOp.registered_forward(op_class, "counted") is None  # undone with the block
    monkeypatch.setenv("SGLANG_DIFFUSION_PLATFORM_OVERRIDE", "cpu")
    assert platforms.diffusion.current_selection().key == "builtin:cpu"  # nothing was left selected


def test_a_seeded_entry_point_table_is_read_again_after_the_block(site):
    make_dist(site, "seeded", {"sglang.srt.plugins": {"real": "real_mod:register"}})
    from platforms import entrypoints

    with fresh_platforms():
        entrypoints.seed((("sglang.srt.plugins", "ghost", "x:y", "nowhere"),))
        assert [ep.name for ep in entrypoints.entry_points("sglang.srt.plugins")] == ["ghost"]
    assert [ep.name for ep in entrypoints.entry_points("sglang.srt.plugins")] == ["real"]
