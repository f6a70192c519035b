"""The status wire between a child and its supervisor: the single definition of every message.

A child PUSHes msgpack-encoded messages to the supervisor's PULL socket at
``ProcessSpec.status_endpoint``, one ZeroMQ frame per message. Every message is a msgspec Struct
of the tagged union ``Message``; the tag field is ``kind``. Common fields:

- ``worker``: ``"<role>.<rank>"`` (``"scheduler.0"``, ``"http.0"``),
- ``pid``: the child's process id,
- ``time``: wall-clock seconds since the epoch when the message was made.

Kinds:

- ``phase``: a phase was reached (``bootstrap.phases.PHASES`` or a worker's own, such as
  ``"model_loaded"``); ``duration`` is the seconds the step took, ``elapsed`` the seconds since
  the child entered ``bootstrap.run``. The ``spawned`` phase carries ``early_imports``: runtime
  modules that were already imported when the child started (see the spec's warning).
- ``ready``: the worker reported ready; ``platform`` is the key of the platform the child
  selected (compare it with the supervisor's), ``info`` the worker's JSON-able details,
  ``manifest`` what the process really has of platform and plugins (``bootstrap.manifest``).
- ``failed``: a step raised; ``phase`` is the phase being worked towards, ``exc_type`` the
  exception's qualified type name, ``message`` its text, ``traceback`` the full formatted
  traceback, ``exit_code`` the status the child is about to exit with, ``exc_types`` the
  qualified names of the exception's classes, its own first (the supervisor classifies a failure
  by them without importing the worker's modules). ``alive``: the worker reported it while it
  goes on running (``ctx.report_failure``: a scheduler that gave up on its failing steps), and
  waits for the supervisor to stop or end it; ``exit_code`` is then the status it would exit with.
- ``heartbeat``: sent every ``ProcessSpec.heartbeat_interval`` seconds when that is set;
  ``busy_s`` is how long the worker's current unit of work (a scheduler's step) has run, 0 when
  none runs (the watchdog's stuck-step check).
- ``stopped``: the worker returned after a stop request; the child exits 0 next. ``info`` is
  what the worker said of its stop (``ctx.stopped(**info)``; the HTTP child: ``requests_cut``).

``encode(message) -> bytes`` and ``decode(data) -> Message`` are the only (de)serializers;
``to_dict(message)`` gives the JSON-able form for ops events.
"""

from __future__ import annotations

import time
from typing import Any

import msgspec

from bootstrap.manifest import Manifest


class _Base(msgspec.Struct, tag_field="kind", kw_only=True, frozen=True):
    worker: str
    pid: int
    time: float = msgspec.field(default_factory=time.time)


class Phase(_Base, tag="phase", frozen=True):
    phase: str
    duration: float
    elapsed: float
    early_imports: list[str] = []


class Ready(_Base, tag="ready", frozen=True):
    platform: str
    duration: float
    elapsed: float
    info: dict[str, object] = {}
    manifest: Manifest | None = None


class Failed(_Base, tag="failed", frozen=True):
    phase: str
    exc_type: str
    message: str
    traceback: str
    exit_code: int
    elapsed: float
    exc_types: list[str] = []
    alive: bool = False


class Heartbeat(_Base, tag="heartbeat", frozen=True):
    phase: str
    elapsed: float
    busy_s: float = 0.0


class Stopped(_Base, tag="stopped", frozen=True):
    elapsed: float
    info: dict[str, object] = {}


Message = Phase | Ready | Failed | Heartbeat | Stopped

_encoder = msgspec.msgpack.Encoder()
_decoder = msgspec.msgpack.Decoder(Message)


class MessageError(ValueError):
    """A frame on the status socket is not a bootstrap message."""


def encode(message: Message) -> bytes:
    """The wire form of ``message``."""
    return _encoder.encode(message)


def decode(data: bytes) -> Message:
    """Parse one status frame; raises ``MessageError`` naming what is wrong with it."""
    try:
        return _decoder.decode(data)
    except msgspec.DecodeError as exc:
        raise MessageError(
            f"not a bootstrap status message ({exc}); only bootstrap.run children may push to "
            "the status endpoint, and both sides must run the same sglang-launch version"
        ) from None


def to_dict(message: Message) -> dict[str, Any]:
    """The message as plain JSON-able data, ``kind`` included."""
    data: dict[str, Any] = msgspec.to_builtins(message)
    return data
