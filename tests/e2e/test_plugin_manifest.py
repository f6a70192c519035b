"""Every worker reports what it really has of platform and plugins, and a worker whose plugins
differ from its peers' is named.

A real general plugin (a dist-info distribution on the servers' ``PYTHONPATH``) hooks two
functions of its own module: one exists in every process, the other not in the scheduler whose
``RANK`` is 1, so there that hook fails to apply (a plugin of no platform: logged, start-up goes
on). A launch with ``--dp-size 2`` on the embedded model, then: ``status --json`` holds each
worker's manifest (the platform, the plugin and its distribution, each hook applied or failed);
``plugins --running`` shows them side by side and marks the difference; ``/ready`` and
``/get_server_info`` say so; the ready events carry the manifests.
"""

from __future__ import annotations

import json
import subprocess

import httpx
import pytest
from support import make_dist, wait_for
from support.serving import cli_command, server_env, start_server

pytestmark = pytest.mark.e2e

PLUGIN = """
import os

from hooks import HookType, plugin_hook


def everywhere():
    return "here"


if os.environ.get("RANK") != "1":

    def not_on_rank_one():
        return "here"


def register():
    plugin_hook(__name__ + ".everywhere", type=HookType.AFTER)(lambda result: None)
    plugin_hook(__name__ + ".not_on_rank_one", type=HookType.AFTER)(lambda result: None)
"""


def test_workers_report_their_manifests_and_the_odd_one_is_named(site, tmp_path):
    make_dist(
        site,
        "watch-plugin",
        {"sglang.srt.plugins": {"watch": "watch_plugin:register"}},
        {"watch_plugin.py": PLUGIN},
        version="1.2.3",
    )
    env = server_env()
    env["PYTHONPATH"] = f"{site}:{env['PYTHONPATH']}"
    server = start_server(["--dp-size", "2"], tmp_path, "manifest", env=env)
    try:

        def status() -> dict:
            done = subprocess.run(
                [*cli_command(), "status", "--json", "--pid", str(server.proc.pid)],
                capture_output=True,
                text=True,
                env=env,
                timeout=60,
            )
            assert done.returncode == 0, done.stderr
            return {w["name"]: w for w in json.loads(done.stdout)["workers"]}

        # /ready answers once the schedulers do; a worker's manifest comes with its ready
        # report to the supervisor, which may be a moment behind.
        workers: dict = {}
        wait_for(
            lambda: all(w["manifest"] for w in workers.update(status()) or workers.values()),
            60,
            "every worker's ready report (with its manifest)",
        )
        assert set(workers) == {"http.0", "scheduler.0", "scheduler.1"}
        for name, worker in workers.items():
            manifest = worker["manifest"]
            assert manifest["platform"]["key"] == "builtin:cpu", name
            plugin = next(p for p in manifest["plugins"] if p["name"] == "watch")
            assert (plugin["distribution"], plugin["version"], plugin["status"]) == (
                "watch-plugin",
                "1.2.3",
                "loaded",
            ), name
            hooks = {h["target"]: h for h in manifest["hooks"]}
            everywhere = hooks["watch_plugin.everywhere"]
            assert (everywhere["distribution"], everywhere["type"]) == ("watch-plugin", "AFTER")
            expected = "failed" if name == "scheduler.1" else "applied"
            assert everywhere["state"] == expected, (name, everywhere)
        # On rank 1 one hook cannot apply, and the plugin's hooks go with it (not a platform's
        # plugin: logged, start-up goes on).
        odd = {h["target"]: h for h in workers["scheduler.1"]["manifest"]["hooks"]}
        assert odd["watch_plugin.not_on_rank_one"]["state"] == "failed"
        assert "not_on_rank_one" in odd["watch_plugin.not_on_rank_one"]["error"]
        assert odd["watch_plugin.everywhere"]["error"].startswith("discarded with its plugin")
        # Whichever scheduler was ready second is named, with what differs from the other.
        named = [n for n in ("scheduler.0", "scheduler.1") if workers[n]["manifest_differs"]]
        assert len(named) == 1, workers
        differs = workers[named[0]]["manifest_differs"]
        assert any("watch_plugin.not_on_rank_one" in d for d in differs), differs

        running = subprocess.run(
            [*cli_command(), "plugins", "--pid", str(server.proc.pid)],
            capture_output=True,
            text=True,
            env=env,
            timeout=60,
        )
        assert running.returncode == 0, running.stderr
        schedulers = running.stdout.split("scheduler workers:", 1)[1]
        line = next(ln for ln in schedulers.splitlines() if "not_on_rank_one" in ln)
        assert line.lstrip().startswith("*") and "applied" in line and "failed" in line, line
        assert f"{named[0]} differs:" in running.stdout

        ready = httpx.get(server.url + "/ready", timeout=30).json()
        assert ready["ready"] is True
        assert any(d.startswith(f"{named[0]}: ") for d in ready["plugins_differ"]), ready
        info = httpx.get(server.url + "/get_server_info", timeout=30).json()
        assert {w["name"] for w in info["workers"]} == set(workers)
        assert all(w["manifest"]["platform"]["key"] == "builtin:cpu" for w in info["workers"])

        from launcher.query import find_launcher, query

        found = find_launcher(server.proc.pid)
        history = query(found["query_endpoint"], {"query": "events", "after": 0})["events"]
        ready_events = [e for e in history if e.get("kind") == "worker.ready"]
        assert {e["worker"] for e in ready_events} == set(workers), history
        assert all(e["manifest"]["platform"]["key"] == "builtin:cpu" for e in ready_events)
    finally:
        server.stop()
