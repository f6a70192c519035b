"""General plugins from real entry points, in this process.

Plugins are real distributions (``*.dist-info`` folders written by ``support.make_dist``) found by
``importlib.metadata`` on ``sys.path``. Covered: source tracking (callbacks and import-time
decorators), ordering and REPLACE conflicts, the ``SGLANG_PLUGINS`` allowlist, skipping plugins of
unselected platform distributions (SRT with ``SGLANG_PLATFORM``, diffusion always), the failure
policy (best-effort vs. the selected platform's own plugins, at load, callback and apply), the
diffusion registration/application split, the separation of the two registries, and hooks
registered after the apply phase.

Every test runs in ``fresh_process`` (``hooks.testing``): no platform selected, no plugin loaded
when it starts, its ``site`` folder on ``sys.path``, and every hook target restored when it ends.
Import neutrality and the phase rules with threads and ``fork`` need a fresh interpreter: they
are in ``test_hooks_process.py``.
"""

from __future__ import annotations

import importlib
import logging
import sys
import threading

import pytest
from support import make_dist
from support.plugins import DEMO_DISTRIBUTION

import hooks
import hooks.diffusion
from hooks import HookRegistry, HookType
from hooks.testing import fresh_plugins

pytestmark = pytest.mark.usefixtures("fresh_process")

SRT_PLUGINS = "sglang.srt.plugins"
SRT_PLATFORMS = "sglang.srt.platforms"
DIFF_PLUGINS = "sglang.multimodal_gen.plugins"
DIFF_PLATFORMS = "sglang.multimodal_gen.platforms"

TARGET = """
def f(x):
    return [x]

def g(x):
    return "g"

class Svc:
    def run(self):
        return "run"
"""


def _set_env(monkeypatch, **values):
    for name, value in values.items():
        if value is not None:
            monkeypatch.setenv(name, value)


def _messages(caplog) -> list[str]:
    """Every line the product logged during the test."""
    return [line for record in caplog.records for line in record.getMessage().splitlines()]


