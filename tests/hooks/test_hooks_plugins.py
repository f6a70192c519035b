"""General plugins from real entry points, each scenario in a fresh interpreter.

Plugins are real distributions (``*.dist-info`` folders written by ``support.make_dist``) found by
``importlib.metadata`` on ``PYTHONPATH``. Covered: source tracking (callbacks and import-time
decorators), ordering and REPLACE conflicts, the ``SGLANG_PLUGINS`` allowlist, skipping plugins of
unselected platform distributions (SRT with ``SGLANG_PLATFORM``, diffusion always), the failure
policy (best-effort vs. the selected platform's own plugins, at load, callback and apply), the
diffusion registration/application split, the separation of the two registries, and the
once-per-process phase rules with threads, re-entrant calls and ``fork``.
"""

from __future__ import annotations

import pytest
from support import clean_env, make_dist, run_python
from support.plugins import DEMO_DISTRIBUTION

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


def _env(**values):
    return clean_env(**values)


# -- registration, sources, order, conflicts, allowlist, runtime separation -------------------------
def test_srt_plugins_register_with_their_source_and_apply_in_name_order(site):
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

    res = run_python(
        """
        import json, sys
        heavy = ("torch", "numpy", "transformers", "starlette", "uvicorn")
        import hooks, hooks.diffusion, hooks.hook_registry
        light = [m for m in heavy if m in sys.modules]
        platforms_at_import = "platforms" in sys.modules
        from hooks import HookRegistry, HookType

        hooks.load_plugins()
        hooks.load_plugins()  # once per process
        import alpha_hooks, tgt
        out = {
            "light": light, "platforms_at_import": platforms_at_import,
            "f": tgt.f(1), "g": tgt.g(1), "run": tgt.Svc().run(),
            "alpha_calls": len(alpha_hooks.CALLS),
            "gamma_imported": "gamma_hooks" in sys.modules,
            "sources": sorted([h.source.name, h.source.distribution, h.type.name, h.path.dotted]
                              for h in HookRegistry.hooks()),
            "diffusion_hooks_before": len(hooks.diffusion.HookRegistry.hooks()),
        }
        # The diffusion registry is separate: its hooks never run through SRT's apply.
        hooks.diffusion.load_plugins()
        HookRegistry.apply_hooks()
        out["diffusion_pending"] = [h.path.dotted for h in hooks.diffusion.HookRegistry.pending()]
        out["f_after_diffusion_load"] = tgt.f(1)
        # A hook registered after application takes effect at the next apply, once.
        HookRegistry.register("tgt.f", lambda result, x: result + ["late"], HookType.AFTER)
        out["f_before_reapply"] = tgt.f(1)
        HookRegistry.apply_hooks(); HookRegistry.apply_hooks()
        out["f_late"] = tgt.f(1)
        print("RESULT:" + json.dumps(out))
    """,
        sites=[site],
        env=_env(SGLANG_PLUGINS="alpha, beta"),
    )
    assert res.returncode == 0, res
    out = res.data
    assert out["light"] == [] and out["platforms_at_import"] is False
    assert out["f"] == [1, "alpha", "beta"]  # plugins run in entry-point name order
    assert out["g"] == "beta-g" and out["run"] == "run+alpha"
    assert out["alpha_calls"] == 1 and out["gamma_imported"] is False
    assert out["sources"] == [
        ["alpha", "alpha-hooks", "AFTER", "tgt.Svc.run"],
        ["alpha", "alpha-hooks", "AFTER", "tgt.f"],
        ["alpha", "alpha-hooks", "REPLACE", "tgt.g"],
        ["beta", "beta-hooks", "AFTER", "tgt.f"],
        ["beta", "beta-hooks", "REPLACE", "tgt.g"],
    ]
    assert out["diffusion_hooks_before"] == 0
    assert out["diffusion_pending"] == ["tgt.f"] and out["f_after_diffusion_load"] == [
        1,
        "alpha",
        "beta",
    ]
    assert out["f_before_reapply"] == [1, "alpha", "beta"]
    assert out["f_late"] == [1, "alpha", "beta", "late"]
    conflict = [line for line in res.stderr.splitlines() if "REPLACE hooks on tgt.g" in line]
    assert len(conflict) == 1, res.stderr
    assert (
        "plugin 'alpha' (alpha-hooks)" in conflict[0]
        and "plugin 'beta' (beta-hooks)" in conflict[0]
    )
    assert conflict[0].split("wins:")[1].strip().endswith("from plugin 'beta' (beta-hooks)")


