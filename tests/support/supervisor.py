"""Shared parts of the supervisor, CLI and Launcher tests (this module holds no tests).

- ``Run``: a real ``sglang-launch`` supervisor process (``python -m launcher``) with its own
  private ``XDG_RUNTIME_DIR``, its output in files, and a tag in its environment that every
  process of the launch inherits, so ``leftovers()`` finds any of them with psutil, even one
  re-parented away from the test's process tree.
- ``fault_site``: a real installed distribution (dist-info on ``PYTHONPATH``) shipping a platform
  plugin and a general plugin of the same distribution that fail on purpose, in the process
  chosen by ``FAULT_RANK`` (a scheduler rank, or ``launcher`` for the supervisor itself):
  ``FAULT=init_backend|plugin_import|hook_apply|args_class|not_in_child`` (the last: the
  platform does not activate in that child, so it cannot select what the supervisor selected).
- ``kill_self_once_seen``, ``exit_once_seen_ready``: workers that die without a report once the
  supervisor has seen them reach a phase (so the test does not depend on message timing);
  ``exit_right_after_ready``: the last worker to report ready, which dies the instant after.
- ``allreduce_worker``: a worker target that joins the torch.distributed group of the launch with
  the platform's backend, all-reduces its rank + 1 and reports the sum in ready info.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import psutil

from support import REPO, clean_env, make_dist, wait_for

TESTS = Path(__file__).resolve().parents[1]
TAG = "SGLANG_LAUNCH_TEST_TAG"
FAST = ["--startup-timeout", "60", "--stop-grace-period", "5"]
READY_WAIT = "support.workers.ready_then_wait"


def short_runtime_dir() -> str:
    """A private XDG_RUNTIME_DIR short enough for unix socket paths."""
    return tempfile.mkdtemp(prefix="sgl")


class Run:
    """One ``sglang-launch`` process; ``stop()`` (or the context manager) leaves nothing behind."""

    def __init__(
        self,
        args: list[str],
        *,
        sites=(),
        env: dict | None = None,
        runtime_dir: str | None = None,
        command: list[str] | None = None,
        stderr=None,
    ) -> None:
        self.tag = uuid.uuid4().hex
        self.runtime_dir = runtime_dir or short_runtime_dir()
        self.out_path = Path(self.runtime_dir) / "stdout.txt"
        self.err_path = Path(self.runtime_dir) / "stderr.txt"
        environ = clean_env(**(env or {}))
        environ["PYTHONPATH"] = os.pathsep.join([*map(str, sites), str(REPO), str(TESTS)])
        environ["XDG_RUNTIME_DIR"] = self.runtime_dir
        environ[TAG] = self.tag
        environ.setdefault("PYTHONDONTWRITEBYTECODE", "1")
        self.env = environ
        cmd = command or [sys.executable, "-m", "launcher"]
        with open(self.out_path, "w") as out, open(self.err_path, "w") as err:
            self.proc = subprocess.Popen(
                [*cmd, *args],
                stdout=out,
                stderr=err if stderr is None else stderr,
                env=environ,
                cwd=str(REPO),
            )

    @property
    def pid(self) -> int:
        return self.proc.pid

    @property
    def stdout(self) -> str:
        return self.out_path.read_text()

    @property
    def stderr(self) -> str:
        return self.err_path.read_text()

    def __str__(self) -> str:
        return f"rc={self.proc.returncode}\n--- stdout\n{self.stdout}\n--- stderr\n{self.stderr}"

    def wait(self, timeout: float = 120) -> int:
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"sglang-launch did not exit within {timeout}s\n{self}") from None

    def ask(self, request: dict) -> dict:
        """The launcher's answer to ``request`` on its query socket (``NoLauncherError`` or
        ``QueryError`` when there is none)."""
        from launcher.query import query
        from launcher.supervisor.rundir import find_launcher

        old = os.environ.get("XDG_RUNTIME_DIR")
        os.environ["XDG_RUNTIME_DIR"] = self.runtime_dir
        try:
            state = find_launcher(self.pid)
            return query(state["query_endpoint"], request, timeout=5)
        finally:
            if old is None:
                del os.environ["XDG_RUNTIME_DIR"]
            else:
                os.environ["XDG_RUNTIME_DIR"] = old

    def snapshot(self) -> dict | None:
        """The launcher's status snapshot through its query socket, or None if not up yet."""
        from launcher.query import QueryError
        from launcher.supervisor.rundir import NoLauncherError

        try:
            return self.ask({"query": "snapshot"})["snapshot"]
        except (NoLauncherError, QueryError):
            return None

    def history(self) -> list[dict]:
        """Every event the launcher published so far (the query socket keeps them)."""
        return self.ask({"query": "events", "after": 0})["events"]

    def wait_ready(self, timeout: float = 120) -> dict:
        def ready():
            if self.proc.poll() is not None:
                raise AssertionError(f"sglang-launch exited before it was ready\n{self}")
            snap = self.snapshot()
            return snap if snap and snap["phase"] == "ready" else None

        return wait_for(ready, timeout, f"the launcher to be ready\n{self}", interval=0.1)

    def cli(self, *args: str, timeout: float = 60) -> subprocess.CompletedProcess:
        """Run another ``sglang-launch`` command against this launcher's runtime directory."""
        return subprocess.run(
            [sys.executable, "-m", "launcher", *args],
            env=self.env,
            cwd=str(REPO),
            capture_output=True,
            text=True,
            timeout=timeout,
        )

    def leftovers(self) -> list[psutil.Process]:
        """Every live process carrying this launch's tag (the supervisor itself excluded)."""
        found = []
        for proc in psutil.process_iter():
            if proc.pid in (os.getpid(), self.pid):
                continue
            try:
                if proc.environ().get(TAG) == self.tag and proc.status() != psutil.STATUS_ZOMBIE:
                    found.append(proc)
            except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
                continue
        return found

    def assert_nothing_left(self, timeout: float = 10) -> None:
        wait_for(
            lambda: not self.leftovers(), timeout, f"every process of the launch to be gone\n{self}"
        )

    def stop(self) -> None:
        """Kill whatever is left of the launch (cleanup after a failing test)."""
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)
        for proc in self.leftovers():
            try:
                proc.kill()
            except psutil.NoSuchProcess:
                pass

    def __enter__(self) -> Run:
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