# -- registration, sources, order, conflicts, allowlist, runtime separation -------------------------
def test_srt_plugins_register_with_their_source_and_apply_in_name_order(site, monkeypatch, caplog):
    make_dist(site, "tgt-module", modules={"tgt.py": TARGET})
    make_dist(
        site,
        "beta-hooks",
        {
            SRT_PLUGINS: {"beta": "beta_hooks:register"},
            DIFF_PLUGINS: {"beta": "beta_hooks:register_diffusion"},
        },
        {
            "beta_hooks.py": """
                  from hooks.hook_registry import HookRegistry, HookType

                  def register():
                      HookRegistry.register("tgt.f", lambda result, x: result + ["beta"], HookType.AFTER)
                      HookRegistry.register("tgt.g", lambda x: "beta-g", HookType.REPLACE)

                  def register_diffusion():
                      import hooks.diffusion as d
                      d.HookRegistry.register("tgt.f", lambda result, x: result + ["diffusion"], d.HookType.AFTER)
              """
        },
    )
    make_dist(
        site,
        "alpha-hooks",
        {SRT_PLUGINS: {"alpha": "alpha_hooks:register"}},
        {
            "alpha_hooks.py": """
        from hooks.hook_registry import HookRegistry, HookType, plugin_hook

        CALLS = []

        @plugin_hook("tgt:Svc.run", type=HookType.AFTER)  # registered while the plugin imports
        def run_after(result, self):
            return result + "+alpha"

        def register():
            CALLS.append(1)
            HookRegistry.register("tgt.f", lambda result, x: result + ["alpha"], HookType.AFTER)
            HookRegistry.register("tgt.g", lambda x: "alpha-g", HookType.REPLACE)
    """
        },
    )
    make_dist(
        site,
        "gamma-hooks",
        {SRT_PLUGINS: {"gamma": "gamma_hooks:register"}},
        {"gamma_hooks.py": "def register():\n    raise AssertionError('gamma must not run')\n"},
    )

    monkeypatch.setenv("SGLANG_PLUGINS", "alpha, beta")
    hooks.load_plugins()
    hooks.load_plugins()  # once per process
    alpha_hooks = importlib.import_module("alpha_hooks")
    tgt = importlib.import_module("tgt")
    assert tgt.f(1) == [1, "alpha", "beta"]  # plugins run in entry-point name order
    assert tgt.g(1) == "beta-g" and tgt.Svc().run() == "run+alpha"
    assert len(alpha_hooks.CALLS) == 1 and "gamma_hooks" not in sys.modules
    sources = sorted(
        [h.source.name, h.source.distribution, h.type.name, h.path.dotted]
        for h in HookRegistry.hooks()
    )
    assert sources == [
        ["alpha", "alpha-hooks", "AFTER", "tgt.Svc.run"],
        ["alpha", "alpha-hooks", "AFTER", "tgt.f"],
        ["alpha", "alpha-hooks", "REPLACE", "tgt.g"],
        ["beta", "beta-hooks", "AFTER", "tgt.f"],
        ["beta", "beta-hooks", "REPLACE", "tgt.g"],
    ]
    assert len(hooks.diffusion.HookRegistry.hooks()) == 0
    # The diffusion registry is separate: its hooks never run through SRT's apply.
    hooks.diffusion.load_plugins()
    HookRegistry.apply_hooks()
    assert [h.path.dotted for h in hooks.diffusion.HookRegistry.pending()] == ["tgt.f"]
    assert tgt.f(1) == [1, "alpha", "beta"]
    # A hook registered after application takes effect at the next apply, once.
    HookRegistry.register("tgt.f", lambda result, x: result + ["late"], HookType.AFTER)
    assert tgt.f(1) == [1, "alpha", "beta"]
    HookRegistry.apply_hooks()
    HookRegistry.apply_hooks()
    assert tgt.f(1) == [1, "alpha", "beta", "late"]
    conflict = [line for line in _messages(caplog) if "REPLACE hooks on tgt.g" in line]
    assert len(conflict) == 1, _messages(caplog)
    assert (
        "plugin 'alpha' (alpha-hooks)" in conflict[0]
        and "plugin 'beta' (beta-hooks)" in conflict[0]
    )
    assert conflict[0].split("wins:")[1].strip().endswith("from plugin 'beta' (beta-hooks)")


# -- best-effort failures ---------------------------------------------------------------------------
def test_other_plugins_failures_are_logged_and_their_hooks_discarded(site, caplog):
    make_dist(site, "tgt-module", modules={"tgt.py": TARGET})
    make_dist(
        site,
        "good-plugin",
        {SRT_PLUGINS: {"good": "good_mod:register"}},
        {
            "good_mod.py": """
        from hooks import HookRegistry, HookType
        def register():
            HookRegistry.register("tgt.f", lambda result, x: result + ["good"], HookType.AFTER)
    """
        },
    )
    make_dist(
        site,
        "loadfail-plugin",
        {SRT_PLUGINS: {"loadfail": "loadfail_mod:register"}},
        {
            "loadfail_mod.py": """
        from hooks import HookType, plugin_hook
        @plugin_hook("tgt.f", type=HookType.AFTER)
        def partial(result, x):
            return result + ["loadfail"]
        raise RuntimeError("loadfail cannot import its vendor library")
    """
        },
    )
    make_dist(
        site,
        "cbfail-plugin",
        {SRT_PLUGINS: {"cbfail": "cbfail_mod:register"}},
        {
            "cbfail_mod.py": """
        from hooks import HookRegistry, HookType
        def register():
            HookRegistry.register("tgt.f", lambda result, x: result + ["cbfail"], HookType.AFTER)
            raise ValueError("cbfail callback broke halfway")
    """
        },
    )
    make_dist(
        site,
        "applyfail-plugin",
        {SRT_PLUGINS: {"applyfail": "applyfail_mod:register"}},
        {
            "applyfail_mod.py": """
        from hooks import HookRegistry, HookType
        def register():
            HookRegistry.register("tgt.f", lambda result, x: result + ["applyfail"], HookType.AFTER)
            HookRegistry.register("tgt.no_such_function", lambda x: None, HookType.BEFORE)
    """
        },
    )
    make_dist(
        site,
        "notcallable-plugin",
        {SRT_PLUGINS: {"notcallable": "nc_mod:VALUE"}},
        {"nc_mod.py": "VALUE = 3\n"},
    )

    hooks.load_plugins()
    tgt = importlib.import_module("tgt")
    assert tgt.f(1) == [1, "good"]
    assert sorted({h.source.name for h in HookRegistry.hooks()}) == ["good"]
    lines = _messages(caplog)
    for name, why in [
        ("loadfail", "failed to load"),
        ("cbfail", "failed to run its callback"),
        ("notcallable", "failed to load"),
        ("applyfail", "has no attribute 'no_such_function'"),
    ]:
        line = next((ln for ln in lines if f"plugin '{name}'" in ln), None)
        assert line is not None and why in line, lines
    assert caplog.text.count("Traceback (most recent call last)") >= 4
    assert "all hooks of plugin 'applyfail' (applyfail-plugin) are discarded" in caplog.text