# -- best-effort failures ---------------------------------------------------------------------------
def test_other_plugins_failures_are_logged_and_their_hooks_discarded(site):
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

    res = run_python(
        """
        import json, hooks
        hooks.load_plugins()
        import tgt
        print("RESULT:" + json.dumps({"f": tgt.f(1), "left": sorted({h.source.name for h in hooks.HookRegistry.hooks()})}))
    """,
        sites=[site],
    )
    assert res.returncode == 0, res
    assert res.data == {"f": [1, "good"], "left": ["good"]}
    err = res.stderr
    for name, why in [
        ("loadfail", "failed to load"),
        ("cbfail", "failed to run its callback"),
        ("notcallable", "failed to load"),
        ("applyfail", "has no attribute 'no_such_function'"),
    ]:
        line = next((ln for ln in err.splitlines() if f"plugin '{name}'" in ln), None)
        assert line is not None and why in line, err
    assert err.count("Traceback (most recent call last)") >= 4
    assert "all hooks of plugin 'applyfail' (applyfail-plugin) are discarded" in err


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


def test_srt_skips_unselected_platform_plugins_from_metadata(site):
    _vendor_site(site)
    res = run_python(
        """
        import json, sys, hooks
        hooks.load_plugins()
        import tgt
        print("RESULT:" + json.dumps({
            "f": tgt.f(1),
            "other_imported": [m for m in ("other_pkg", "other_pkg.hooks") if m in sys.modules],
        }))
    """,
        sites=[site],
        env=_env(SGLANG_PLATFORM="vendor"),
    )
    assert res.returncode == 0, res
    assert res.data == {"f": [1, "plain", "vendor"], "other_imported": []}


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
    site, stage, platform_env, message
):
    _vendor_site(site)
    res = run_python(
        """
        import json, threading, hooks
        errors = []
        for _ in range(2):
            try:
                hooks.load_plugins()
            except hooks.PluginError as exc:
                errors.append(exc)
        thread_error = []
        def later():
            try:
                hooks.apply_plugin_hooks()
            except hooks.PluginError as exc:
                thread_error.append(exc)
        t = threading.Thread(target=later); t.start(); t.join(60)
        import tgt
        first = errors[0]
        print("RESULT:" + json.dumps({
            "count": len(errors), "same": errors[1] is first and thread_error[0] is first,
            "plugin": first.plugin, "distribution": first.distribution,
            "message": str(first), "cause": type(first.__cause__).__name__,
            "vendor_hooks": [h.path.dotted for h in hooks.HookRegistry.hooks() if h.source.name == "vendor"],
            "f": tgt.f(1),
        }))
    """,
        sites=[site],
        env=_env(SGLANG_PLATFORM=platform_env, VENDOR_FAIL=stage),
    )
    assert res.returncode == 0, res
    out = res.data
    assert out["count"] == 2 and out["same"] is True  # terminal: later callers get the same error
    assert out["plugin"] == "vendor" and out["distribution"] == "vendor-platform"
    assert message in out["message"] and "plugin 'vendor' (vendor-platform)" in out["message"]
    assert out["cause"] in {"ImportError", "RuntimeError", "TargetError"}
    assert out["vendor_hooks"] == [] and "vendor" not in out["f"]


