"""Fault injection against the supervisor: reloads, signals, kills and drains under client load.

The supervisor's cases of issue 28's fault-injection run, against real servers on the CPU
platform (the embedded all-MiniLM-L6-v2 embedding model, and a tiny Llama built here), each with
clients on loopback throughout, every process of every server counted and stopped afterwards:

1. ``reloads``: ``--reloads`` good reloads of an embedding server (``--dp-size 2``) under load;
2. ``bad-reloads``: reloads to an empty directory, a directory that is no model, a corrupt model
   (its weights file cut short), a missing path and a model of another kind (a causal LM), under
   the same load: each refused (exit 2) or rolled back (exit 1), with no client error;
3. ``sighup``: SIGHUP once, twice in a row, during a reload, and a reload whose new scheduler is
   SIGKILLed while it starts, under the same load;
4. ``scale-streams``: a tiny Llama at ``--dp-size 3`` scaled to 1 under 400-token streams: none
   cut;
5. ``launcher-kill``: the launcher SIGKILLed while a reload starts a replica (``--kills`` times):
   the processes of the launch still alive 0.5 s and 2 s later;
6. ``drain``: SIGTERM while 8 streams of 900 tokens run, with a grace period that lets them
   finish and one that does not: each completes, or ends with an error event, never silently.

Every case is bounded (``--budget`` seconds in all; a case that would start past it is skipped).
This is not a test (it asserts nothing): it prints what happened, for the figures in
``benchmarks/README.md``.

    .venv/bin/python benchmarks/faults.py [--budget 1500] [--only reloads sighup ...]
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(REPO), str(REPO / "tests")]
os.environ.setdefault("HF_HUB_OFFLINE", "1")

from support.serving import (  # noqa: E402
    Clients,
    build_tiny_llama,
    cli_command,
    server_env,
    start_server,
)

TAG = "SGLANG_FAULTS_TAG"
CASES = ("reloads", "bad-reloads", "sighup", "scale-streams", "launcher-kill", "drain")


# -- clients ----------------------------------------------------------------------------------------
def stream_body(i: int, tokens: int = 400) -> dict:
    return {
        "text": f"a story, number {i}:",
        "sampling_params": {"max_new_tokens": tokens, "temperature": 0, "ignore_eos": True},
        "stream": True,
    }


def one_stream(url: str, body: dict, started: threading.Event | None = None) -> str:
    """``"done"`` (ends with ``data: [DONE]``, no error), ``"error event"`` (it carries one),
    ``"cut"`` (it ended without either) or ``"refused <status>"``."""
    import httpx

    try:
        with httpx.Client(timeout=300) as c:
            with c.stream("POST", url + "/generate", json=body) as r:
                if r.status_code != 200:
                    return f"refused {r.status_code}"
                text = ""
                for chunk in r.iter_text():
                    text += chunk
                    if started is not None and "data:" in text:
                        started.set()
    except httpx.HTTPError:
        return "cut"
    if '"error"' in text:
        return "error event"
    return "done" if text.rstrip().endswith("data: [DONE]") else "cut"


class Streams:
    """``count`` threads streaming ``stream_body`` back to back, tallying how each ended."""

    def __init__(self, url: str, count: int = 4) -> None:
        self.url = url
        self.ends: dict[str, int] = {}
        self.stop = threading.Event()
        self.lock = threading.Lock()
        self.threads = [
            threading.Thread(target=self._run, args=(k,), daemon=True) for k in range(count)
        ]
        for t in self.threads:
            t.start()

    def _run(self, k: int) -> None:
        i = 0
        while not self.stop.is_set():
            end = one_stream(self.url, stream_body(k * 1000 + i))
            with self.lock:
                self.ends[end] = self.ends.get(end, 0) + 1
            i += 1

    def finish(self) -> dict[str, int]:
        self.stop.set()
        for t in self.threads:
            t.join(timeout=300)
        return dict(self.ends)


# -- the launcher -----------------------------------------------------------------------------------
class Lab:
    """What every case shares: a private runtime directory, the clock, the models."""

    def __init__(self, root: Path, budget: float) -> None:
        self.root = root
        self.deadline = time.monotonic() + budget
        self.runtime_dir = tempfile.mkdtemp(prefix="sglf")
        os.environ["XDG_RUNTIME_DIR"] = self.runtime_dir  # this process asks the launchers too
        self._llama: Path | None = None
        self.results: list[tuple[str, str]] = []

    def left(self) -> float:
        return self.deadline - time.monotonic()

    def llama(self) -> Path:
        from launchspec.model_source import embedding_model_dir

        if self._llama is None:
            self._llama = build_tiny_llama(self.root / "llama", embedding_model_dir())
        return self._llama

    def server(self, args: list[str], name: str, **extra: str):
        tag = uuid.uuid4().hex
        env = server_env(XDG_RUNTIME_DIR=self.runtime_dir, **{TAG: tag}, **extra)
        server = start_server(args, self.root, name, env=env)
        server.tag, server.env = tag, env
        return server

    def cli(self, server, *args: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [*cli_command(), *args, "--pid", str(server.proc.pid)],
            env=server.env,
            capture_output=True,
            text=True,
            timeout=timeout,
        )

    def record(self, case: str, line: str) -> None:
        print(f"[{case}] {line}", flush=True)
        self.results.append((case, line))


def history(server) -> list[dict]:
    from launcher.query import find_launcher, query

    found = find_launcher(server.proc.pid)
    events = query(found["query_endpoint"], {"query": "events", "after": 0}, 10)["events"]
    return events if isinstance(events, list) else []


def snapshot(server) -> dict:
    from launcher.query import find_launcher, query

    found = find_launcher(server.proc.pid)
    answer = query(found["query_endpoint"], {"query": "snapshot"}, 10)["snapshot"]
    return answer if isinstance(answer, dict) else {}


def schedulers(server) -> dict[str, int]:
    return {w["name"]: w["pid"] for w in snapshot(server)["workers"] if w["role"] == "scheduler"}


def until(condition, timeout: float, what: str, interval: float = 0.1):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        value = condition()
        if value:
            return value
        time.sleep(interval)
    raise TimeoutError(f"not within {timeout:.0f}s: {what}")


def tagged(tag: str) -> list[int]:
    """The live processes (zombies aside) carrying ``tag`` in their environment."""
    import psutil

    found = []
    for proc in psutil.process_iter():
        if proc.pid == os.getpid():
            continue
        try:
            if proc.environ().get(TAG) == tag and proc.status() != psutil.STATUS_ZOMBIE:
                found.append(proc.pid)
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
    return found


def stop(server) -> str:
    """Stop ``server``; what of its launch was still alive right after the launcher exited, and
    2 s later (what is left then is killed)."""
    import psutil

    server.stop()
    at_exit = [_what(pid) for pid in tagged(server.tag)]
    time.sleep(2.0)
    left = tagged(server.tag)
    for pid in left:
        try:
            psutil.Process(pid).kill()
        except psutil.NoSuchProcess:
            pass
    return f"{len(at_exit)} {at_exit if at_exit else ''}, {len(left)} 2 s later"


def changes_ended(server, kind: str) -> int:
    return sum(e["kind"] in (f"{kind}.finished", f"{kind}.failed") for e in history(server))


# -- the cases --------------------------------------------------------------------------------------
def embedding_cases(lab: Lab, cases: set[str], reloads: int) -> None:
    """``reloads``, ``bad-reloads`` and ``sighup``, on one embedding server."""
    from launchspec.model_source import embedding_model_dir

    server = lab.server(["--dp-size", "2"], "embed")
    load = Clients(server.url, 4, pause=0.02)
    try:
        until(lambda: load.ok > 20, 60, "the load to run")
        load.take()
        if "reloads" in cases:
            copy = Path(shutil.copytree(embedding_model_dir(), lab.root / "minilm-copy"))
            codes = []
            for n in range(reloads):
                target = [] if n % 2 == 0 else ["--model-path", str(copy)]
                codes.append(lab.cli(server, "reload", *target).returncode)
            ok, errors = load.take()
            lab.record(
                "reloads",
                f"{reloads} reloads (exit codes {codes}): {ok + len(errors)} requests, "
                f"{len(errors)} errors" + (f" (first: {errors[0]})" if errors else ""),
            )
        if "bad-reloads" in cases and lab.left() > 120:
            empty = lab.root / "empty"
            empty.mkdir()
            not_a_model = lab.root / "not-a-model"
            not_a_model.mkdir()
            (not_a_model / "README.md").write_text("no model here\n")
            corrupt = Path(shutil.copytree(embedding_model_dir(), lab.root / "corrupt"))
            for weights in list(corrupt.glob("*.safetensors")) + list(corrupt.glob("*.bin")):
                weights.write_bytes(weights.read_bytes()[:1000])  # cut short
            targets = {
                "empty": empty,
                "not a model": not_a_model,
                "corrupt": corrupt,
                "missing": lab.root / "nowhere",
                "another kind": lab.llama(),
            }
            before = sorted(schedulers(server).values())
            outcomes = []
            for name, path in targets.items():
                done = lab.cli(server, "reload", "--model-path", str(path))
                outcomes.append(f"{name}: exit {done.returncode}")
            until(lambda: len(schedulers(server)) == 2, 120, "two replicas again")
            ok, errors = load.take()
            same = sorted(schedulers(server).values()) == before
            lab.record(
                "bad-reloads",
                f"{'; '.join(outcomes)}; {ok + len(errors)} requests, {len(errors)} errors; "
                f"the same schedulers serve: {same}"
                + (f" (first error: {errors[0]})" if errors else ""),
            )
        if "sighup" in cases and lab.left() > 120:
            pid = server.proc.pid
            ended = changes_ended(server, "reload")
            os.kill(pid, signal.SIGHUP)
            until(lambda: changes_ended(server, "reload") > ended, 180, "the SIGHUP reload")
            ended = changes_ended(server, "reload")
            os.kill(pid, signal.SIGHUP)
            os.kill(pid, signal.SIGHUP)
            until(
                lambda: changes_ended(server, "reload") > ended, 180, "the double SIGHUP's reload"
            )
            time.sleep(1.0)
            twice = changes_ended(server, "reload") - ended
            ended = changes_ended(server, "reload")
            began = lab.cli(server, "reload", "--no-wait")
            os.kill(pid, signal.SIGHUP)  # during a reload: refused, logged
            until(lambda: changes_ended(server, "reload") > ended, 180, "the reload")
            during = changes_ended(server, "reload") - ended
            # A new scheduler SIGKILLed while it starts: that reload fails and rolls back.
            ended = changes_ended(server, "reload")
            old = set(schedulers(server).values())
            lab.cli(server, "reload", "--no-wait")
            newcomer = until(
                lambda: next((p for p in schedulers(server).values() if p and p not in old), None),
                120,
                "a new scheduler",
                interval=0.02,
            )
            os.kill(newcomer, signal.SIGKILL)
            until(lambda: changes_ended(server, "reload") > ended, 180, "the killed reload")
            last = [e for e in history(server) if e["kind"].startswith("reload.")][-1]
            until(lambda: len(schedulers(server)) == 2, 120, "two replicas again")
            ok, errors = load.take()
            lab.record(
                "sighup",
                f"once: reloaded; twice: {twice} reload(s); during a reload (began: exit "
                f"{began.returncode}): {during} reload(s) ended; new scheduler killed mid-reload: "
                f"{last['kind']}; {ok + len(errors)} requests, {len(errors)} errors"
                + (f" (first: {errors[0]})" if errors else ""),
            )
    finally:
        load.finish()
        ok, errors = load.take()
        left = stop(server)
        if errors:
            lab.record("embedding server", f"{len(errors)} more errors at the end: {errors[0]}")
        lab.record("embedding server", f"processes left after its stop: {left}")


def scale_streams(lab: Lab) -> None:
    server = lab.server(["--model-path", str(lab.llama()), "--dp-size", "3"], "scale")
    streams = Streams(server.url)
    try:
        until(lambda: sum(streams.ends.values()) >= 4, 120, "streams to run")
        down = lab.cli(server, "scale", "--dp-size", "1")
        time.sleep(2)
    finally:
        ends = streams.finish()
        left = stop(server)
    lab.record(
        "scale-streams",
        f"scale 3 -> 1: exit {down.returncode}; 400-token streams: {ends}; processes left: {left}",
    )


def launcher_kill(lab: Lab, kills: int) -> None:
    import psutil

    counts = []
    for n in range(kills):
        if lab.left() < 90:
            break
        server = lab.server(["--dp-size", "2"], f"kill{n}")
        try:
            old = set(schedulers(server).values())
            lab.cli(server, "reload", "--no-wait")
            until(
                lambda s=server, o=old: any(p and p not in o for p in schedulers(s).values()),
                120,
                "a new scheduler",
                interval=0.02,
            )
            launch = [
                server.proc.pid,
                *(c.pid for c in psutil.Process(server.proc.pid).children(True)),
            ]
            os.kill(server.proc.pid, signal.SIGKILL)
            killed = time.monotonic()
            server.proc.wait(10)
            time.sleep(max(0.0, killed + 0.5 - time.monotonic()))
            at_half = [_what(pid) for pid in tagged(server.tag)]
            time.sleep(max(0.0, killed + 2.0 - time.monotonic()))
            at_two = len(tagged(server.tag))
            counts.append((len(launch), at_half, at_two))
        finally:
            stop(server)
    lab.record(
        "launcher-kill",
        "; ".join(
            f"{n} processes, {len(a)} left at 0.5 s {a if a else ''}, {b} at 2 s"
            for n, a, b in counts
        ),
    )


def _what(pid: int) -> str:
    """A process's pid and the tail of its command line (to tell a rank from a helper)."""
    import psutil

    try:
        return f"{pid} {' '.join(psutil.Process(pid).cmdline())[-60:]}"
    except psutil.Error:
        return f"{pid} (gone)"


