"""Ops events: what a launch tells ops tooling, one msgspec struct per kind of event.

The supervisor builds these structs and ``launcher.supervisor.ops.OpsChannel`` publishes them:
to its in-process listeners (the terminal display, systemd, the embedded ``Launcher``) as the
structs themselves, on the ops PUB socket as two frames ``[topic, JSON]``, and from its history
to whoever asks the query socket. ``encode`` is the one way from a struct to JSON; ``decode``
(one event's JSON) and ``from_dict`` (one event already parsed, as in the query socket's
history) are the one way back, through the tagged union ``Event``.

Every event's JSON object has:

- ``kind``: which struct it is, the union's tag: ``"worker.ready"``, ``"server.failed"``,
  ``"replica.restarting"``, ... (``kind()`` of each class below);
- ``topic``: its ZeroMQ topic, derived from the event: ``worker.<role>.<rank>.<phase>``,
  ``server.<kind>``, ``replica.<dp>.<kind>`` (a decoded event whose ``topic`` does not match its
  fields is refused);
- ``seq``: 1, 2, ... per launch, no gaps, and ``time``: wall-clock seconds, both set when the
  event is published;
- the fields of its kind, below. A field that does not apply is ``null`` (or ``false``), never
  left out.

Kinds: worker events (``WorkerPhase``, ``WorkerReady``, ``WorkerFailed``, ``WorkerStopped``,
``WorkerExited``, ``WorkerRestarted``), server events (``ServerStarting``, ``ServerReady``,
``ServerFailed``, ``ServerStopping``, ``ServerStopped``), the events of a scheduler replica
that heals (``ReplicaRestarting``, ``ReplicaReady``), those of a replica that a reload or a scale
starts or retires (``ReplicaJoining``, ``ReplicaServing``, ``ReplicaDraining``, ``ReplicaReplaced``,
``ReplicaRemoved``), and those of the change itself (``ReloadStarted``, ``ReloadFinished``,
``ReloadFailed``, ``ScaleStarted``, ``ScaleFinished``, ``ScaleFailed``: topics ``reload.<kind>``
and ``scale.<kind>``). ``WORKER_GONE`` are the worker events after which the worker's process is
gone (or going).

Import-light: msgspec and the standard library only (the serving runtime's HTTP child imports
this module; ``launchspec.causes`` is standard library only).
"""

from __future__ import annotations

from typing import Literal, TypedDict

import msgspec

from bootstrap.manifest import Manifest
from launchspec.causes import RootCause

__all__ = [
    "CHANGE_ENDED",
    "WORKER_GONE",
    "Event",
    "EventError",
    "OpsEvent",
    "ReloadFailed",
    "ReloadFinished",
    "ReloadStarted",
    "ReplicaDraining",
    "ReplicaEvent",
    "ReplicaJoining",
    "ReplicaReady",
    "ReplicaRemoved",
    "ReplicaReplaced",
    "ReplicaRestarting",
    "ReplicaServing",
    "ScaleFailed",
    "ScaleFinished",
    "ScaleStarted",
    "ServerFailed",
    "ServerReady",
    "ServerStarting",
    "ServerStopped",
    "ServerStopping",
    "WorkerError",
    "WorkerEvent",
    "WorkerExited",
    "WorkerFailed",
    "WorkerFields",
    "WorkerPhase",
    "WorkerReady",
    "WorkerRestarted",
    "WorkerStopped",
    "decode",
    "encode",
    "from_dict",
    "to_dict",
]


class OpsEvent(msgspec.Struct, frozen=True, kw_only=True, tag_field="kind"):
    """What every event has. ``topic`` is derived (leave it out when building an event)."""

    topic: str = ""
    seq: int = 0
    time: float = 0.0

    def __post_init__(self) -> None:
        topic = self._topic()
        if self.topic and self.topic != topic:
            raise ValueError(f"topic {self.topic!r} does not match the event's fields ({topic!r})")
        msgspec.structs.force_setattr(self, "topic", topic)

    @classmethod
    def kind(cls) -> str:
        """The event's ``kind``, the tag of its class (``"server.ready"``)."""
        return str(cls.__struct_config__.tag)

    def _topic(self) -> str:
        return self.kind()


# -- worker events: worker.<role>.<rank>.<phase> --------------------------------------------------
class WorkerFields(TypedDict):
    """The fields every worker event has besides its phase (``LaunchState.worker_fields``)."""

    worker: str
    role: str
    rank: int
    pid: int | None
    ready_count: int
    worker_count: int


