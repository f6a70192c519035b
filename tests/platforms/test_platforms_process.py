"""The process-level platform state where a fresh interpreter is the subject: import neutrality
(``import platforms`` and selecting a plugin or probing without drivers pull in no torch), the
first resolution in a process with threads racing it, and ``initialize_current_platform()``'s
once-per-process contract with waiting threads, re-entry and ``fork``.

Each test writes real entry points (dist-info folders) and runs a fresh interpreter. Everything
else about ``current_platform`` is tested in this process, in ``test_current_platform.py``.
"""

from __future__ import annotations

import sys

import pytest
from support import clean_env, run_python
from support.plugins import platform_plugin

HEAVY = ("torch", "numpy", "transformers", "starlette", "uvicorn")


def test_import_and_explicit_selection_import_no_torch(site):
    platform_plugin(site, "beta")
    code = f"""
        import json, sys
        import platforms, platforms.diffusion, platforms.testing
        heavy_at_import = [m for m in {HEAVY!r} if m in sys.modules]
        from platforms import current_platform, current_selection
        key = current_selection().key
        line = str(current_platform)
        print("RESULT:" + json.dumps(dict(
            heavy_at_import=heavy_at_import, key=key,
            heavy_after=[m for m in {HEAVY!r} if m in sys.modules],
        )))
    """
    result = run_python(code, sites=[site], env=clean_env(SGLANG_PLATFORM="beta"))
    assert result.returncode == 0, result
    data = result.data
    assert data["key"] == "plugin:beta"
    assert data["heavy_at_import"] == [] and data["heavy_after"] == []


def test_threads_racing_the_first_use_resolve_once_and_metadata_is_read_once(site):
    platform_plugin(site, "alpha", tag="t")
    platform_plugin(site, "vendor", runtime="diffusion", tag="t")
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
        diffusion = platforms.diffusion.current_selection().key
        for group in entrypoints.GROUPS:
            entrypoints.entry_points(group)
        print("RESULT:" + json.dumps(dict(
            distinct=len(set(seen)), count=len(seen), calls=len(sys.modules["plg_alpha_t"].CALLS),
            diffusion=diffusion, scans=len(scans))))
    """
    result = run_python(code, sites=[site], timeout=60)
    assert result.returncode == 0, result
    assert result.data["count"] == 8 and result.data["distinct"] == 1
    assert result.data["calls"] == 1, "several threads ran discovery"
    assert result.data["diffusion"] == "plugin:vendor"
    assert result.data["scans"] == 1, (
        "entry-point metadata was read more than once for both runtimes"
    )


INIT_PLATFORM = """
def init_backend(self):
    import os, sys, threading, platforms
    state = sys.modules[__name__]
    state.INIT.append(os.getpid())
    assert platforms.initialize_current_platform() is not None  # re-entrant: returns at once
    state.ENTERED.set()
    state.RELEASE.wait(30)
"""


def test_initialize_current_platform_once_per_process_with_threads_reentry_and_fork(site):
    """The first call runs ``init_backend()``; a re-entrant call from inside it returns at once,
    another thread waits for it, and a forked child runs it afresh. (A failure being terminal
    is tested in this process, in ``test_current_platform.py``.)"""
    platform_plugin(site, "good", tag="i", class_body=INIT_PLATFORM)
    # The class module holds the shared state the platform's init_backend uses.
    (site / "plg_good_i" / "platform.py").write_text(
        "import threading\nINIT = []\nENTERED = threading.Event()\nRELEASE = threading.Event()\n"
        + (site / "plg_good_i" / "platform.py").read_text()
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
        print("RESULT:" + json.dumps(out))
    """
    env = clean_env(SGLANG_PLATFORM="good")
    result = run_python(code, sites=[site], env=env, timeout=90)
    assert result.returncode == 0, result
    data = result.data
    assert data["waited"] and data["runs"] == 1 and data["same"]
    assert data["child_runs"] == 2 and data["parent_runs_after_fork"] == 1


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


def test_selecting_without_probes_imports_no_torch(site):
    """``current_selection(probe=False)`` imports neither torch nor any built-in probe's module,
    where it stops for a probe (nothing installed) and where a plugin activates."""
    code = """
        import json, sys
        import platforms, platforms.diffusion
        from platforms import ProbeRequired
        out = {}
        for name, module in (("srt", platforms), ("diffusion", platforms.diffusion)):
            try:
                out[name] = module.current_selection(probe=False).key
            except ProbeRequired:
                out[name] = "probe"
        out["torch"] = "torch" in sys.modules
        out["probes_imported"] = sorted(m for m in sys.modules if m.startswith("platforms.builtin."))
        print("RESULT:" + json.dumps(out))
    """
    bare = run_python(code).data
    assert bare == {"srt": "probe", "diffusion": "probe", "torch": False, "probes_imported": []}
    platform_plugin(site, "on")
    with_plugin = run_python(code, sites=[site]).data
    assert with_plugin["srt"] == "plugin:on" and not with_plugin["torch"], with_plugin
