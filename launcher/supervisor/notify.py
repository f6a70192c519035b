"""systemd readiness notification (``sd_notify``), spoken over the ``NOTIFY_SOCKET`` datagram socket.

An ops listener: ``STATUS=`` lines while workers start, ``READY=1`` once every worker is ready,
``STOPPING=1`` when the launcher begins to stop. Without ``NOTIFY_SOCKET`` it does nothing.
Sends never block the supervisor's event loop: a notification that cannot be delivered at once
(no listener, or its queue is full) is dropped and logged once; systemd being slow or away must
never stall or stop a launch.
"""

from __future__ import annotations

import logging
import os
import socket

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

    def __call__(self, event: dict) -> None:
        """Ops listener: translate launch events into systemd notifications."""
        topic = event["topic"]
        if topic == "server.ready":
            self.notify("READY=1", f"STATUS=ready at {event.get('url') or 'this node'}")
        elif topic == "server.stopping":
            self.notify("STOPPING=1", f"STATUS=stopping: {event.get('reason', '')}")
        elif topic == "server.failed":
            self.notify(f"STATUS=failed: {event.get('root_cause', {}).get('summary', '')}")
        elif topic.startswith("replica.") and topic.endswith(".restarting"):
            self.notify(f"STATUS=ready; {event.get('replica')} restarting: {event.get('cause')}")
        elif topic.startswith("replica.") and topic.endswith(".ready"):
            self.notify(f"STATUS=ready; {event.get('replica')} serves again")
        elif topic.startswith("worker.") and "ready_count" in event:
            self.notify(
                f"STATUS=starting: {event['ready_count']}/{event['worker_count']} workers ready; "
                f"{event['worker']} {event['phase']}"
            )