# -- the selected platform's own plugins --------------------------------------------------------------
def _vendor_site(site):
    make_dist(site, "tgt-module", modules={"tgt.py": TARGET})
    make_dist(
        site,
        "vendor-platform",
        {
            SRT_PLATFORMS: {"vendor": "vendor_pkg:activate"},
            SRT_PLUGINS: {"vendor": "vendor_pkg.hooks:register"},
        },
        {
            "vendor_pkg/__init__.py": "def activate():\n    return 'vendor_pkg.platform.VendorPlatform'\n",
            "vendor_pkg/hooks.py": """
                   import os
                   from hooks import HookRegistry, HookType
                   FAIL = os.environ.get("VENDOR_FAIL", "")
                   if FAIL == "load":
                       raise ImportError("vendor runtime library is missing")
                   def register():
                       HookRegistry.register("tgt.f", lambda result, x: result + ["vendor"], HookType.AFTER)
                       if FAIL == "callback":
                           raise RuntimeError("vendor callback failed")
                       if FAIL == "apply":
                           HookRegistry.register("tgt.Svc.missing", lambda self: None, HookType.BEFORE)
               """,
        },
    )
    make_dist(
        site,
        "other-platform",
        {
            SRT_PLATFORMS: {"other": "other_pkg:activate"},
            SRT_PLUGINS: {"other_extra": "other_pkg.hooks:register"},
        },
        {
            "other_pkg/__init__.py": "def activate():\n    return None\n",
            "other_pkg/hooks.py": "def register():\n    raise AssertionError('an unselected platform plugin ran')\n",
        },
    )
    make_dist(
        site,
        "plain-plugin",
        {SRT_PLUGINS: {"plain": "plain_mod:register"}},
        {
            "plain_mod.py": """
        from hooks import HookRegistry, HookType
        def register():
            HookRegistry.register("tgt.f", lambda result, x: result + ["plain"], HookType.AFTER)
    """
        },
    )


def test_srt_skips_unselected_platform_plugins_from_metadata(site, monkeypatch):
    _vendor_site(site)
    monkeypatch.setenv("SGLANG_PLATFORM", "vendor")
    hooks.load_plugins()
    tgt = importlib.import_module("tgt")
    assert tgt.f(1) == [1, "plain", "vendor"]
    assert [m for m in ("other_pkg", "other_pkg.hooks") if m in sys.modules] == []


