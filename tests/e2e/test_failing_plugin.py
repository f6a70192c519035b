"""A general plugin that fails once the server serves, through the real CLI on a tiny generation
model (issue 42, points 1-4).

Two real plugins (dist-info distributions on the servers' ``PYTHONPATH``, group
``sglang.srt.plugins``, written with SGLang's names):

- ``myplug``: an ``AROUND`` hook on ``Scheduler.get_next_batch_to_run`` whose behaviour the test
  switches at run time through a file (``ok``, ``once``: raise on the next call only,
  ``alternate``: raise on every other call, ``raise``: raise on every call, ``block``: hang until
  the mode changes). Every call that is not ``ok`` is counted in another file.
- ``badreplace``: a ``REPLACE`` of the same target that returns a string.

One launch with ``--restart-policy on-failure`` (shared by the module's tests, in order) shows:
a failed step answers its requests with a 500 naming the plugin, its hook and the target, and
the scheduler serves on; a failure that repeats is logged once and counted; steps that keep
failing answer every request (queued ones too) within a deadline, turn ``/health`` 503 naming
the plugin, and get the replica restarted (``status``, the event stream); a step stuck in a hook
past ``--watchdog-timeout`` turns ``/health`` 503 naming the scheduler and how long its step has
run, and the replica is restarted again; failing once more past ``--max-restarts`` stops the
launch with exit 4 (the module's server ends there). A second launch, ``--restart-policy never`` with the
``REPLACE``, stops with exit 4 and a root-cause block naming the plugin's hook.
"""

from __future__ import annotations

import json
import subprocess
import threading
from pathlib import Path

import httpx
import pytest
from support import make_dist, wait_for
from support.serving import Server, build_tiny_llama, cli_command, server_env, start_server

pytestmark = pytest.mark.e2e

TARGET = "sglang.srt.managers.scheduler.Scheduler.get_next_batch_to_run"
NAMED = "the plugin 'myplug' (AROUND hook on Scheduler.get_next_batch_to_run)"
DEADLINE_S = 60.0  # every request is answered well within this (a hang waits for ever)
WATCHDOG_S = 3

MYPLUG = f"""
import os
import time
from pathlib import Path

from sglang.srt.plugins.hook_registry import HookRegistry, HookType

STATE = Path(os.environ["FAILING_PLUGIN_DIR"])
MODE, CALLS = STATE / "mode", STATE / "calls"
TURN = [0]


def mode():
    try:
        return MODE.read_text().strip() or "ok"
    except FileNotFoundError:
        return "ok"


def policy(original_fn, self, *args, **kwargs):
    now = mode()
    if now == "ok":
        return original_fn(self, *args, **kwargs)
    with CALLS.open("a") as calls:
        calls.write(f"{{os.getpid()}} {{now}}\\n")
    if now == "once":
        MODE.write_text("ok")
        raise RuntimeError("policy bug")
    if now == "raise":
        raise RuntimeError("policy bug")
    if now == "alternate":
        TURN[0] += 1
        if TURN[0] % 2:
            raise RuntimeError("policy bug")
    if now == "block":
        while mode() == "block":
            time.sleep(0.05)
    return original_fn(self, *args, **kwargs)


def register():
    HookRegistry.register({TARGET!r}, policy, HookType.AROUND)
"""

BADREPLACE = f"""
from sglang.srt.plugins.hook_registry import HookRegistry, HookType


def not_a_batch(self):
    return "not a batch"


def register():
    HookRegistry.register({TARGET!r}, not_a_batch, HookType.REPLACE)
"""


@pytest.fixture(scope="module")
def tiny_path(tmp_path_factory) -> Path:
    from launchspec.model_source import embedding_model_dir

    return build_tiny_llama(tmp_path_factory.mktemp("tiny") / "tiny-llama", embedding_model_dir())


@pytest.fixture(scope="module")
def plugin_env(tmp_path_factory) -> tuple[dict[str, str], Path]:
    root = tmp_path_factory.mktemp("failing-plugin")
    site, state = root / "site", root / "state"
    state.mkdir()
    make_dist(
        site,
        "myplug-dist",
        {"sglang.srt.plugins": {"myplug": "myplug_mod:register"}},
        {"myplug_mod.py": MYPLUG},
    )
    make_dist(
        site,
        "badreplace-dist",
        {"sglang.srt.plugins": {"badreplace": "badreplace_mod:register"}},
        {"badreplace_mod.py": BADREPLACE},
    )
    env = server_env(FAILING_PLUGIN_DIR=str(state))
    env["PYTHONPATH"] = f"{site}:{env['PYTHONPATH']}"
    return env, state


@pytest.fixture(scope="module")
def server(tiny_path, plugin_env, tmp_path_factory):
    env, state = plugin_env
    (state / "mode").write_text("ok")
    srv = start_server(
        [
            *("--model-path", str(tiny_path), "--max-input-tokens", "64"),
            *("--restart-policy", "on-failure", "--max-restarts", "2"),
            *("--restart-backoff", "0", "--watchdog-timeout", str(WATCHDOG_S)),
        ],
        tmp_path_factory.mktemp("failing-server"),
        "failing",
        env={**env, "SGLANG_PLUGINS": "myplug"},
    )
    yield srv, state
    srv.stop()


