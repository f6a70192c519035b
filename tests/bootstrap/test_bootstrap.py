"""The bootstrap, for real: spawn children, a ZeroMQ PULL socket, real entry points and signals.

Each test runs a small supervisor (``_harness``) in a fresh interpreter, so the process-level
singletons (platform selection, hook registries) of the test process are never touched. The
harness spawns ``bootstrap.run`` children with a local spawn context, receives their status
messages on a real PULL socket, sends signals when a child reaches a given point, and prints what
it saw as ``RESULT:<json>``. Several children share one harness run to keep the suite lean.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from support import REPO, clean_env, make_dist, run_python

TESTS = Path(__file__).resolve().parents[1]
HERE = Path(__file__).resolve().parent  # this module runs as the harness in fresh interpreters

# Entry points that the fault-injection children select (via ProcessSpec.platform_key).
SRT_PLATFORMS = "sglang.srt.platforms"
SRT_PLUGINS = "sglang.srt.plugins"


# ---------------------------------------------------------------------------------------------
# The harness: a minimal supervisor, run in a fresh interpreter.
# ---------------------------------------------------------------------------------------------
def _harness(config: dict) -> dict:
    """Spawn the children of ``config`` and collect what each reported and how it ended."""
    import multiprocessing
    import tempfile

    import psutil
    import zmq

    import bootstrap
    from bootstrap import messages

    if config.get("load_plugins"):
        import hooks

        hooks.load_plugins()
    import platforms

    platforms.pin_selection(config.get("supervisor_platform", "builtin:cpu"))
    import launchspec.server_args as server_args_module
    from launchspec.server_args import ARGS_CLASS, ServerArgs, encode_server_args

    args = server_args_module.ServerArgs(**config.get("args", {}))
    assert isinstance(args, ServerArgs)
    good_payload = encode_server_args(args)

    runtime_dir = tempfile.mkdtemp(prefix="bt-")
    status = f"ipc://{runtime_dir}/status"
    zctx = zmq.Context()
    pull = zctx.socket(zmq.PULL)
    pull.bind(status)
    spawn = multiprocessing.get_context("spawn")

    children = {}
    for index, (name, child) in enumerate(config["children"].items()):
        payload = good_payload
        if child.get("payload") == "corrupt":
            payload = good_payload[: len(good_payload) // 2]
        elif child.get("payload") == "version":
            import msgspec

            doc = msgspec.msgpack.decode(good_payload)
            doc["version"] = 99
            payload = msgspec.msgpack.encode(doc)
        parent_pid = os.getpid() if child.get("parent") != "bogus" else os.getpid() + 7_000_000
        spec = bootstrap.ProcessSpec(
            role=child.get("role", "scheduler"),
            rank=child.get("rank", index),
            local_rank=child.get("rank", index),
            world_size=child.get("world_size", 1),
            tp_size=args.tp_size,  # as the supervisor's plan does
            dp_size=args.dp_size,
            target=child["target"],
            payload=payload,
            args_class=ARGS_CLASS,
            status_endpoint=status if child.get("status") != "bad" else "nonsense://nowhere",
            runtime=child.get("runtime", "srt"),
            platform_key=child.get("platform", "builtin:cpu"),
            runtime_dir=runtime_dir,
            parent_pid=parent_pid,
            env=child.get("env", {}),
            heartbeat_interval=child.get("heartbeat", 0.0),
        )
        proc = spawn.Process(target=bootstrap.run, args=(spec,), name=spec.worker_id)
        proc.start()
        children[name] = {"proc": proc, "spec": spec, "config": child, "signalled": False}

    by_worker = {c["spec"].worker_id: name for name, c in children.items()}
    seen = {name: [] for name in children}
    deadline = time.monotonic() + config.get("deadline", 60)
    terminal = ("failed", "stopped")

    def settled(name: str) -> bool:
        c = children[name]
        code = c["proc"].exitcode
        if code is None:
            return False
        # A child that ended through the bootstrap (0 or one of its phase codes) has sent a
        # terminal message; wait for it to arrive rather than for a fixed time.
        if c["config"].get("status") == "bad":  # it has nobody to tell
            return True
        if code == 0 or code in bootstrap.EXIT_CODES.values():
            return any(m["kind"] in terminal for m in seen[name])
        return True

    timed_out = []
    while not all(settled(n) for n in children):
        if time.monotonic() > deadline:
            timed_out = sorted(n for n in children if not settled(n))
            break
        if pull.poll(50):
            msg = messages.to_dict(messages.decode(pull.recv()))
            seen[by_worker[msg["worker"]]].append(msg)
        for name, c in children.items():
            trigger = c["config"].get("signal")
            if not trigger or c["signalled"] or c["proc"].exitcode is not None:
                continue
            # "when": message kinds that must all have arrived, or "marker": a file the child made.
            when = trigger["when"]
            if when == "marker":
                hit = os.path.exists(c["config"]["env"]["TESTWORKER_MARKER"])
            else:
                got = {m["kind"] for m in seen[name]}
                hit = all(kind in got for kind in when)
            if hit:
                os.kill(c["proc"].pid, getattr(signal, trigger["sig"]))
                c["signalled"] = True
    for c in children.values():  # only after a timeout: leave nothing behind
        if c["proc"].exitcode is None:
            for p in psutil.Process(c["proc"].pid).children(recursive=True):
                p.kill()
            c["proc"].kill()
        c["proc"].join(10)
    pull.close(0)
    zctx.term()
    return {
        "timed_out": timed_out,
        "supervisor_platform": platforms.current_selection().key,
        "args": {"class": type(args).__name__, "port": args.port},
        "children": {
            name: {"exitcode": c["proc"].exitcode, "pid": c["proc"].pid, "messages": seen[name]}
            for name, c in children.items()
        },
    }


def run_harness(config: dict, *, sites=(), env=None, timeout=150):
    code = "import json, sys, test_bootstrap as t; print('RESULT:' + json.dumps(t._harness(json.loads(sys.argv[1]))))"
    result = run_python(
        code, sites=[*sites, HERE, TESTS], env=env, timeout=timeout, args=[json.dumps(config)]
    )
    assert result.data is not None, str(result)
    assert not result.data["timed_out"], str(result)
    return result.data["children"], result


def kinds(child: dict) -> list[str]:
    return [m["kind"] for m in child["messages"]]


def phases_reached(child: dict) -> list[str]:
    return [m["phase"] for m in child["messages"] if m["kind"] == "phase"]


def failure(child: dict) -> dict:
    failed = [m for m in child["messages"] if m["kind"] == "failed"]
    assert len(failed) == 1, child
    return failed[0]


STARTUP = [
    "spawned",
    "platform_initialized",
    "plugins_loaded",
    "hooks_applied",
    "args_materialized",
    "worker_imported",
]


# ---------------------------------------------------------------------------------------------
# Import neutrality.
# ---------------------------------------------------------------------------------------------
def test_import_bootstrap_adds_only_stdlib_and_itself():
    result = run_python(
        """
        import json, sys
        def new_since(before):
            return sorted(m for m in set(sys.modules) - before
                          if m.split(".")[0] not in sys.stdlib_module_names)
        before = set(sys.modules)
        import bootstrap
        after_bootstrap = new_since(before)
        before = set(sys.modules)
        import launchspec.server_args
        after_args = new_since(before)
        before = set(sys.modules)
        import bootstrap.messages
        after_messages = new_since(before)
        print("RESULT:" + json.dumps([after_bootstrap, after_args, after_messages]))
        """
    )
    assert result.returncode == 0, str(result)
    after_bootstrap, after_args, after_messages = result.data
    assert [m for m in after_bootstrap if not m.startswith("bootstrap")] == []
    # ServerArgs reads the runtime table (platforms, import-light by contract) and nothing else.
    assert {m.split(".")[0] for m in after_args} <= {"launchspec", "platforms"}, after_args
    assert not [m for m in after_args if m.startswith("serving")]
    heavy = {"torch", "numpy", "transformers", "starlette", "uvicorn", "zmq"}
    assert not {m.split(".")[0] for m in after_messages} & heavy


# ---------------------------------------------------------------------------------------------
# A healthy start, both runtimes, and a stop request.
# ---------------------------------------------------------------------------------------------
@pytest.mark.e2e
def test_children_report_every_phase_ready_and_stop_cleanly_on_sigterm():
    children, _ = run_harness(
        {
            "args": {"tp_size": 2, "port": 31234, "model_path": "/models/demo"},
            "children": {
                "sched": {
                    "role": "scheduler",
                    "rank": 1,
                    "world_size": 2,
                    "target": "support.workers.report_args",
                    "env": {"TESTWORKER_FLAVOUR": "mint"},
                    "signal": {"when": ["ready", "heartbeat"], "sig": "SIGTERM"},
                    "heartbeat": 0.05,
                },
                "phases": {
                    "role": "http",
                    "target": "support.workers:custom_phases",
                    "signal": {"when": ["ready"], "sig": "SIGTERM"},
                },
                "diffusion": {
                    "role": "scheduler",
                    "rank": 0,
                    "runtime": "diffusion",
                    "target": "support.workers.ready_then_wait",
                    "signal": {"when": ["ready"], "sig": "SIGTERM"},
                },
            },
        }
    )
    sched = children["sched"]
    assert sched["exitcode"] == 0
    assert phases_reached(sched) == STARTUP
    assert [k for k in kinds(sched) if k != "heartbeat"] == ["phase"] * 6 + ["ready", "stopped"]
    assert all(m["worker"] == "scheduler.1" and m["pid"] == sched["pid"] for m in sched["messages"])
    spawned = sched["messages"][0]
    assert spawned["early_imports"] == []  # nothing ran ahead of the bootstrap
    assert all(m["duration"] >= 0 for m in sched["messages"] if m["kind"] == "phase")
    ready = next(m for m in sched["messages"] if m["kind"] == "ready")
    assert ready["platform"] == "builtin:cpu"
    info = ready["info"]
    assert info["fields"]["port"] == 31234 and info["fields"]["tp_size"] == 2
    assert info["fields"]["model_path"] == "/models/demo"
    assert info["args_class"] == "launchspec.server_args.ServerArgs"
    assert (info["rank"], info["world_size"], info["tp_rank"], info["dp_rank"]) == (1, 2, 1, 0)
    assert info["env"]["TESTWORKER_FLAVOUR"] == "mint"  # ProcessSpec.env reached the worker
    assert info["endpoint"].startswith("ipc://") and info["endpoint"].endswith("/probe")
    assert "heartbeat" in kinds(sched)

    phases = children["phases"]
    assert phases["exitcode"] == 0
    assert phases_reached(phases) == STARTUP + ["model_loaded", "warmed_up"]
    assert kinds(phases)[-2:] == ["ready", "stopped"]

    diffusion = children["diffusion"]
    assert diffusion["exitcode"] == 0, diffusion
    assert phases_reached(diffusion) == STARTUP
    assert (
        next(m for m in diffusion["messages"] if m["kind"] == "ready")["platform"] == "builtin:cpu"
    )


# ---------------------------------------------------------------------------------------------
# Fault injection: every phase's failure, signals, and a stop request during start-up.
# ---------------------------------------------------------------------------------------------
def platform_dist(site: Path, name: str, *, init_backend: str = "pass", plugin: str | None = None):
    """A real distribution ``<name>-platform`` shipping an SRT platform ``name`` (and a plugin)."""
    pkg = f"{name}_platform"
    entry_points = {SRT_PLATFORMS: {name: f"{pkg}:activate"}}
    modules = {
        f"{pkg}/__init__.py": f"""
            def activate():
                return "{pkg}.platform.ThePlatform"
        """,
        f"{pkg}/platform.py": f"""
            import os, time
            from platforms import PlatformEnum, SRTPlatform

            class ThePlatform(SRTPlatform):
                _enum = PlatformEnum.OOT
                device_name = "{name}"
                device_type = "cpu"

                def init_backend(self):
                    {init_backend}
        """,
    }
    if plugin is not None:
        entry_points[SRT_PLUGINS] = {name: f"{pkg}.plugin:register"}
        modules[f"{pkg}/plugin.py"] = plugin
    make_dist(site, f"{name}-platform", entry_points, modules)


@pytest.mark.e2e
def test_each_failing_phase_reports_phase_type_traceback_and_its_exit_code(site, tmp_path):
    platform_dist(site, "boom", init_backend='raise RuntimeError("the boom driver is missing")')
    platform_dist(
        site,
        "slowinit",
        init_backend='open(os.environ["TESTWORKER_MARKER"], "w").close(); time.sleep(120)',
    )
    platform_dist(
        site,
        "badplug",
        plugin='raise ImportError("badplug plugin needs libbadplug, which is not installed")\n',
    )
    platform_dist(
        site,
        "badhook",
        plugin="""
            from hooks import HookRegistry, HookType

            def register():
                HookRegistry.register("no_such_module_for_hook.func", lambda *a, **k: None, HookType.BEFORE)
        """,
    )
    ok = "support.workers.ready_then_wait"
    marker = str(tmp_path / "in-init-backend")
    children, result = run_harness(
        {
            "children": {
                "boom": {"target": ok, "platform": "plugin:boom"},
                "badplug": {"target": ok, "platform": "plugin:badplug"},
                "badhook": {"target": ok, "platform": "plugin:badhook"},
                "corrupt": {"target": ok, "payload": "corrupt"},
                "version": {"target": ok, "payload": "version"},
                "unimportable": {"target": "no_such_worker_module.run"},
                "not_callable": {"target": "bootstrap.phases.PHASES"},
                "bad_endpoint": {"target": ok, "status": "bad"},
                "raises": {"target": "support.workers.raise_error"},
                "raises_after_ready": {"target": "support.workers.raise_after_ready"},
                "returns_early": {"target": "support.workers.return_early"},
                "raises_on_stop": {
                    "target": "support.workers.raise_on_stop",
                    "signal": {"when": ["ready"], "sig": "SIGTERM"},
                },
                "exit_code": {
                    "target": "support.workers.exit_with_code",
                    "env": {"TESTWORKER_EXIT_CODE": "7"},
                },
                "sigkill": {"target": "support.workers.kill_self"},
                "parent_gone": {"target": ok, "parent": "bogus"},
                "stop_in_init": {
                    "target": ok,
                    "platform": "plugin:slowinit",
                    "env": {"TESTWORKER_MARKER": marker},
                    "signal": {"when": "marker", "sig": "SIGTERM"},
                },
            }
        },
        sites=[site],
    )

    def check(name, phase, code, exc_type, *needles):
        child = children[name]
        assert child["exitcode"] == code, (name, child)
        failed = failure(child)
        assert kinds(child)[-1] == "failed", (name, child)
        assert (failed["phase"], failed["exit_code"]) == (phase, code), (name, failed)
        assert failed["exc_type"].endswith(exc_type), (name, failed)
        assert failed["traceback"].startswith("Traceback"), (name, failed)
        text = failed["message"] + failed["traceback"]
        for needle in needles:
            assert needle in text, (name, needle, failed)
        # Each phase before the failing one was reached, none after it.
        if phase in STARTUP:
            assert phases_reached(child) == STARTUP[: STARTUP.index(phase)], (name, child)
        # The child's stderr names the failure in one line (the traceback travels in the report
        # and is printed once, by the supervisor); after a stop request it leaves that to the
        # supervisor.
        lines = [
            line
            for line in result.stderr.splitlines()
            if line.startswith(f"{failed['worker']} failed while")
        ]
        assert len(lines) == (0 if phase == "stopping" else 1), (name, result.stderr)
        assert all("(reported to the supervisor)" in line for line in lines), lines

    check(
        "boom",
        "platform_initialized",
        81,
        "RuntimeError",
        "the boom driver is missing",
        "init_backend",
    )
    check("badplug", "plugins_loaded", 82, "PluginError", "badplug")
    check("badhook", "hooks_applied", 83, "PluginError", "no_such_module_for_hook")
    check("corrupt", "args_materialized", 84, "PayloadError", "corrupt")
    check("version", "args_materialized", 84, "PayloadError", "version 99", "same environment")
    check("unimportable", "worker_imported", 85, "TargetError", "no_such_worker_module")
    check("not_callable", "worker_imported", 85, "TypeError", "not a function")
    check("raises", "ready", 86, "RuntimeError", "worker failed on purpose", "support/workers.py")
    check("raises_after_ready", "serving", 87, "RuntimeError", "failed on purpose after ready")
    check(
        "returns_early", "serving", 87, "WorkerReturned", "before the supervisor asked it to stop"
    )
    check("raises_on_stop", "stopping", 88, "RuntimeError", "failed on purpose while stopping")
    assert kinds(children["raises_after_ready"])[-2:] == ["ready", "failed"]

    # A child that cannot even reach the supervisor still says why, on stderr, and exits 80.
    assert children["bad_endpoint"]["exitcode"] == 80
    assert children["bad_endpoint"]["messages"] == []
    assert "failed while arming orphan protection and connecting to the supervisor" in result.stderr

    # Deaths the bootstrap cannot see: the status is the worker's own, and no failed message.
    assert children["exit_code"]["exitcode"] == 7
    assert "failed" not in kinds(children["exit_code"])
    assert children["sigkill"]["exitcode"] == -signal.SIGKILL
    # A child whose parent is not the one in its spec exits at once, reporting nothing.
    assert children["parent_gone"]["exitcode"] == 89
    assert children["parent_gone"]["messages"] == []
    # SIGTERM inside init_backend ends the start-up cleanly.
    stopped = children["stop_in_init"]
    assert stopped["exitcode"] == 0, stopped
    assert kinds(stopped) == ["phase", "stopped"]


@pytest.mark.e2e
def test_a_sigterm_while_the_child_imports_the_runtime_table_ends_the_start_up_with_0(tmp_path):
    # The first thing a child imports is the runtime table (platforms.runtimes). A meta-path
    # finder, installed by sitecustomize in spawn children only, holds that import until the
    # harness sends SIGTERM: the stop must end the start-up like any other, exit 0, no traceback.
    site = tmp_path / "slow-site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(
        textwrap.dedent(
            """
            import multiprocessing, os, sys, time

            class HoldRuntimeTable:
                def find_spec(self, name, path=None, target=None):
                    if name == "platforms.runtimes" and multiprocessing.parent_process():
                        open(os.environ["TESTWORKER_MARKER"], "w").close()
                        time.sleep(60)  # the SIGTERM handler interrupts this
                    return None

            sys.meta_path.insert(0, HoldRuntimeTable())
            """
        )
    )
    marker = str(tmp_path / "in-table-import")
    env = {**clean_env(), "TESTWORKER_MARKER": marker}
    children, result = run_harness(
        {
            "children": {
                "stop_in_table": {
                    "target": "support.workers.ready_then_wait",
                    "env": {"TESTWORKER_MARKER": marker},
                    "signal": {"when": "marker", "sig": "SIGTERM"},
                    # Stopped before it connects its reporter: only the exit code tells.
                    "status": "bad",
                }
            }
        },
        sites=[site],
        env=env,
    )
    stopped = children["stop_in_table"]
    assert stopped["exitcode"] == 0, result
    assert "Traceback" not in result.stderr, result.stderr


@pytest.mark.e2e
def test_a_sigterm_where_python_cannot_raise_it_still_ends_the_start_up_quietly(tmp_path):
    # A SIGTERM that lands in a __del__ (or an at-fork callback, as logging's) cannot propagate:
    # Python prints "Exception ignored in ..." with a traceback. The stop must still end the
    # start-up with exit 0, and nothing is printed about it.
    site = tmp_path / "del-site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(
        textwrap.dedent(
            """
            import multiprocessing, os, sys, time

            class SlowToDie:
                def __del__(self):
                    open(os.environ["TESTWORKER_MARKER"], "w").close()
                    time.sleep(60)  # the SIGTERM handler raises here, where nothing catches it

            class DropOneOnTheRuntimeTable:
                def find_spec(self, name, path=None, target=None):
                    if name == "platforms.runtimes" and multiprocessing.parent_process():
                        SlowToDie()  # dropped at once: its __del__ runs now
                    return None

            sys.meta_path.insert(0, DropOneOnTheRuntimeTable())
            """
        )
    )
    marker = str(tmp_path / "in-del")
    env = {**clean_env(), "TESTWORKER_MARKER": marker}
    children, result = run_harness(
        {
            "children": {
                "stop_in_del": {
                    "target": "support.workers.ready_then_wait",
                    "env": {"TESTWORKER_MARKER": marker},
                    "signal": {"when": "marker", "sig": "SIGTERM"},
                }
            }
        },
        sites=[site],
        env=env,
    )
    stopped = children["stop_in_del"]
    assert stopped["exitcode"] == 0, result.stderr
    assert "Traceback" not in result.stderr and "Exception ignored" not in result.stderr, (
        result.stderr
    )


@pytest.mark.e2e
def test_a_worker_polling_stopping_in_a_tight_loop_stops_on_sigterm():
    # The handler runs on the main thread between two bytecodes; here that thread is nearly
    # always inside stopping.wait(), holding the event's lock, so setting the event from the
    # handler would wait for that lock forever. And it may never run at all: CPython 3.11 can
    # leave a signal noted while another thread took the GIL pending with nothing telling a main
    # thread that never waits to look (a hang in about one run in fifteen on a busy machine,
    # before the stop came through the signal wakeup fd). The stop must be noticed all the same.
    children, result = run_harness(
        {
            "children": {
                f"spin{i}": {
                    "target": "support.workers.spin_on_stopping",
                    "signal": {"when": ["ready"], "sig": "SIGTERM"},
                }
                for i in range(4)
            }
        }
    )
    for name, child in children.items():
        assert child["exitcode"] == 0, (name, result)
        assert child["messages"][-1]["kind"] == "stopped", (name, child["messages"][-1])


@pytest.mark.e2e
@pytest.mark.skipif(not hasattr(os, "fork"), reason="a forked copy needs os.fork")
def test_a_sigterm_to_a_process_forked_from_a_worker_does_not_stop_the_worker(tmp_path):
    # The copy shares the stop relay's pipe; its signals must stay its own.
    children, result = run_harness(
        {
            "children": {
                "w": {
                    "target": "support.workers.signal_a_fork",
                    "env": {"TESTWORKER_MARKER": str(tmp_path / "forked")},
                    "signal": {"when": "marker", "sig": "SIGTERM"},
                }
            }
        }
    )
    child = children["w"]
    assert child["exitcode"] == 0, result
    stopped = child["messages"][-1]
    assert stopped["kind"] == "stopped", stopped
    assert stopped["info"] == {"stopped_by_fork": False, "fork_status": 0}, stopped


# ---------------------------------------------------------------------------------------------
# The spec's early-import warning.
# ---------------------------------------------------------------------------------------------
@pytest.mark.e2e
def test_child_names_runtime_modules_the_launching_script_imported_at_module_scope(tmp_path):
    # spawn re-runs this script's module scope in the child, importing the worker module there
    # before the bootstrap starts: the child must say so.
    script = tmp_path / "launch_app.py"
    script.write_text(
        textwrap.dedent(
            """
        import json
        import support.workers  # module scope: runs again in every spawn child

        if __name__ == "__main__":
            import test_bootstrap
            config = {"children": {"w": {"target": "support.workers.ready_then_wait",
                                         "signal": {"when": ["ready"], "sig": "SIGTERM"}}}}
            print("RESULT:" + json.dumps(test_bootstrap._harness(config)))
        """
        )
    )
    env = clean_env(
        PYTHONPATH=os.pathsep.join([str(HERE), str(TESTS), str(REPO)]),
        PYTHONDONTWRITEBYTECODE="1",
    )
    proc = subprocess.run(
        [sys.executable, str(script)],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        cwd=str(tmp_path),
    )
    assert proc.returncode == 0, proc.stderr
    line = next(ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT:"))
    child = json.loads(line[len("RESULT:") :])["children"]["w"]
    assert child["exitcode"] == 0, child
    assert child["messages"][0]["early_imports"] == ["support"]
    warning = next(ln for ln in proc.stderr.splitlines() if "already imported" in ln)
    assert "support" in warning and 'if __name__ == "__main__":' in warning


# ---------------------------------------------------------------------------------------------
# Hooks are applied before ServerArgs and the worker are looked up: a REPLACE of either applies.
# ---------------------------------------------------------------------------------------------
REPLACING_PLUGIN = """
    import dataclasses

    from {api} import HookRegistry, HookType


    def replaced_worker(server_args, ctx):
        ctx.ready(replaced_by="{runtime}", args_class=type(server_args).__name__,
                  tuning=getattr(server_args, "tuning", None))
        ctx.stopping.wait()


    def register():
        from launchspec.server_args import ServerArgs

        @dataclasses.dataclass
        class TunedServerArgs(ServerArgs):
            tuning: str = "default"

        HookRegistry.register("launchspec.server_args.ServerArgs", TunedServerArgs, HookType.REPLACE)
        HookRegistry.register("support.workers.ready_then_wait", replaced_worker, HookType.REPLACE)