@pytest.mark.parametrize(
    "stage, platform_env, message",
    [
        ("load", "vendor", "failed to load: ImportError: vendor runtime library is missing"),
        ("callback", "vendor", "failed to run its callback: RuntimeError: vendor callback failed"),
        ("apply", "vendor", "has no attribute 'missing'"),
        (
            "callback",
            None,
            "failed to run its callback",
        ),  # selected automatically: the only one that activates
    ],
)
def test_selected_platform_plugin_failure_aborts_and_stays_failed(
    site, monkeypatch, stage, platform_env, message
):
    _vendor_site(site)
    _set_env(monkeypatch, SGLANG_PLATFORM=platform_env, VENDOR_FAIL=stage)
    errors = []
    for _ in range(2):
        with pytest.raises(hooks.PluginError) as caught:
            hooks.load_plugins()
        errors.append(caught.value)
    thread_error = []

    def later():
        try:
            hooks.apply_plugin_hooks()
        except hooks.PluginError as exc:
            thread_error.append(exc)

    t = threading.Thread(target=later)
    t.start()
    t.join(60)
    tgt = importlib.import_module("tgt")
    first = errors[0]
    assert errors[1] is first and thread_error[0] is first  # terminal: later callers get it too
    assert first.plugin == "vendor" and first.distribution == "vendor-platform"
    assert message in str(first) and "plugin 'vendor' (vendor-platform)" in str(first)
    assert type(first.__cause__).__name__ in {"ImportError", "RuntimeError", "TargetError"}
    assert [h.path.dotted for h in HookRegistry.hooks() if h.source.name == "vendor"] == []
    assert "vendor" not in tgt.f(1)


@pytest.mark.parametrize("stage", ["callback", "apply"])
@pytest.mark.parametrize("platform_env", [None, "vendor"])
def test_a_required_plugins_failure_suggests_starting_without_it_on_the_same_platform(
    site, monkeypatch, stage, platform_env
):
    """sglang-plugin-FL's shape: the platform and its plugin share a distribution. Under
    automatic selection SGLANG_PLUGINS also narrows platform discovery, so leaving the plugin
    out of it alone would drop the platform too: the hint names the platform as well, and
    following it starts on that platform without the plugin."""
    _vendor_site(site)
    _set_env(monkeypatch, SGLANG_PLATFORM=platform_env, VENDOR_FAIL=stage)
    with pytest.raises(hooks.PluginError) as caught:
        hooks.load_plugins()
    message = str(caught.value)
    hint = message.rpartition("start without ")[2].partition(": ")[2]
    if platform_env is None:
        assert hint.startswith("SGLANG_PLATFORM=vendor SGLANG_PLUGINS=other_extra,plain"), hint
        assert "SGLANG_PLATFORM keeps the platform" in hint, hint
    else:
        assert hint.startswith("SGLANG_PLUGINS=other_extra,plain"), hint
    for word in hint.split(" (")[0].split(";")[0].split():
        name, _, value = word.partition("=")
        monkeypatch.setenv(name, value)
    with fresh_plugins():
        hooks.load_plugins()
        assert hooks.runtime("srt").selection().key == "plugin:vendor"
        assert importlib.import_module("tgt").f(1) == [1, "plain"]


def test_a_plugin_registration_never_reached_is_not_run_in_the_report_and_the_manifest(
    site, monkeypatch
):
    """``sglang-launch plugins`` and the workers' manifests say the same of a plugin that the
    registration never reached (it stopped at a required plugin before): ``not run``, and why."""
    _vendor_site(site)
    make_dist(
        site,
        "zeta-plugin",
        {SRT_PLUGINS: {"zeta": "zeta_mod:register"}},
        {"zeta_mod.py": "def register():\n    pass\n"},
    )
    _set_env(monkeypatch, SGLANG_PLATFORM="vendor", VENDOR_FAIL="callback")
    report = hooks.describe("srt")
    assert "PluginError" in report["registration_error"]
    described = {p["name"]: p for p in report["groups"][SRT_PLUGINS]}
    manifest = {p["name"]: p for p in hooks.manifest("srt")["plugins"]}
    for name, status in (("other_extra", "skipped"), ("plain", "loaded"), ("vendor", "failed")):
        assert described[name]["status"] == manifest[name]["status"] == status
    zeta = described["zeta"]
    assert zeta["status"] == "not run", zeta
    assert (
        zeta["detail"] == "plugin registration stopped before it at plugin 'vendor' (PluginError)"
    )
    assert {k: v for k, v in zeta.items() if k in manifest["zeta"]} == manifest["zeta"]


