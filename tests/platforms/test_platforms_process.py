"""The process-level singletons, each checked in a fresh interpreter with real entry points.

Each subprocess checks several things at once to keep the suite fast: import lightness,
the lazy ``current_platform`` and what it prints, explicit selection importing one plugin only,
thread safety, ``initialize_current_platform()``'s once-per-process contract (re-entry, waiting
threads, terminal failure, fork), ``pin_selection``, and the pip-installed demo plugin end to end.
"""

from __future__ import annotations

import sys

import pytest
from support import clean_env, run_python
from support.plugins import DEMO_DISTRIBUTION, platform_plugin

HEAVY = ("torch", "numpy", "transformers", "starlette", "uvicorn")


def test_print_current_platform_is_one_readable_line():
    result = run_python(
        "from platforms import current_platform; print(current_platform)",
        env=clean_env(SGLANG_USE_CPU_ENGINE="1"),
    )
    assert result.returncode == 0, result
    line = result.stdout.strip()
    assert "\n" not in line
    assert line.startswith("CpuSRTPlatform (platforms.builtin.cpu) on device 'cpu'")
    assert "builtin:cpu" in line and "SGLANG_USE_CPU_ENGINE is set" in line


def test_explicit_selection_imports_one_plugin_and_no_torch(site):
    packages = [platform_plugin(site, name, tag="x") for name in ("alpha", "beta", "gamma")]
    diffusion = platform_plugin(site, "vendor", runtime="diffusion", tag="x")
    code = f"""
        import json, sys
        import platforms, platforms.diffusion
        heavy_at_import = [m for m in {HEAVY!r} if m in sys.modules]
        from platforms import current_platform, current_selection
        selection = current_selection()
        after_selection = sorted(p for p in {packages + [diffusion]!r} if p in sys.modules)
        class_imported_early = "plg_beta_x.platform" in sys.modules
        line = str(current_platform)
        print("RESULT:" + json.dumps(dict(
            heavy_at_import=heavy_at_import,
            heavy_after=[m for m in {HEAVY!r} if m in sys.modules],
            key=selection.key, dist=selection.distribution, line=line,
            imported=after_selection, class_imported_early=class_imported_early,
            isinstance=isinstance(current_platform, platforms.SRTPlatform),
            same=current_platform.device_name == "beta" and current_selection() is selection,
            calls=len(sys.modules["plg_beta_x"].CALLS),
        )))
    """
    result = run_python(code, sites=[site], env=clean_env(SGLANG_PLATFORM="beta"))
    assert result.returncode == 0, result
    data = result.data
    assert data["heavy_at_import"] == [] and data["heavy_after"] == []
    assert data["imported"] == ["plg_beta_x"], (
        "explicit selection imported more than the selected plugin"
    )
    assert not data["class_imported_early"], "current_selection() imported the platform class"
    assert data["key"] == "plugin:beta" and data["dist"] == "dist-plg-beta-x"
    assert data["line"].startswith("Plat (plg_beta_x.platform) on device 'cpu' [beta]")
    assert "selected by SGLANG_PLATFORM=beta" in data["line"]
    assert data["isinstance"] and data["same"] and data["calls"] == 1


def test_threads_resolve_once_reentry_is_an_error_and_metadata_is_read_once(site):
    platform_plugin(site, "alpha", tag="t")
    # A diffusion activate() that touches current_platform must get an error, not a deadlock.
    platform_plugin(
        site,
        "loopy",
        runtime="diffusion",
        tag="t",
        activate=(
            "from platforms.diffusion import current_platform\ncurrent_platform.device_name\nreturn None"
        ),
    )
    code = """
        import json, sys, threading
        from importlib import metadata
        scans = []
        real_distributions = metadata.distributions
        def counted(*a, **k):  # instrumentation only: counts metadata scans
            scans.append(1)
            return real_distributions(*a, **k)
        metadata.distributions = counted
        import platforms, platforms.diffusion
        from platforms import entrypoints
        barrier = threading.Barrier(8)
        seen = []
        def touch():
            barrier.wait()
            seen.append(id(platforms._slot.platform()) if platforms.current_platform.device_name else None)
        threads = [threading.Thread(target=touch) for _ in range(8)]
        for t in threads: t.start()
        for t in threads: t.join()
        try:
            platforms.diffusion.current_platform.device_name
            reentry = "no error"
        except platforms.PlatformSelectionError as exc:
            reentry = str(exc)
        for group in entrypoints.GROUPS:
            entrypoints.entry_points(group)
        print("RESULT:" + json.dumps(dict(
            distinct=len(set(seen)), count=len(seen), calls=len(sys.modules["plg_alpha_t"].CALLS),
            reentry=reentry, scans=len(scans))))
    """
    result = run_python(code, sites=[site], timeout=60)
    assert result.returncode == 0, result
    assert result.data["count"] == 8 and result.data["distinct"] == 1
    assert result.data["calls"] == 1, "several threads ran discovery"
    assert "was used while its platform was being selected" in result.data["reentry"]
    assert result.data["scans"] == 1, (
        "entry-point metadata was read more than once for both runtimes"
    )
    assert "move that code into init_backend()" in result.data["reentry"]