# -- the fault-injection plugin ------------------------------------------------------------------
FAULT_MODULES = {
    "fault_plugin/__init__.py": """
        import os

        def hit(kind):
            '''True in the process that FAULT_RANK picks (a scheduler rank, or "launcher").'''
            return os.environ.get("FAULT") == kind and os.environ.get("RANK", "launcher") == os.environ.get("FAULT_RANK", "1")

        def activate():
            if "FAULT" not in os.environ or hit("not_in_child"):
                return None
            return "fault_plugin.platform.FaultPlatform"
    """,
    "fault_plugin/platform.py": """
        from platforms import PlatformEnum
        from platforms.builtin.cpu import CpuSRTPlatform
        from fault_plugin import hit

        class FaultPlatform(CpuSRTPlatform):
            _enum = PlatformEnum.OOT
            device_name = "fault"

            def init_backend(self):
                if hit("init_backend"):
                    raise RuntimeError("fault plugin: init_backend failed on purpose")
    """,
    "fault_plugin/hooks.py": """
        from fault_plugin import hit

        if hit("plugin_import"):
            raise ImportError("fault plugin: this plugin module cannot be imported (on purpose)")

        def register():
            from hooks import HookRegistry, HookType
            if hit("hook_apply"):
                HookRegistry.register("launchspec.server_args.NoSuchClass.method", lambda *a, **k: None, HookType.BEFORE)
            if hit("args_class"):
                # Only the supervisor adds a field: the children cannot decode its payload.
                import dataclasses
                from launchspec.server_args import ServerArgs

                @dataclasses.dataclass
                class FaultArgs(ServerArgs):
                    fault_extra: int = 1

                HookRegistry.register("launchspec.server_args.ServerArgs", FaultArgs, HookType.REPLACE)
    """,
}