def test_in_a_process_that_loaded_no_plugin_every_plugin_is_not_run(site):
    _vendor_site(site)
    plugins = hooks.manifest("srt")["plugins"]
    assert {p["status"] for p in plugins} == {"not run"}
    assert {p["detail"] for p in plugins} == {"plugin registration has not run in this process"}


def test_allowlist_can_leave_out_the_selected_platforms_plugin(site, monkeypatch):
    _vendor_site(site)
    _set_env(monkeypatch, SGLANG_PLATFORM="vendor", VENDOR_FAIL="callback", SGLANG_PLUGINS="plain")
    hooks.load_plugins()
    tgt = importlib.import_module("tgt")
    assert tgt.f(1) == [1, "plain"]
    assert "vendor_pkg.hooks" not in sys.modules


# -- diffusion --------------------------------------------------------------------------------------
def _diffusion_site(site):
    make_dist(site, "dtarget-module", modules={"dtarget.py": "def f(x):\n    return [x]\n"})
    make_dist(
        site,
        "dvendor-platform",
        {
            DIFF_PLATFORMS: {"dvendor": "dvendor_pkg:activate"},
            DIFF_PLUGINS: {"dvendor": "dvendor_pkg.hooks:register"},
        },
        {
            "dvendor_pkg/__init__.py": "def activate():\n    return 'dvendor_pkg.platform.P'\n",
            "dvendor_pkg/hooks.py": """
                   import os
                   from hooks.diffusion import HookRegistry, HookType
                   if os.environ.get("DVENDOR_FAIL") == "load":
                       raise ImportError("dvendor runtime library is missing")
                   def register():
                       HookRegistry.register("dtarget.f", lambda result, x: result + ["dvendor"], HookType.AFTER)
                       if os.environ.get("DVENDOR_FAIL") == "apply":
                           HookRegistry.register("dtarget.missing", lambda x: x, HookType.REPLACE)
                       if os.environ.get("DVENDOR_FAIL") == "callback":
                           raise RuntimeError("dvendor callback failed")
               """,
        },
    )
    make_dist(
        site,
        "dother-platform",
        {
            DIFF_PLATFORMS: {"dother": "dother_pkg:activate"},
            DIFF_PLUGINS: {"dother_extra": "dother_pkg.hooks:register"},
        },
        {
            "dother_pkg/__init__.py": "def activate():\n    return None\n",
            "dother_pkg/hooks.py": "def register():\n    raise AssertionError('an unselected platform plugin ran')\n",
        },
    )
    make_dist(
        site,
        "dplain-plugin",
        {
            DIFF_PLUGINS: {"dplain": "dplain_mod:register"},
            SRT_PLUGINS: {"srtonly": "dplain_mod:srt"},
        },
        {
            "dplain_mod.py": """
                  from hooks.diffusion import HookType, plugin_hook
                  def register():
                      plugin_hook("dtarget:f", type=HookType.AFTER)(lambda result, x: result + ["dplain"])
                  def srt():
                      raise AssertionError("an SRT plugin ran in diffusion")
              """
        },
    )


