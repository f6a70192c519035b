"""The ops events of a real launch, read the way ops tooling reads them.

A real ``sglang-launch`` (tp=2, dp=2, test workers, no model) starts, one of its replicas is
SIGKILLed and heals, and a SIGTERM stops it; a ZeroMQ SUB socket on the launcher's PUB endpoint
receives the frames. Every frame decodes with ``launchspec.events.decode`` into the struct its
``kind`` names, on the topic the struct derives, and the struct says everything the JSON said.
Events published before the subscription was up (a subscriber that joins late misses them) come
from the query socket's history and decode with ``launchspec.events.from_dict``. (And, without a launch:
a topic comes from its event; what does not match is refused.)
"""

from __future__ import annotations

import json
import os
import signal
import threading

import pytest
import zmq
from support.supervisor import FAST, READY_WAIT, Run, wait_for

from launchspec import events

LAUNCH = [
    *FAST,
    "--tp-size",
    "2",
    "--dp-size",
    "2",
    "--scheduler-target",
    READY_WAIT,
    "--http-target",
    READY_WAIT,
    "--restart-backoff",
    "0.1",
]


class Subscriber:
    """Every ``[topic, JSON]`` frame pair the launcher publishes from now until ``server.stopped``."""

    def __init__(self, endpoint: str) -> None:
        self.frames: list[tuple[bytes, bytes]] = []
        self.ended = threading.Event()
        self._zctx = zmq.Context()
        self._sub = self._zctx.socket(zmq.SUB)
        self._sub.setsockopt(zmq.LINGER, 0)
        self._sub.setsockopt(zmq.SUBSCRIBE, b"")
        self._sub.connect(endpoint)
        self._thread = threading.Thread(target=self._receive, daemon=True)
        self._thread.start()

    def _receive(self) -> None:
        while not self.ended.is_set():
            if not self._sub.poll(100):
                continue
            topic, data = self._sub.recv_multipart()
            self.frames.append((topic, data))
            if topic == b"server.stopped":
                self.ended.set()

    def close(self) -> None:
        self.ended.set()
        self._thread.join(10)
        self._sub.close()
        self._zctx.term()


def _ops_endpoints(run: Run) -> tuple[str, str]:
    """The launcher's PUB and query endpoints, from its state file once it is written."""
    from launcher.supervisor.rundir import NoLauncherError, find_launcher

    def found():
        assert run.proc.poll() is None, run
        try:
            return find_launcher(run.pid)
        except NoLauncherError:
            return None

    state = wait_for(found, 60, f"the launcher's state file\n{run}")
    return state["ops_endpoint"], state["query_endpoint"]


def test_a_topic_comes_from_the_event_and_a_decoder_refuses_what_does_not_match():
    who = {"worker": "scheduler.3", "role": "scheduler", "rank": 3, "pid": 42}
    gone = events.WorkerExited(**who, ready_count=1, worker_count=4, exitcode=-9, signal="SIGKILL")
    assert gone.topic == "worker.scheduler.3.exited" and isinstance(gone, events.WORKER_GONE)
    wire = json.loads(events.encode(gone))
    assert wire["kind"] == "worker.exited" and wire["phase"] == "exited"
    assert events.decode(events.encode(gone)) == gone

    with pytest.raises(events.EventError, match="does not match"):
        events.from_dict({**wire, "topic": "worker.scheduler.0.exited"})
    with pytest.raises(events.EventError, match="same sglang-launch version"):
        events.decode(b'{"kind": "worker.vanished", "topic": "worker.scheduler.3.vanished"}')
    back = events.ReplicaReady(replica="scheduler dp=1", dp_rank=1, attempt=1, down_s=0.5, pids=[7])
    assert back.topic == "replica.1.ready" and not isinstance(back, events.WORKER_GONE)


@pytest.mark.e2e
def test_every_event_of_a_launch_that_heals_decodes_into_its_struct(monkeypatch):
    from launcher.query import query

    with Run(LAUNCH) as run:
        monkeypatch.setenv("XDG_RUNTIME_DIR", run.runtime_dir)  # where find_launcher looks
        ops_endpoint, query_endpoint = _ops_endpoints(run)
        subscriber = Subscriber(ops_endpoint)
        try:
            before = {w["name"]: w for w in run.wait_ready()["workers"]}
            os.kill(before["scheduler.3"]["pid"], signal.SIGKILL)  # a rank of replica dp=1

            def healed():
                snap = run.snapshot()
                workers = {w["name"]: w for w in snap["workers"]} if snap else {}
                return all(
                    workers.get(n, {}).get("restarts") == 1 and workers[n]["ready"]
                    for n in ("scheduler.2", "scheduler.3")
                )

            wait_for(healed, 60, f"replica dp=1 to heal\n{run}")
            history = query(query_endpoint, {"query": "events", "after": 0}, timeout=5)["events"]
            os.kill(run.pid, signal.SIGTERM)
            assert run.wait(60) == 0, run
            assert subscriber.ended.wait(30), "no server.stopped on the PUB socket"
        finally:
            subscriber.close()

    published = []
    for topic, data in subscriber.frames:
        event = events.decode(data)
        assert type(event).kind() == json.loads(data)["kind"]
        assert event.topic == topic.decode()
        assert json.loads(events.encode(event)) == json.loads(data)  # the struct holds it all
        published.append(event)
    seqs = [e.seq for e in published]
    assert seqs == list(range(seqs[0], seqs[0] + len(seqs))), f"gaps or repeats in {seqs}"

    # What the subscription missed while it joined, from the history.
    early = [events.from_dict(entry) for entry in history if entry["seq"] < seqs[0]]
    assert [e.seq for e in early] == list(range(1, seqs[0]))
    everything = early + published
    assert isinstance(everything[0], events.ServerStarting)
    assert isinstance(everything[-1], events.ServerStopped) and everything[-1].exit_code == 0

    seen = {type(e) for e in published}
    assert {
        events.ReplicaRestarting,
        events.WorkerStopped,
        events.WorkerExited,
        events.WorkerRestarted,
        events.WorkerPhase,
        events.WorkerReady,
        events.ReplicaReady,
        events.ServerStopping,
        events.ServerStopped,
    } <= seen, seen
    restarting = [e for e in published if isinstance(e, events.ReplicaRestarting)]
    assert [(e.topic, e.dp_rank, e.workers) for e in restarting] == [
        ("replica.1.restarting", 1, ["scheduler.2", "scheduler.3"])
    ]
    assert restarting[0].root_cause.worker == "scheduler.3"
    peer = [e for e in published if isinstance(e, events.WorkerStopped) and e.restart]
    assert [(e.worker, e.because_of) for e in peer] == [("scheduler.2", "scheduler.3")]
    assert any(isinstance(e, events.ServerReady) for e in everything)