INIT_PLATFORM = """
def init_backend(self):
    import os, sys, threading, platforms
    state = sys.modules[__name__]
    state.INIT.append(os.getpid())
    assert platforms.initialize_current_platform() is not None  # re-entrant: returns at once
    state.ENTERED.set()
    state.RELEASE.wait(30)
"""

FAILING_PLATFORM = """
def init_backend(self):
    import sys
    sys.modules[__name__].INIT.append(1)
    raise RuntimeError("backend exploded")
"""


def test_initialize_current_platform_once_per_process(site):
    platform_plugin(site, "good", tag="i", class_body=INIT_PLATFORM)
    platform_plugin(site, "bad", runtime="diffusion", tag="i", class_body=FAILING_PLATFORM)
    # The class module holds the shared state the platform's init_backend uses.
    (site / "plg_good_i" / "platform.py").write_text(
        "import threading\nINIT = []\nENTERED = threading.Event()\nRELEASE = threading.Event()\n"
        + (site / "plg_good_i" / "platform.py").read_text()
    )
    (site / "plg_bad_i" / "platform.py").write_text(
        "INIT = []\n" + (site / "plg_bad_i" / "platform.py").read_text()
    )
    code = """
        import json, os, sys, threading
        import platforms, platforms.diffusion
        state = __import__("plg_good_i.platform", fromlist=["x"])
        results = {}
        first = threading.Thread(target=lambda: results.setdefault("first", platforms.initialize_current_platform()))
        first.start()
        state.ENTERED.wait(30)
        second = threading.Thread(target=lambda: results.setdefault("second", platforms.initialize_current_platform()))
        second.start()
        second.join(0.5)
        waited = second.is_alive()          # the second thread waits for the first to finish
        state.RELEASE.set()
        first.join(30); second.join(30)
        again = platforms.initialize_current_platform()
        out = dict(waited=waited, runs=len(state.INIT), same=results["first"] is results["second"] is again)

        # A forked child is a new process: its backend initialization runs afresh.
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:
            os.close(r)
            platforms.initialize_current_platform()
            os.write(w, str(len(state.INIT)).encode()); os._exit(0)
        os.close(w)
        child_runs = int(os.read(r, 100) or b"-1"); os.waitpid(pid, 0)
        out.update(child_runs=child_runs, parent_runs_after_fork=len(state.INIT))

        # Diffusion: a failure is terminal and re-raised to every later caller.
        errors = []
        for _ in range(3):
            try:
                platforms.diffusion.initialize_current_platform()
            except RuntimeError as exc:
                errors.append(exc)
        bad = __import__("plg_bad_i.platform", fromlist=["x"])
        out.update(failures=len(errors), same_error=len({id(e) for e in errors}) == 1,
                   message=str(errors[0]), bad_runs=len(bad.INIT))
        print("RESULT:" + json.dumps(out))
    """
    env = clean_env(SGLANG_PLATFORM="good", SGLANG_DIFFUSION_PLATFORM_OVERRIDE="bad")
    result = run_python(code, sites=[site], env=env, timeout=90)
    assert result.returncode == 0, result
    data = result.data
    assert data["waited"] and data["runs"] == 1 and data["same"]
    assert data["child_runs"] == 2 and data["parent_runs_after_fork"] == 1
    assert data["failures"] == 3 and data["same_error"] and data["bad_runs"] == 1
    assert data["message"] == "backend exploded"


