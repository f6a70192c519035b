"""systemd readiness notification (``sd_notify``), spoken over the ``NOTIFY_SOCKET`` datagram socket.

An ops listener: ``STATUS=`` lines while workers start, ``READY=1`` once every worker is ready,
``RELOADING=1`` (with ``MONOTONIC_USEC``) when a reload begins and ``READY=1`` again when it ends,
as ``systemctl reload`` of a ``Type=notify`` unit expects, ``STOPPING=1`` when the launcher
begins to stop. Without ``NOTIFY_SOCKET`` it does nothing.
Sends never block the supervisor's event loop: a notification that cannot be delivered at once
(no listener, or its queue is full) is dropped and logged once; systemd being slow or away must
never stall or stop a launch.
"""

from __future__ import annotations

import logging
import os
import socket
import time

from launchspec.events import (
    Event,
    ReloadFailed,
    ReloadFinished,
    ReloadStarted,
    ReplicaReady,
    ReplicaRestarting,
    ServerFailed,
    ServerReady,
    ServerStopping,
    WorkerEvent,
)

log = logging.getLogger("launcher")


class SystemdNotifier:
    def __init__(self, address: str | None = None) -> None:
        address = os.environ.get("NOTIFY_SOCKET") if address is None else address
        self._address = None
        if address:
            # "@name" is a socket in the abstract namespace.
            self._address = "\0" + address[1:] if address.startswith("@") else address
        self._warned = False

    @property
    def enabled(self) -> bool:
        return self._address is not None

    def notify(self, *lines: str) -> None:
        if self._address is None:
            return
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
                sock.setblocking(False)
                sock.sendto("\n".join(lines).encode(), self._address)
        except OSError as exc:
            if not self._warned:
                self._warned = True
                log.warning("sd_notify to %s failed: %s", os.environ.get("NOTIFY_SOCKET"), exc)

    def __call__(self, event: Event) -> None:
        """Ops listener: translate launch events into systemd notifications."""
        match event:
            case ServerReady():
                self.notify("READY=1", f"STATUS=ready at {event.url or 'this node'}")
            case ServerStopping():
                self.notify("STOPPING=1", f"STATUS=stopping: {event.reason}")
            case ServerFailed():
                self.notify(f"STATUS=failed: {event.root_cause.summary}")
            case ReplicaRestarting():
                self.notify(f"STATUS=ready; {event.replica} restarting: {event.cause}")
            case ReplicaReady():
                self.notify(f"STATUS=ready; {event.replica} serves again")
            case ReloadStarted():
                usec = time.clock_gettime_ns(time.CLOCK_MONOTONIC) // 1000
                self.notify(
                    "RELOADING=1",
                    f"MONOTONIC_USEC={usec}",
                    f"STATUS=reloading: {event.served_name} ({event.reason})",
                )
            case ReloadFinished():
                self.notify("READY=1", f"STATUS=ready; reloaded: {event.served_name}")
            case ReloadFailed():
                self.notify(
                    "READY=1",
                    f"STATUS=ready; reload failed and was rolled back: {event.root_cause.summary}",
                )
            case WorkerEvent():
                self.notify(
                    f"STATUS=starting: {event.ready_count}/{event.worker_count} workers ready; "
                    f"{event.worker} {event.phase}"
                )