class WorkerEvent(OpsEvent, frozen=True, kw_only=True):
    """Something happened to one worker process. ``worker`` is ``"<role>.<rank>"``; ``pid`` its
    process (None before it was spawned); ``ready_count`` of ``worker_count`` workers of this
    node are ready."""

    worker: str
    role: str
    rank: int
    pid: int | None
    phase: str
    ready_count: int
    worker_count: int

    def _topic(self) -> str:
        return f"worker.{self.role}.{self.rank}.{self.phase}"


class WorkerError(msgspec.Struct, frozen=True):
    """A worker's own ``failed`` report: the phase it failed in, the exception's type, message
    and formatted traceback."""

    phase: str
    type: str
    message: str
    traceback: str


class WorkerPhase(WorkerEvent, frozen=True, kw_only=True, tag="worker.phase"):
    """The worker reached ``phase`` (a bootstrap phase or one of the worker's own) after
    ``duration`` seconds; ``early_imports`` (phase ``spawned``) names runtime modules that were
    imported before the child started."""

    duration: float
    early_imports: list[str] = []


class WorkerReady(WorkerEvent, frozen=True, kw_only=True, tag="worker.ready"):
    """The worker reported ready; ``info`` is what it reported about itself, ``manifest`` what it
    has of platform and plugins, ``differs`` how that differs from a ready peer's of its role
    (empty: the same, or no peer yet)."""

    phase: Literal["ready"] = "ready"
    duration: float
    info: dict[str, object] = {}
    manifest: Manifest | None = None
    differs: list[str] = []


class WorkerFailed(WorkerEvent, frozen=True, kw_only=True, tag="worker.failed"):
    """The worker reported a failure (the first of the launch, or one its replica heals)."""

    phase: Literal["failed"] = "failed"
    error: WorkerError


class WorkerStopped(WorkerEvent, frozen=True, kw_only=True, tag="worker.stopped"):
    """The worker stopped: on request, or because of ``because_of``'s failure. ``error`` is a
    failure it reported as a consequence of that; ``restart``: it was ended for its replica's
    restart; ``at_once``: killed with no grace period (it was still starting)."""

    phase: Literal["stopped"] = "stopped"
    because_of: str | None = None
    error: WorkerError | None = None
    restart: bool = False
    at_once: bool = False
    info: dict[str, object] = {}  # what it said as it stopped (the HTTP child: requests_cut)


class WorkerExited(WorkerEvent, frozen=True, kw_only=True, tag="worker.exited"):
    """The worker's process ended with ``exitcode`` (negative: the signal ``signal`` killed it)."""

    phase: Literal["exited"] = "exited"
    exitcode: int | None
    signal: str | None


class WorkerRestarted(WorkerEvent, frozen=True, kw_only=True, tag="worker.restarted"):
    """The worker was spawned again as ``pid``, for restart number ``restart`` of its replica."""

    phase: Literal["restarted"] = "restarted"
    restart: int


# Worker events after which the worker's process is gone, or about to be.
WORKER_GONE: tuple[type[WorkerEvent], ...] = (WorkerFailed, WorkerStopped, WorkerExited)


# -- server events: server.<kind> -----------------------------------------------------------------
class ServerStarting(OpsEvent, frozen=True, kw_only=True, tag="server.starting"):
    """The launch begins: the platform it selected and why, whether that is the CPU fallback,
    the runtime, the URL it will serve (None on a node without the HTTP child), and its workers."""

    platform: str
    platform_reason: str
    cpu_fallback: bool
    runtime: str
    url: str | None
    node_rank: int
    nnodes: int
    workers: list[str]


class ServerReady(OpsEvent, frozen=True, kw_only=True, tag="server.ready"):
    """Every worker of this node is ready, ``startup_s`` seconds after they were spawned."""

    url: str | None
    node_rank: int
    worker_count: int
    startup_s: float


class ServerFailed(OpsEvent, frozen=True, kw_only=True, tag="server.failed"):
    """The launch failed: ``root_cause``, and ``root_cause_text`` as the operator reads it."""

    root_cause: RootCause
    root_cause_text: str


class ServerStopping(OpsEvent, frozen=True, kw_only=True, tag="server.stopping"):
    """The workers are being stopped, for ``reason`` (the stop request or the failure)."""

    reason: str


class ServerStopped(OpsEvent, frozen=True, kw_only=True, tag="server.stopped"):
    """Every worker is gone after ``teardown_s`` seconds; the launch exits ``exit_code`` in
    ``phase`` (``"stopped"`` or ``"failed"``). ``requests_cut``: requests the HTTP child was still
    answering when the grace period ran out (each got a 503 or an error event; None: no HTTP
    child reported)."""

    exit_code: int
    teardown_s: float
    phase: str
    requests_cut: int | None = None