def set_mode(state: Path, mode: str) -> None:
    (state / "mode").write_text(mode)


def calls(state: Path) -> list[str]:
    path = state / "calls"
    return path.read_text().splitlines() if path.exists() else []


def generate(url: str, text: str = "hello", **extra) -> httpx.Response:
    body = {"text": text, "sampling_params": {"max_new_tokens": 4, "temperature": 0}, **extra}
    return httpx.post(url + "/generate", json=body, timeout=DEADLINE_S)


def stream(url: str, text: str = "hello") -> tuple[int, str]:
    body = {"text": text, "stream": True, "sampling_params": {"max_new_tokens": 4}}
    with httpx.stream("POST", url + "/generate", json=body, timeout=DEADLINE_S) as r:
        return r.status_code, r.read().decode()


def scheduler_pid(url: str) -> int:
    return httpx.get(url + "/get_server_info", timeout=30).json()["schedulers"][0]["pid"]


def status(pid: int) -> dict:
    out = subprocess.run(
        [*cli_command(), "status", "--json", "--pid", str(pid)],
        env=server_env(),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def scheduler_status(pid: int) -> dict:
    return next(w for w in status(pid)["workers"] if w["name"] == "scheduler.0")


def serving_again(url: str) -> httpx.Response:
    def served() -> httpx.Response | None:
        try:
            r = generate(url)
        except httpx.HTTPError:
            return None
        return r if r.status_code == 200 else None

    return wait_for(served, 180, "the restarted replica to serve", interval=0.2)


def test_a_hook_that_raises_once_fails_its_step_naming_the_plugin_and_the_scheduler_goes_on(
    server,
):
    srv, state = server
    with srv.log_on_failure():
        pid = scheduler_pid(srv.url)
        set_mode(state, "once")
        failed = generate(srv.url)
        assert failed.status_code == 500, failed.text
        message = failed.json()["error"]["message"]
        assert f"{NAMED} raised RuntimeError: policy bug" in message, message
        assert "the model failed" not in message
        assert generate(srv.url).status_code == 200
        assert scheduler_pid(srv.url) == pid  # the same process serves on
        assert httpx.get(srv.url + "/health", timeout=30).status_code == 200


def test_a_failure_that_repeats_is_logged_once_and_counted(server):
    srv, state = server
    with srv.log_on_failure():
        before = srv.log.count("policy bug")
        set_mode(state, "alternate")  # never two failed steps in a row: the scheduler goes on
        statuses = [generate(srv.url).status_code for _ in range(12)]
        set_mode(state, "ok")
        assert statuses.count(500) >= 6, statuses
        logged = srv.log.count("policy bug") - before
        # The first failure with its traceback (the error line and the message), no more.
        assert 1 <= logged <= 3, srv.log
        assert httpx.get(srv.url + "/health", timeout=30).status_code == 200


def test_failing_steps_then_a_stuck_step_restart_the_replica_until_its_restarts_run_out(
    server, tmp_path, request
):
    """Every restart in one test: a process a test starts is ended when it ends (conftest's
    orphan check), and a restarted scheduler is one. The module's server ends here."""
    request.node._leak_ok = True
    srv, state = server
    events = tmp_path / "events.jsonl"
    with srv.log_on_failure(), events.open("w") as out:
        follower = subprocess.Popen(
            [*cli_command(), "events", "--follow", "--pid", str(srv.proc.pid)],
            env=server_env(),
            stdout=out,
            stderr=subprocess.STDOUT,
        )
        try:
            _keep_failing(srv, state)
            wait_for(lambda: "replica.ready" in events.read_text(), 60, "the replica.ready event")
        finally:
            follower.kill()
            follower.wait(10)
    seen = [json.loads(line) for line in events.read_text().splitlines() if line.startswith("{")]
    failed = [e for e in seen if e.get("kind") == "worker.failed"]
    assert failed and NAMED in failed[0]["error"]["message"], failed
    restarting = [e for e in seen if e.get("kind") == "replica.restarting"]
    assert restarting and "myplug" in restarting[0]["cause"], restarting
    assert srv.log.count("policy bug") < 30, srv.log  # bounded, whatever the number of steps
    with srv.log_on_failure():
        _stuck_step(srv, state)
        _past_max_restarts(srv, state)


def _keep_failing(srv: Server, state: Path) -> None:
    """Steps fail until the scheduler gives up: every request is answered naming the plugin,
    /health turns 503 naming it, and the replica is restarted (``status`` says why)."""
    pid = scheduler_pid(srv.url)
    set_mode(state, "raise")
    answers: list[tuple[int, str]] = []
    lock = threading.Lock()

    def one(i: int) -> None:
        try:
            got = stream(srv.url, f"hello {i}") if i % 2 else _plain(generate(srv.url))
        except httpx.HTTPError as exc:  # a request that hangs times out here
            got = (0, repr(exc))
        with lock:
            answers.append(got)

    # Waves of concurrent requests (streams and not) until the scheduler gives up: every
    # one is answered, queued ones included, and names the plugin.
    def unhealthy() -> httpx.Response | None:
        threads = [threading.Thread(target=one, args=(i,), daemon=True) for i in range(6)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(DEADLINE_S + 5)
        r = httpx.get(srv.url + "/health", timeout=30)
        return r if r.status_code == 503 else None

    health = wait_for(unhealthy, 120, "/health to turn 503", interval=0)
    set_mode(state, "ok")  # the restarted replica serves
    reason = health.json()["reason"]
    assert "5 steps in a row failed; the last: " + NAMED in reason, reason
    for code, text in answers:
        assert code in (200, 500, 503), (code, text)  # a stream's error comes as an event
        assert "myplug" in text, text
    assert any(code == 500 for code, _ in answers)

    # No tight loop: at most FAILED_STEPS_LIMIT (5) steps of that process ran the hook.
    raised = [line for line in calls(state) if line == f"{pid} raise"]
    assert 1 <= len(raised) <= 5, raised

    serving_again(srv.url)
    assert scheduler_pid(srv.url) != pid
    worker = scheduler_status(srv.proc.pid)
    assert worker["restarts"] >= 1, worker
    assert NAMED in worker["restart_cause"], worker
    text = subprocess.run(
        [*cli_command(), "status", "--pid", str(srv.proc.pid)],
        env=server_env(),
        capture_output=True,
        text=True,
        timeout=60,
    ).stdout
    assert "scheduler.0 restarted 1x, the last time after: scheduler.0 is unhealthy" in text, text


def _stuck_step(srv: Server, state: Path) -> None:
    """A step stuck in a hook past --watchdog-timeout: /health turns 503 naming the scheduler and
    how long its step has run, the held request is answered, the replica is restarted."""
    pid = scheduler_pid(srv.url)
    restarts = scheduler_status(srv.proc.pid)["restarts"]
    set_mode(state, "block")
    held = threading.Thread(target=lambda: _quietly(generate, srv.url), daemon=True)
    held.start()

    def health_503() -> dict | None:
        r = httpx.get(srv.url + "/health", timeout=30)
        return r.json() if r.status_code == 503 else None

    body = wait_for(health_503, 60, "/health to turn 503 on the stuck step", interval=0.2)
    set_mode(state, "ok")
    reason = body["reason"]
    assert "scheduler.0's step has run for" in reason, reason
    assert f"past --watchdog-timeout {WATCHDOG_S}s" in reason, reason
    held.join(DEADLINE_S)
    assert not held.is_alive()  # the held request was answered
    serving_again(srv.url)
    assert scheduler_pid(srv.url) != pid
    assert scheduler_status(srv.proc.pid)["restarts"] == restarts + 1


def _past_max_restarts(srv: Server, state: Path) -> None:
    """The plugin fails again after the replica's --max-restarts (2) restarts: the launch stops
    with exit 4 and a root cause naming the hook and saying the restarts ran out."""
    set_mode(state, "raise")

    def ended() -> bool:
        try:
            generate(srv.url)
        except httpx.HTTPError:  # the server is going away
            pass
        return srv.proc.poll() is not None

    wait_for(ended, 120, "the launch to stop once the restarts ran out", interval=0)
    assert srv.proc.returncode == 4, srv.log
    block = srv.log[srv.log.index("sglang-launch: scheduler.0 is unhealthy") :]
    assert NAMED in block.splitlines()[0], block
    assert "was restarted 2 time(s) already (--max-restarts 2)" in block, block


def test_a_replace_returning_a_string_stops_the_launch_with_exit_4_naming_the_hook(
    tiny_path, plugin_env, tmp_path
):
    env, _ = plugin_env
    srv = start_server(
        [*("--model-path", str(tiny_path), "--restart-policy", "never")],
        tmp_path,
        "never",
        env={**env, "SGLANG_PLUGINS": "badreplace"},
    )
    try:
        with srv.log_on_failure():
            named = "the plugin 'badreplace' (REPLACE hook on Scheduler.get_next_batch_to_run)"
            answers = []
            while srv.proc.poll() is None and len(answers) < 40:
                try:
                    r = generate(srv.url)
                except httpx.HTTPError:  # the HTTP child is stopping
                    break
                answers.append((r.status_code, r.text))
            assert answers and all(code in (500, 503) for code, _ in answers), answers
            assert named in answers[0][1], answers[0]
            assert "returned str 'not a batch', not a batch" in answers[0][1], answers[0]
            assert srv.wait_exit(60) == 4
    finally:
        srv.stop()
    log = srv.log
    block = log[log.index("sglang-launch: scheduler.0 is unhealthy") :]
    assert named in block.splitlines()[0], block
    assert "WorkerUnhealthy" in block and "what to do:" in block, block
    assert "process:    still running (stopped by the launcher)" in block, block


def _plain(r: httpx.Response) -> tuple[int, str]:
    return r.status_code, r.text


def _quietly(fn, *args) -> None:
    try:
        fn(*args)
    except httpx.HTTPError:
        pass
