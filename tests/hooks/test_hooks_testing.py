"""``hooks.testing.fresh_plugins``: plugins load afresh in the block, and every hook target and
registry is as it was when the block ends. Each test runs inside ``fresh_process`` as well."""

from __future__ import annotations

import importlib

import pytest
from support import make_dist

import hooks
import hooks.diffusion
import platforms
from hooks import HookRegistry
from hooks.testing import fresh_plugins

pytestmark = pytest.mark.usefixtures("fresh_process")

SRT_PLUGINS = "sglang.srt.plugins"
DIFF_PLUGINS = "sglang.multimodal_gen.plugins"


def _plugin(site):
    """``counting``: an SRT and a diffusion plugin that hook ``tgt_fresh.f`` and count their
    callbacks' runs; ``tgt_fresh.g`` carries a module-level hook of ``early_mod`` (no plugin)."""
    make_dist(
        site,
        "counting-plugin",
        {
            SRT_PLUGINS: {"counting": "counting_mod:register", "early": "early_mod:register"},
            DIFF_PLUGINS: {"counting": "counting_mod:register_diffusion"},
        },
        {
            "tgt_fresh.py": "def f(x):\n    return [x]\n\ndef g(x):\n    return [x]\n",
            "counting_mod.py": """
                from hooks import HookRegistry, HookType
                import hooks.diffusion
                RUNS = []
                def register():
                    RUNS.append("srt")
                    HookRegistry.register("tgt_fresh.f", lambda r, x: r + ["srt"], HookType.AFTER)
                def register_diffusion():
                    RUNS.append("diffusion")
                    hooks.diffusion.HookRegistry.register(
                        "tgt_fresh.f", lambda r, x: r + ["diffusion"], HookType.AFTER)
            """,
            "early_mod.py": """
                from hooks import HookType, plugin_hook
                @plugin_hook("tgt_fresh.g", type=HookType.AFTER)
                def early(result, x):
                    return result + ["early"]
                def register():
                    pass
            """,
        },
    )


def test_plugins_load_again_in_each_block_and_their_targets_are_restored(site):
    _plugin(site)
    tgt = importlib.import_module("tgt_fresh")
    original = tgt.f
    counting = importlib.import_module("counting_mod")
    for _ in range(2):
        with fresh_plugins():
            hooks.load_plugins()
            hooks.diffusion.apply_plugin_hooks()
            assert tgt.f(1) == [1, "srt", "diffusion"]
            assert hooks.runtime("srt").outcomes[("counting", "counting-plugin")].status == "loaded"
        assert tgt.f is original and tgt.f(1) == [1]
        assert HookRegistry.hooks() == [] and hooks.diffusion.HookRegistry.hooks() == []
        assert hooks.runtime("srt").outcomes == {}
    assert counting.RUNS == ["srt", "diffusion"] * 2  # each block ran both callbacks once


def test_hooks_registered_before_the_block_stay_as_they_were(site):
    _plugin(site)
    early = importlib.import_module("early_mod")  # its decorator registers outside any plugin
    tgt = importlib.import_module("tgt_fresh")
    before = HookRegistry.hooks()
    assert [h.source for h in before] == [None]
    with fresh_plugins():
        hooks.load_plugins()  # the "early" plugin claims its module's hook and applies it
        assert [h.source.name for h in HookRegistry.hooks() if h.func is early.early] == ["early"]
        assert tgt.g(1) == [1, "early"]
    assert HookRegistry.hooks() == before and before[0].source is None
    assert HookRegistry.pending() == before and tgt.g(1) == [1]  # registered, not applied
    HookRegistry.apply_hooks()
    with fresh_plugins():
        hooks.load_plugins()
        assert tgt.g(1) == [1, "early"]
    assert tgt.g(1) == [1, "early"] and HookRegistry.pending() == []  # applied, as before
    assert HookRegistry.hooks() == before and before[0].source is None


def test_a_block_that_raises_is_undone_and_pins_reach_the_platforms(site):
    _plugin(site)
    tgt = importlib.import_module("tgt_fresh")
    with pytest.raises(RuntimeError, match="the test's own failure"):
        with fresh_plugins(srt="builtin:cpu"):
            assert platforms.current_selection().key == "builtin:cpu"
            hooks.load_plugins()
            assert tgt.f(1) == [1, "srt"]
            raise RuntimeError("the test's own failure")
    assert tgt.f(1) == [1] and HookRegistry.hooks() == []
    with fresh_plugins():
        with pytest.raises(platforms.PlatformSelectionError, match="not a srt platform key"):
            with fresh_plugins(srt="cpu"):
                pytest.fail("the block ran with a malformed key")
        hooks.load_plugins()  # the outer block's phases are untouched by the refused one
        assert tgt.f(1) == [1, "srt"]