def test_allowlist_can_leave_out_the_selected_platforms_plugin(site):
    _vendor_site(site)
    res = run_python(
        """
        import json, sys, hooks
        hooks.load_plugins()
        import tgt
        print("RESULT:" + json.dumps({"f": tgt.f(1), "vendor": "vendor_pkg.hooks" in sys.modules}))
    """,
        sites=[site],
        env=_env(SGLANG_PLATFORM="vendor", VENDOR_FAIL="callback", SGLANG_PLUGINS="plain"),
    )
    assert res.returncode == 0, res
    assert res.data == {"f": [1, "plain"], "vendor": False}


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
def test_diffusion_registers_without_resolving_then_applies(site, override):
    _diffusion_site(site)
    res = run_python(
        """
        import json, sys
        import hooks.diffusion as d
        d.load_plugins()
        out = {"target_imported_after_load": "dtarget" in sys.modules,
               "pending": sorted(h.source.name for h in d.HookRegistry.pending())}
        d.apply_plugin_hooks()
        d.apply_plugin_hooks()
        import dtarget, hooks
        out.update(f=dtarget.f(1), other=[m for m in ("dother_pkg.hooks",) if m in sys.modules],
                   srt_hooks=len(hooks.HookRegistry.hooks()))
        print("RESULT:" + json.dumps(out))
    """,
        sites=[site],
        env=_env(SGLANG_DIFFUSION_PLATFORM_OVERRIDE=override),
    )
    assert res.returncode == 0, res
    assert res.data == {
        "target_imported_after_load": False,
        "pending": ["dplain", "dvendor"],
        "f": [1, "dplain", "dvendor"],
        "other": [],
        "srt_hooks": 0,
    }


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
def test_diffusion_selected_platform_plugin_failure_aborts(site, stage, message, cause):
    _diffusion_site(site)
    res = run_python(
        """
        import json
        import hooks.diffusion as d
        try:
            d.apply_plugin_hooks()
        except d.PluginError as exc:
            import dtarget
            print("RESULT:" + json.dumps([exc.plugin, exc.distribution, str(exc), type(exc.__cause__).__name__,
                                          dtarget.f(1)]))
    """,
        sites=[site],
        env=_env(DVENDOR_FAIL=stage),
    )
    assert res.returncode == 0, res
    plugin, distribution, text, cause_name, f = res.data
    assert (plugin, distribution, cause_name) == ("dvendor", "dvendor-platform", cause)
    assert message in text and "plugin 'dvendor' (dvendor-platform)" in text and "selected" in text
    assert "dvendor" not in f  # its hooks are discarded


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
    res = run_python(
        """
        import json, sys
        import hooks, hooks.diffusion as d
        out = {}
        try:
            d.load_plugins()
        except d.HookError as exc:
            out["error"] = [type(exc).__name__, str(exc), exc.names]
        out["imported"] = sorted(m for m in ("first_dup", "second_dup") if m in sys.modules)
        hooks.load_plugins()  # SRT loads both: the rule is diffusion's
        out["srt_imported"] = sorted(m for m in ("first_dup", "second_dup") if m in sys.modules)
        print("RESULT:" + json.dumps(out))
    """,
        sites=[site],
    )
    assert res.returncode == 0, res
    kind, text, names = res.data["error"]
    assert kind == "DuplicatePluginError" and names == ["twin"]
    assert "'twin' is shipped by 'first-vendor' and 'second-vendor'" in text
    assert "uninstall all but one" in text
    assert res.data["imported"] == []
    assert res.data["srt_imported"] == ["first_dup", "second_dup"]


