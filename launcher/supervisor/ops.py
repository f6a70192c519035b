"""The ops side of a launch: events out (PUB + in-process listeners), snapshots on request.

Every state change the supervisor makes is one event, a struct of ``launchspec.events``:
``publish(event)`` gives it the next sequence number and the time, keeps it in a bounded history,
sends it on the PUB socket as two frames ``[topic, JSON]`` and hands the struct to every
in-process listener (the terminal display, systemd, the embedded ``Launcher``'s event streams).
``launchspec.events`` lists the kinds, their topics and fields.

A subscriber that joins late missed what was published before; the query socket (REP, JSON
requests) fills that in:

- ``{"query": "snapshot"}`` -> ``{"ok": true, "snapshot": {...}}``, the whole current state,
  whose ``seq`` is the number of the last event it includes;
- ``{"query": "events", "after": N}`` -> ``{"ok": true, "events": [...], "complete": bool,
  "seq": N}``, every event numbered above ``N`` still in the history (``complete`` is false when
  older ones were already dropped), so a follower that sees a gap in the sequence can close it;
  each entry is an event's JSON object (``launchspec.events.from_dict`` reads it).

Commands the launch registers (``add_command``) answer too: ``reload`` and ``scale`` begin a
change and answer at once (``launcher.supervisor.rollout``: the change's own events say how it
ends), and the HTTP child reports ``replica.probed`` and ``replica.drained`` there.

Anything else gets ``{"ok": false, "error": "..."}``; a bad request never disturbs the launch.
"""

from __future__ import annotations

import asyncio
import collections
import json
import logging
import time
from collections.abc import Callable
from typing import Any

import msgspec
import zmq
import zmq.asyncio

from launcher.supervisor.state import LaunchState
from launchspec.events import Event, encode

log = logging.getLogger("launcher")

HISTORY = 10_000
Listener = Callable[[Event], None]
Command = Callable[[dict[str, Any]], dict[str, object]]


class OpsChannel:
    """Owns the PUB and query sockets of one launch; ``publish`` is the one way events leave."""

    def __init__(
        self,
        zctx: zmq.asyncio.Context,
        state: LaunchState,
        pub_endpoint: str,
        query_endpoint: str,
    ) -> None:
        self.state = state
        self.history: collections.deque[Event] = collections.deque(maxlen=HISTORY)
        self._listeners: list[Listener] = []
        self._commands: dict[str, Command] = {}
        self._pub = zctx.socket(zmq.PUB)
        self._pub.setsockopt(zmq.LINGER, 500)  # let server.stopped reach subscribers on close
        self._pub.bind(pub_endpoint)
        self._query = zctx.socket(zmq.REP)
        self._query.setsockopt(zmq.LINGER, 0)
        self._query.bind(query_endpoint)
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._answer_queries())

    def add_listener(self, listener: Listener) -> None:
        self._listeners.append(listener)

    def add_command(self, name: str, command: Command) -> None:
        """Answer ``{"query": name, ...}`` with ``command(request)`` (run on the loop; it must
        not block: a command that takes long answers at once and reports through events)."""
        self._commands[name] = command

    def publish(self, event: Event) -> Event:
        """Number, time-stamp and send ``event``; returns it as sent."""
        self.state.seq += 1
        event = msgspec.structs.replace(event, seq=self.state.seq, time=time.time())
        self.history.append(event)
        try:
            self._pub.send_multipart([event.topic.encode(), encode(event)], flags=zmq.NOBLOCK)
        except zmq.ZMQError as exc:  # a PUB socket drops rather than blocks; nothing to do
            log.debug("ops event %s not published: %s", event.topic, exc)
        for listener in list(self._listeners):
            try:
                listener(event)
            except Exception:  # noqa: BLE001 - a broken listener must not stop the launch
                log.exception("ops listener %r failed on %s", listener, event.topic)
        return event

    def answer(self, request: object) -> dict[str, object]:
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
            events = [e for e in self.history if e.seq > after]
            first = self.history[0].seq if self.history else self.state.seq + 1
            return {
                "ok": True,
                "events": events,
                "complete": first <= after + 1,
                "seq": self.state.seq,
            }
        command = self._commands.get(kind) if isinstance(kind, str) else None
        if command is not None:
            try:
                return command(request)
            except Exception as exc:  # noqa: BLE001 - a bad request never disturbs the launch
                log.exception("the %r query failed", kind)
                return {
                    "ok": False,
                    "error": f"the {kind} query failed: {type(exc).__name__}: {exc}",
                }
        known = ", ".join(["snapshot", "events", *self._commands])
        return {"ok": False, "error": f"unknown query {kind!r}; known queries: {known}"}

    async def _answer_queries(self) -> None:
        while True:
            raw = await self._query.recv()
            try:
                reply = self.answer(json.loads(raw))
            except ValueError as exc:
                reply = {"ok": False, "error": f"a query must be JSON: {exc}"}
            await self._query.send(msgspec.json.encode(reply, enc_hook=str))

    def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
        self._query.close(linger=0)
        self._pub.close()
