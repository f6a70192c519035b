"""General plugins where a fresh interpreter is the subject: ``import hooks`` pulls in no torch and
no platform code, and the once-per-process phase rules hold with threads waiting on a running
phase, re-entrant calls and ``fork`` (a forked child starts its phases over, without doubling a
hook). Plugins are real distributions (``support.make_dist``) on ``PYTHONPATH``. Everything else
about plugins and hooks is tested in this process, in ``test_hooks_plugins.py``.
"""

from __future__ import annotations

import pytest
from support import clean_env, make_dist, run_python

SRT_PLUGINS = "sglang.srt.plugins"
HEAVY = ("torch", "numpy", "transformers", "starlette", "uvicorn")


def test_import_hooks_pulls_in_no_torch_and_no_platform_code():
    res = run_python(
        f"""
        import json, sys
        import hooks, hooks.diffusion, hooks.hook_registry
        light = [m for m in {HEAVY!r} if m in sys.modules]
        platforms_at_import = "platforms" in sys.modules
        import hooks.testing
        testing_light = [m for m in {HEAVY!r} if m in sys.modules]
        print("RESULT:" + json.dumps({{"light": light, "platforms_at_import": platforms_at_import,
                                      "testing_light": testing_light}}))
    """
    )
    assert res.returncode == 0, res
    assert res.data == {"light": [], "platforms_at_import": False, "testing_light": []}


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


@pytest.mark.e2e  # pip-installs the demo plugin
def test_demo_plugin_hook_runs_once_in_a_forked_child(demo_site):
    # The demo's callback registers a fresh closure each call; a forked child re-runs the callback.
    res = run_python(
        """
        import json, os
        import hooks
        from demo_platform_plugin import hooks as demo
        from launchspec.server_args import ServerArgs
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