@pytest.mark.parametrize("override", ["dvendor", None])
def test_diffusion_registers_without_resolving_then_applies(site, monkeypatch, override):
    _diffusion_site(site)
    _set_env(monkeypatch, SGLANG_DIFFUSION_PLATFORM_OVERRIDE=override)
    d = hooks.diffusion
    d.load_plugins()
    assert "dtarget" not in sys.modules  # registration resolves no target
    assert sorted(h.source.name for h in d.HookRegistry.pending()) == ["dplain", "dvendor"]
    d.apply_plugin_hooks()
    d.apply_plugin_hooks()
    dtarget = importlib.import_module("dtarget")
    assert dtarget.f(1) == [1, "dplain", "dvendor"]
    assert "dother_pkg.hooks" not in sys.modules
    assert len(HookRegistry.hooks()) == 0


@pytest.mark.parametrize(
    "stage, message, cause",
    [
        ("load", "failed to load: ImportError: dvendor runtime library is missing", "ImportError"),
        (
            "callback",
            "failed to run its callback: RuntimeError: dvendor callback failed",
            "RuntimeError",
        ),
        ("apply", "module 'dtarget' has no attribute 'missing'", "TargetError"),
    ],
)
def test_diffusion_selected_platform_plugin_failure_aborts(
    site, monkeypatch, stage, message, cause
):
    _diffusion_site(site)
    monkeypatch.setenv("DVENDOR_FAIL", stage)
    d = hooks.diffusion
    with pytest.raises(d.PluginError) as caught:
        d.apply_plugin_hooks()
    exc = caught.value
    dtarget = importlib.import_module("dtarget")
    assert (exc.plugin, exc.distribution, type(exc.__cause__).__name__) == (
        "dvendor",
        "dvendor-platform",
        cause,
    )
    text = str(exc)
    assert message in text and "plugin 'dvendor' (dvendor-platform)" in text and "selected" in text
    assert "dvendor" not in dtarget.f(1)  # its hooks are discarded


def test_diffusion_rejects_two_plugins_of_one_name_before_importing_either(site):
    for dist, module in (("first-vendor", "first_dup"), ("second-vendor", "second_dup")):
        make_dist(
            site,
            dist,
            {
                DIFF_PLUGINS: {"twin": f"{module}:register"},
                SRT_PLUGINS: {"twin": f"{module}:register"},
            },
            {f"{module}.py": "import sys\nIMPORTED = True\ndef register():\n    pass\n"},
        )
    d = hooks.diffusion
    with pytest.raises(d.HookError) as caught:
        d.load_plugins()
    kind, text, names = type(caught.value).__name__, str(caught.value), caught.value.names
    assert kind == "DuplicatePluginError" and names == ["twin"]
    assert "'twin' is shipped by 'first-vendor' and 'second-vendor'" in text
    assert "uninstall all but one" in text
    assert sorted(m for m in ("first_dup", "second_dup") if m in sys.modules) == []
    hooks.load_plugins()  # SRT loads both: the rule is diffusion's
    assert sorted(m for m in ("first_dup", "second_dup") if m in sys.modules) == [
        "first_dup",
        "second_dup",
    ]


@pytest.mark.parametrize("runtime", ["srt", "diffusion"])
def test_a_repeated_apply_call_applies_hooks_registered_late_once(site, caplog, runtime):
    make_dist(site, "late-target", modules={"late_tgt.py": "def f(x):\n    return [x]\n"})
    group = SRT_PLUGINS if runtime == "srt" else DIFF_PLUGINS
    make_dist(
        site,
        "late-plugin",
        {group: {"late": "late_pkg:register"}},
        {
            "late_pkg.py": f"""
        import hooks{".diffusion" if runtime == "diffusion" else ""} as h

        def register():
            h.HookRegistry.register("late_tgt.f", lambda result, x: result + ["early"], h.HookType.AFTER)
            h.load_plugins()  # re-entrant: returns at once, applies nothing half registered
    """
        },
    )
    caplog.set_level(logging.INFO, logger="hooks")
    h = hooks.diffusion if runtime == "diffusion" else hooks
    late_tgt = importlib.import_module("late_tgt")
    calls = [h.apply_plugin_hooks] + ([] if runtime == "diffusion" else [h.load_plugins])
    h.apply_plugin_hooks()
    seen = [late_tgt.f(1)]
    for n, call in enumerate(calls):
        h.HookRegistry.register(
            "late_tgt.f", lambda result, x, n=n: result + [f"late{n}"], h.HookType.AFTER
        )
        seen.append(late_tgt.f(1))  # registered, not applied yet
        call()
        call()
        seen.append(late_tgt.f(1))
    expected = [[1, "early"], [1, "early"], [1, "early", "late0"]]
    if runtime == "srt":
        expected += [[1, "early", "late0"], [1, "early", "late0", "late1"]]
    assert seen == expected
    applied_late = f"applying 1 {runtime} hook(s) registered after hooks were applied"
    assert caplog.text.count(applied_late) == len(expected) // 2


