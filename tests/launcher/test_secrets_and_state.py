"""The API key stays secret, and launchers sharing a state directory never trip over each other.

Real ``sglang-launch`` processes: the real serving runtime (the embedded default model) for the
key's effect on HTTP, test workers for the rest; real ``/proc/<pid>/cmdline`` and ``environ``
reads, real state files, real ``status`` / ``events`` commands, and real PID namespaces
(``unshare --pid --fork --mount-proc``, where this machine allows it).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import httpx
import psutil
import pytest
from support import REPO, clean_env, free_port, kill_tree, wait_for
from support.serving import server_env, start_server
from support.supervisor import FAST, READY_WAIT, TESTS, Run, short_runtime_dir

pytestmark = pytest.mark.e2e

KEY = "s3cret-key-0123456789"
BASIC = [*FAST, "--scheduler-target", READY_WAIT, "--http-target", READY_WAIT]


def _texts_of_the_launch(root_pid: int, state_dir: Path) -> dict[str, str]:
    """Everything another local user, an operator or a log could read about the launch."""
    texts = {}
    root = psutil.Process(root_pid)
    for proc in [root, *root.children(recursive=True)]:
        texts[f"cmdline {proc.pid}"] = " ".join(proc.cmdline())
    for path in state_dir.rglob("*"):
        if path.is_file():
            texts[str(path)] = path.read_text(errors="replace")
    return texts


def _assert_key_nowhere(texts: dict[str, str]) -> None:
    leaks = [where for where, text in texts.items() if KEY in text]
    assert not leaks, f"the API key shows in {leaks}"


@pytest.mark.parametrize("source", ["file", "environment"])
def test_the_key_from_a_file_or_the_environment_guards_the_api_and_shows_nowhere(tmp_path, source):
    runtime_dir = short_runtime_dir()
    args, extra = [], {"XDG_RUNTIME_DIR": runtime_dir}
    if source == "file":
        key_file = tmp_path / "key"
        key_file.write_text(KEY + "\n")
        key_file.chmod(0o600)
        args = ["--api-key-file", str(key_file)]
    else:
        extra["SGLANG_API_KEY"] = KEY
    env = server_env(**extra)
    server = start_server(
        args, tmp_path, "keyed", headers={"Authorization": f"Bearer {KEY}"}, env=env
    )
    try:
        body = {"input": "hello"}
        assert httpx.post(server.url + "/v1/embeddings", json=body, timeout=60).status_code == 401
        ok = httpx.post(
            server.url + "/v1/embeddings",
            json=body,
            timeout=60,
            headers={"Authorization": f"Bearer {KEY}"},
        )
        assert ok.status_code == 200, ok.text
        info = httpx.get(
            server.url + "/get_server_info", timeout=30, headers={"Authorization": f"Bearer {KEY}"}
        )
        texts = _texts_of_the_launch(server.proc.pid, Path(runtime_dir))
        texts["/get_server_info"] = info.text

        def run(*a: str) -> subprocess.CompletedProcess:
            return subprocess.run(
                [sys.executable, "-m", "launcher", *a],
                env=env,
                cwd=str(REPO),
                capture_output=True,
                text=True,
                timeout=60,
            )

        status, events = run("status", "--json"), run("events")
        assert status.returncode == 0 and events.returncode == 0, (status.stderr, events.stderr)
        texts["status"], texts["events"] = status.stdout, events.stdout
        _assert_key_nowhere(texts)
        assert "visible to every local user" not in server.log
    finally:
        server.stop()
        shutil.rmtree(runtime_dir, ignore_errors=True)


def test_a_key_on_the_command_line_warns_and_stays_out_of_the_state_file():
    with Run([*BASIC, "--port", str(free_port()), "--api-key", KEY]) as run:
        run.wait_ready()
        assert "--api-key on the command line is visible to every local user" in run.stderr
        assert "--api-key-file" in run.stderr and "SGLANG_API_KEY" in run.stderr
        state = json.loads(next(Path(run.runtime_dir, "sglang-launch").glob("*.json")).read_text())
        assert "--api-key" in state["argv"] and "***" in state["argv"]
        _assert_key_nowhere(
            {
                "state dir": json.dumps(state),
                "status": run.cli("status", "--json").stdout,
                "events": run.cli("events").stdout,
            }
        )
        os.kill(run.pid, signal.SIGTERM)
        assert run.wait(60) == 0, run


@pytest.mark.parametrize("case", ["missing", "empty", "both"])
def test_an_unusable_key_source_is_a_usage_error(tmp_path, case):
    key_file = tmp_path / "key"
    if case == "empty":
        key_file.write_text("\n")
    extra = ["--api-key", KEY] if case == "both" else []
    if case == "both":
        key_file.write_text(KEY)
    with Run([*BASIC, "--port", str(free_port()), "--api-key-file", str(key_file), *extra]) as run:
        assert run.wait(60) == 2, run
        expected = {"missing": "cannot read it", "empty": "is empty", "both": "were both given"}[
            case
        ]
        assert expected in run.stderr and "--api-key-file" in run.stderr, run
        assert "Traceback" not in run.stderr
        run.assert_nothing_left()


# -- the state directory ------------------------------------------------------------------------
def _launch_without_xdg(tmp_path: Path) -> tuple[subprocess.Popen, dict]:
    env = clean_env(
        XDG_RUNTIME_DIR=None,
        TMPDIR=str(tmp_path / "tmp"),
        HOME=str(tmp_path / "home"),
        PYTHONPATH=os.pathsep.join([str(REPO), str(TESTS)]),
        PYTHONDONTWRITEBYTECODE="1",
    )
    err = open(tmp_path / "stderr.txt", "w")
    proc = subprocess.Popen(
        [sys.executable, "-m", "launcher", *BASIC, "--port", str(free_port())],
        env=env,
        cwd=str(REPO),
        stdout=subprocess.DEVNULL,
        stderr=err,
    )
    err.close()
    return proc, env


def _status(env: dict) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "launcher", "status", "--json"],
        env=env,
        cwd=str(REPO),
        capture_output=True,
        text=True,
        timeout=60,
    )


@pytest.mark.skipif(os.geteuid() != 0, reason="making a directory owned by another user needs root")
@pytest.mark.parametrize("hostile", ["another user's directory", "a symlink"])
def test_a_hostile_shared_tmp_path_is_avoided(hostile):
    tmp_path = Path(short_runtime_dir())  # short: unix socket paths live under it
    try:
        _hostile_tmp(tmp_path, hostile)
    finally:
        shutil.rmtree(tmp_path, ignore_errors=True)


def _hostile_tmp(tmp_path: Path, hostile: str) -> None:
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    tmp.chmod(0o1777)
    taken = tmp / f"sglang-launch-{os.getuid()}"
    if hostile == "a symlink":
        (tmp_path / "elsewhere").mkdir()
        taken.symlink_to(tmp_path / "elsewhere")
    else:
        taken.mkdir()
        os.chown(taken, 65534, 65534)
    proc, env = _launch_without_xdg(tmp_path)
    try:

        def ready():
            assert proc.poll() is None, (tmp_path / "stderr.txt").read_text()
            result = _status(env)
            return (
                result.returncode == 0 and json.loads(result.stdout)["phase"] == "ready" and result
            )

        wait_for(ready, 120, "the launcher to be ready")
        stderr = (tmp_path / "stderr.txt").read_text()
        assert f"not using {taken}" in stderr and "sglang-launch-run" in stderr, stderr
        fallback = tmp_path / "home" / ".cache" / "sglang-launch-run"
        assert (fallback.stat().st_mode & 0o777) == 0o700 and list(fallback.glob("*.json"))
        assert not list((tmp_path / "elsewhere").iterdir()) if hostile == "a symlink" else True
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(60) == 0, (tmp_path / "stderr.txt").read_text()
        assert not list(fallback.iterdir())
    finally:
        if proc.poll() is None:
            kill_tree(
                [psutil.Process(proc.pid), *psutil.Process(proc.pid).children(recursive=True)]
            )
            proc.wait(10)


def test_a_hostile_xdg_runtime_dir_is_refused_naming_the_fix(tmp_path):
    xdg = Path(short_runtime_dir())
    try:
        (xdg / "sglang-launch").symlink_to(tmp_path)
        with Run([*BASIC, "--port", str(free_port())], runtime_dir=str(xdg)) as run:
            assert run.wait(60) == 5, run
            assert (
                "is a symbolic link" in run.stderr
                and "set XDG_RUNTIME_DIR to a private directory" in run.stderr
            )
            assert "Traceback" not in run.stderr
    finally:
        shutil.rmtree(xdg, ignore_errors=True)


def _can_unshare() -> bool:
    if not shutil.which("unshare"):
        return False
    return (
        subprocess.run(
            ["unshare", "--pid", "--fork", "--mount-proc", "true"], capture_output=True
        ).returncode
        == 0
    )


def _query_snapshot(state: dict) -> dict | None:
    from launcher.query import QueryError, query

    try:
        return query(state["query_endpoint"], {"query": "snapshot"}, timeout=5)["snapshot"]
    except QueryError:
        return None


@pytest.mark.skipif(
    not _can_unshare(), reason="needs unshare --pid --fork --mount-proc (root or user namespaces)"
)
def test_two_launchers_that_are_both_pid_1_share_a_state_directory():
    runtime_dir = short_runtime_dir()
    base = Path(runtime_dir) / "sglang-launch"
    runs = []
    try:
        for _ in range(2):
            runs.append(
                Run(
                    [*BASIC, "--port", str(free_port())],
                    runtime_dir=runtime_dir,
                    command=[
                        "unshare",
                        "--pid",
                        "--fork",
                        "--mount-proc",
                        sys.executable,
                        "-m",
                        "launcher",
                    ],
                )
            )

            def all_ready(count=len(runs)):  # noqa: B008 - this round's count, bound now
                states = [json.loads(p.read_text()) for p in base.glob("*.json")]
                snaps = [_query_snapshot(s) for s in states]
                return (
                    len(states) == count
                    and all(s and s["phase"] == "ready" for s in snaps)
                    and states
                )

            states = wait_for(
                all_ready, 120, f"{len(runs)} launcher(s) ready\n" + "\n".join(map(str, runs))
            )
        assert [s["pid"] for s in states] == [1, 1], "each launcher is pid 1 of its own namespace"
        assert len({s["runtime_dir"] for s in states}) == 2

        # Stop the first: the second's directory, state file and lock are untouched, and it serves on.
        first = psutil.Process(runs[0].pid).children()[0]  # the launcher, pid 1 inside
        first.send_signal(signal.SIGTERM)
        assert runs[0].wait(60) == 0, runs[0]
        left = [json.loads(p.read_text()) for p in base.glob("*.json")]
        assert len(left) == 1 and Path(left[0]["runtime_dir"]).is_dir()
        assert _query_snapshot(left[0])["phase"] == "ready"
        assert len(list(base.glob("*.lock"))) == 1
        psutil.Process(runs[1].pid).children()[0].send_signal(signal.SIGTERM)
        assert runs[1].wait(60) == 0, runs[1]
        assert not list(base.iterdir()), list(base.iterdir())
    finally:
        for run in runs:
            run.stop()
        shutil.rmtree(runtime_dir, ignore_errors=True)


def test_no_worker_inherits_the_key_from_the_environment():
    """``SGLANG_API_KEY`` reaches the workers in their spawn payload alone: no worker, and nothing
    a worker starts, finds it in its environment (``/proc/<pid>/environ``)."""
    args = [*FAST, "--port", str(free_port()), "--http-target", "support.workers.report_args"]
    args += ["--scheduler-target", "support.workers.spawn_descendants"]
    with Run(args, env={"SGLANG_API_KEY": KEY}) as run:
        snap = run.wait_ready()
        http = next(w for w in snap["workers"] if w["role"] == "http")
        assert http["info"]["fields"]["api_key"] == KEY  # the payload carries it
        scheduler = next(w for w in snap["workers"] if w["role"] == "scheduler")
        pids = [
            http["pid"],
            scheduler["pid"],
            *(scheduler["info"][k] for k in ("child", "detached")),
        ]
        for pid in pids:
            assert "SGLANG_API_KEY" not in psutil.Process(pid).environ(), pid
        assert psutil.Process(run.pid).environ()["SGLANG_API_KEY"] == KEY  # the launcher's own
        os.kill(run.pid, signal.SIGTERM)
        assert run.wait(60) == 0, run
        run.assert_nothing_left()
