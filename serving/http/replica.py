"""``Replica``: one data-parallel scheduler replica as the HTTP child's ``SchedulerClient`` sees it."""

from __future__ import annotations

import asyncio
from typing import Any


class Replica:
    """Replica ``dp_rank``: its request address (None until announced), its socket, the requests
    in flight on it, and whether it is connected, dead (why) or unreachable (why)."""

    def __init__(self, dp_rank: int, endpoint: str | None) -> None:
        self.dp_rank = dp_rank
        self.endpoint = endpoint
        self.sock: Any = None  # the asyncio socket (its monitor is awaited)
        self.io: Any = None  # a plain shadow of it: requests are sent and replies read through this
        self.inflight: set[str] = set()
        self.connected = False
        self.watcher: asyncio.Task[None] | None = None  # its socket monitor
        self.dead_reason: str | None = None
        self.unreachable: str | None = None  # why its address could not be learned
        self.last_reply = float("-inf")  # time.monotonic() of its last answer to anything

    @property
    def where(self) -> str:
        return self.endpoint or "address not announced yet"