# -- this project's own hook targets ------------------------------------------------------------------
def test_a_plugin_adds_an_option_and_a_check_to_server_args(site, monkeypatch):
    make_dist(
        site,
        "args-plugin",
        {SRT_PLUGINS: {"args": "args_plugin:register"}},
        {
            "args_plugin.py": """
        from hooks import HookRegistry, HookType

        def add_option(parser, cls, *args):
            parser.add_argument("--my-plugin-level", type=int, default=1)

        def check(self):
            if self.max_batch_size > 64:
                raise ValueError("args_plugin supports --max-batch-size up to 64")

        def register():
            HookRegistry.register("launchspec.server_args.ServerArgs.add_cli_args", add_option, HookType.AFTER)
            HookRegistry.register("launchspec.server_args:ServerArgs.check_server_args", check, HookType.BEFORE)
    """
        },
    )
    monkeypatch.setenv("SGLANG_USE_CPU_ENGINE", "1")  # CPU: no accelerator probe (torch)
    hooks.load_plugins()
    import argparse

    from launchspec.server_args import ServerArgs

    parser = ServerArgs.add_cli_args(argparse.ArgumentParser())
    ns = parser.parse_args(["--my-plugin-level", "3", "--max-batch-size", "128"])
    args = ServerArgs.from_cli_args(ns)
    assert ns.my_plugin_level == 3
    with pytest.raises(ValueError) as caught:
        args.check_server_args()
    assert str(caught.value) == "args_plugin supports --max-batch-size up to 64"


# -- the demo platform package, installed by pip ------------------------------------------------------
@pytest.mark.e2e  # pip-installs the demo plugin
def test_pip_installed_demo_platform_plugin_is_required_when_selected(
    demo_site, monkeypatch, caplog
):
    monkeypatch.syspath_prepend(str(demo_site))

    def load() -> dict:
        with fresh_plugins():
            try:
                hooks.load_plugins()
            except hooks.PluginError as exc:
                return {"error": [exc.plugin, exc.distribution, str(exc.__cause__)]}
            return {
                "hooks": [
                    [h.source.name, h.source.distribution, h.type.name, h.path.dotted]
                    for h in HookRegistry.hooks()
                ]
            }

    monkeypatch.setenv("SGLANG_PLATFORM", "demo")
    monkeypatch.setenv("DEMO_PLATFORM_ENABLE", "1")
    assert load() == {
        "hooks": [
            ["demo", DEMO_DISTRIBUTION, "AFTER", "launchspec.server_args.ServerArgs.__post_init__"]
        ]
    }
    monkeypatch.setenv("DEMO_PLATFORM_FAIL_HOOKS", "1")
    assert load() == {
        "error": ["demo", DEMO_DISTRIBUTION, "demo plugin: DEMO_PLATFORM_FAIL_HOOKS=1"]
    }
    # Not the selected platform (no platform selected explicitly, demo hardware off): best effort.
    monkeypatch.delenv("SGLANG_PLATFORM")
    monkeypatch.delenv("DEMO_PLATFORM_ENABLE")
    assert load() == {"hooks": []}
    assert "plugin 'demo' (sglang-launch-demo-platform) failed to run its callback" in caplog.text