# -- events of a replica that heals: replica.<dp>.<kind> --------------------------------------------
class ReplicaEvent(OpsEvent, frozen=True, kw_only=True):
    """A scheduler replica (the tp ranks of data-parallel group ``dp_rank``), named ``replica``."""

    replica: str
    dp_rank: int

    def _topic(self) -> str:
        return f"replica.{self.dp_rank}.{self.kind().partition('.')[2]}"


class ReplicaRestarting(ReplicaEvent, frozen=True, kw_only=True, tag="replica.restarting"):
    """The replica failed and restarts: its ``workers`` are ended and, after ``backoff_s``
    seconds, spawned again (restart ``attempt`` of ``max_restarts``); ``cause`` is the failure's
    one-line summary, ``root_cause`` the full record."""

    workers: list[str]
    attempt: int
    max_restarts: int
    backoff_s: float
    cause: str
    root_cause: RootCause


class ReplicaReady(ReplicaEvent, frozen=True, kw_only=True, tag="replica.ready"):
    """Every rank of the restarted replica is ready again (processes ``pids``), ``down_s``
    seconds after it failed."""

    attempt: int
    down_s: float
    pids: list[int | None]


# -- a replica that a reload or a scale starts or retires: replica.<dp>.<kind> -----------------------
class ReplicaJoining(ReplicaEvent, frozen=True, kw_only=True, tag="replica.joining"):
    """Every rank of a replica that ``change`` (``"reload"``, ``"scale"``, ``"rollback"``) started
    is ready (processes ``pids``, ``startup_s`` after they were spawned), serving ``model_path`` as
    ``served_name``. It takes no requests yet: with ``probe``, the HTTP child connects, sends it one
    request and reports the answer to the supervisor (``replica.probed`` on the query socket)."""

    change: str
    pids: list[int | None]
    startup_s: float
    model_path: str | None
    served_name: str | None
    probe: bool


class ReplicaServing(ReplicaEvent, frozen=True, kw_only=True, tag="replica.serving"):
    """The joining replica answered its probe (``probe_s`` seconds, None when there was none) and
    takes requests from now on."""

    change: str
    probe_s: float | None


class ReplicaDraining(ReplicaEvent, frozen=True, kw_only=True, tag="replica.draining"):
    """The replica takes no new requests; the HTTP child lets those it holds finish (streams to
    their end) and reports it drained (``replica.drained``), then the supervisor stops it.
    ``in_place``: nothing serves beside it meanwhile (``--reload-surge 0``); requests wait for its
    successor rather than fail."""

    change: str
    in_place: bool


class ReplicaReplaced(ReplicaEvent, frozen=True, kw_only=True, tag="replica.replaced"):
    """Replica ``dp_rank`` is gone and replica ``by`` (processes ``pids``) serves in its place,
    ``model_path`` as ``served_name``; ``previous_pids`` were the old processes. ``seconds`` from
    the start of the new replica to the old one's end: ``startup_s`` to ready, ``probe_s`` for the
    probe, ``drain_s`` to drain and stop the old one."""

    change: str
    by: int
    pids: list[int | None]
    previous_pids: list[int | None]
    model_path: str | None
    served_name: str | None
    seconds: float
    startup_s: float
    probe_s: float | None
    drain_s: float


class ReplicaRemoved(ReplicaEvent, frozen=True, kw_only=True, tag="replica.removed"):
    """The replica is gone for good: drained and stopped by a scale down, or, with ``cause`` (the
    failure's summary), a replica that failed before it served, ended at once."""

    change: str
    pids: list[int | None]
    cause: str | None = None


# -- the changes themselves: reload.<kind>, scale.<kind> ------------------------------------------
class ReloadStarted(OpsEvent, frozen=True, kw_only=True, tag="reload.started"):
    """Reload ``id`` replaces ``replicas`` one at a time (``surge`` 1: each new one beside the
    old one; 0: in place), because of ``reason`` (``"reload command"``, ``"received SIGHUP"``,
    ``"Launcher.reload()"``). From ``previous_model_path`` / ``previous_served_name`` to
    ``model_path`` / ``served_name``; ``changes`` lists what else differs for the new replicas
    (plugin distributions installed, removed or upgraded since the replicas now serving started).
    ``previous_model_kind`` and ``model_kind`` say what the model directories serve
    (``"embedding"``, ``"generation"``, ``"image"``; None where the files do not say): when they
    differ, the reload was asked for with ``allow_kind_change`` and the API changes with it."""

    id: int
    reason: str
    replicas: list[int]
    surge: int
    model_path: str | None
    served_name: str | None
    previous_model_path: str | None
    previous_served_name: str | None
    changes: list[str]
    model_kind: str | None = None
    previous_model_kind: str | None = None