def test_pin_selection_and_remembered_failures(site):
    platform_plugin(site, "alpha", tag="p")
    code = """
        import json
        import platforms, platforms.diffusion
        from platforms import PlatformSelectionError
        out = {}
        platforms.pin_selection("builtin:cpu")
        platforms.pin_selection("builtin:cpu")       # pinning again before resolution: fine
        out["srt"] = str(platforms.current_platform)
        platforms.pin_selection("builtin:cpu")       # the same key after resolution: fine
        try:
            platforms.pin_selection("plugin:alpha")
        except PlatformSelectionError as exc:
            out["late_pin"] = str(exc)
        try:
            platforms.diffusion.pin_selection("gpu")
        except PlatformSelectionError as exc:
            out["bad_key"] = str(exc)
        # Diffusion: the selection fails (no plugin named "missing"); the failure is remembered.
        errors = []
        for _ in range(2):
            try:
                platforms.diffusion.current_selection()
            except PlatformSelectionError as exc:
                errors.append(exc)
        out["remembered"] = len(errors) == 2 and errors[0] is errors[1]
        try:
            platforms.diffusion.pin_selection("builtin:cpu")
        except PlatformSelectionError as exc:
            out["pin_after_failure"] = str(exc)
        print("RESULT:" + json.dumps(out))
    """
    env = clean_env(SGLANG_PLATFORM="alpha", SGLANG_DIFFUSION_PLATFORM_OVERRIDE="missing")
    result = run_python(code, sites=[site], env=env)
    assert result.returncode == 0, result
    data = result.data
    # The pin wins over SGLANG_PLATFORM=alpha.
    assert data["srt"].startswith("CpuSRTPlatform") and "pinned builtin:cpu" in data["srt"]
    assert "already resolved builtin:cpu" in data["late_pin"]
    assert "not a diffusion platform key" in data["bad_key"]
    assert data["remembered"]
    assert "failed selection" in data["pin_after_failure"]


DEMO_CHECKS = """
    import json, os, sys
    import torch
    import platforms, platforms.diffusion
    from platforms.custom_op import CustomOp
    out = {}
    srt = platforms.current_platform
    diff = platforms.diffusion.current_platform
    out["srt_line"] = str(srt)
    out["diff_selection"] = [platforms.diffusion.current_selection().key,
                             platforms.diffusion.current_selection().distribution]
    if os.environ.get("DEMO_PLATFORM_ENABLE") == "1":
        import demo_platform_plugin, demo_platform_plugin.ops as ops
        platforms.initialize_current_platform(); platforms.diffusion.initialize_current_platform()
        out["init_calls"] = len(demo_platform_plugin.INIT_CALLS)
        out["device"] = [str(srt.get_device(0)), srt.device_type, srt.get_device_name(),
                         srt.is_out_of_tree(), srt.is_cpu(), diff.is_out_of_tree(),
                         diff.get_torch_library_dispatch_key(), diff.get_dispatch_key_name()]
        x = torch.ones(3, 4, device=diff.get_local_torch_device())
        norm = ops.RMSNorm(4)
        out["registered"] = [bool(torch.allclose(norm(x), x)), ops.DEMO_FORWARD_CALLS]

        class ByKey(CustomOp):
            def forward_demo(self, x): return "forward_demo"
            def forward_native(self, x): return "forward_native"
        class ByOot(CustomOp):
            def forward_oot(self, x): return "forward_oot"
            def forward_native(self, x): return "forward_native"
        class Native(CustomOp):
            def forward_native(self, x): return "forward_native"
        class Sub(ByKey):
            pass
        CustomOp.register_oot_forward(ByKey, lambda op, x: f"registered:{type(op).__name__}", "demo")
        CustomOp.register_oot_forward(Native, lambda op, x: "wrong key", "cuda")
        built_before = ByOot()
        CustomOp.register_oot_forward(ByOot, lambda op, x: "registered:ByOot", "demo")
        out["dispatch"] = [ByKey()(1), Sub()(1), ByOot()(1), built_before(1), Native()(1)]
        try:
            CustomOp.register_oot_forward(int, lambda op: None, "demo")
        except TypeError as exc:
            out["bad_registration"] = str(exc)
    print("RESULT:" + json.dumps(out))
"""


@pytest.mark.e2e  # pip-installs the demo plugin
def test_demo_plugin_installed_with_pip_disabled(demo_site):
    result = run_python(DEMO_CHECKS, sites=[demo_site])
    assert result.returncode == 0, result
    assert result.data["srt_line"].startswith("SRTPlatform (platforms.interface)")
    assert "no platform plugin activated" in result.data["srt_line"]
    assert result.data["diff_selection"][1] is None