# -- once per process: threads, re-entrant calls, fork -----------------------------------------------
def test_phases_run_once_with_threads_reentrancy_and_fork(site):
    make_dist(site, "ptarget-module", modules={"ptarget.py": "def f(x):\n    return [x]\n"})
    make_dist(
        site,
        "phase-plugin",
        {SRT_PLUGINS: {"phase": "phase_pkg:register"}},
        {
            "phase_pkg.py": """
        import os, threading
        import hooks
        from hooks.hook_registry import HookRegistry, HookType

        PARENT = os.getpid()
        CALLS, SEEN_INSIDE = [], []
        STARTED, GO = threading.Event(), threading.Event()

        def after(result, x):
            return result + ["hooked"]

        def after2(result, x):
            return result + ["hooked2"]

        def register():
            CALLS.append(os.getpid())
            HookRegistry.register("ptarget.f", after, HookType.AFTER)
            # A fresh closure each call: a forked child re-running this callback must not add it twice.
            HookRegistry.register("ptarget.f", lambda result, x: result + ["fresh"], HookType.AFTER)
            # Re-entrant calls return at once and apply nothing; the outer calls finish the work.
            hooks.load_plugins(); hooks.register_plugins(); hooks.apply_plugin_hooks()
            import ptarget
            SEEN_INSIDE.append(ptarget.f(1))
            HookRegistry.register("ptarget.f", after2, HookType.AFTER)
            if os.getpid() == PARENT:
                STARTED.set()
                GO.wait(120)
    """
        },
    )
    res = run_python(
        """
        import json, os, signal, sys, threading, time
        import hooks, phase_pkg

        HOOKED = [1, "hooked", "fresh", "hooked2"]
        results = {}
        def call(tag, fn):
            fn()
            import ptarget
            results[tag] = ptarget.f(1)

        def blocked_in_phase(thread):
            frame = sys._current_frames().get(thread.ident)
            while frame is not None:
                if frame.f_code.co_name == "wait" and frame.f_code.co_filename.endswith("threading.py"):
                    return True
                frame = frame.f_back
            return False

        def fork_and_check():
            pid = os.fork()
            if pid == 0:
                code = 1
                try:
                    hooks.load_plugins()  # a forked child starts fresh (and does not deadlock)
                    hooks.load_plugins()  # again: nothing new to apply
                    import ptarget
                    code = 0 if ptarget.f(1) == HOOKED and phase_pkg.CALLS[-1] == os.getpid() else 2
                    code = code or (0 if len(hooks.HookRegistry.hooks()) == 3 else 3)
                finally:
                    os._exit(code)
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                done, status = os.waitpid(pid, os.WNOHANG)
                if done:
                    return os.waitstatus_to_exitcode(status)
                time.sleep(0.01)
            os.kill(pid, signal.SIGKILL); os.waitpid(pid, 0)
            return "child hung"

        # The bootstrap's order: t1 registers; t2 applies (waits for t1's registration); t3 does both.
        t1 = threading.Thread(target=call, args=("t1", hooks.register_plugins)); t1.start()
        assert phase_pkg.STARTED.wait(60)
        t2 = threading.Thread(target=call, args=("t2", hooks.apply_plugin_hooks)); t2.start()
        t3 = threading.Thread(target=call, args=("t3", hooks.load_plugins)); t3.start()
        deadline = time.monotonic() + 60
        while not (blocked_in_phase(t2) and blocked_in_phase(t3)) and time.monotonic() < deadline:
            time.sleep(0.01)
        out = {"waiting": blocked_in_phase(t2) and blocked_in_phase(t3)}
        out["fork_mid_phase"] = fork_and_check()   # another thread is inside the phase right now
        phase_pkg.GO.set()
        for t in (t1, t2, t3):
            t.join(60)
        hooks.load_plugins()
        import ptarget
        out.update(t1_returned="t1" in results, t2=results.get("t2"), t3=results.get("t3"),
                   calls=phase_pkg.CALLS.count(os.getpid()), seen_inside=phase_pkg.SEEN_INSIDE,
                   main=ptarget.f(1))
        out["fork_after_done"] = fork_and_check()
        print("RESULT:" + json.dumps(out))
    """,
        sites=[site],
        timeout=180,
    )
    assert res.returncode == 0, res
    out = res.data
    assert out["waiting"] is True
    hooked = [1, "hooked", "fresh", "hooked2"]
    assert out["t1_returned"] and out["t2"] == hooked and out["t3"] == hooked
    assert out["calls"] == 1 and out["seen_inside"] == [[1]]
    assert out["main"] == hooked  # every hook applied, each once
    assert out["fork_mid_phase"] == 0 and out["fork_after_done"] == 0


@pytest.mark.parametrize("runtime", ["srt", "diffusion"])
def test_a_repeated_apply_call_applies_hooks_registered_late_once(site, runtime):
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
    res = run_python(
        f"""
        import json, logging
        import hooks{".diffusion" if runtime == "diffusion" else ""} as h
        import late_tgt
        logging.basicConfig(level=logging.INFO)
        calls = [h.apply_plugin_hooks] + ([] if {runtime!r} == "diffusion" else [h.load_plugins])
        h.apply_plugin_hooks()
        out = [late_tgt.f(1)]
        for n, call in enumerate(calls):
            h.HookRegistry.register("late_tgt.f", lambda result, x, n=n: result + [f"late{{n}}"], h.HookType.AFTER)
            out.append(late_tgt.f(1))  # registered, not applied yet
            call(); call()
            out.append(late_tgt.f(1))
        print("RESULT:" + json.dumps(out))
    """,
        sites=[site],
    )
    assert res.returncode == 0, res
    expected = [[1, "early"], [1, "early"], [1, "early", "late0"]]
    if runtime == "srt":
        expected += [[1, "early", "late0"], [1, "early", "late0", "late1"]]
    assert res.data == expected
    assert (
        res.stderr.count(f"applying 1 {runtime} hook(s) registered after hooks were applied")
        == len(expected) // 2
    )


