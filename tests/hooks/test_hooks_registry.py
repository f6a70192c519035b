"""The hook registry's mechanics on real modules: hook types and their return rules, target
forms, methods of every kind, classes, coroutine functions, composition order, incremental
application, the saved-original idiom, stale bindings in other modules.

Each test writes its own uniquely named modules into a temporary folder on ``sys.path`` and uses
its own ``Registry`` instance (the same implementation as ``hooks.hook_registry.HookRegistry``),
so tests share no state. Plugin-level rules (entry points, sources, filtering, failure policy)
are in ``test_hooks_plugins.py``, in fresh interpreters.
"""

from __future__ import annotations

import asyncio
import importlib
import inspect
import itertools
import logging
import sys
import textwrap

import pytest

from hooks import HookError, HookRegistry, HookType, plugin_hook
from hooks._core import PluginSource, Registry, plugin_source

_ids = itertools.count()


@pytest.fixture
def modules(tmp_path, monkeypatch):
    """``modules(source, **more)``: write and import a fresh module (plus named companions)."""
    monkeypatch.syspath_prepend(str(tmp_path))
    created = []

    def make(source: str, **companions: str):
        name = f"hooktarget_{next(_ids)}"
        (tmp_path / f"{name}.py").write_text(textwrap.dedent(source))
        for suffix, text in companions.items():
            (tmp_path / f"{name}_{suffix}.py").write_text(
                textwrap.dedent(text).replace("TARGET", name)
            )
        importlib.invalidate_caches()
        created.append(name)
        return importlib.import_module(name)

    yield make
    for name in list(sys.modules):
        if any(name == c or name.startswith(c + "_") for c in created):
            del sys.modules[name]


@pytest.fixture
def registry():
    reg = Registry("test")
    yield reg
    reg.reset()


FUNCS = """
def add(x, y=10):
    return x + y
"""


def test_each_hook_type_follows_the_spec_return_rules(modules, registry):
    mod = modules(
        FUNCS
        + """
def keep(x, y=10):
    return x + y
def swap(x, y=10):
    return x + y
def wrapped(x, y=10):
    return x + y
def replaced(x, y=10):
    return x + y
"""
    )
    seen = []
    registry.register(
        f"{mod.__name__}.keep", lambda x, y: seen.append(("before", x, y)), HookType.BEFORE
    )
    registry.register(f"{mod.__name__}.add", lambda x, y: ((x * 2, y), {}), HookType.BEFORE)
    registry.register(
        f"{mod.__name__}.keep", lambda result, x, y: seen.append(("after", result)), HookType.AFTER
    )
    registry.register(f"{mod.__name__}.swap", lambda result, x, y: -result, HookType.AFTER)
    registry.register(
        f"{mod.__name__}.wrapped",
        lambda original_fn, x, y: original_fn(x, y=0) + 0.5,
        HookType.AROUND,
    )
    registry.register(f"{mod.__name__}.replaced", lambda x, y=10: "replaced", HookType.REPLACE)
    registry.apply_hooks()

    assert (
        mod.keep(1) == 11
    )  # BEFORE returning None keeps the arguments, AFTER returning None the result
    assert seen == [("before", 1, 10), ("after", 11)]
    assert mod.add(1, 2) == 4  # BEFORE returning (args, kwargs) changes them
    assert mod.swap(1) == -11  # AFTER returning a value replaces the result
    assert mod.wrapped(1) == 1.5  # AROUND calls the original itself
    assert mod.replaced(1) == "replaced"


def test_plugin_hook_registers_and_returns_the_hook_unchanged(modules):
    mod = modules(FUNCS)

    def double(result, x, y=10):
        return result * 2

    try:
        decorated = plugin_hook(f"{mod.__name__}.add", type=HookType.AFTER)(double)
        assert decorated is double
        assert any(h.func is double for h in HookRegistry.hooks())
        HookRegistry.apply_hooks()
        assert mod.add(1) == 22
    finally:
        HookRegistry.discard(None)
    assert mod.add(1) == 11