@pytest.mark.e2e  # pip-installs the demo plugin
def test_demo_plugin_installed_with_pip_end_to_end(demo_site):
    result = run_python(DEMO_CHECKS, sites=[demo_site], env=clean_env(DEMO_PLATFORM_ENABLE="1"))
    assert result.returncode == 0, result
    data = result.data
    assert data["srt_line"].startswith(
        "DemoSRTPlatform (demo_platform_plugin.platform) on device 'cpu' [demo]"
    )
    assert (
        f"plugin:demo from {DEMO_DISTRIBUTION}" in data["srt_line"]
        and "automatic discovery" in data["srt_line"]
    )
    assert data["diff_selection"] == ["plugin:demo", DEMO_DISTRIBUTION]
    assert data["init_calls"] == 2  # once per runtime
    device, device_type, name, oot, is_cpu, diff_oot, torch_key, key_name = data["device"]
    assert (device, device_type, oot, is_cpu, diff_oot) == ("cpu", "cpu", True, False, True)
    assert name.startswith("Demo accelerator (CPU underneath") and (torch_key, key_name) == (
        "CPU",
        "demo",
    )
    assert data["registered"] == [True, 1]
    # registration (exact class), forward_<key>, registration made before construction, an op
    # built before the registration keeps forward_oot, a registration for another key is ignored.
    assert data["dispatch"] == [
        "registered:ByKey",
        "forward_demo",
        "registered:ByOot",
        "forward_oot",
        "forward_native",
    ]
    assert "must be a CustomOp subclass" in data["bad_registration"]


@pytest.mark.e2e  # pip-installs the demo plugin
def test_demo_plugin_init_failure_is_terminal(demo_site):
    code = """
        import json, platforms
        messages = []
        for _ in range(2):
            try:
                platforms.initialize_current_platform()
            except RuntimeError as exc:
                messages.append(str(exc))
        print("RESULT:" + json.dumps(messages))
    """
    env = clean_env(SGLANG_PLATFORM="demo", DEMO_PLATFORM_ENABLE="1", DEMO_PLATFORM_FAIL_INIT="1")
    result = run_python(code, sites=[demo_site], env=env)
    assert result.returncode == 0, result
    assert result.data == ["demo platform: DEMO_PLATFORM_FAIL_INIT=1"] * 2


@pytest.mark.e2e  # pip-installs the demo plugin
def test_explicit_demo_when_disabled_names_the_fix(demo_site):
    result = run_python(
        "from platforms import current_platform; print(current_platform)",
        sites=[demo_site],
        env=clean_env(SGLANG_PLATFORM="demo"),
    )
    assert result.returncode == 1
    assert "PlatformSelectionError" in result.stderr and "activate() returned None" in result.stderr
    assert f"demo = demo_platform_plugin:activate (from {DEMO_DISTRIBUTION})" in result.stderr


def test_children_adopt_the_parents_entry_point_reading(site):
    """A launcher reads entry-point metadata once and hands the table to its children: a child
    seeded with that snapshot sees the same entry points without reading metadata, and a process
    that has already read its own keeps its own."""
    from support import make_dist

    make_dist(site, "seeded-plugin", {"sglang.srt.plugins": {"seeded": "seeded_mod:register"}})
    result = run_python(
        """
        import json
        from platforms import entrypoints as e
        rows = e.snapshot()
        e.reset()
        e.seed(rows + (("sglang.srt.plugins", "only-in-snapshot", "x:y", "ghost"),))
        seeded = [ep.name for ep in e.entry_points("sglang.srt.plugins")]
        e.seed(())  # already filled: ignored
        kept = [ep.name for ep in e.entry_points("sglang.srt.plugins")]
        print("RESULT:" + json.dumps({"seeded": seeded, "kept": kept}))
        """,
        sites=[site],
    )
    assert result.returncode == 0, result
    assert result.data["seeded"] == ["seeded", "only-in-snapshot"]
    assert result.data["kept"] == result.data["seeded"]


@pytest.mark.e2e  # probes the accelerators (torch) in fresh interpreters
def test_a_server_runs_on_the_cpu_where_the_srt_chart_ends_at_the_base_platform(site):
    """``use_serving_fallback()``: with no plugin, nothing explicit and no accelerator, the spec's
    chart ends at the bare SRTPlatform, which cannot run a model; a server gets the CPU platform
    instead and is told why. Without the call, and on every other branch, the chart is unchanged."""
    code = """
        import json, sys
        import platforms
        if sys.argv[1] == "serve":
            platforms.use_serving_fallback()
        s = platforms.current_selection()
        print("RESULT:" + json.dumps([s.key, s.reason]))
    """
    served = run_python(code, args=["serve"])
    plain = run_python(code, args=["plain"])
    explicit = run_python(code, args=["serve"], env=clean_env(SGLANG_USE_CPU_ENGINE="1"))
    assert served.data[0] == "builtin:cpu", served
    assert "so a server runs on the CPU platform" in served.data[1]
    assert "set SGLANG_PLATFORM or SGLANG_USE_CPU_ENGINE=1" in served.data[1]
    assert plain.data[0] == "builtin:base", plain
    assert explicit.data == [
        "builtin:cpu",
        "fallback: no platform plugin installed and SGLANG_USE_CPU_ENGINE is set",
    ]

    platform_plugin(site, "on")
    with_plugin = run_python(code, args=["serve"], sites=[site])
    assert with_plugin.data[0] == "plugin:on", with_plugin