"""


@pytest.mark.e2e
@pytest.mark.parametrize("runtime", ["srt", "diffusion"])
def test_replace_hooks_reach_the_server_args_class_and_the_worker_target(site, runtime):
    group = "sglang.srt.plugins" if runtime == "srt" else "sglang.multimodal_gen.plugins"
    api = "hooks" if runtime == "srt" else "hooks.diffusion"
    make_dist(
        site,
        "tuning-plugin",
        {group: {"tuning": "tuning_plugin:register"}},
        {"tuning_plugin.py": REPLACING_PLUGIN.format(api=api, runtime=runtime)},
    )
    children, _ = run_harness(
        {
            # The supervisor loads the same plugins before it builds ServerArgs (srt), so its
            # payload carries the plugin's field.
            "load_plugins": runtime == "srt",
            "args": {"tuning": "fast"} if runtime == "srt" else {},
            "children": {
                "w": {
                    "target": "support.workers.ready_then_wait",
                    "runtime": runtime,
                    "signal": {"when": ["ready"], "sig": "SIGTERM"},
                },
            },
        },
        sites=[site],
    )
    child = children["w"]
    assert child["exitcode"] == 0, child
    info = next(m for m in child["messages"] if m["kind"] == "ready")["info"]
    assert info["replaced_by"] == runtime
    assert info["args_class"] == "TunedServerArgs"
    assert info["tuning"] == ("fast" if runtime == "srt" else "default")


# ---------------------------------------------------------------------------------------------
# Bad input to the API a supervisor and a worker use (in-process: no platform involved).
# ---------------------------------------------------------------------------------------------
def test_process_spec_and_worker_context_reject_bad_input_with_the_fix(tmp_path):
    import bootstrap

    with pytest.raises(ValueError, match="runtime is 'tpu'; use one of srt, diffusion"):
        bootstrap.ProcessSpec(
            role="scheduler",
            target="m.f",
            payload=b"",
            status_endpoint="x",
            args_class="m.Args",
            runtime="tpu",
        )
    with pytest.raises(
        TypeError, match="payload must be bytes from bootstrap.payload.encode_payload"
    ):
        bootstrap.ProcessSpec(
            role="scheduler", target="m.f", payload="text", status_endpoint="x", args_class="m.A"
        )
    spec = bootstrap.ProcessSpec(
        role="http", rank=3, target="m.f", payload=b"", status_endpoint="x", args_class="m.A"
    )
    assert spec.worker_id == "http.3" and spec.parent_pid == os.getpid()

    sent = []
    ctx = bootstrap.WorkerContext(
        role="scheduler",
        rank=5,
        local_rank=1,
        world_size=8,
        tp_size=4,
        dp_size=2,
        runtime_dir=str(tmp_path),
        ops_endpoint="",
        query_endpoint="",
        platform="builtin:cpu",
        _report=lambda *a: sent.append(a),
    )
    assert (ctx.tp_rank, ctx.dp_rank, ctx.worker_id) == (1, 1, "scheduler.5")
    assert ctx.endpoint("scheduler.0") == f"ipc://{tmp_path}/scheduler.0"
    with pytest.raises(ValueError, match="plain file name"):
        ctx.endpoint("../elsewhere")
    with pytest.raises(ValueError, match="shorter runtime directory"):
        ctx.endpoint("x" * 120)
    with pytest.raises(TypeError, match="JSON-able"):
        ctx.ready(handle=object())
    ctx.phase("model_loaded")
    ctx.ready(slots=4)
    with pytest.raises(RuntimeError, match="already reported ready; call ctx.ready\\(\\) once"):
        ctx.ready()
    assert [(kind, name) for kind, name, _, _ in sent] == [
        ("phase", "model_loaded"),
        ("ready", "ready"),
    ]
    assert sent[1][3] == {"slots": 4}
    no_dir = bootstrap.WorkerContext(
        role="http",
        rank=0,
        local_rank=0,
        world_size=1,
        tp_size=1,
        dp_size=1,
        runtime_dir="",
        ops_endpoint="",
        query_endpoint="",
        platform="builtin:cpu",
    )
    with pytest.raises(RuntimeError, match="no runtime directory"):
        no_dir.endpoint("a")