def test_registration_rejects_bad_input_with_errors_that_name_the_fix(registry):
    class Replacement:
        pass

    for hook_type in (HookType.BEFORE, HookType.AFTER, HookType.AROUND):
        with pytest.raises(TypeError, match="only HookType.REPLACE accepts a class"):
            registry.register("os.getcwd", Replacement, hook_type)
    registry.register("os.getcwd", Replacement, HookType.REPLACE)  # a class is fine for REPLACE
    with pytest.raises(TypeError, match="must be one of HookType.BEFORE"):
        registry.register("os.getcwd", print, "sideways")
    with pytest.raises(TypeError, match="must be callable"):
        registry.register("os.getcwd", 42, HookType.AFTER)
    for bad in ("os", "os.path:join:x", "os..getcwd", "not a path", ""):
        with pytest.raises(ValueError, match="package.module"):
            registry.register(bad, print, HookType.AFTER)
    with pytest.raises(TypeError, match="must be a string"):
        registry.register(None, print, HookType.AFTER)
    registry.discard(None)
    assert registry.hooks() == []


def test_dotted_and_entry_point_forms_name_the_same_targets(modules, registry):
    mod = modules("""
class Service:
    def handle(self, x):
        return ("handled", x)
def helper(x):
    return ("helper", x)
""")
    name = mod.__name__
    registry.register(
        f"{name}:Service.handle", lambda result, self, x: result + ("colon",), HookType.AFTER
    )
    registry.register(
        f"{name}.Service.handle", lambda result, self, x: result + ("dotted",), HookType.AFTER
    )
    registry.register(f"{name}:helper", lambda result, x: result + ("colon",), HookType.AFTER)
    registry.register(f"{name}.helper", lambda result, x: result + ("dotted",), HookType.AFTER)
    registry.apply_hooks()
    assert mod.Service().handle(1) == ("handled", 1, "colon", "dotted")  # one wrapper, both hooks
    assert mod.helper(2) == ("helper", 2, "colon", "dotted")


