"""``hooks.blame`` and ``hooks.result_culprit``: which plugin's hook is to blame, in this process.

A real plugin (a dist-info distribution, group ``sglang.srt.plugins``) hooks a small target module;
the test calls the hooked targets and asks who failed. Every test runs in ``fresh_process``
(``hooks.testing``): its ``site`` folder on ``sys.path``, every hook target restored at the end.
Each test writes modules of its own names (imported modules stay imported).
"""

from __future__ import annotations

import importlib

import pytest
from support import make_dist

import hooks

pytestmark = pytest.mark.usefixtures("fresh_process")

TARGET = """
class Scheduler:
    def get_next_batch_to_run(self):
        return ["batch"]

    def run_batch(self, batch):
        raise RuntimeError("the model broke")

    def process_batch_result(self, batch, result):
        return None

    def pick(self):
        return ["batch"]


def helper():
    raise ValueError("deep in a library")
"""

PLUGIN = """
import {target}
from hooks.hook_registry import HookRegistry, HookType

T = "{target}.Scheduler"


def raising_policy(original_fn, self):
    return {target}.helper()  # a library call that raises: still this hook's failure


def wrap_model(original_fn, self, batch):
    return original_fn(self, batch)  # the target itself raises: the model's failure


def after_result(result, self, batch, result_value):
    raise KeyError("metrics bug")


def not_a_batch(self):
    return "not a batch"


def register():
    HookRegistry.register(T + ".get_next_batch_to_run", raising_policy, HookType.AROUND)
    HookRegistry.register(T + ".run_batch", wrap_model, HookType.AROUND)
    HookRegistry.register(T + ".process_batch_result", after_result, HookType.AFTER)
    HookRegistry.register(T + ".pick", not_a_batch, HookType.REPLACE)
"""


def _load(site, name: str):
    make_dist(site, f"{name}-target", modules={f"{name}_tgt.py": TARGET})
    make_dist(
        site,
        f"{name}-dist",
        {"sglang.srt.plugins": {name: f"{name}_plug:register"}},
        {f"{name}_plug.py": PLUGIN.format(target=f"{name}_tgt")},
    )
    hooks.load_plugins()
    return importlib.import_module(f"{name}_tgt")


def _raised(call):
    with pytest.raises(Exception) as info:
        call()
    return info.value


def test_a_hook_that_raises_or_calls_what_raises_is_blamed_by_plugin_hook_and_target(site):
    target = _load(site, "blameone")
    scheduler = target.Scheduler()
    culprit = hooks.blame(_raised(lambda: scheduler.process_batch_result([], None)))
    assert culprit is not None
    assert culprit.plugin == "blameone" and culprit.type == "AFTER"
    assert culprit.describe() == (
        "the plugin 'blameone' (AFTER hook on Scheduler.process_batch_result)"
    )
    culprit = hooks.blame(_raised(scheduler.get_next_batch_to_run))  # raised inside helper()
    assert culprit is not None and culprit.type == "AROUND", culprit
    assert culprit.short_target == "Scheduler.get_next_batch_to_run"


def test_a_hook_that_only_wraps_a_target_that_raises_leaves_the_blame_with_the_target(site):
    target = _load(site, "blametwo")
    assert hooks.blame(_raised(lambda: target.Scheduler().run_batch([]))) is None
    assert hooks.blame(_raised(target.helper)) is None  # no hook in the traceback at all


def test_what_a_replaced_method_returns_is_the_replacements_fault(site):
    target = _load(site, "blamethree")
    scheduler = target.Scheduler()
    assert scheduler.pick() == "not a batch"
    culprit = hooks.result_culprit(target.Scheduler, "pick")
    assert culprit is not None and culprit.type == "REPLACE", culprit
    assert culprit.describe() == "the plugin 'blamethree' (REPLACE hook on Scheduler.pick)"
    # A subclass inherits the hooked method, and the blame.
    sub = type("Sub", (target.Scheduler,), {})
    assert hooks.result_culprit(sub, "pick") == culprit
    assert hooks.result_culprit(target.Scheduler, "run_batch").type == "AROUND"