# -- this project's own hook targets ------------------------------------------------------------------
def test_a_plugin_adds_an_option_and_a_check_to_server_args(site):
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
            HookRegistry.register("launcher.server_args.ServerArgs.add_cli_args", add_option, HookType.AFTER)
            HookRegistry.register("launcher.server_args:ServerArgs.check_server_args", check, HookType.BEFORE)
    """
        },
    )
    res = run_python(
        """
        import argparse, json, hooks
        hooks.load_plugins()
        from launcher.server_args import ServerArgs
        parser = ServerArgs.add_cli_args(argparse.ArgumentParser())
        ns = parser.parse_args(["--my-plugin-level", "3", "--max-batch-size", "128"])
        args = ServerArgs.from_cli_args(ns)
        try:
            args.check_server_args()
            error = None
        except ValueError as exc:
            error = str(exc)
        print("RESULT:" + json.dumps({"level": ns.my_plugin_level, "error": error}))
    """,
        sites=[site],
        env=clean_env(SGLANG_USE_CPU_ENGINE="1"),
    )  # CPU: no accelerator probe (torch)
    assert res.returncode == 0, res
    assert res.data == {"level": 3, "error": "args_plugin supports --max-batch-size up to 64"}


# -- the demo platform package, installed by pip ------------------------------------------------------
@pytest.mark.e2e  # pip-installs the demo plugin
def test_pip_installed_demo_platform_plugin_is_required_when_selected(demo_site):
    code = """
        import json, hooks
        try:
            hooks.load_plugins()
            out = {"hooks": [[h.source.name, h.source.distribution, h.type.name, h.path.dotted]
                             for h in hooks.HookRegistry.hooks()]}
        except hooks.PluginError as exc:
            out = {"error": [exc.plugin, exc.distribution, str(exc.__cause__)]}
        print("RESULT:" + json.dumps(out))
    """
    ok = run_python(
        code, sites=[demo_site], env=clean_env(SGLANG_PLATFORM="demo", DEMO_PLATFORM_ENABLE="1")
    )
    assert ok.returncode == 0, ok
    assert ok.data == {
        "hooks": [
            ["demo", DEMO_DISTRIBUTION, "AFTER", "launcher.server_args.ServerArgs.__post_init__"]
        ]
    }
    broken = run_python(
        code,
        sites=[demo_site],
        env=clean_env(
            SGLANG_PLATFORM="demo", DEMO_PLATFORM_ENABLE="1", DEMO_PLATFORM_FAIL_HOOKS="1"
        ),
    )
    assert broken.returncode == 0, broken
    assert broken.data == {
        "error": ["demo", DEMO_DISTRIBUTION, "demo plugin: DEMO_PLATFORM_FAIL_HOOKS=1"]
    }
    # Not the selected platform (no platform selected explicitly, demo hardware off): best effort.
    other = run_python(code, sites=[demo_site], env=clean_env(DEMO_PLATFORM_FAIL_HOOKS="1"))
    assert other.returncode == 0, other
    assert (
        other.data == {"hooks": []}
        and "plugin 'demo' (sglang-launch-demo-platform) failed to run its callback" in other.stderr
    )


@pytest.mark.e2e  # pip-installs the demo plugin
def test_demo_plugin_hook_runs_once_in_a_forked_child(demo_site):
    # The demo's callback registers a fresh closure each call; a forked child re-runs the callback.
    res = run_python(
        """
        import json, os
        import hooks
        from demo_platform_plugin import hooks as demo
        from launcher.server_args import ServerArgs
        hooks.load_plugins()
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                hooks.load_plugins()
                ServerArgs()
                code = 0 if demo.CALLS == [f"srt {os.getpid()}"] and len(hooks.HookRegistry.hooks()) == 1 else 2
            finally:
                os._exit(code)
        child = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
        ServerArgs()
        print("RESULT:" + json.dumps([child, demo.CALLS == [f"srt {os.getpid()}"]]))
    """,
        sites=[demo_site],
        env=clean_env(SGLANG_PLATFORM="demo", DEMO_PLATFORM_ENABLE="1"),
    )
    assert res.returncode == 0, res
    assert res.data == [0, True]