@pytest.mark.parametrize(
    "form", ["{pkg}.inner.deep.C.run", "{pkg}:inner.deep.C.run", "{pkg}.inner:deep.C.run"]
)
def test_target_in_a_package_submodule_not_yet_imported(tmp_path, monkeypatch, registry, form):
    # The entry-point form treats the colon as a dot: submodules after it are imported too.
    pkg = f"hookpkg_{next(_ids)}"
    (tmp_path / pkg / "inner").mkdir(parents=True)
    (tmp_path / pkg / "__init__.py").write_text("")
    (tmp_path / pkg / "inner" / "__init__.py").write_text("")
    (tmp_path / pkg / "inner" / "deep.py").write_text(
        "class C:\n    def run(self):\n        return 'run'\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    try:
        registry.register(form.format(pkg=pkg), lambda result, self: result.upper(), HookType.AFTER)
        assert f"{pkg}.inner.deep" not in sys.modules  # registering resolves nothing
        registry.apply_hooks()
        from importlib import import_module

        assert import_module(f"{pkg}.inner.deep").C().run() == "RUN"
    finally:
        registry.reset()
        for name in [n for n in sys.modules if n == pkg or n.startswith(pkg + ".")]:
            del sys.modules[name]


def test_methods_staticmethods_and_classmethods_keep_their_kind(modules, registry):
    mod = modules("""
class Base:
    def method(self, x):
        return ("method", type(self).__name__, x)
    @staticmethod
    def static(x):
        return ("static", x)
    @classmethod
    def build(cls, x):
        return ("build", cls.__name__, x)
class Child(Base):
    pass
""")
    name = mod.__name__
    calls = []
    registry.register(
        f"{name}.Base.method", lambda self, x: calls.append(("method", x)), HookType.BEFORE
    )
    registry.register(
        f"{name}.Base.static", lambda original_fn, x: original_fn(x + 1), HookType.AROUND
    )
    registry.register(
        f"{name}.Base.build", lambda result, cls, x: result + (cls.__name__,), HookType.AFTER
    )
    registry.apply_hooks()

    assert isinstance(mod.Base.__dict__["static"], staticmethod)
    assert isinstance(mod.Base.__dict__["build"], classmethod)
    assert mod.Child().method(1) == ("method", "Child", 1) and calls == [("method", 1)]
    assert mod.Child.static(1) == ("static", 2) and mod.Child().static(1) == ("static", 2)
    assert mod.Child.build(3) == ("build", "Child", 3, "Child")  # cls is still the subclass
    assert mod.Base.build(3) == ("build", "Base", 3, "Base")


def test_hook_on_an_inherited_method_patches_only_the_named_class(modules, registry):
    mod = modules("""
class Base:
    def run(self):
        return "base"
class Child(Base):
    pass
""")
    registry.register(
        f"{mod.__name__}.Child.run", lambda result, self: result + "+hook", HookType.AFTER
    )
    registry.apply_hooks()
    assert mod.Child().run() == "base+hook"
    assert mod.Base().run() == "base"
    registry.reset()
    assert "run" not in mod.Child.__dict__  # removing the hook restores inheritance


def test_class_replace_keeps_isinstance_and_method_hooks_land_on_the_replacement(modules, registry):
    mod = modules("""
class Scheduler:
    def step(self):
        return "step"
def make():
    return Scheduler()
""")
    name = mod.__name__
    original = mod.Scheduler

    class MyScheduler(original):
        def step(self):
            return "my " + super().step()

    # Registered first, but on a deeper target: applied after the class is replaced.
    registry.register(f"{name}.Scheduler.step", lambda result, self: result + "!", HookType.AFTER)
    plugin_hook_result = registry.decorator(f"{name}.Scheduler", type=HookType.REPLACE)(MyScheduler)
    assert plugin_hook_result is MyScheduler
    registry.apply_hooks()

    made = mod.make()
    assert mod.Scheduler is MyScheduler and type(made) is MyScheduler
    assert isinstance(made, original) and issubclass(mod.Scheduler, original)
    assert made.step() == "my step!"


def test_non_replace_hook_on_a_class_target_is_reported_at_apply(modules, registry):
    mod = modules("class Thing:\n    pass\n")
    registry.register(f"{mod.__name__}.Thing", lambda *a, **k: None, HookType.BEFORE)
    with pytest.raises(
        HookError, match=r"is a class; a BEFORE hook needs a function or method: hook .*__init__"
    ):
        registry.apply_hooks()
    assert registry.hooks() == []  # the failing hook is gone, nothing half applied
    assert mod.Thing.__init__ is object.__init__


def test_async_targets_stay_coroutine_functions(modules, registry):
    mod = modules("""
async def fetch(x):
    return x * 2
async def plain(x):
    return x
async def swapped(x):
    return x
class Client:
    async def get(self, x):
        return ("get", x)
""")
    name = mod.__name__
    log = []

    async def async_around(original_fn, x):
        log.append("around-in")
        result = await original_fn(x)
        log.append("around-out")
        return result + 1

    registry.register(f"{name}.fetch", lambda x: log.append(("before", x)), HookType.BEFORE)
    registry.register(
        f"{name}.fetch", lambda result, x: result * 10, HookType.AFTER
    )  # gets the awaited result
    registry.register(f"{name}.fetch", async_around, HookType.AROUND)
    registry.register(
        f"{name}.plain", lambda original_fn, x: original_fn(x + 1), HookType.AROUND
    )  # sync around
    registry.register(f"{name}.swapped", lambda x: ("sync replacement", x), HookType.REPLACE)
    registry.register(
        f"{name}.Client.get", lambda result, self, x: result + ("after",), HookType.AFTER
    )
    registry.apply_hooks()

    for func in (mod.fetch, mod.plain, mod.swapped, mod.Client.get):
        assert inspect.iscoroutinefunction(func), func
    assert asyncio.run(mod.fetch(1)) == 30
    assert log == [("before", 1), "around-in", "around-out"]
    assert asyncio.run(mod.plain(1)) == 2
    assert asyncio.run(mod.swapped(1)) == ("sync replacement", 1)
    assert asyncio.run(mod.Client().get(5)) == ("get", 5, "after")


def test_composition_order_is_documented_and_deterministic(modules, registry):
    mod = modules("""
def work(trace):
    trace.append("target")
    return ["result"]
""")
    name = mod.__name__

    def before(tag):
        return lambda trace: trace.append(tag)

    def after(tag):
        return lambda result, trace: result + [tag]

    def around(tag):
        def hook(original_fn, trace):
            trace.append(tag + "-in")
            out = original_fn(trace)
            trace.append(tag + "-out")
            return out

        return hook

    # Interleaved on purpose: order within a type is registration order.
    registry.register(f"{name}.work", after("after1"), HookType.AFTER)
    registry.register(f"{name}.work", around("around1"), HookType.AROUND)
    registry.register(f"{name}.work", before("before1"), HookType.BEFORE)
    registry.register(f"{name}.work", around("around2"), HookType.AROUND)
    registry.register(f"{name}.work", after("after2"), HookType.AFTER)
    registry.register(f"{name}.work", before("before2"), HookType.BEFORE)
    registry.apply_hooks()

    trace = []
    result = mod.work(trace)
    # AROUND: the last registered is outermost, as in SGLang and pluggy.
    assert trace == [
        "before1",
        "before2",
        "around2-in",
        "around1-in",
        "target",
        "around1-out",
        "around2-out",
    ]
    assert result == ["result", "after1", "after2"]


def test_three_around_hooks_nest_last_registered_outermost(modules, registry):
    mod = modules("""
def work(trace):
    trace.append("target")
""")
    for tag in ("a", "b", "c"):

        def hook(original_fn, trace, tag=tag):
            trace.append(tag + "-in")
            original_fn(trace)
            trace.append(tag + "-out")

        registry.register(f"{mod.__name__}.work", hook, HookType.AROUND)
    registry.apply_hooks()
    trace = []
    mod.work(trace)
    assert trace == ["c-in", "b-in", "a-in", "target", "a-out", "b-out", "c-out"]


def test_register_and_plugin_hook_default_to_after_with_sglangs_parameter_names(modules, registry):
    mod = modules(FUNCS)
    name = mod.__name__
    assert list(inspect.signature(registry.register).parameters) == ["target", "hook", "hook_type"]
    assert inspect.signature(registry.register).parameters["hook_type"].default is HookType.AFTER
    assert inspect.signature(plugin_hook).parameters["type"].default is HookType.AFTER

    registry.register(f"{name}.add", lambda result, x, y: result * 2)  # no type: AFTER
    registry.register(f"{name}.add", lambda result, x, y: result + 1, hook_type=HookType.AFTER)
    registry.apply_hooks()
    assert mod.add(1) == 23  # (1 + 10) * 2 + 1: both ran after the target, in order
    assert [h.type for h in registry.hooks()] == [HookType.AFTER, HookType.AFTER]


def test_the_plugin_hook_decorator_defaults_to_after(modules):
    from hooks._core import make_plugin_hook

    mod = modules(FUNCS)
    reg = Registry("decorator-default")
    try:
        decorate = make_plugin_hook(reg)

        @decorate(f"{mod.__name__}.add")
        def tenfold(result, x, y):
            return result * 10

        reg.apply_hooks()
        assert mod.add(1) == 110
        assert reg.hooks()[0].type is HookType.AFTER
    finally:
        reg.reset()


def test_apply_is_idempotent_and_incremental(modules, registry):
    mod = modules(FUNCS)
    name = mod.__name__
    calls = []
    registry.register(f"{name}.add", lambda x, y: calls.append("first"), HookType.BEFORE)
    registry.apply_hooks()
    registry.apply_hooks()  # nothing pending: nothing changes
    mod.add(1)
    assert calls == ["first"]

    registry.register(f"{name}.add", lambda x, y: calls.append("late"), HookType.BEFORE)
    assert len(registry.pending()) == 1
    mod.add(1)
    assert calls == ["first", "first"]  # not applied until the next apply
    registry.apply_hooks()
    registry.apply_hooks()
    calls.clear()
    mod.add(1)
    assert calls == ["first", "late"]  # each exactly once


def test_registering_the_same_hook_twice_is_a_no_op(modules, registry):
    mod = modules(FUNCS)
    calls = []

    def hook(x, y):
        calls.append(x)

    for _ in range(3):
        registry.register(f"{mod.__name__}.add", hook, HookType.BEFORE)
        registry.apply_hooks()
    mod.add(5)
    assert calls == [5]


def test_replace_binds_the_replacement_and_a_saved_original_does_not_recurse(modules, registry):
    mod = modules(
        FUNCS,
        plugin="""
import TARGET as target

original = target.add  # saved before hooks are applied

def add(x, y=10):
    return ("plugin", original(x, y))
""",
    )
    plugin = importlib.import_module(f"{mod.__name__}_plugin")
    registry.register(f"{mod.__name__}.add", plugin.add, HookType.REPLACE)
    registry.apply_hooks()
    assert mod.add is plugin.add  # bound as is: no wrapper, no extra call
    assert mod.add(1) == ("plugin", 11)  # the saved original is still the original: no recursion
    assert plugin.original(1) == 11


def test_wrappers_keep_the_target_signature_and_error_messages(modules, registry):
    mod = modules("""
def full(a, b=2, /, c=3, *rest, d, e=5, **extra):
    return (a, b, c, rest, d, e, extra)
""")
    seen = []
    registry.register(
        f"{mod.__name__}.full", lambda *args, **kwargs: seen.append((args, kwargs)), HookType.BEFORE
    )
    registry.apply_hooks()
    before = inspect.signature(mod.full.__wrapped__)
    assert inspect.signature(mod.full) == before
    assert mod.full.__name__ == "full"
    assert mod.full(1, d=4) == (1, 2, 3, (), 4, 5, {})
    assert mod.full(1, 7, 8, 9, d=4, z=0) == (1, 7, 8, (9,), 4, 5, {"z": 0})
    # Hooks see the arguments as the signature binds them: positional ones positionally.
    assert seen[0] == ((1, 2, 3), {"d": 4, "e": 5})
    with pytest.raises(TypeError, match=r"full\(\) missing 1 required keyword-only argument: 'd'"):
        mod.full(1)


def test_before_hook_returning_garbage_gets_an_error_naming_it(modules, registry):
    mod = modules(FUNCS)

    def sloppy(x, y):
        return 42

    registry.register(f"{mod.__name__}.add", sloppy, HookType.BEFORE)
    registry.apply_hooks()
    with pytest.raises(
        TypeError, match=r"BEFORE hook .*sloppy .*returned 42; .*None .*\(args, kwargs\)"
    ):
        mod.add(1)


def test_unresolvable_targets_raise_for_hooks_outside_plugins_and_change_nothing(modules, registry):
    mod = modules(FUNCS)
    registry.register(f"{mod.__name__}.add", lambda x, y: None, HookType.BEFORE)
    registry.register(f"{mod.__name__}.missing", lambda x: None, HookType.BEFORE)
    with pytest.raises(HookError, match=r"missing.*has no attribute 'missing'"):
        registry.apply_hooks()
    registry.register("no_such_module_anywhere.f", lambda x: None, HookType.BEFORE)
    with pytest.raises(HookError, match="no module named 'no_such_module_anywhere'"):
        registry.apply_hooks()
    assert [h.path.dotted for h in registry.hooks()] == [f"{mod.__name__}.add"]


def test_a_failing_plugin_loses_all_its_hooks_and_others_stay(modules, registry, caplog):
    mod = modules(FUNCS + "def other(x):\n    return x\n")
    name = mod.__name__
    bad = PluginSource("flaky", "flaky-dist", "sglang.srt.plugins")
    good = PluginSource("solid", "solid-dist", "sglang.srt.plugins")
    with plugin_source(bad):
        registry.register(f"{name}.add", lambda result, x, y: "flaky", HookType.AFTER)
        registry.register(f"{name}.nowhere", lambda x: None, HookType.BEFORE)
    with plugin_source(good):
        registry.register(f"{name}.other", lambda result, x: "solid", HookType.AFTER)
    with caplog.at_level(logging.WARNING, logger="hooks"):
        registry.apply_hooks()
    assert mod.add(1) == 11  # the flaky plugin's valid hook was discarded too
    assert mod.other(1) == "solid"
    record = next(r for r in caplog.records if "flaky" in r.getMessage())
    assert record.levelno == logging.WARNING and record.exc_info is not None
    assert "all hooks of plugin 'flaky' (flaky-dist) are discarded" in record.getMessage()


def test_original_still_bound_elsewhere_is_named_in_one_warning(modules, registry, caplog):
    mod = modules(
        FUNCS,
        early="""
from TARGET import add  # imported before hooks were applied
""",
    )
    early = importlib.import_module(f"{mod.__name__}_early")
    registry.register(f"{mod.__name__}.add", lambda result, x, y: result + 1, HookType.AFTER)
    with caplog.at_level(logging.WARNING, logger="hooks"):
        registry.apply_hooks()
    warnings = [r.getMessage() for r in caplog.records if "do not reach" in r.getMessage()]
    assert len(warnings) == 1 and f"{mod.__name__}_early.add" in warnings[0]
    assert mod.add(1) == 12
    assert early.add(1) == 11  # never rebound: other modules' names are left alone


def test_reset_restores_every_original(modules, registry):
    mod = modules(FUNCS + "class K:\n    def m(self):\n        return 1\n")
    add, klass = mod.add, mod.K
    registry.register(f"{mod.__name__}.add", lambda x, y: None, HookType.BEFORE)
    registry.register(f"{mod.__name__}.K", type("K2", (klass,), {}), HookType.REPLACE)
    registry.register(f"{mod.__name__}.K.m", lambda result, self: 2, HookType.AFTER)
    registry.apply_hooks()
    assert mod.add is not add and mod.K is not klass
    registry.reset()
    assert mod.add is add and mod.K is klass and klass().m() == 1


def test_builtins_and_inherited_slot_methods_get_generic_wrappers(modules, registry):
    mod = modules("""
from os import getpid as pid
class Plain:
    pass
class Child(Plain):
    pass
""")
    import os

    seen = []
    registry.register(f"{mod.__name__}.pid", lambda result: ("pid", result), HookType.AFTER)
    registry.register(
        f"{mod.__name__}.Child.__init__",
        lambda self, *a, **k: seen.append(type(self).__name__),
        HookType.BEFORE,
    )
    registry.apply_hooks()
    assert mod.pid() == ("pid", os.getpid())
    mod.Child()
    mod.Plain()
    assert seen == ["Child"]
    registry.reset()
    assert mod.pid is os.getpid and "__init__" not in mod.Child.__dict__


def test_adopt_attributes_hooks_of_no_plugin_by_their_module(modules, registry):
    target = modules(FUNCS)
    owner = modules(
        """
def hook(result, x, y):
    return result
""",
        extra="def hook(result, x, y):\n    return result\n",
    )
    other = modules("def hook(result, x, y):\n    return result\n")
    extra = importlib.import_module(f"{owner.__name__}_extra")
    for fn in (owner.hook, extra.hook, other.hook):
        registry.register(f"{target.__name__}.add", fn)
    source = PluginSource("mine", "my-dist", "sglang.srt.plugins")
    with plugin_source(PluginSource("theirs", "their-dist", "sglang.srt.plugins")):
        registry.register(f"{target.__name__}.g", owner.hook)  # already someone's: left alone
    adopted = registry.adopt(owner.__name__, source)
    assert [h.func for h in adopted] == [
        owner.hook
    ]  # a sibling module with a longer name is not a submodule
    by_func = {(h.func, h.path.dotted): h.source for h in registry.hooks()}
    assert by_func[(owner.hook, f"{target.__name__}.add")] == source
    assert by_func[(extra.hook, f"{target.__name__}.add")] is None
    assert by_func[(other.hook, f"{target.__name__}.add")] is None
    assert by_func[(owner.hook, f"{target.__name__}.g")].name == "theirs"


def test_the_registry_says_which_hooks_are_applied_failed_or_pending(modules, registry):
    mod = modules(FUNCS)
    good_source = PluginSource("good", "good-dist", "sglang.srt.plugins")
    bad_source = PluginSource("bad", "bad-dist", "sglang.srt.plugins")

    def observe(result, *args, **kwargs):
        return None

    def also(result, *args, **kwargs):
        return None

    with plugin_source(good_source):
        registry.register(f"{mod.__name__}.add", observe, HookType.AFTER)
    with plugin_source(bad_source):
        registry.register(f"{mod.__name__}.add", also, HookType.AFTER)
        registry.register(f"{mod.__name__}.no_such_function", also, HookType.AFTER)
    assert not registry.is_applied(observe)  # registered, not applied yet
    registry.apply_hooks()
    registry.register(f"{mod.__name__}.add", lambda result, *a, **k: None)  # after: pending

    assert registry.is_applied(observe) and not registry.is_applied(also)
    by_state = {}
    for record in registry.records():
        by_state.setdefault(record["state"], []).append(record)
    applied = by_state["applied"]
    assert [(r["plugin"], r["distribution"], r["type"]) for r in applied] == [
        ("good", "good-dist", "AFTER")
    ]
    assert applied[0]["target"] == f"{mod.__name__}.add"
    failed = {r["target"]: r for r in by_state["failed"]}
    assert (
        "has no attribute 'no_such_function'" in failed[f"{mod.__name__}.no_such_function"]["error"]
    )
    assert failed[f"{mod.__name__}.add"]["error"].startswith("discarded with its plugin")
    assert [r["plugin"] for r in by_state["pending"]] == [None]