def _device_drivers_here() -> bool:
    from platforms.builtin import cuda, rocm, xpu
    from platforms.builtin._accelerator import driver_loadable, linux_device_nodes

    return (
        sys.platform == "darwin"
        or driver_loadable(*cuda.DRIVER_LIBRARIES)
        or linux_device_nodes(*rocm.DEVICE_NODES, *xpu.DEVICE_NODES) is not False
    )


@pytest.mark.skipif(_device_drivers_here(), reason="this machine has a device driver")
def test_probing_a_machine_without_device_drivers_imports_no_torch():
    """This machine has no NVIDIA, AMD or Intel GPU driver and is not a Mac: every built-in probe
    of both runtimes answers "not available" from the driver check alone, without importing
    torch (seconds of every launch's start-up, in the supervisor, before any worker spawns).
    A server falls back to the CPU in both runtimes."""
    code = """
        import json, sys
        from platforms import runtimes
        from platforms._selection import resolve
        from platforms.builtin import cuda, mps, rocm, xpu
        out = {"probes": [cuda.available(), rocm.available(), xpu.available(), mps.available()]}
        out["keys"] = [resolve(spec, {}, serving=True).key
                       for spec in (runtimes.SRT, runtimes.DIFFUSION)]
        out["torch"] = "torch" in sys.modules
        print("RESULT:" + json.dumps(out))
    """
    got = run_python(code).data
    assert got == {
        "probes": [False, False, False, False],
        "keys": ["builtin:cpu", "builtin:cpu"],
        "torch": False,
    }, got


@pytest.mark.e2e  # probes the accelerators (torch) in fresh interpreters
def test_current_selection_without_probes(site):
    """``current_selection(probe=False)`` runs no hardware probe and imports no torch: where only a
    probe could decide it raises ``ProbeRequired`` naming the built-ins in probing order (with the
    server's stand-in after ``use_serving_fallback()``) and remembers nothing; a plugin that
    activates, or an environment-only built-in, is selected as usual."""
    code = """
        import json, sys
        import platforms, platforms.diffusion
        from platforms import ProbeRequired
        if sys.argv[1] == "serve":
            platforms.use_serving_fallback()
        out = {}
        for name, module in (("srt", platforms), ("diffusion", platforms.diffusion)):
            try:
                s = module.current_selection(probe=False)
                out[name] = ["selected", s.key, s.reason]
            except ProbeRequired as need:
                out[name] = ["probe", list(need.builtins), need.serving_fallback, need.reason]
        out["torch"] = "torch" in sys.modules
        out["probes_imported"] = sorted(m for m in sys.modules if m.startswith("platforms.builtin."))
        out["then"] = platforms.current_selection().key  # nothing was remembered: this one probes
        print("RESULT:" + json.dumps(out))
    """
    bare = run_python(code, args=["plain"]).data
    assert bare["srt"] == [
        "probe",
        ["cuda", "rocm", "xpu", "base"],
        None,
        "fallback: no platform plugin installed",
    ]
    assert bare["diffusion"][:3] == [
        "probe",
        ["mps", "xpu", "rocm", "cuda", "npu", "musa", "cpu"],
        None,
    ]
    assert not bare["torch"] and bare["probes_imported"] == [], bare
    assert bare["then"].startswith("builtin:")  # probed now: base here, an accelerator's elsewhere

    served = run_python(code, args=["serve"]).data
    assert served["srt"][:3] == ["probe", ["cuda", "rocm", "xpu", "base"], "cpu"], served
    assert served["then"].startswith("builtin:")

    cpu_engine = run_python(code, args=["plain"], env=clean_env(SGLANG_USE_CPU_ENGINE="1")).data
    assert cpu_engine["srt"][:2] == ["selected", "builtin:cpu"], cpu_engine

    platform_plugin(site, "on")
    with_plugin = run_python(code, args=["plain"], sites=[site]).data
    assert with_plugin["srt"][:2] == ["selected", "plugin:on"] and not with_plugin["torch"], (
        with_plugin
    )