class ReloadFinished(OpsEvent, frozen=True, kw_only=True, tag="reload.finished"):
    """Every replica of reload ``id`` was replaced (``replicas``: the dp ranks now serving) in
    ``seconds``; the server serves ``model_path`` as ``served_name``, a model of ``model_kind``
    (as in ``reload.started``)."""

    id: int
    replicas: list[int]
    model_path: str | None
    served_name: str | None
    seconds: float
    model_kind: str | None = None


class ReloadFailed(OpsEvent, frozen=True, kw_only=True, tag="reload.failed"):
    """Reload ``id`` stopped at its ``root_cause`` (``root_cause_text`` as the operator reads it);
    the replicas it had replaced went back (``rolled_back``: their dp ranks now), and
    ``replicas`` serve ``model_path`` as ``served_name``, as before the reload.
    ``rollback_failures`` names what could not be put back (empty when all was)."""

    id: int
    root_cause: RootCause
    root_cause_text: str
    rolled_back: list[int]
    replicas: list[int]
    model_path: str | None
    served_name: str | None
    rollback_failures: list[str] = []


class ScaleStarted(OpsEvent, frozen=True, kw_only=True, tag="scale.started"):
    """Scale ``id`` goes from ``previous_dp_size`` to ``dp_size`` replicas, because of
    ``reason`` (``"scale command"``, ``"received SIGTTIN"``, ...); ``restart_policy`` is the
    policy in effect while it runs."""

    id: int
    reason: str
    dp_size: int
    previous_dp_size: int
    restart_policy: str


class ScaleFinished(OpsEvent, frozen=True, kw_only=True, tag="scale.finished"):
    """Scale ``id`` is done: ``replicas`` (their dp ranks) serve, ``added`` and ``removed`` by it,
    in ``seconds``; ``restart_policy`` is the policy in effect now (the default follows the
    number of replicas)."""

    id: int
    dp_size: int
    replicas: list[int]
    added: list[int]
    removed: list[int]
    restart_policy: str
    seconds: float


class ScaleFailed(OpsEvent, frozen=True, kw_only=True, tag="scale.failed"):
    """Scale ``id`` stopped at its ``root_cause``; ``replicas`` serve (those it added before the
    failure stay), ``restart_policy`` is the policy in effect."""

    id: int
    root_cause: RootCause
    root_cause_text: str
    dp_size: int
    replicas: list[int]
    added: list[int]
    removed: list[int]
    restart_policy: str


# The events that end a reload or a scale.
CHANGE_ENDED: tuple[type[OpsEvent], ...] = (
    ReloadFinished,
    ReloadFailed,
    ScaleFinished,
    ScaleFailed,
)


Event = (
    WorkerPhase
    | WorkerReady
    | WorkerFailed
    | WorkerStopped
    | WorkerExited
    | WorkerRestarted
    | ServerStarting
    | ServerReady
    | ServerFailed
    | ServerStopping
    | ServerStopped
    | ReplicaRestarting
    | ReplicaReady
    | ReplicaJoining
    | ReplicaServing
    | ReplicaDraining
    | ReplicaReplaced
    | ReplicaRemoved
    | ReloadStarted
    | ReloadFinished
    | ReloadFailed
    | ScaleStarted
    | ScaleFinished
    | ScaleFailed
)


class EventError(ValueError):
    """Data that is not an ops event of this sglang-launch version."""


_encoder = msgspec.json.Encoder()
_decoder = msgspec.json.Decoder(Event)


def encode(event: Event) -> bytes:
    """``event`` as its JSON object (the second frame on the PUB socket)."""
    return _encoder.encode(event)


def decode(data: bytes | str) -> Event:
    """The event one JSON object describes; ``EventError`` names what is wrong with it."""
    try:
        return _decoder.decode(data)
    except msgspec.DecodeError as exc:
        raise _refused(exc) from None


def from_dict(data: object) -> Event:
    """The event of one JSON object already parsed (an entry of the query socket's history)."""
    try:
        event: Event = msgspec.convert(data, Event)
    except msgspec.ValidationError as exc:
        raise _refused(exc) from None
    return event


def to_dict(event: Event) -> dict[str, object]:
    """``event`` as plain JSON-able data: the object ``encode`` writes."""
    data: dict[str, object] = msgspec.to_builtins(event)
    return data


def _refused(exc: Exception) -> EventError:
    return EventError(
        f"not an sglang-launch ops event ({exc}); the launcher and its reader must be the same "
        "sglang-launch version"
    )
