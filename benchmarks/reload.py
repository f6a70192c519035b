"""Reload benchmark: what replacing the replicas of a serving launch costs, side by side.

1. Time per replica: ``sglang-launch reload`` replaces each replica (``--dp-size``, 2 by default)
   with a fresh one; its ``replica.<dp>.replaced`` event says how long that took from the new
   replica's start to the old one's end, and its parts: start-up (spawn to every rank ready),
   probe (one request through the new replica), drain (the old one's requests finished, then its
   stop). The baselines are the model's own load time, as the new scheduler reports it
   (``model.load_seconds`` in its ready report), and the runtime's whole start-up in the worker
   (its phases from the worker import to ready: importing torch and transformers, loading,
   warming up). Target: a replica takes that start-up plus its probe plus under 1 s (the
   launcher's part: spawning and bootstrapping the process, draining and stopping the old one).
2. Requests served during the reload against the same length of time without one: ``--clients``
   client threads (4) post embeddings throughout; the completions are counted in the window of
   the reload, and in a window of the same length right after it (a second past its end).

The server runs the embedded embedding model, all-MiniLM-L6-v2 (``--model-path`` another), on
the CPU platform unless ``--platform auto``; loopback only.

    .venv/bin/python benchmarks/reload.py [--dp-size 2] [--clients 4] [--pause 0.02] [--reloads 2]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(REPO), str(REPO / "tests")]
os.environ.setdefault("HF_HUB_OFFLINE", "1")

from support.serving import Clients, cli_command, server_env, start_server  # noqa: E402


def reload(server, env: dict[str, str]) -> tuple[list[dict], float]:
    """One ``sglang-launch reload --json``: its events and its wall time."""
    started = time.monotonic()
    done = subprocess.run(
        [*cli_command(), "reload", "--json", "--pid", str(server.proc.pid)],
        env=env,
        capture_output=True,
        text=True,
        timeout=1800,
    )
    took = time.monotonic() - started
    if done.returncode != 0:
        raise SystemExit(f"the reload failed ({done.returncode}):\n{done.stderr}")
    return [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")], took


def load_seconds(server, env: dict[str, str]) -> dict[int, tuple[float, dict[str, float]]]:
    """Each scheduler's model load time (its ready report) and phase timings, by pid."""
    status = subprocess.run(
        [*cli_command(), "status", "--json", "--pid", str(server.proc.pid)],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    found = {}
    for w in json.loads(status.stdout)["workers"]:
        model = (w.get("info") or {}).get("model") or {}
        if w["role"] == "scheduler" and "load_seconds" in model:
            found[w["pid"]] = (float(model["load_seconds"]), w["phases"])
    return found


BOOT = ("spawned", "platform_initialized", "plugins_loaded", "hooks_applied", "args_materialized")


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--dp-size", type=int, default=2)
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument(
        "--pause", type=float, default=0.02, help="seconds each client waits after an answer"
    )
    parser.add_argument("--reloads", type=int, default=2)
    parser.add_argument("--model-path", default=None)
    parser.add_argument("--platform", choices=("cpu", "auto"), default="cpu")
    ns = parser.parse_args()

    runtime_dir = tempfile.mkdtemp(prefix="sglb")
    extra = {"XDG_RUNTIME_DIR": runtime_dir}
    if ns.platform == "auto":
        extra["SGLANG_USE_CPU_ENGINE"] = None
    env = server_env(**extra)
    args = ["--dp-size", str(ns.dp_size)] + (
        ["--model-path", ns.model_path] if ns.model_path else []
    )
    with tempfile.TemporaryDirectory() as tmp:
        server = start_server(args, Path(tmp), "reload-bench", env=env)
        clients = Clients(server.url, ns.clients, pause=ns.pause)
        try:
            time.sleep(5)  # the clients reach their pace before anything is counted
            print(f"--dp-size {ns.dp_size}, {ns.clients} clients pausing {ns.pause * 1000:.0f} ms")
            print(
                f"{'replica':<10} {'replaced in':>11} {'start-up':>9} {'of it load':>10} "
                f"{'probe':>8} {'drain+stop':>10} {'vs load+probe':>13}"
            )
            windows = []
            parts: list[tuple[int, int, dict[str, float], float]] = []
            for _ in range(ns.reloads):
                before = time.monotonic()
                events, took = reload(server, env)
                after = time.monotonic()
                loads = load_seconds(server, env)
                for e in (e for e in events if e["kind"] == "replica.replaced"):
                    load, phases = loads.get(e["pids"][0], (None, {}))
                    probe = e["probe_s"] or 0.0
                    parts.append((e["dp_rank"], e["by"], phases, e["seconds"] - probe))
                    extra_s = e["seconds"] - (load or 0.0) - probe
                    print(
                        f"dp={e['dp_rank']}->{e['by']:<5} {e['seconds']:>10.2f}s {e['startup_s']:>8.2f}s "
                        f"{(load or float('nan')):>9.2f}s {probe * 1000:>6.0f}ms {e['drain_s']:>9.2f}s "
                        f"{'+' if extra_s >= 0 else ''}{extra_s:>11.2f}s"
                    )
                windows.append((before, after, took))
                time.sleep(took + 1.0)  # a window of the same length without a reload
            print("the new replicas' start-up, phase by phase (the scheduler's own report):")
            print(
                f"{'replica':<10} {'interpreter+bootstrap':>21} {'worker import':>13} "
                f"{'model_loaded':>12} {'warmed_up':>9} {'ready':>6} {'launcher part':>13}"
            )
            for old, new, phases, replaced in parts:
                boot = sum(phases.get(name, 0.0) for name in BOOT)
                # The runtime's own start-up in the worker: importing torch and transformers
                # (inside model_loaded: the scheduler imports them lazily), loading, warming up.
                runtime = sum(
                    phases.get(name, 0.0) for name in ("model_loaded", "warmed_up", "ready")
                )
                print(
                    f"dp={old}->{new:<5} {boot:>20.2f}s {phases.get('worker_imported', 0):>12.2f}s "
                    f"{phases.get('model_loaded', 0):>11.2f}s {phases.get('warmed_up', 0):>8.2f}s "
                    f"{phases.get('ready', 0):>5.2f}s {replaced - runtime:>12.2f}s"
                )
            print(
                "launcher part: replaced in - probe - the runtime's start-up in the worker "
                "(model_loaded + warmed_up + ready); target under 1 s"
            )
            for before, after, took in windows:
                during = clients.served(before, after)
                quiet = clients.served(after + 1.0, after + 1.0 + took)
                ratio = during / quiet if quiet else float("nan")
                print(
                    f"reload of {took:.1f}s: {during} requests served ({during / took:.1f}/s); the "
                    f"{took:.1f}s after it: {quiet} ({quiet / took:.1f}/s); ratio {ratio:.2f}x"
                )
            print(
                f"client errors: {len(clients.errors())}"
                + (f" (first: {clients.errors()[0]})" if clients.errors() else "")
            )
        finally:
            clients.finish()
            server.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