def drain(lab: Lab) -> None:
    """SIGTERM with 8 streams running, under a grace period that lets them end (30 s) and one
    that cuts them (1 s: each must then end with an error event)."""
    for grace in ("30", "1"):
        if lab.left() < 90:
            break
        lab.record("drain", _drain_once(lab, grace))


def _drain_once(lab: Lab, grace: str) -> str:
    args = ["--model-path", str(lab.llama()), "--stop-grace-period", grace]
    server = lab.server(args, f"drain{grace}")
    started = [threading.Event() for _ in range(8)]
    ends: list[str] = []

    def stream(k: int) -> None:
        ends.append(one_stream(server.url, stream_body(k, 900), started[k]))

    threads = [threading.Thread(target=stream, args=(k,), daemon=True) for k in range(8)]
    code, took = None, float("nan")
    try:
        for t in threads:
            t.start()
        until(lambda: all(e.is_set() for e in started) or ends, 120, "8 streams to begin")
        server.proc.send_signal(signal.SIGTERM)
        stopped = time.monotonic()
        code = server.proc.wait(120)
        took = time.monotonic() - stopped
        for t in threads:
            t.join(60)
    finally:
        left = stop(server)
    tally = {end: ends.count(end) for end in sorted(set(ends))}
    return (
        f"SIGTERM with 8 streams of 900 tokens running, --stop-grace-period {grace}: exit "
        f"{code} in {took:.1f}s; the streams: {tally}; processes left: {left}"
    )


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--budget", type=float, default=1500.0, help="seconds for every case together"
    )
    parser.add_argument("--only", nargs="+", choices=CASES, default=list(CASES))
    parser.add_argument("--reloads", type=int, default=4)
    parser.add_argument("--kills", type=int, default=3)
    ns = parser.parse_args()
    cases = set(ns.only)
    load = os.getloadavg()[0]
    print(f"load average at the start: {load:.1f} on {os.cpu_count()} cores", flush=True)
    started = time.monotonic()
    with tempfile.TemporaryDirectory() as tmp:
        lab = Lab(Path(tmp), ns.budget)
        runs = [
            ({"reloads", "bad-reloads", "sighup"}, lambda: embedding_cases(lab, cases, ns.reloads)),
            ({"scale-streams"}, lambda: scale_streams(lab)),
            ({"launcher-kill"}, lambda: launcher_kill(lab, ns.kills)),
            ({"drain"}, lambda: drain(lab)),
        ]
        for names, run in runs:
            if not names & cases:
                continue
            if lab.left() < 90:
                lab.record(",".join(sorted(names & cases)), "skipped: out of budget")
                continue
            try:
                run()
            except Exception as exc:  # noqa: BLE001 - one case's trouble is reported, the rest run
                lab.record(
                    ",".join(sorted(names & cases)), f"did not finish: {type(exc).__name__}: {exc}"
                )
        print(f"\n{len(lab.results)} results in {time.monotonic() - started:.0f}s:")
        for case, line in lab.results:
            print(f"  {case}: {line}")
    shutil.rmtree(lab.runtime_dir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
