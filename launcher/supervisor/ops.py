"""The ops side of a launch: events out (PUB + in-process listeners), snapshots on request.

Every state change the supervisor makes is one event, ``emit(topic, **body)``: it gets the next
sequence number, goes into a bounded history, out on the PUB socket as two frames
``[topic, JSON]``, and to every in-process listener (the terminal display, systemd, the embedded
``Launcher``'s event streams). Topics: ``worker.<role>.<rank>.<phase>``, ``server.ready``,
``server.failed``, ``server.stopping``, ``server.stopped``, and for a scheduler replica that the
supervisor restarts (``--restart-policy on-failure``) ``replica.<dp>.restarting`` (``replica``,
``dp_rank``, ``workers``, ``attempt``, ``max_restarts``, ``backoff_s``, ``cause``, ``root_cause``)
and ``replica.<dp>.ready`` (``replica``, ``dp_rank``, ``attempt``, ``down_s``: seconds from the
failure to ready again, ``pids``).

A subscriber that joins late missed what was published before; the query socket (REP, JSON
requests) fills that in:

- ``{"query": "snapshot"}`` -> ``{"ok": true, "snapshot": {...}}``, the whole current state,
  whose ``seq`` is the number of the last event it includes;
- ``{"query": "events", "after": N}`` -> ``{"ok": true, "events": [...], "complete": bool}``,
  every event numbered above ``N`` still in the history (``complete`` is false when older ones
  were already dropped), so a follower that sees a gap in the sequence can close it.

Anything else gets ``{"ok": false, "error": "..."}``; a bad request never disturbs the launch.
"""

from __future__ import annotations

import asyncio
import collections
import json
import logging
import time
from collections.abc import Callable

import zmq
import zmq.asyncio

from launcher.supervisor.state import LaunchState

log = logging.getLogger("launcher")

HISTORY = 10_000
Listener = Callable[[dict], None]


class OpsChannel:
    """Owns the PUB and query sockets of one launch; ``emit`` is the one way events leave."""

    def __init__(
        self, zctx: zmq.asyncio.Context, state: LaunchState, pub_endpoint: str, query_endpoint: str
    ):
        self.state = state
        self.history: collections.deque[dict] = collections.deque(maxlen=HISTORY)
        self._listeners: list[Listener] = []
        self._pub = zctx.socket(zmq.PUB)
        self._pub.setsockopt(zmq.LINGER, 500)  # let server.stopped reach subscribers on close
        self._pub.bind(pub_endpoint)
        self._query = zctx.socket(zmq.REP)
        self._query.setsockopt(zmq.LINGER, 0)
        self._query.bind(query_endpoint)
        self._task: asyncio.Task | None = None

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._answer_queries())

    def add_listener(self, listener: Listener) -> None:
        self._listeners.append(listener)

    def emit(self, topic: str, **body: object) -> dict:
        self.state.seq += 1
        event = {"topic": topic, "seq": self.state.seq, "time": time.time(), **body}
        self.history.append(event)
        data = json.dumps(event, default=str).encode()
        try:
            self._pub.send_multipart([topic.encode(), data], flags=zmq.NOBLOCK)
        except zmq.ZMQError as exc:  # a PUB socket drops rather than blocks; nothing to do
            log.debug("ops event %s not published: %s", topic, exc)
        for listener in list(self._listeners):
            try:
                listener(event)
            except Exception:  # noqa: BLE001 - a broken listener must not stop the launch
                log.exception("ops listener %r failed on %s", listener, topic)
        return event

    def answer(self, request: object) -> dict:
        """The reply to one decoded query (see the module docstring)."""
        if not isinstance(request, dict):
            return {"ok": False, "error": 'a query is a JSON object such as {"query": "snapshot"}'}
        kind = request.get("query")
        if kind == "snapshot":
            return {"ok": True, "snapshot": self.state.snapshot()}
        if kind == "events":
            after = request.get("after", 0)
            if not isinstance(after, int):
                return {"ok": False, "error": '"after" must be an event sequence number (int)'}
            events = [e for e in self.history if e["seq"] > after]
            first = self.history[0]["seq"] if self.history else self.state.seq + 1
            return {
                "ok": True,
                "events": events,
                "complete": first <= after + 1,
                "seq": self.state.seq,
            }
        return {"ok": False, "error": f"unknown query {kind!r}; known queries: snapshot, events"}

    async def _answer_queries(self) -> None:
        while True:
            raw = await self._query.recv()
            try:
                reply = self.answer(json.loads(raw))
            except ValueError as exc:
                reply = {"ok": False, "error": f"a query must be JSON: {exc}"}
            await self._query.send(json.dumps(reply, default=str).encode())

    def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
        self._query.close(linger=0)
        self._pub.close()