def fault_site(root: Path) -> Path:
    site = root / "fault-site"
    make_dist(
        site,
        "fault-platform",
        entry_points={
            "sglang.srt.platforms": {"fault": "fault_plugin:activate"},
            "sglang.srt.plugins": {"fault": "fault_plugin.hooks:register"},
        },
        modules=FAULT_MODULES,
    )
    return site


# -- worker targets -------------------------------------------------------------------------------
def allreduce_worker(server_args, ctx) -> None:
    """Join the launch's process group with the platform's backend and all-reduce rank + 1."""
    import torch
    import torch.distributed as dist

    from platforms import current_platform

    backend = current_platform.get_torch_distributed_backend_str()
    dist.init_process_group(
        backend=backend, init_method="env://", rank=ctx.rank, world_size=ctx.world_size
    )
    try:
        value = torch.tensor([float(ctx.rank + 1)])
        dist.all_reduce(value)
        ctx.ready(rank=ctx.rank, world_size=ctx.world_size, backend=backend, sum=value.item())
        ctx.stopping.wait()
    finally:
        dist.destroy_process_group()


def _workers_seen(ctx) -> list[dict]:
    """The workers of the supervisor's snapshot, asked through its query socket from a worker
    (an empty list when it did not answer within 10 s)."""
    return _snapshot_seen(ctx).get("workers", [])


def _snapshot_seen(ctx) -> dict:
    """The supervisor's snapshot, asked through its query socket from a worker (empty when it
    did not answer within 10 s)."""
    import json

    import zmq

    zctx = zmq.Context()
    try:
        sock = zctx.socket(zmq.REQ)
        sock.setsockopt(zmq.LINGER, 0)
        sock.connect(ctx.query_endpoint)
        sock.send(b'{"query": "snapshot"}')
        reply = json.loads(sock.recv()) if sock.poll(10_000) else {}
        sock.close()
        return reply.get("snapshot", {})
    finally:
        zctx.term()


def _wait_until_seen(ctx, phase: str) -> None:
    """Wait until the supervisor's snapshot shows this worker at ``phase``.

    Status messages travel asynchronously: a process that dies the instant after reporting may
    take unsent messages with it. A test that needs the supervisor to have seen a phase before the
    worker dies asks the supervisor's query socket instead of sleeping.
    """
    while not any(w["name"] == ctx.worker_id and w["phase"] == phase for w in _workers_seen(ctx)):
        time.sleep(0.01)


def _others_seen_ready(ctx) -> None:
    """Wait until the supervisor's snapshot shows every other worker ready."""
    while True:
        others = [w for w in _workers_seen(ctx) if w["name"] != ctx.worker_id]
        if others and all(w["phase"] == "ready" for w in others):
            return
        time.sleep(0.01)


def exit_right_after_ready(server_args, ctx) -> None:
    """Once every other worker is ready, report ready and die that instant (``os._exit(3)``)."""
    _others_seen_ready(ctx)
    ctx.ready()
    os._exit(3)


def kill_self_once_seen(server_args, ctx) -> None:
    """SIGKILL itself while starting, once the supervisor saw it import its target."""
    _wait_until_seen(ctx, "worker_imported")
    os.kill(os.getpid(), signal.SIGKILL)


def exit_once_seen_ready(server_args, ctx) -> None:
    """Report ready, and once the supervisor saw the whole server ready (every worker), die with
    ``os._exit(3)`` (no report)."""
    ctx.ready()
    while _snapshot_seen(ctx).get("phase") != "ready":
        time.sleep(0.01)
    os._exit(3)
